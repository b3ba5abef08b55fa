// ops_gemm.cpp: grouped GEMM (forward, dgrad, wgrad), grouped bias gradient and offsets.
// Shapes and dtypes are validated by the core (its messages name the op and the argument).
#include <torch/library.h>

#include "binding.hpp"
#include "groupmm/dbias.hpp"
#include "groupmm/gemm.hpp"
#include "groupmm/offsets.hpp"

namespace groupmm_torch {
namespace {

const char* gemm_op_name(groupmm::GemmPass pass) {
  switch (pass) {
    case groupmm::GemmPass::forward:
      return "grouped_mm";
    case groupmm::GemmPass::dgrad:
      return "grouped_mm_dgrad";
    case groupmm::GemmPass::wgrad:
      break;
  }
  return "grouped_mm_wgrad";
}

// The args of one pass without out; the operands' ranks are checked here so that the output shape
// can be read from them (each pass names its operands in the message).
groupmm::GroupedGemmArgs gemm_args(Call& call, groupmm::GemmPass pass, const at::Tensor& a,
                                   const at::Tensor& b, const at::Tensor& splits,
                                   const std::optional<at::Tensor>& bias) {
  using groupmm::GemmPass;
  const bool fwd = pass == GemmPass::forward, wgrad = pass == GemmPass::wgrad;
  const char* a_name = fwd ? "x" : "dy";
  const char* b_name = wgrad ? "x" : "w";
  TORCH_CHECK_VALUE(a.dim() == 2 && b.dim() == (wgrad ? 2 : 3), "groupmm.", gemm_op_name(pass),
                    ": ", a_name, " must be [M, ", fwd ? "K" : "N", "] and ", b_name, " ",
                    wgrad ? "[M, K]" : "[G, N, K]", "; got ", a_name, " ", a.sizes(), ", ", b_name,
                    " ", b.sizes());
  groupmm::GroupedGemmArgs args;
  args.pass = pass;
  args.a = call.in(a, a_name);
  args.b = call.in(b, b_name);
  args.splits = call.in(splits, "splits");
  args.bias = call.in(bias, "bias");
  return args;
}

Bound bind(Call& call, const groupmm::GroupedGemmArgs& args, std::vector<at::Tensor> outputs) {
  auto& ctx = call.ctx();
  const size_t bytes = groupmm::grouped_gemm_workspace_size(ctx, args);
  void* ws = call.workspace(bytes);
  return {[&ctx, args, ws, bytes] { groupmm::grouped_gemm(ctx, args, ws, bytes); },
          std::move(outputs)};
}

// bind_gemm with the splits rule of gemm.hpp (SplitsTotal, zero_tail, expected_rows) chosen.
Bound bind_gemm_rule(Call& call, groupmm::GemmPass pass, const at::Tensor& a, const at::Tensor& b,
                     const at::Tensor& splits, const std::optional<at::Tensor>& bias,
                     std::optional<at::ScalarType> out_dtype, groupmm::SplitsTotal total,
                     bool zero_tail, int64_t expected_rows) {
  groupmm::GroupedGemmArgs args = gemm_args(call, pass, a, b, splits, bias);
  args.splits_total = total;
  args.zero_tail = zero_tail;
  args.expected_rows = expected_rows;  // validated by the core (at_most only, at most the rows)
  std::vector<int64_t> shape{a.size(0), b.size(1)};                                      // forward
  if (pass == groupmm::GemmPass::dgrad) shape = {a.size(0), b.size(2)};                  // dx
  if (pass == groupmm::GemmPass::wgrad) shape = {splits.size(0), a.size(1), b.size(1)};  // dW
  at::Tensor out = call.empty(shape, out_dtype.value_or(a.scalar_type()));
  args.out = call.out(out, "out");
  return bind(call, args, {out});
}

}  // namespace

Bound bind_gemm(Call& call, groupmm::GemmPass pass, const at::Tensor& a, const at::Tensor& b,
                const at::Tensor& splits, const std::optional<at::Tensor>& bias,
                std::optional<at::ScalarType> out_dtype) {
  return bind_gemm_rule(call, pass, a, b, splits, bias, out_dtype, groupmm::SplitsTotal::exact,
                        false, 0);
}

namespace {

at::Tensor run_gemm(groupmm::GemmPass pass, const at::Tensor& a, const at::Tensor& b,
                    const at::Tensor& splits, const std::optional<at::Tensor>& bias,
                    std::optional<at::ScalarType> out_dtype, c10::string_view splits_total,
                    int64_t expected_rows) {
  const char* op_name = gemm_op_name(pass);
  const groupmm::SplitsTotal total = splits_total_of(splits_total, op_name);
  Call call(op_name, a);
  Bound op = bind_gemm_rule(call, pass, a, b, splits, bias, out_dtype, total, false, expected_rows);
  op.run();
  call.finish();
  return op.outputs[0];
}

// y [M, N] = x_g W_g^T (+ b_g) per expert, in out_dtype (x's dtype or float32; bias in it).
at::Tensor grouped_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& splits,
                      const std::optional<at::Tensor>& bias,
                      std::optional<at::ScalarType> out_dtype, c10::string_view splits_total,
                      int64_t expected_rows) {
  return run_gemm(groupmm::GemmPass::forward, x, w, splits, bias, out_dtype, splits_total,
                  expected_rows);
}

// dx [M, K] = dy_g W_g per expert, in out_dtype (dy's dtype or float32).
at::Tensor grouped_mm_dgrad(const at::Tensor& dy, const at::Tensor& w, const at::Tensor& splits,
                            std::optional<at::ScalarType> out_dtype, c10::string_view splits_total,
                            int64_t expected_rows) {
  return run_gemm(groupmm::GemmPass::dgrad, dy, w, splits, std::nullopt, out_dtype, splits_total,
                  expected_rows);
}

// dW [G, N, K] = dy_g^T x_g per expert, in out_dtype (dy's dtype or float32).
at::Tensor grouped_mm_wgrad(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& splits,
                            std::optional<at::ScalarType> out_dtype, c10::string_view splits_total,
                            int64_t expected_rows) {
  return run_gemm(groupmm::GemmPass::wgrad, dy, x, splits, std::nullopt, out_dtype, splits_total,
                  expected_rows);
}

// main_grad [G, N, K] fp32 += dy_g^T x_g (a zero-row expert leaves its slice unchanged).
void grouped_mm_wgrad_accumulate(const at::Tensor& dy, const at::Tensor& x,
                                 const at::Tensor& splits, const at::Tensor& main_grad,
                                 c10::string_view splits_total, int64_t expected_rows) {
  const char* op = "grouped_mm_wgrad_accumulate";
  const groupmm::SplitsTotal total = splits_total_of(splits_total, op);
  Call call(op, dy);
  groupmm::GroupedGemmArgs args =
      gemm_args(call, groupmm::GemmPass::wgrad, dy, x, splits, std::nullopt);
  args.splits_total = total;
  args.expected_rows = expected_rows;
  args.out = call.out(main_grad, "main_grad");
  args.beta = 1.0f;
  bind(call, args, {}).run();
  call.finish();
}

// db [G, N] (accumulate: += into fp32 db) = sum of expert g's rows of dy.
void run_dbias(Call& call, const at::Tensor& dy, const at::Tensor& splits, const at::Tensor& db,
               bool accumulate, groupmm::SplitsTotal total) {
  const auto dyv = call.in(dy, "dy");
  const auto sv = call.in(splits, "splits");
  auto& ctx = call.ctx();
  const size_t ws =
      groupmm::group_dbias_workspace_size(ctx, dy.size(0), dy.size(1), splits.size(0));
  groupmm::group_dbias(ctx, dyv, sv, call.out(db, accumulate ? "main_grad" : "db"), accumulate,
                       total, call.workspace(ws), ws);
  call.finish();
}

// db [G, N] = sum of expert g's rows of dy, in out_dtype (dy's dtype or float32).
at::Tensor group_dbias(const at::Tensor& dy, const at::Tensor& splits,
                       std::optional<at::ScalarType> out_dtype, c10::string_view splits_total) {
  const groupmm::SplitsTotal total = splits_total_of(splits_total, "group_dbias");
  Call call("group_dbias", dy);
  TORCH_CHECK_VALUE(dy.dim() == 2, "groupmm.group_dbias: dy must be [M, N]; got ", dy.sizes());
  at::Tensor db = call.empty({splits.size(0), dy.size(1)}, out_dtype.value_or(dy.scalar_type()));
  run_dbias(call, dy, splits, db, false, total);
  return db;
}

// main_grad [G, N] fp32 += sum of expert g's rows of dy (a zero-row expert: unchanged).
void group_dbias_accumulate(const at::Tensor& dy, const at::Tensor& splits,
                            const at::Tensor& main_grad, c10::string_view splits_total) {
  const groupmm::SplitsTotal total = splits_total_of(splits_total, "group_dbias_accumulate");
  Call call("group_dbias_accumulate", dy);
  TORCH_CHECK_VALUE(dy.dim() == 2, "groupmm.group_dbias_accumulate: dy must be [M, N]; got ",
                    dy.sizes());
  run_dbias(call, dy, splits, main_grad, true, total);
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

groupmm::GemmPass parse_pass(const std::string& s) {
  if (s == "forward") return groupmm::GemmPass::forward;
  if (s == "dgrad") return groupmm::GemmPass::dgrad;
  TORCH_CHECK_VALUE(s == "wgrad", "groupmm.grouped_gemm: gemm_pass='", s,
                    "' must be 'forward', 'dgrad' or 'wgrad'");
  return groupmm::GemmPass::wgrad;
}

// One pass with the splits rule chosen (gemm.hpp, SplitsTotal): out as bind_gemm allocates it.
at::Tensor grouped_gemm_op(const at::Tensor& a, const at::Tensor& b, const at::Tensor& splits,
                           const std::string& gemm_pass, const std::optional<at::Tensor>& bias,
                           std::optional<at::ScalarType> out_dtype, const std::string& splits_total,
                           bool zero_tail, int64_t expected_rows) {
  TORCH_CHECK_VALUE(splits_total == "exact" || splits_total == "at_most",
                    "groupmm.grouped_gemm: splits_total='", splits_total,
                    "' must be 'exact' or 'at_most'");
  const groupmm::GemmPass pass = parse_pass(gemm_pass);
  Call call("grouped_gemm", a);
  Bound op = bind_gemm_rule(
      call, pass, a, b, splits, bias, out_dtype,
      splits_total == "at_most" ? groupmm::SplitsTotal::at_most : groupmm::SplitsTotal::exact,
      zero_tail, expected_rows);
  op.run();
  call.finish();
  return op.outputs[0];
}

void register_gemm_impls(Kernels& m) {
  m.impl("grouped_gemm", &grouped_gemm_op);
  m.impl("grouped_mm", &grouped_mm);
  m.impl("grouped_mm_dgrad", &grouped_mm_dgrad);
  m.impl("grouped_mm_wgrad", &grouped_mm_wgrad);
  m.impl("grouped_mm_wgrad_accumulate", &grouped_mm_wgrad_accumulate);
  m.impl("group_dbias", &group_dbias);
  m.impl("group_dbias_accumulate", &group_dbias_accumulate);
  m.impl("group_offsets", &group_offsets);
}

}  // namespace

GROUPMM_TORCH_CPU_AND_CUDA(register_gemm_impls)

}  // namespace groupmm_torch
