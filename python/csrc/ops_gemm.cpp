// ops_gemm.cpp: grouped GEMM (forward, dgrad, wgrad), grouped bias gradient and offsets.
// Shapes and dtypes are validated by the core (its messages name the op and the argument).
#include <torch/library.h>

#include "binding.hpp"
#include "groupmm/dbias.hpp"
#include "groupmm/gemm.hpp"
#include "groupmm/offsets.hpp"

namespace groupmm_torch {
namespace {

at::Tensor run_gemm(const char* op, groupmm::GemmPass pass, const at::Tensor& a,
                    const at::Tensor& b, const at::Tensor& splits,
                    const std::optional<at::Tensor>& bias, std::vector<int64_t> out_shape,
                    at::ScalarType out_dtype) {
  Call call(op, a);
  groupmm::GroupedGemmArgs args;
  args.pass = pass;
  args.a = call.in(a, pass == groupmm::GemmPass::forward ? "x" : "dy");
  args.b = call.in(b, pass == groupmm::GemmPass::wgrad ? "x" : "w");
  args.splits = call.in(splits, "splits");
  args.bias = call.in(bias, "bias");
  at::Tensor out = call.empty(out_shape, out_dtype);
  args.out = call.out(out, "out");
  auto& ctx = call.ctx();
  const size_t ws = groupmm::grouped_gemm_workspace_size(ctx, args);
  groupmm::grouped_gemm(ctx, args, call.workspace(ws), ws);
  call.finish();
  return out;
}

// y [M, N] = x_g W_g^T (+ b_g) per expert.
at::Tensor grouped_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& splits,
                      const std::optional<at::Tensor>& bias) {
  TORCH_CHECK_VALUE(x.dim() == 2 && w.dim() == 3, "groupmm.grouped_mm: x must be [M, K] and w ",
                    "[G, N, K]; got x ", x.sizes(), ", w ", w.sizes());
  return run_gemm("grouped_mm", groupmm::GemmPass::forward, x, w, splits, bias,
                  {x.size(0), w.size(1)}, x.scalar_type());
}

// dx [M, K] = dy_g W_g per expert.
at::Tensor grouped_mm_dgrad(const at::Tensor& dy, const at::Tensor& w, const at::Tensor& splits) {
  TORCH_CHECK_VALUE(dy.dim() == 2 && w.dim() == 3, "groupmm.grouped_mm_dgrad: dy must be [M, N] ",
                    "and w [G, N, K]; got dy ", dy.sizes(), ", w ", w.sizes());
  return run_gemm("grouped_mm_dgrad", groupmm::GemmPass::dgrad, dy, w, splits, std::nullopt,
                  {dy.size(0), w.size(2)}, dy.scalar_type());
}

// dW [G, N, K] = dy_g^T x_g per expert, in out_dtype (dy's dtype or float32).
at::Tensor grouped_mm_wgrad(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& splits,
                            std::optional<at::ScalarType> out_dtype) {
  TORCH_CHECK_VALUE(dy.dim() == 2 && x.dim() == 2, "groupmm.grouped_mm_wgrad: dy must be [M, N] ",
                    "and x [M, K]; got dy ", dy.sizes(), ", x ", x.sizes());
  return run_gemm("grouped_mm_wgrad", groupmm::GemmPass::wgrad, dy, x, splits, std::nullopt,
                  {splits.size(0), dy.size(1), x.size(1)}, out_dtype.value_or(dy.scalar_type()));
}

// main_grad [G, N, K] fp32 += dy_g^T x_g (a zero-row expert leaves its slice unchanged).
void grouped_mm_wgrad_accumulate(const at::Tensor& dy, const at::Tensor& x,
                                 const at::Tensor& splits, const at::Tensor& main_grad) {
  Call call("grouped_mm_wgrad_accumulate", dy);
  groupmm::GroupedGemmArgs args;
  args.pass = groupmm::GemmPass::wgrad;
  args.a = call.in(dy, "dy");
  args.b = call.in(x, "x");
  args.splits = call.in(splits, "splits");
  args.out = call.out(main_grad, "main_grad");
  args.beta = 1.0f;
  auto& ctx = call.ctx();
  const size_t ws = groupmm::grouped_gemm_workspace_size(ctx, args);
  groupmm::grouped_gemm(ctx, args, call.workspace(ws), ws);
  call.finish();
}

// db [G, N] = sum of expert g's rows of dy, in out_dtype (dy's dtype or float32).
at::Tensor group_dbias(const at::Tensor& dy, const at::Tensor& splits,
                       std::optional<at::ScalarType> out_dtype) {
  Call call("group_dbias", dy);
  const auto dyv = call.in(dy, "dy");
  const auto sv = call.in(splits, "splits");
  TORCH_CHECK_VALUE(dy.dim() == 2, "groupmm.group_dbias: dy must be [M, N]; got ", dy.sizes());
  at::Tensor db = call.empty({splits.size(0), dy.size(1)}, out_dtype.value_or(dy.scalar_type()));
  auto& ctx = call.ctx();
  const size_t ws =
      groupmm::group_dbias_workspace_size(ctx, dy.size(0), dy.size(1), splits.size(0));
  groupmm::group_dbias(ctx, dyv, sv, call.out(db, "db"), false, call.workspace(ws), ws);
  call.finish();
  return db;
}

// (start, end) [G] in splits' dtype: end is torch._grouped_mm's `offs`.
std::tuple<at::Tensor, at::Tensor> group_offsets(const at::Tensor& splits) {
  Call call("group_offsets", splits);
  groupmm::OffsetsArgs args;
  args.splits = call.in(splits, "splits");
  at::Tensor start = call.empty(splits.sizes(), splits.scalar_type());
  at::Tensor end = call.empty(splits.sizes(), splits.scalar_type());
  args.start = call.out(start, "start");
  args.end = call.out(end, "end");
  groupmm::group_offsets(call.ctx(), args);
  call.finish();
  return {start, end};
}

void register_impls(torch::Library& m) {
  m.impl("grouped_mm", &grouped_mm);
  m.impl("grouped_mm_dgrad", &grouped_mm_dgrad);
  m.impl("grouped_mm_wgrad", &grouped_mm_wgrad);
  m.impl("grouped_mm_wgrad_accumulate", &grouped_mm_wgrad_accumulate);
  m.impl("group_dbias", &group_dbias);
  m.impl("group_offsets", &group_offsets);
}

}  // namespace

TORCH_LIBRARY_IMPL(groupmm, CPU, m) {
  register_impls(m);
}
TORCH_LIBRARY_IMPL(groupmm, CUDA, m) {
  register_impls(m);
}

}  // namespace groupmm_torch
