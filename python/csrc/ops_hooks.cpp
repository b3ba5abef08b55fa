// ops_hooks.cpp: hidden test and bench hooks (names start with an underscore; not an API).
//
//  _core_call_us          runs one core op `iters` times straight from C++ over tensors bound
//                         once (the same Bound as the op kernel: ops_*.cpp) and returns the host
//                         microseconds per call: bench/torch_overhead.py subtracts it from the
//                         time of the same call through torch.ops.groupmm (the binding's cost).
//  _core_grouped_linear   one forward (+ backward, + backward_dw with delay_wgrad) of the C++
//                         nn::GroupedLinear with the given weights: tests compare the package's
//                         groupmm.nn.GroupedLinear with it bit for bit, recipe by recipe.
//  _core_layer_step_us    the median device time of that C++ layer's training step
//                         (bench/torch_layer_step.py: the package's step against the core's, in
//                         the same process, on the same tensors).
//  _core_moe              one forward (+ backward) of the C++ nn::MoE with the given weights:
//                         tests compare the package's groupmm.nn.MoE with it.
#include <torch/library.h>

#include <algorithm>
#include <chrono>
#include <memory>

#include "binding.hpp"
#include "groupmm/nn/grouped_linear.hpp"
#include "groupmm/nn/moe.hpp"

namespace groupmm_torch {
namespace {

using steady = std::chrono::steady_clock;

// ---- _core_call_us ------------------------------------------------------------------------------

Bound bind_by_name(Call& call, const std::string& op, at::TensorList t, at::IntArrayRef ints,
                   c10::string_view recipe) {
  auto need = [&](size_t n_tensors, size_t n_ints, const char* what) {
    TORCH_CHECK_VALUE(t.size() == n_tensors && ints.size() == n_ints, "groupmm._core_call_us: op '",
                      op, "' takes tensors ", what, "; got ", t.size(), " tensors and ",
                      ints.size(), " ints");
  };
  using groupmm::GemmPass;
  if (op == "grouped_mm" || op == "grouped_mm_dgrad" || op == "grouped_mm_wgrad") {
    need(3, 0, "[a, b, splits] as the op takes them");
    const GemmPass pass = op == "grouped_mm"         ? GemmPass::forward
                          : op == "grouped_mm_dgrad" ? GemmPass::dgrad
                                                     : GemmPass::wgrad;
    return bind_gemm(call, pass, t[0], t[1], t[2], std::nullopt, std::nullopt);
  }
  if (op == "group_quantize") {
    need(2, 0, "[x, splits] (recipe from `recipe`, both directions, plain scales)");
    return bind_group_quantize(call, t[0], t[1], recipe, std::nullopt, "both", "plain", false,
                               false);
  }
  if (op == "router") {
    need(1, 1, "[logits] and ints [topk] (softmax, renormalized)");
    return bind_router(call, t[0], std::nullopt, ints[0], "softmax", 1, 1, true, 1.0, 0.0, 0.0);
  }
  if (op == "permute") {
    need(6, 2, "[x, dest_row, row_start, kept, splits, weights] and ints [align, capacity]");
    return bind_permute(call, t[0], t[1], t[2], t[3], t[4], ints[0], ints[1], t[5]);
  }
  if (op == "unpermute") {
    need(5, 2, "[y_perm, dest_row, row_start, kept, splits] and ints [align, capacity]");
    return bind_unpermute(call, t[0], t[1], t[2], t[3], t[4], ints[0], ints[1], std::nullopt,
                          std::nullopt, std::nullopt, std::nullopt);
  }
  TORCH_CHECK_VALUE(false, "groupmm._core_call_us: op='", op,
                    "' must be grouped_mm, grouped_mm_dgrad, grouped_mm_wgrad, group_quantize, "
                    "router, permute or unpermute");
}

double core_call_us(c10::string_view op, at::TensorList tensors, at::IntArrayRef ints,
                    c10::string_view recipe, int64_t iters) {
  TORCH_CHECK_VALUE(!tensors.empty(), "groupmm._core_call_us: tensors must not be empty");
  TORCH_CHECK_VALUE(iters >= 1, "groupmm._core_call_us: iters=", iters, " must be >= 1");
  Call call("_core_call_us", tensors[0]);
  Bound b = bind_by_name(call, std::string(op), tensors, ints, recipe);
  for (int i = 0; i < 3; ++i) b.run();  // first-use kernel attributes, workspace growth
  call.ctx().synchronize();
  const auto t0 = steady::now();
  for (int64_t i = 0; i < iters; ++i) b.run();
  const auto t1 = steady::now();
  call.ctx().synchronize();
  call.finish();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / static_cast<double>(iters);
}

// ---- the C++ GroupedLinear ----------------------------------------------------------------------

std::shared_ptr<const groupmm::nn::LinearRecipe> layer_recipe(c10::string_view r,
                                                              std::optional<at::ScalarType> grad,
                                                              bool pow2, bool hp_wgrad) {
  namespace nn = groupmm::nn;
  TORCH_CHECK_VALUE(!hp_wgrad || r == "fp8_current" || r == "fp8_block" || r == "mxfp8",
                    "groupmm._core_grouped_linear: high_precision_wgrad=True needs recipe "
                    "fp8_current, fp8_block or mxfp8, not '",
                    std::string(r), "'");
  if (r == "bf16") return nn::high_precision_recipe();
  if (r == "nvfp4_weight") return nn::nvfp4_weight_recipe();
  if (r == "mxfp4_weight") return nn::mxfp4_weight_recipe();
  TORCH_CHECK_VALUE(r == "fp8_current" || r == "fp8_block" || r == "mxfp8",
                    "groupmm._core_grouped_linear: recipe='", std::string(r),
                    "' must be bf16, fp8_current, fp8_block, mxfp8, nvfp4_weight or mxfp4_weight");
  nn::QuantizedRecipeOptions o;
  o.grad_dtype =
      to_groupmm(grad.value_or(at::kFloat8_e4m3fn), "_core_grouped_linear", "grad_dtype");
  o.pow2_scales = pow2;
  o.high_precision_wgrad = hp_wgrad;
  return nn::quantized_recipe(recipe_of(r, "_core_grouped_linear"), o);
}

// Copies weight [G, N, K] (or [N, K]: one group) and bias [G, N] into a C++ layer.
void import_into(Call& call, groupmm::nn::GroupedLinear& layer, const at::Tensor& weight,
                 const std::optional<at::Tensor>& bias) {
  const auto w = call.in(weight, "weight"), b = call.in(bias, "bias");
  const auto& cfg = layer.config();
  const int64_t G = cfg.experts, N = cfg.out_features, K = cfg.in_features;
  TORCH_CHECK_VALUE(weight.numel() == G * N * K, "groupmm._core hooks: weight ", weight.sizes(),
                    " must hold [", G, ", ", N, ", ", K, "]");
  const int64_t esz = groupmm::dtype_bits(w.dtype) / 8;
  std::vector<groupmm::TensorView> ws, bs;
  for (int64_t g = 0; g < G; ++g) {
    ws.emplace_back(static_cast<char*>(w.data) + g * N * K * esz, w.dtype, w.device,
                    std::initializer_list<int64_t>{N, K});
    if (cfg.bias)
      bs.emplace_back(static_cast<char*>(b.data) + g * N * esz, b.dtype, b.device,
                      std::initializer_list<int64_t>{N});
  }
  layer.import_weights(call.ctx(), ws, bs);
}

// A C++ layer holding copies of weight [G, N, K] (and bias [G, N]), sized for x's rows.
struct CoreLayer {
  std::unique_ptr<groupmm::nn::GroupedLinear> layer;
  groupmm::TensorView x, splits, dy;

  CoreLayer(Call& call, const at::Tensor& x_t, const at::Tensor& splits_t, const at::Tensor& weight,
            const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& dy_t,
            c10::string_view recipe, bool delay_wgrad, bool main_grad,
            std::optional<at::ScalarType> grad_dtype, bool pow2_scales, bool hp_wgrad) {
    TORCH_CHECK_VALUE(weight.dim() == 3 && x_t.dim() == 2,
                      "groupmm._core_grouped_linear: weight must be [G, N, K] and x [M, K]");
    namespace nn = groupmm::nn;
    nn::GroupedLinearConfig cfg;
    cfg.experts = weight.size(0);
    cfg.out_features = weight.size(1);
    cfg.in_features = weight.size(2);
    cfg.bias = bias.has_value();
    cfg.dtype = to_groupmm(weight.scalar_type(), "_core_grouped_linear", "weight");
    cfg.delay_wgrad = delay_wgrad;
    cfg.accumulate_into_main_grad = main_grad;
    cfg.max_tokens = std::max<int64_t>(x_t.size(0), 1);
    cfg.recipe = layer_recipe(recipe, grad_dtype, pow2_scales, hp_wgrad);
    layer = std::make_unique<nn::GroupedLinear>(call.ctx(), cfg);
    import_into(call, *layer, weight, bias);
    x = call.in(x_t, "x");
    splits = call.in(splits_t, "splits");
    dy = call.in(dy_t, "dy");
  }

  // forward, then (with dy) backward and backward_dw: y and dx are the layer's views.
  std::pair<groupmm::TensorView, groupmm::TensorView> step(groupmm::Context& ctx) {
    const groupmm::TensorView y = layer->forward(ctx, x, splits);
    if (!dy.present()) return {y, groupmm::TensorView()};
    const groupmm::TensorView dx = layer->backward(ctx, dy);
    layer->backward_dw(ctx);  // no-op without delay_wgrad
    return {y, dx};
  }
};

at::Tensor copy_out(Call& call, const groupmm::TensorView& v) {
  if (!v.present()) return call.empty({0}, at::kFloat);
  at::Tensor t = call.empty(at::IntArrayRef(v.shape.data(), static_cast<size_t>(v.rank)),
                            torch_dtype(v.dtype));
  groupmm::copy(call.out(t, "copy"), v, call.ctx().stream());
  return t;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> core_grouped_linear(
    const at::Tensor& x, const at::Tensor& splits, const at::Tensor& weight,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& dy,
    c10::string_view recipe, bool delay_wgrad, bool main_grad,
    std::optional<at::ScalarType> grad_dtype, bool pow2_scales, bool high_precision_wgrad) {
  Call call("_core_grouped_linear", x);
  CoreLayer l(call, x, splits, weight, bias, dy, recipe, delay_wgrad, main_grad, grad_dtype,
              pow2_scales, high_precision_wgrad);
  const auto [y, dx] = l.step(call.ctx());
  const bool grads = dy.has_value();
  std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> out{
      copy_out(call, y), copy_out(call, dx),
      copy_out(call, grads ? l.layer->weight_grad() : groupmm::TensorView()),
      copy_out(call, grads ? l.layer->bias_grad() : groupmm::TensorView())};
  call.ctx().synchronize();  // the layer's buffers are freed when it goes
  call.finish();
  return out;
}

// Median device microseconds of one training step (forward, backward, backward_dw) of the C++
// layer after `warmup` steps: CUDA events on torch's current stream, or the wall clock on the CPU.
double core_layer_step_us(const at::Tensor& x, const at::Tensor& splits, const at::Tensor& weight,
                          const std::optional<at::Tensor>& bias, const at::Tensor& dy,
                          c10::string_view recipe, bool delay_wgrad, bool main_grad, int64_t iters,
                          int64_t warmup) {
  TORCH_CHECK_VALUE(iters >= 1 && warmup >= 0, "groupmm._core_layer_step_us: iters=", iters,
                    " must be >= 1 and warmup=", warmup, " >= 0");
  Call call("_core_layer_step_us", x);
  auto& ctx = call.ctx();
  CoreLayer l(call, x, splits, weight, bias, dy, recipe, delay_wgrad, main_grad, std::nullopt,
              false, false);
  for (int64_t i = 0; i < warmup; ++i) l.step(ctx);
  std::vector<double> us;
  const bool cuda = ctx.device() == groupmm::Device::CUDA;
  cudaEvent_t ev[2] = {nullptr, nullptr};
  if (cuda)
    for (auto& e : ev) GROUPMM_CHECK_CUDA(cudaEventCreate(&e));
  for (int64_t i = 0; i < iters; ++i) {
    ctx.synchronize();
    const auto t0 = steady::now();
    if (cuda) GROUPMM_CHECK_CUDA(cudaEventRecord(ev[0], ctx.stream()));
    l.step(ctx);
    if (cuda) {
      GROUPMM_CHECK_CUDA(cudaEventRecord(ev[1], ctx.stream()));
      GROUPMM_CHECK_CUDA(cudaEventSynchronize(ev[1]));
      float ms = 0;
      GROUPMM_CHECK_CUDA(cudaEventElapsedTime(&ms, ev[0], ev[1]));
      us.push_back(1e3 * ms);
    } else {
      us.push_back(std::chrono::duration<double, std::micro>(steady::now() - t0).count());
    }
  }
  for (auto e : ev)
    if (e) cudaEventDestroy(e);
  call.finish();
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

// ---- the C++ MoE block --------------------------------------------------------------------------

using MoeOut =
    std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// nn::MoE (no biases, no expert bias, no loss terms) holding copies of the given weights: router
// [E, H], gate_up [E, 2F, H], down [E, H, F], shared_up [2Fs, H] and shared_down [H, Fs]. Returns
// y and, with dy, dx and the weight grads (the shared ones [1, N, K]; absent ones empty).
MoeOut core_moe(const at::Tensor& x, const at::Tensor& router_weight, const at::Tensor& gate_up,
                const at::Tensor& down, const std::optional<at::Tensor>& shared_up,
                const std::optional<at::Tensor>& shared_down, const std::optional<at::Tensor>& dy,
                int64_t topk, c10::string_view score, bool renormalize, int64_t align,
                double capacity_factor, c10::string_view recipe) {
  namespace nn = groupmm::nn;
  TORCH_CHECK_VALUE(x.dim() == 2 && gate_up.dim() == 3 && down.dim() == 3,
                    "groupmm._core_moe: x must be [T, H], gate_up [E, 2F, H], down [E, H, F]");
  TORCH_CHECK_VALUE(score == "softmax" || score == "sigmoid", "groupmm._core_moe: score='",
                    std::string(score), "' must be 'softmax' or 'sigmoid'");
  Call call("_core_moe", x);
  auto& ctx = call.ctx();
  nn::MoEConfig c;
  c.hidden = x.size(1);
  c.ffn_hidden = down.size(2);
  c.experts = gate_up.size(0);
  c.topk = topk;
  c.max_tokens = std::max<int64_t>(x.size(0), 1);
  c.score = score == "softmax" ? groupmm::RouterScore::softmax : groupmm::RouterScore::sigmoid;
  c.renormalize = renormalize;
  c.shared_ffn_hidden = shared_down.has_value() ? shared_down->size(1) : 0;
  c.capacity_factor = capacity_factor;
  c.pad_align = align;
  c.dtype = to_groupmm(x.scalar_type(), "_core_moe", "x");
  c.recipe = layer_recipe(recipe, std::nullopt, false, false);
  nn::MoE moe(ctx, c);
  groupmm::copy(moe.router_weight(), call.in(router_weight, "router_weight"), ctx.stream());
  import_into(call, moe.gate_up(), gate_up, std::nullopt);
  import_into(call, moe.down(), down, std::nullopt);
  if (moe.has_shared_expert()) {
    TORCH_CHECK_VALUE(shared_up.has_value(),
                      "groupmm._core_moe: shared_up and shared_down go "
                      "together");
    import_into(call, moe.shared_gate_up(), *shared_up, std::nullopt);
    import_into(call, moe.shared_down(), *shared_down, std::nullopt);
  }
  const groupmm::TensorView y = moe.forward(ctx, call.in(x, "x"));
  MoeOut out;
  std::get<0>(out) = copy_out(call, y);
  const bool grads = dy.has_value();
  const groupmm::TensorView none;
  std::get<1>(out) = copy_out(call, grads ? moe.backward(ctx, call.in(dy, "dy")) : none);
  std::get<2>(out) = copy_out(call, grads ? moe.router_weight_grad() : none);
  std::get<3>(out) = copy_out(call, grads ? moe.gate_up().weight_grad() : none);
  std::get<4>(out) = copy_out(call, grads ? moe.down().weight_grad() : none);
  const bool sh = grads && moe.has_shared_expert();
  std::get<5>(out) = copy_out(call, sh ? moe.shared_gate_up().weight_grad() : none);
  std::get<6>(out) = copy_out(call, sh ? moe.shared_down().weight_grad() : none);
  ctx.synchronize();  // the block's buffers are freed when it goes
  call.finish();
  return out;
}

void register_hooks_impls(Kernels& m) {
  m.impl("_core_moe", &core_moe);
  m.impl("_core_call_us", &core_call_us);
  m.impl("_core_grouped_linear", &core_grouped_linear);
  m.impl("_core_layer_step_us", &core_layer_step_us);
}

}  // namespace

GROUPMM_TORCH_CPU_AND_CUDA(register_hooks_impls)

}  // namespace groupmm_torch
