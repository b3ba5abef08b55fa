// nn::MoE's configuration: the stage names, the router config and printing of MoEConfig, and the
// constructor's validation (moe.cpp builds the layer).
#include "nn/moe_config.hpp"

#include <cmath>

namespace groupmm::nn {

const char* moe_stage_name(MoEStage s) {
  switch (s) {
    case MoEStage::router:
      return "router";
    case MoEStage::permute:
      return "permute";
    case MoEStage::gate_up:
      return "gate_up";
    case MoEStage::activation:
      return "activation";
    case MoEStage::down:
      return "down";
    case MoEStage::shared_expert:
      return "shared_expert";
    case MoEStage::unpermute:
      return "unpermute";
  }
  return "?";
}

RouterConfig MoEConfig::router_config() const {
  return RouterConfig{.experts = experts,
                      .topk = topk,
                      .score = score,
                      .n_group = n_group,
                      .topk_group = topk_group,
                      .renormalize = renormalize,
                      .scaling_factor = scaling_factor,
                      .aux_loss_coeff = aux_loss_coeff,
                      .z_loss_coeff = z_loss_coeff};
}

std::string MoEExpertParallel::to_string() const {
  if (!enabled()) return "off";
  return detail::cat(
      "rank ", transport->rank(), " of ", transport->size(), ", ", ep::ep_mode_name(mode),
      mode == ep::EpMode::capacity ? ", " + capacity.to_string() : std::string(),
      max_rows > 0 ? detail::cat(", max_rows=", max_rows) : std::string(),
      chunks != 1 ? detail::cat(", chunks=", chunks) : std::string(),
      exchange_sms != 0 ? detail::cat(", exchange_sms=", exchange_sms) : std::string());
}

std::string MoEConfig::to_string() const {
  return detail::cat("MoEConfig(H=", hidden, ", F=", ffn_hidden, ", E=", experts, ", k=", topk,
                     ", max_tokens=", max_tokens, ", shared_F=", shared_ffn_hidden,
                     ", capacity_factor=", capacity_factor, ", pad_align=", pad_align,
                     ", bias=", bias ? "true" : "false", ", dtype=", dtype_name(dtype),
                     ", delay_wgrad=", delay_wgrad ? "true" : "false",
                     ", main_grad=", accumulate_into_main_grad ? "true" : "false",
                     ", expert_bias=", expert_bias ? "true" : "false",
                     fused_gate_up ? ", fused_gate_up=true" : "",
                     gathered_quantize ? "" : ", gathered_quantize=false", ", ep=", ep.to_string(),
                     ", ", router_config().to_string(), ")");
}

void check_moe_config(const Context& ctx, const MoEConfig& c) {
  const char* op = "MoE";
  GROUPMM_CHECK(c.hidden >= 1, op, ": hidden=", c.hidden, " must be >= 1");
  GROUPMM_CHECK(c.ffn_hidden >= 1, op, ": ffn_hidden=", c.ffn_hidden, " must be >= 1");
  GROUPMM_CHECK(c.experts >= 1 && c.experts <= 1024, op, ": experts=", c.experts,
                " must be in [1, 1024]");
  GROUPMM_CHECK(c.topk >= 1 && c.topk <= c.experts && c.topk <= 32, op, ": topk=", c.topk,
                " must be in [1, min(experts=", c.experts, ", 32)]");
  GROUPMM_CHECK(c.max_tokens >= 1, op, ": max_tokens=", c.max_tokens, " must be >= 1");
  GROUPMM_CHECK(c.shared_ffn_hidden >= 0, op, ": shared_ffn_hidden=", c.shared_ffn_hidden,
                " must be >= 0");
  GROUPMM_CHECK(std::isfinite(c.capacity_factor) && c.capacity_factor >= 0, op,
                ": capacity_factor=", c.capacity_factor, " must be finite and >= 0");
  GROUPMM_CHECK(c.pad_align >= 1, op, ": pad_align=", c.pad_align, " must be >= 1");
  GROUPMM_CHECK(c.ep.chunks == 1 || c.ep.enabled(), op, ": ep.chunks=", c.ep.chunks,
                " needs expert parallelism (ep.transport); without it, 1");
  GROUPMM_CHECK(c.ep.exchange_sms == 0 || c.ep.chunks > 1, op,
                ": ep.exchange_sms=", c.ep.exchange_sms,
                " needs ep.chunks > 1 (the exchanges beside the experts)");
  GROUPMM_CHECK(
      c.ep.exchange_sms >= 0 && (ctx.device() == Device::CPU || c.ep.exchange_sms < ctx.sm_count()),
      op, ": ep.exchange_sms=", c.ep.exchange_sms, " must be in [0, ", ctx.sm_count(),
      ") (the device's SMs)");
  if (c.ep.enabled()) {
    const ep::Transport& tr = *c.ep.transport;
    const int64_t R = tr.size();
    GROUPMM_CHECK(c.experts % R == 0, op, ": experts=", c.experts,
                  " must be divisible by the expert-parallel world size ", R);
    GROUPMM_CHECK(c.capacity_factor == 0, op, ": capacity_factor=", c.capacity_factor,
                  " must be 0 with expert parallelism (its capacity is ep.capacity)");
    GROUPMM_CHECK(c.pad_align == 1, op, ": pad_align=", c.pad_align,
                  " must be 1 with expert parallelism (the dispatched rows are not padded)");
    GROUPMM_CHECK(tr.device() == ctx.device(), op, ": ep.transport's buffers live on ",
                  device_name(tr.device()), " but the context is ", device_name(ctx.device()));
    GROUPMM_CHECK(c.ep.max_rows >= 0, op, ": ep.max_rows=", c.ep.max_rows, " must be >= 0");
    // A chunk holds at least one local expert (more chunks than experts would leave empty ones).
    GROUPMM_CHECK(c.ep.chunks >= 1 && c.ep.chunks <= c.experts / R, op, ": ep.chunks=", c.ep.chunks,
                  " must be in [1, E / R=", c.experts / R,
                  "] (each chunk holds at least one local expert)");
    if (c.ep.mode == ep::EpMode::capacity)
      GROUPMM_CHECK(c.ep.capacity.rows_per_peer >= 1 && c.ep.capacity.entries_per_peer >= 0, op,
                    ": ep.capacity=", c.ep.capacity.to_string(),
                    " needs rows_per_peer >= 1 and entries_per_peer >= 0 in capacity mode");
  }
  const bool fp32_ok = ctx.device() == Device::CPU;
  GROUPMM_CHECK(
      c.dtype == DType::bf16 || c.dtype == DType::fp16 || (fp32_ok && c.dtype == DType::fp32), op,
      ": dtype=", dtype_name(c.dtype), " must be bf16 or fp16 (fp32 only on a CPU context)");
  if (c.fused_gate_up) {
    GROUPMM_CHECK(
        !c.ep.enabled() && !c.bias && (!c.recipe || c.recipe->quantization() == QuantRecipe::none),
        op, ": fused_gate_up needs the high-precision recipe (recipe=",
        c.recipe ? c.recipe->name() : std::string("bf16"),
        "), no bias (bias=", c.bias ? "true" : "false",
        ") and no expert parallelism (ep=", c.ep.to_string(), ")");
    GROUPMM_CHECK(moe_gate_up_swiglu_supported(ctx, c.dtype, c.hidden, c.ffn_hidden, c.experts), op,
                  ": fused_gate_up: moe_gate_up_swiglu does not take dtype=", dtype_name(c.dtype),
                  ", hidden=", c.hidden, ", ffn_hidden=", c.ffn_hidden, ", experts=", c.experts,
                  " on ", device_name(ctx.device()),
                  " (CUDA: hidden % 8 == 0, ffn_hidden % 64 == 0, experts <= 1024)");
  }
}

}  // namespace groupmm::nn
