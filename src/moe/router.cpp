// Router ops: validation and backend dispatch (moe_router_logits[_backward], moe_router_forward,
// moe_router_backward).
#include <cmath>

#include "moe/backends.hpp"

namespace groupmm {

const char* router_score_name(RouterScore s) {
  return s == RouterScore::softmax ? "softmax" : "sigmoid";
}

std::string RouterConfig::to_string() const {
  return detail::cat("RouterConfig(E=", experts, ", k=", topk, ", score=", router_score_name(score),
                     ", n_group=", n_group, ", topk_group=", topk_group,
                     ", renormalize=", renormalize ? "true" : "false",
                     ", scaling_factor=", scaling_factor, ", aux_loss_coeff=", aux_loss_coeff,
                     ", z_loss_coeff=", z_loss_coeff, ")");
}

namespace {

void check_router_config(const char* op, const RouterConfig& c) {
  const int64_t E = c.experts, k = c.topk;
  GROUPMM_CHECK(E >= 1 && E <= kRouterMaxExperts, op, ": cfg.experts=", E, " must be in [1, ",
                kRouterMaxExperts, "]");
  GROUPMM_CHECK(k >= 1 && k <= kRouterMaxTopk, op, ": cfg.topk=", k, " must be in [1, ",
                kRouterMaxTopk, "]");
  GROUPMM_CHECK(k <= E, op, ": cfg.topk=", k, " must be <= cfg.experts=", E);
  GROUPMM_CHECK(c.n_group >= 1 && c.n_group <= 32 && E % c.n_group == 0, op,
                ": cfg.n_group=", c.n_group, " must be in [1, 32] and divide experts=", E);
  GROUPMM_CHECK(c.topk_group >= 1 && c.topk_group <= c.n_group, op,
                ": cfg.topk_group=", c.topk_group, " must be in [1, n_group=", c.n_group, "]");
  if (c.n_group > 1) {
    GROUPMM_CHECK(c.topk_group <= k, op, ": cfg.topk_group=", c.topk_group, " must be <= topk=", k,
                  " (a group's score sums its top k/topk_group)");
    GROUPMM_CHECK(k <= c.topk_group * (E / c.n_group), op, ": cfg.topk=", k, " exceeds the ",
                  c.topk_group * (E / c.n_group), " experts of topk_group=", c.topk_group,
                  " groups");
  }
  GROUPMM_CHECK(std::isfinite(c.scaling_factor), op, ": cfg.scaling_factor=", c.scaling_factor,
                " must be finite");
  GROUPMM_CHECK(std::isfinite(c.aux_loss_coeff) && c.aux_loss_coeff >= 0, op,
                ": cfg.aux_loss_coeff=", c.aux_loss_coeff, " must be finite and >= 0");
  GROUPMM_CHECK(std::isfinite(c.z_loss_coeff) && c.z_loss_coeff >= 0, op,
                ": cfg.z_loss_coeff=", c.z_loss_coeff, " must be finite and >= 0");
}

// logits [T, E] fp32; returns T.
int64_t check_logits(const Context& ctx, const char* op, const TensorView& logits, int64_t E) {
  check_view(op, "logits", logits, DType::fp32, 2, ctx.device());
  check_dim(op, "logits", logits, 1, E);
  GROUPMM_CHECK(logits.dim(0) <= INT32_MAX, op, ": logits.shape[0]=", logits.dim(0),
                " must fit int32");
  return logits.dim(0);
}

void check_tk(const Context& ctx, const char* op, const char* arg, const TensorView& v, DType t,
              int64_t T, int64_t k) {
  check_view(op, arg, v, t, 2, ctx.device());
  check_dim(op, arg, v, 0, T);
  check_dim(op, arg, v, 1, k);
}

void check_scalar(const Context& ctx, const char* op, const char* arg, const TensorView& v) {
  check_view(op, arg, v, DType::fp32, 1, ctx.device());
  check_dim(op, arg, v, 0, 1);
}

// x [T, H] and w [E, H] in one dtype; returns it.
DType check_gemm_operands(const Context& ctx, const char* op, const TensorView& x,
                          const TensorView& w) {
  GROUPMM_CHECK(x.present(), op, ": x is required");
  const DType t = x.dtype;
  const bool fp32_ok = ctx.device() == Device::CPU;
  GROUPMM_CHECK(t == DType::bf16 || t == DType::fp16 || (fp32_ok && t == DType::fp32), op,
                ": x.dtype=", dtype_name(t), " must be bf16 or fp16",
                fp32_ok ? " (or fp32 on a CPU context)" : "");
  // Named from x's side, as grouped_gemm does: the router weight has the block's dtype and size.
  GROUPMM_CHECK(!w.present() || w.dtype == t, op, ": x.dtype=", dtype_name(t),
                " must equal w.dtype=", dtype_name(w.dtype), " (both operands in one dtype)");
  check_view(op, "x", x, t, 2, ctx.device());
  check_view(op, "w", w, t, 2, ctx.device());
  GROUPMM_CHECK(x.dim(1) == w.dim(1), op, ": x.shape[1]=", x.dim(1),
                " must equal w.shape[1]=", w.dim(1), " (the hidden size H: w is [E, H])");
  GROUPMM_CHECK(w.dim(0) >= 1, op, ": w.shape[0]=", w.dim(0), " (experts) must be >= 1");
  return t;
}

}  // namespace

// ---- router GEMMs -------------------------------------------------------------------------------

size_t moe_router_logits_workspace_size(const Context& ctx, int64_t tokens, int64_t experts) {
  return ctx.device() == Device::CUDA ? cuda::moe_router_logits_workspace_size(tokens, experts) : 0;
}

void moe_router_logits(Context& ctx, const TensorView& x, const TensorView& w,
                       const TensorView& logits, const TensorView& bias) {
  const char* op = "moe_router_logits";
  const DType t = check_gemm_operands(ctx, op, x, w);
  check_view(op, "logits", logits, DType::fp32, 2, ctx.device());
  check_dim(op, "logits", logits, 0, x.dim(0));
  check_dim(op, "logits", logits, 1, w.dim(0));
  if (bias.present()) {
    check_view(op, "bias", bias, t, 1, ctx.device());
    check_dim(op, "bias", bias, 0, w.dim(0));
  }
  if (ctx.device() == Device::CPU) {
    cpu::moe_router_logits(ctx, x, w, bias, logits);
  } else {
    size_t bytes = 0;
    const size_t need = cuda::moe_router_logits_workspace_size(x.dim(0), w.dim(0));
    void* ws = moe_workspace(ctx, op, need, nullptr, bytes, "moe_router_logits_workspace_size");
    cuda::moe_router_logits(ctx, x, w, bias, logits, ws, bytes);
  }
  ctx.after_op();
}

void moe_router_logits_backward(Context& ctx, const TensorView& d_logits, const TensorView& x,
                                const TensorView& w, const TensorView& dx, const TensorView& dw,
                                bool accumulate_dx, bool accumulate_dw) {
  const char* op = "moe_router_logits_backward";
  const DType t = check_gemm_operands(ctx, op, x, w);
  check_view(op, "d_logits", d_logits, DType::fp32, 2, ctx.device());
  check_dim(op, "d_logits", d_logits, 0, x.dim(0));
  check_dim(op, "d_logits", d_logits, 1, w.dim(0));
  if (dx.present()) {
    check_view(op, "dx", dx, t, 2, ctx.device());
    check_dim(op, "dx", dx, 0, x.dim(0));
    check_dim(op, "dx", dx, 1, x.dim(1));
  }
  if (dw.present()) {
    GROUPMM_CHECK(dw.dtype == DType::fp32 || dw.dtype == t, op, ": dw.dtype=", dtype_name(dw.dtype),
                  " must be fp32 or x's dtype ", dtype_name(t));
    check_view(op, "dw", dw, dw.dtype, 2, ctx.device());
    check_dim(op, "dw", dw, 0, w.dim(0));
    check_dim(op, "dw", dw, 1, w.dim(1));
  }
  if (ctx.device() == Device::CPU) {
    cpu::moe_router_logits_backward(ctx, d_logits, x, w, dx, dw, accumulate_dx, accumulate_dw);
  } else {
    size_t bytes = 0;
    const size_t need = cuda::moe_router_logits_workspace_size(x.dim(0), w.dim(0));
    void* ws = moe_workspace(ctx, op, need, nullptr, bytes, "moe_router_logits_workspace_size");
    cuda::moe_router_logits_backward(ctx, d_logits, x, w, dx, dw, accumulate_dx, accumulate_dw, ws,
                                     bytes);
  }
  ctx.after_op();
}

// ---- top-k routing ------------------------------------------------------------------------------

size_t moe_router_workspace_size(const Context& ctx, const RouterConfig& cfg, int64_t tokens) {
  check_router_config("moe_router_workspace_size", cfg);
  GROUPMM_CHECK(tokens >= 0, "moe_router_workspace_size: tokens=", tokens, " must be >= 0");
  return ctx.device() == Device::CUDA ? cuda::moe_router_workspace_size(cfg, tokens) : 0;
}

void moe_router_forward(Context& ctx, const RouterConfig& cfg, const RouterArgs& a, void* ws,
                        size_t ws_bytes) {
  const char* op = "moe_router_forward";
  check_router_config(op, cfg);
  const int64_t E = cfg.experts, k = cfg.topk;
  const int64_t T = check_logits(ctx, op, a.logits, E);
  if (a.expert_bias.present()) {
    check_view(op, "expert_bias", a.expert_bias, DType::fp32, 1, ctx.device());
    check_dim(op, "expert_bias", a.expert_bias, 0, E);
  }
  check_tk(ctx, op, "expert_ids", a.expert_ids, DType::int32, T, k);
  check_tk(ctx, op, "weights", a.weights, DType::fp32, T, k);
  check_view(op, "counts", a.counts, DType::int32, 1, ctx.device());
  check_dim(op, "counts", a.counts, 0, E);
  // A loss output is required when its coefficient is nonzero, and written 0 when given without.
  if (cfg.aux_loss_coeff != 0 || a.aux_loss.present())
    check_scalar(ctx, op, "aux_loss", a.aux_loss);
  if (cfg.z_loss_coeff != 0 || a.z_loss.present()) check_scalar(ctx, op, "z_loss", a.z_loss);
  if (ctx.device() == Device::CPU) {
    cpu::moe_router_forward(ctx, cfg, a);
  } else {
    ws = moe_workspace(ctx, op, cuda::moe_router_workspace_size(cfg, T), ws, ws_bytes,
                       "moe_router_workspace_size");
    cuda::moe_router_forward(ctx, cfg, a, ws);
  }
  ctx.after_op();
}

void moe_router_backward(Context& ctx, const RouterConfig& cfg, const RouterBackwardArgs& a) {
  const char* op = "moe_router_backward";
  check_router_config(op, cfg);
  const int64_t E = cfg.experts, k = cfg.topk;
  const int64_t T = check_logits(ctx, op, a.logits, E);
  check_tk(ctx, op, "expert_ids", a.expert_ids, DType::int32, T, k);
  check_tk(ctx, op, "d_weights", a.d_weights, DType::fp32, T, k);
  check_view(op, "d_logits", a.d_logits, DType::fp32, 2, ctx.device());
  check_dim(op, "d_logits", a.d_logits, 0, T);
  check_dim(op, "d_logits", a.d_logits, 1, E);
  if (cfg.aux_loss_coeff != 0) {
    check_view(op, "counts", a.counts, DType::int32, 1, ctx.device());
    check_dim(op, "counts", a.counts, 0, E);
  }
  if (ctx.device() == Device::CPU)
    cpu::moe_router_backward(ctx, cfg, a);
  else
    cuda::moe_router_backward(ctx, cfg, a);
  ctx.after_op();
}

}  // namespace groupmm
