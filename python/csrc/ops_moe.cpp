// ops_moe.cpp: SwiGLU (plain and router-weighted, with a SwigluForm too), router, permute plan,
// permute / unpermute.
//
// A permute map travels as its four tensors (dest_row, row_start, kept, splits) plus align and
// capacity; the host-known sizes (tokens, top-k, experts, rows) follow from their shapes.
#include <torch/library.h>

#include <algorithm>

#include "binding.hpp"
#include "groupmm/moe.hpp"

namespace groupmm_torch {
namespace {

at::Tensor swiglu(const at::Tensor& gate_up) {
  Call call("swiglu", gate_up);
  const auto g = call.in(gate_up, "gate_up");
  TORCH_CHECK_VALUE(gate_up.dim() == 2, "groupmm.swiglu: gate_up must be [M, 2I]; got ",
                    gate_up.sizes());
  at::Tensor out = call.empty({gate_up.size(0), gate_up.size(1) / 2}, gate_up.scalar_type());
  groupmm::swiglu_forward(call.ctx(), g, call.out(out, "out"));
  call.finish();
  return out;
}

at::Tensor swiglu_backward(const at::Tensor& dout, const at::Tensor& gate_up) {
  Call call("swiglu_backward", gate_up);
  const auto d = call.in(dout, "dout");
  const auto g = call.in(gate_up, "gate_up");
  at::Tensor dgu = call.empty(gate_up.sizes(), gate_up.scalar_type());
  groupmm::swiglu_backward(call.ctx(), d, g, call.out(dgu, "dgate_up"));
  call.finish();
  return dgu;
}

groupmm::SwigluForm swiglu_form(double alpha, std::optional<double> limit, double up_offset,
                                bool interleaved) {
  groupmm::SwigluForm f;
  f.alpha = static_cast<float>(alpha);
  if (limit) f.limit = static_cast<float>(*limit);
  f.up_offset = static_cast<float>(up_offset);
  f.layout = interleaved ? groupmm::SwigluLayout::interleaved : groupmm::SwigluLayout::halves;
  return f;
}

// The SwigluForm variant: the same outputs as weighted_swiglu, the form's parameters validated
// by the core (messages name the op and form.<parameter>). With splits: sum(splits) <= M, the
// rows past the sum neither read nor written (moe.hpp).
at::Tensor weighted_swiglu_with(const char* op, const at::Tensor& gate_up, const at::Tensor& prob,
                                const groupmm::SwigluForm& form,
                                const std::optional<at::Tensor>& splits = std::nullopt) {
  Call call(op, gate_up);
  const auto g = call.in(gate_up, "gate_up");
  const auto p = call.in(prob, "prob");
  const auto sv = call.in(splits, "splits");
  TORCH_CHECK_VALUE(gate_up.dim() == 2, "groupmm.", op, ": gate_up must be [M, 2I]; got ",
                    gate_up.sizes());
  at::Tensor out = call.empty({gate_up.size(0), gate_up.size(1) / 2}, gate_up.scalar_type());
  groupmm::weighted_swiglu_forward(call.ctx(), g, p, call.out(out, "out"), form, sv);
  call.finish();
  return out;
}

std::tuple<at::Tensor, at::Tensor> weighted_swiglu_backward_with(
    const char* op, const at::Tensor& dout, const at::Tensor& gate_up, const at::Tensor& prob,
    const groupmm::SwigluForm& form, const std::optional<at::Tensor>& splits = std::nullopt) {
  Call call(op, gate_up);
  const auto d = call.in(dout, "dout");
  const auto g = call.in(gate_up, "gate_up");
  const auto p = call.in(prob, "prob");
  const auto sv = call.in(splits, "splits");
  at::Tensor dgu = call.empty(gate_up.sizes(), gate_up.scalar_type());
  at::Tensor dprob = call.empty(prob.sizes(), at::kFloat);
  groupmm::weighted_swiglu_backward(call.ctx(), d, g, p, call.out(dgu, "dgate_up"),
                                    call.out(dprob, "dprob"), form, sv);
  call.finish();
  return {dgu, dprob};
}

at::Tensor weighted_swiglu(const at::Tensor& gate_up, const at::Tensor& prob,
                           const std::optional<at::Tensor>& splits) {
  return weighted_swiglu_with("weighted_swiglu", gate_up, prob, groupmm::SwigluForm{}, splits);
}

std::tuple<at::Tensor, at::Tensor> weighted_swiglu_backward(
    const at::Tensor& dout, const at::Tensor& gate_up, const at::Tensor& prob,
    const std::optional<at::Tensor>& splits) {
  return weighted_swiglu_backward_with("weighted_swiglu_backward", dout, gate_up, prob,
                                       groupmm::SwigluForm{}, splits);
}

at::Tensor weighted_swiglu_ex(const at::Tensor& gate_up, const at::Tensor& prob, double alpha,
                              std::optional<double> limit, double up_offset, bool interleaved) {
  return weighted_swiglu_with("weighted_swiglu_ex", gate_up, prob,
                              swiglu_form(alpha, limit, up_offset, interleaved));
}

std::tuple<at::Tensor, at::Tensor> weighted_swiglu_ex_backward(const at::Tensor& dout,
                                                               const at::Tensor& gate_up,
                                                               const at::Tensor& prob, double alpha,
                                                               std::optional<double> limit,
                                                               double up_offset, bool interleaved) {
  return weighted_swiglu_backward_with("weighted_swiglu_ex_backward", dout, gate_up, prob,
                                       swiglu_form(alpha, limit, up_offset, interleaved));
}

// The config of router (and router_backward, whose k is expert_ids.shape[1]). E and k are
// checked here, before the op sizes its outputs [T, k] from them (a negative k would otherwise
// fail in torch's allocator); the core checks the rest of the config.
groupmm::RouterConfig router_config(const char* op, int64_t experts, int64_t topk,
                                    const char* topk_arg, c10::string_view score, int64_t n_group,
                                    int64_t topk_group, bool renormalize, double scaling_factor,
                                    double aux_loss_coeff, double z_loss_coeff) {
  using groupmm::kRouterMaxExperts, groupmm::kRouterMaxTopk;
  TORCH_CHECK_VALUE(experts >= 1 && experts <= kRouterMaxExperts, "groupmm.", op,
                    ": logits.shape[1]=", experts, " (experts) must be in [1, ", kRouterMaxExperts,
                    "]");
  const int64_t max_k = std::min(experts, kRouterMaxTopk);
  TORCH_CHECK_VALUE(topk >= 1 && topk <= max_k, "groupmm.", op, ": ", topk_arg, "=", topk,
                    " must be in [1, min(experts, ", kRouterMaxTopk, ")] = [1, ", max_k, "]");
  groupmm::RouterConfig c;
  c.experts = experts;
  c.topk = topk;
  TORCH_CHECK_VALUE(score == "softmax" || score == "sigmoid", "groupmm.", op, ": score='",
                    std::string(score), "' must be 'softmax' or 'sigmoid'");
  c.score = score == "softmax" ? groupmm::RouterScore::softmax : groupmm::RouterScore::sigmoid;
  c.n_group = n_group;
  c.topk_group = topk_group;
  c.renormalize = renormalize;
  c.scaling_factor = static_cast<float>(scaling_factor);
  c.aux_loss_coeff = static_cast<float>(aux_loss_coeff);
  c.z_loss_coeff = static_cast<float>(z_loss_coeff);
  return c;
}

}  // namespace

// logits [T, E] fp32 -> expert_ids [T, k] int32, weights [T, k] fp32, counts [E] int32,
// aux_loss [1], z_loss [1] (0 when their coefficient is 0: the core writes it).
Bound bind_router(Call& call, const at::Tensor& logits,
                  const std::optional<at::Tensor>& expert_bias, int64_t topk,
                  c10::string_view score, int64_t n_group, int64_t topk_group, bool renormalize,
                  double scaling_factor, double aux_loss_coeff, double z_loss_coeff) {
  TORCH_CHECK_VALUE(logits.dim() == 2, "groupmm.router: logits must be [T, E]; got ",
                    logits.sizes());
  const int64_t T = logits.size(0), E = logits.size(1);
  const auto cfg = router_config("router", E, topk, "topk", score, n_group, topk_group, renormalize,
                                 scaling_factor, aux_loss_coeff, z_loss_coeff);
  groupmm::RouterArgs a;
  a.logits = call.in(logits, "logits");
  a.expert_bias = call.in(expert_bias, "expert_bias");
  at::Tensor ids = call.empty({T, topk}, at::kInt), w = call.empty({T, topk}, at::kFloat);
  at::Tensor counts = call.empty({E}, at::kInt);
  // The core writes both losses (0 for a disabled one): no fill kernels here.
  at::Tensor aux = call.empty({1}, at::kFloat), z = call.empty({1}, at::kFloat);
  a.expert_ids = call.out(ids, "expert_ids");
  a.weights = call.out(w, "weights");
  a.counts = call.out(counts, "counts");
  a.aux_loss = call.out(aux, "aux_loss");
  a.z_loss = call.out(z, "z_loss");
  auto& ctx = call.ctx();
  const size_t bytes = groupmm::moe_router_workspace_size(ctx, cfg, T);
  void* ws = call.workspace(bytes);
  return {[&ctx, cfg, a, ws, bytes] { groupmm::moe_router_forward(ctx, cfg, a, ws, bytes); },
          {ids, w, counts, aux, z}};
}

namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> router(
    const at::Tensor& logits, const std::optional<at::Tensor>& expert_bias, int64_t topk,
    c10::string_view score, int64_t n_group, int64_t topk_group, bool renormalize,
    double scaling_factor, double aux_loss_coeff, double z_loss_coeff) {
  Call call("router", logits);
  Bound op = bind_router(call, logits, expert_bias, topk, score, n_group, topk_group, renormalize,
                         scaling_factor, aux_loss_coeff, z_loss_coeff);
  op.run();
  call.finish();
  const auto& o = op.outputs;
  return {o[0], o[1], o[2], o[3], o[4]};
}

// d_logits of sum(d_weights * weights) + aux_loss + z_loss (the losses with gradient 1).
at::Tensor router_backward(const at::Tensor& logits, const at::Tensor& expert_ids,
                           const at::Tensor& counts, const at::Tensor& d_weights,
                           c10::string_view score, int64_t n_group, int64_t topk_group,
                           bool renormalize, double scaling_factor, double aux_loss_coeff,
                           double z_loss_coeff) {
  Call call("router_backward", logits);
  TORCH_CHECK_VALUE(logits.dim() == 2 && expert_ids.dim() == 2,
                    "groupmm.router_backward: logits must be [T, E] and expert_ids [T, k]");
  const auto cfg = router_config("router_backward", logits.size(1), expert_ids.size(1),
                                 "expert_ids.shape[1]", score, n_group, topk_group, renormalize,
                                 scaling_factor, aux_loss_coeff, z_loss_coeff);
  groupmm::RouterBackwardArgs a;
  a.logits = call.in(logits, "logits");
  a.expert_ids = call.in(expert_ids, "expert_ids");
  a.counts = call.in(counts, "counts");
  a.d_weights = call.in(d_weights, "d_weights");
  at::Tensor dl = call.empty(logits.sizes(), at::kFloat);
  a.d_logits = call.out(dl, "d_logits");
  groupmm::moe_router_backward(call.ctx(), cfg, a);
  call.finish();
  return dl;
}

// The map's views over its four tensors (validated by the core where it is used).
groupmm::PermuteMap map_of(Call& call, const at::Tensor& dest_row, const at::Tensor& row_start,
                           const at::Tensor& kept, const at::Tensor& splits, int64_t align,
                           int64_t capacity) {
  TORCH_CHECK_VALUE(dest_row.dim() == 2, "groupmm: dest_row must be [T, k]; got ",
                    dest_row.sizes());
  groupmm::PermuteMap m;
  m.tokens = dest_row.size(0);
  m.topk = dest_row.size(1);
  m.experts = splits.size(0);
  m.align = align;
  m.capacity = capacity;
  m.rows = groupmm::moe_permuted_rows(m.tokens, m.topk, m.experts, align, capacity);
  m.dest_row = call.in(dest_row, "dest_row");
  m.row_start = call.in(row_start, "row_start");
  m.kept = call.in(kept, "kept");
  m.splits = call.in(splits, "splits");
  return m;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> permute_plan(
    const at::Tensor& expert_ids, int64_t experts, int64_t align, int64_t capacity) {
  Call call("permute_plan", expert_ids);
  const auto ids = call.in(expert_ids, "expert_ids");
  TORCH_CHECK_VALUE(expert_ids.dim() == 2, "groupmm.permute_plan: expert_ids must be [T, k]; got ",
                    expert_ids.sizes());
  const int64_t T = expert_ids.size(0), k = expert_ids.size(1);
  groupmm::PermuteMap m;
  m.tokens = T;
  m.topk = k;
  m.experts = experts;
  m.align = align;
  m.capacity = capacity;
  m.rows = groupmm::moe_permuted_rows(T, k, experts, align, capacity);
  at::Tensor dest = call.empty({T, k}, at::kInt), start = call.empty({experts}, at::kInt);
  at::Tensor kept = call.empty({experts}, at::kInt), splits = call.empty({experts}, at::kInt);
  m.dest_row = call.out(dest, "dest_row");
  m.row_start = call.out(start, "row_start");
  m.kept = call.out(kept, "kept");
  m.splits = call.out(splits, "splits");
  auto& ctx = call.ctx();
  const size_t ws = groupmm::moe_permute_plan_workspace_size(ctx, T, k, experts);
  groupmm::moe_permute_plan(ctx, ids, m, call.workspace(ws), ws);
  call.finish();
  return {dest, start, kept, splits};
}

}  // namespace

// x [T, H] -> x_perm [R, H] (and probs [R] fp32 from weights [T, k] when given; else empty).
Bound bind_permute(Call& call, const at::Tensor& x, const at::Tensor& dest_row,
                   const at::Tensor& row_start, const at::Tensor& kept, const at::Tensor& splits,
                   int64_t align, int64_t capacity, const std::optional<at::Tensor>& weights) {
  const auto m = map_of(call, dest_row, row_start, kept, splits, align, capacity);
  const auto xv = call.in(x, "x");
  at::Tensor xp = call.empty({m.rows, x.size(1)}, x.scalar_type());
  at::Tensor probs = call.empty({weights ? m.rows : 0}, at::kFloat);
  const auto xpv = call.out(xp, "x_perm"), wv = call.in(weights, "weights");
  const auto pv = weights ? call.out(probs, "probs") : groupmm::TensorView();
  auto& ctx = call.ctx();
  return {[&ctx, xv, m, xpv, wv, pv] { groupmm::moe_permute(ctx, xv, m, xpv, wv, pv); },
          {xp, probs}};
}

// y [T, H] = sum over the k rows of each token in y_perm [R, H] (+ the routed bias: sum over the
// kept (t, j) of weights [T, k] times bias [E, H] at expert_ids [T, k]) (+ add [T, H]).
Bound bind_unpermute(Call& call, const at::Tensor& y_perm, const at::Tensor& dest_row,
                     const at::Tensor& row_start, const at::Tensor& kept, const at::Tensor& splits,
                     int64_t align, int64_t capacity, const std::optional<at::Tensor>& add,
                     const std::optional<at::Tensor>& bias,
                     const std::optional<at::Tensor>& expert_ids,
                     const std::optional<at::Tensor>& weights) {
  const auto m = map_of(call, dest_row, row_start, kept, splits, align, capacity);
  const auto yp = call.in(y_perm, "y_perm"), av = call.in(add, "add");
  const groupmm::RoutedBias rb{call.in(bias, "bias"), call.in(expert_ids, "expert_ids"),
                               call.in(weights, "weights")};
  at::Tensor y = call.empty({m.tokens, y_perm.size(1)}, y_perm.scalar_type());
  const auto yv = call.out(y, "y");
  auto& ctx = call.ctx();
  return {[&ctx, yp, m, yv, av, rb] { groupmm::moe_unpermute(ctx, yp, m, yv, av, rb); }, {y}};
}

namespace {

// The gate_up projection of the permuted rows with the weighted SwiGLU, x read through the row map
// (moe_permute_sources, then moe_gate_up_swiglu): bit for bit permute -> grouped_mm ->
// weighted_swiglu. The row map is scratch from torch's allocator.
std::tuple<at::Tensor, at::Tensor, at::Tensor> gate_up_swiglu(
    const at::Tensor& x, const at::Tensor& dest_row, const at::Tensor& row_start,
    const at::Tensor& kept, const at::Tensor& splits, int64_t align, int64_t capacity,
    const at::Tensor& weights, const at::Tensor& w, bool pre_activation, c10::string_view config) {
  Call call("gate_up_swiglu", x);
  TORCH_CHECK_VALUE(x.dim() == 2 && w.dim() == 3 && w.size(1) % 2 == 0,
                    "groupmm.gate_up_swiglu: x must be [T, H] and w [E, 2F, H]; got ", x.sizes(),
                    " and ", w.sizes());
  const auto m = map_of(call, dest_row, row_start, kept, splits, align, capacity);
  const int64_t F = w.size(1) / 2;
  at::Tensor h = call.empty({m.rows, F}, x.scalar_type());
  at::Tensor gu = call.empty({pre_activation ? m.rows : 0, 2 * F}, x.scalar_type());
  at::Tensor probs = call.empty({m.rows}, at::kFloat);
  at::Tensor src = call.empty({m.rows}, at::kInt);
  auto& ctx = call.ctx();
  const auto pv = call.out(probs, "probs"), sv = call.out(src, "src_row");
  groupmm::moe_permute_sources(ctx, m, sv, call.in(weights, "weights"), pv);
  groupmm::MoeGateUpArgs a{
      .x = call.in(x, "x"),
      .src_row = sv,
      .splits = m.splits,
      .w = call.in(w, "w"),
      .prob = pv,
      .out = call.out(h, "h"),
      .gate_up = pre_activation ? call.out(gu, "gate_up") : groupmm::TensorView(),
      .config = std::string(config)};
  groupmm::moe_gate_up_swiglu(ctx, a);
  call.finish();
  return {h, gu, probs};
}

std::tuple<at::Tensor, at::Tensor> permute(const at::Tensor& x, const at::Tensor& dest_row,
                                           const at::Tensor& row_start, const at::Tensor& kept,
                                           const at::Tensor& splits, int64_t align,
                                           int64_t capacity,
                                           const std::optional<at::Tensor>& weights) {
  Call call("permute", x);
  Bound op = bind_permute(call, x, dest_row, row_start, kept, splits, align, capacity, weights);
  op.run();
  call.finish();
  return {op.outputs[0], op.outputs[1]};
}

// dx [T, H] = k-way sum of d_x_perm rows; d_weights [T, k] from d_probs [R] when given.
std::tuple<at::Tensor, at::Tensor> permute_backward(
    const at::Tensor& d_x_perm, const at::Tensor& dest_row, const at::Tensor& row_start,
    const at::Tensor& kept, const at::Tensor& splits, int64_t align, int64_t capacity,
    const std::optional<at::Tensor>& d_probs) {
  Call call("permute_backward", d_x_perm);
  const auto m = map_of(call, dest_row, row_start, kept, splits, align, capacity);
  const auto dxp = call.in(d_x_perm, "d_x_perm");
  at::Tensor dx = call.empty({m.tokens, d_x_perm.size(1)}, d_x_perm.scalar_type());
  at::Tensor dw = call.empty({d_probs ? m.tokens : 0, d_probs ? m.topk : 0}, at::kFloat);
  groupmm::moe_permute_backward(call.ctx(), dxp, m, call.out(dx, "dx"), call.in(d_probs, "d_probs"),
                                d_probs ? call.out(dw, "d_weights") : groupmm::TensorView());
  call.finish();
  return {dx, dw};
}

at::Tensor unpermute(const at::Tensor& y_perm, const at::Tensor& dest_row,
                     const at::Tensor& row_start, const at::Tensor& kept, const at::Tensor& splits,
                     int64_t align, int64_t capacity, const std::optional<at::Tensor>& add,
                     const std::optional<at::Tensor>& bias,
                     const std::optional<at::Tensor>& expert_ids,
                     const std::optional<at::Tensor>& weights) {
  Call call("unpermute", y_perm);
  Bound op = bind_unpermute(call, y_perm, dest_row, row_start, kept, splits, align, capacity, add,
                            bias, expert_ids, weights);
  op.run();
  call.finish();
  return op.outputs[0];
}

at::Tensor unpermute_backward(const at::Tensor& dy, const at::Tensor& dest_row,
                              const at::Tensor& row_start, const at::Tensor& kept,
                              const at::Tensor& splits, int64_t align, int64_t capacity) {
  Call call("unpermute_backward", dy);
  const auto m = map_of(call, dest_row, row_start, kept, splits, align, capacity);
  const auto dyv = call.in(dy, "dy");
  at::Tensor dyp = call.empty({m.rows, dy.size(1)}, dy.scalar_type());
  groupmm::moe_unpermute_backward(call.ctx(), dyv, m, call.out(dyp, "dy_perm"));
  call.finish();
  return dyp;
}

// logits [T, E] fp32 = x [T, H] w [E, H]^T (+ bias [E]) (moe_router_logits: what nn::MoE's router
// runs). The core op uses the Context's workspace (cuBLAS on CUDA), reserved here: eager calls grow
// it before a capture needs it.
at::Tensor router_logits(const at::Tensor& x, const at::Tensor& w,
                         const std::optional<at::Tensor>& bias) {
  Call call("router_logits", x);
  TORCH_CHECK_VALUE(x.dim() == 2 && w.dim() == 2,
                    "groupmm.router_logits: x must be [T, H] and w [E, H]; got ", x.sizes(),
                    " and ", w.sizes());
  const auto xv = call.in(x, "x"), wv = call.in(w, "w"), bv = call.in(bias, "bias");
  at::Tensor logits = call.empty({x.size(0), w.size(0)}, at::kFloat);
  auto& ctx = call.ctx();
  ctx.reserve_workspace(groupmm::moe_router_logits_workspace_size(ctx, x.size(0), w.size(0)));
  groupmm::moe_router_logits(ctx, xv, wv, call.out(logits, "logits"), bv);
  call.finish();
  return logits;
}

// dx [T, H] (x's dtype) and dw [E, H] (w's dtype) from d_logits [T, E] fp32, rounded to x's
// dtype first (moe_router_logits_backward).
std::tuple<at::Tensor, at::Tensor> router_logits_backward(const at::Tensor& d_logits,
                                                          const at::Tensor& x,
                                                          const at::Tensor& w) {
  Call call("router_logits_backward", x);
  TORCH_CHECK_VALUE(x.dim() == 2 && w.dim() == 2,
                    "groupmm.router_logits_backward: x must be [T, H] and w [E, H]; got ",
                    x.sizes(), " and ", w.sizes());
  const auto dl = call.in(d_logits, "d_logits"), xv = call.in(x, "x"), wv = call.in(w, "w");
  at::Tensor dx = call.empty(x.sizes(), x.scalar_type());
  at::Tensor dw = call.empty(w.sizes(), w.scalar_type());
  auto& ctx = call.ctx();
  ctx.reserve_workspace(groupmm::moe_router_logits_workspace_size(ctx, x.size(0), w.size(0)));
  groupmm::moe_router_logits_backward(ctx, dl, xv, wv, call.out(dx, "dx"), call.out(dw, "dw"),
                                      false, false);
  call.finish();
  return {dx, dw};
}

void register_moe_impls(Kernels& m) {
  m.impl("router_logits", &router_logits);
  m.impl("router_logits_backward", &router_logits_backward);
  m.impl("swiglu", &swiglu);
  m.impl("swiglu_backward", &swiglu_backward);
  m.impl("weighted_swiglu", &weighted_swiglu);
  m.impl("weighted_swiglu_backward", &weighted_swiglu_backward);
  m.impl("weighted_swiglu_ex", &weighted_swiglu_ex);
  m.impl("weighted_swiglu_ex_backward", &weighted_swiglu_ex_backward);
  m.impl("router", &router);
  m.impl("router_backward", &router_backward);
  m.impl("permute_plan", &permute_plan);
  m.impl("permute", &permute);
  m.impl("permute_backward", &permute_backward);
  m.impl("unpermute", &unpermute);
  m.impl("unpermute_backward", &unpermute_backward);
  m.impl("gate_up_swiglu", &gate_up_swiglu);
}

}  // namespace

GROUPMM_TORCH_CPU_AND_CUDA(register_moe_impls)

}  // namespace groupmm_torch
