// ops_gemm_fp8.cpp: grouped GEMMs over quantized operands (gemm.hpp, QuantizedGemmArgs): recipes
// fp8_current (per-expert scales), fp8_block (DeepSeek-V3 blocks) and mxfp8, forward TN, dgrad NN
// and wgrad NT (into a new dW or accumulated into an fp32 main_grad).
//
// Each operand is the list of five tensors group_quantize returned for it (data, scale_inv,
// columnwise_data, columnwise_scale_inv, amax; a copy the pass does not read may be an empty
// tensor). The binding checks every given part against group_quantize_shapes for the recipe, so a
// tensor quantized with other options (1x128 blocks for fp8_block weights, another scale layout)
// is refused with both shapes named, instead of being read with the wrong geometry. Which copy a
// pass reads, the dtypes and the alignment rules are the core's (its messages reach Python).
#include <torch/library.h>

#include "binding.hpp"
#include "groupmm/gemm.hpp"

namespace groupmm_torch {
namespace {

const char* const kParts[] = {"data", "scale_inv", "columnwise_data", "columnwise_scale_inv",
                              "amax"};

struct Operand {
  groupmm::GroupedTensor t;
  int64_t rows = 0, cols = 0;  // the un-transposed [rows, cols] that was quantized
};

// One quantized operand over its five tensors. Weights (forward and dgrad b) have no splits and
// G * N rows; fp8_block weights are in 128x128 blocks (block_2d), everything else in 1-D blocks.
Operand operand(Call& call, const char* op, const char* arg, at::TensorList q,
                groupmm::QuantRecipe recipe, groupmm::ScaleLayout layout, bool weight, int64_t G,
                const groupmm::TensorView& splits) {
  TORCH_CHECK_VALUE(q.size() == 5, "groupmm.", op, ": ", arg, " must be the 5 tensors ",
                    "group_quantize returns (data, scale_inv, columnwise_data, ",
                    "columnwise_scale_inv, amax); got ", q.size());
  TORCH_CHECK_VALUE(
      recipe == groupmm::QuantRecipe::fp8_current || recipe == groupmm::QuantRecipe::fp8_block ||
          recipe == groupmm::QuantRecipe::mxfp8,
      "groupmm.", op, ": recipe='", groupmm::recipe_name(recipe),
      "' must be 'fp8_current', 'fp8_block' or 'mxfp8' (4-bit weights: ", "grouped_mm_w4)");
  Operand o;
  const bool rowwise = !absent(q[0]), colwise = !absent(q[2]);
  TORCH_CHECK_VALUE(rowwise || colwise, "groupmm.", op, ": ", arg,
                    " has neither data nor columnwise_data");
  const at::Tensor& d = rowwise ? q[0] : q[2];
  TORCH_CHECK_VALUE(d.dim() == 2, "groupmm.", op, ": ", arg, "[", rowwise ? 0 : 2, "] (",
                    kParts[rowwise ? 0 : 2], ") must be 2-D; got ", d.sizes());
  o.rows = rowwise ? d.size(0) : d.size(1);
  o.cols = rowwise ? d.size(1) : d.size(0);

  groupmm::QuantizeConfig c;
  c.recipe = recipe;
  c.fp8_dtype = to_groupmm(d.scalar_type(), op, arg);
  c.scale_layout = layout;
  c.block_2d = weight && recipe == groupmm::QuantRecipe::fp8_block;
  const groupmm::QuantizedShapes s = groupmm::group_quantize_shapes(o.rows, o.cols, G, c);
  const std::string what = groupmm::detail::cat(
      "group_quantize(recipe='", groupmm::recipe_name(recipe), "', scale_layout='",
      groupmm::scale_layout_name(layout), "', block_2d=", c.block_2d ? "True" : "False", ") of ",
      o.rows, " rows x ", o.cols, " in ", G, " experts");
  const groupmm::TensorSpec* specs[] = {&s.data, &s.scale_inv, &s.columnwise_data,
                                        &s.columnwise_scale_inv, &s.amax};
  groupmm::TensorView* views[] = {&o.t.data, &o.t.scale_inv, &o.t.columnwise_data,
                                  &o.t.columnwise_scale_inv, &o.t.amax};
  for (size_t i = 0; i < 5; ++i) {
    if (absent(q[i])) continue;
    const std::string part = groupmm::detail::cat(arg, "[", i, "] (", kParts[i], ")");
    check_spec(op, part, q[i], *specs[i], what);
    *views[i] = call.in(q[i], part.c_str());
  }
  o.t.num_groups = G;
  o.t.splits = weight ? groupmm::TensorView() : splits;
  o.t.recipe = recipe;
  o.t.scale_layout = layout;
  o.t.block_2d = c.block_2d;
  return o;
}

void run(Call& call, groupmm::QuantizedGemmArgs& args) {
  auto& ctx = call.ctx();
  const size_t ws = groupmm::grouped_gemm_workspace_size(ctx, args);
  groupmm::grouped_gemm(ctx, args, call.workspace(ws), ws);
  call.finish();
}

// The pieces every pass shares: the Call (anchored on splits, which is on the op's device), the
// recipe and layout, and both operands.
struct Setup {
  Call call;
  groupmm::QuantizedGemmArgs args;
  Operand a, b;
  Setup(const char* op, groupmm::GemmPass pass, at::TensorList a_q, const char* a_name,
        at::TensorList b_q, const char* b_name, const at::Tensor& splits, c10::string_view recipe,
        c10::string_view scale_layout, c10::string_view splits_total, int64_t expected_rows)
      : call(op, splits) {
    const auto r = recipe_of(recipe, op);
    const auto l = layout_of(scale_layout, op);
    TORCH_CHECK_VALUE(splits.dim() == 1 && splits.size(0) >= 1, "groupmm.", op,
                      ": splits must be [G] with G >= 1; got ", splits.sizes());
    const int64_t G = splits.size(0);
    args.pass = pass;
    args.splits_total = splits_total_of(splits_total, op);
    args.expected_rows = expected_rows;  // validated by the core (at_most only, at most the rows)
    args.splits = call.in(splits, "splits");
    a = operand(call, op, a_name, a_q, r, l, false, G, args.splits);
    b = operand(call, op, b_name, b_q, r, l, pass != groupmm::GemmPass::wgrad, G, args.splits);
    args.a = a.t;
    args.b = b.t;
  }
};

// Expert weights quantized from [G, N, K] have G * N rows.
int64_t weight_rows_per_expert(const char* op, const Operand& w, int64_t G) {
  TORCH_CHECK_VALUE(G >= 1 && w.rows % G == 0, "groupmm.", op, ": w has ", w.rows,
                    " rows, not a multiple of G=", G, " (splits.shape[0]); quantize weights ",
                    "[G, N, K] without splits");
  return w.rows / G;
}

// y [M, N] bf16 = x_g W_g^T (+ b_g): x quantized rowwise, W [G, N, K] rowwise.
at::Tensor grouped_mm_fp8(at::TensorList x, at::TensorList w, const at::Tensor& splits,
                          c10::string_view recipe, c10::string_view scale_layout,
                          const std::optional<at::Tensor>& bias, bool fast_accum,
                          c10::string_view splits_total, int64_t expected_rows) {
  const char* op = "grouped_mm_fp8";
  Setup s(op, groupmm::GemmPass::forward, x, "x", w, "w", splits, recipe, scale_layout,
          splits_total, expected_rows);
  const int64_t N = weight_rows_per_expert(op, s.b, splits.size(0));
  at::Tensor y = s.call.empty({s.a.rows, N}, at::kBFloat16);
  s.args.out = s.call.out(y, "out");
  s.args.bias = s.call.in(bias, "bias");
  s.args.fast_accum = fast_accum;
  run(s.call, s.args);
  return y;
}

// dx [M, K] bf16 = dy_g W_g: dy quantized rowwise, W's columnwise copy.
at::Tensor grouped_mm_fp8_dgrad(at::TensorList dy, at::TensorList w, const at::Tensor& splits,
                                c10::string_view recipe, c10::string_view scale_layout,
                                c10::string_view splits_total, int64_t expected_rows) {
  const char* op = "grouped_mm_fp8_dgrad";
  Setup s(op, groupmm::GemmPass::dgrad, dy, "dy", w, "w", splits, recipe, scale_layout,
          splits_total, expected_rows);
  weight_rows_per_expert(op, s.b, splits.size(0));
  at::Tensor dx = s.call.empty({s.a.rows, s.b.cols}, at::kBFloat16);
  s.args.out = s.call.out(dx, "out");
  run(s.call, s.args);
  return dx;
}

// dW [G, N, K] (bf16 or float32) = dy_g^T x_g: the columnwise copies of dy and x.
at::Tensor grouped_mm_fp8_wgrad(at::TensorList dy, at::TensorList x, const at::Tensor& splits,
                                c10::string_view recipe, c10::string_view scale_layout,
                                std::optional<at::ScalarType> out_dtype,
                                c10::string_view splits_total, int64_t expected_rows) {
  Setup s("grouped_mm_fp8_wgrad", groupmm::GemmPass::wgrad, dy, "dy", x, "x", splits, recipe,
          scale_layout, splits_total, expected_rows);
  at::Tensor dw =
      s.call.empty({splits.size(0), s.a.cols, s.b.cols}, out_dtype.value_or(at::kBFloat16));
  s.args.out = s.call.out(dw, "out");
  run(s.call, s.args);
  return dw;
}

// main_grad [G, N, K] fp32 += dy_g^T x_g (a zero-row expert leaves its slice unchanged).
void grouped_mm_fp8_wgrad_accumulate(at::TensorList dy, at::TensorList x, const at::Tensor& splits,
                                     c10::string_view recipe, const at::Tensor& main_grad,
                                     c10::string_view scale_layout, c10::string_view splits_total,
                                     int64_t expected_rows) {
  Setup s("grouped_mm_fp8_wgrad_accumulate", groupmm::GemmPass::wgrad, dy, "dy", x, "x", splits,
          recipe, scale_layout, splits_total, expected_rows);
  s.args.out = s.call.out(main_grad, "main_grad");
  s.args.beta = 1.0f;
  run(s.call, s.args);
}

void register_gemm_fp8_impls(Kernels& m) {
  m.impl("grouped_mm_fp8", &grouped_mm_fp8);
  m.impl("grouped_mm_fp8_dgrad", &grouped_mm_fp8_dgrad);
  m.impl("grouped_mm_fp8_wgrad", &grouped_mm_fp8_wgrad);
  m.impl("grouped_mm_fp8_wgrad_accumulate", &grouped_mm_fp8_wgrad_accumulate);
}

}  // namespace

GROUPMM_TORCH_CPU_AND_CUDA(register_gemm_fp8_impls)

}  // namespace groupmm_torch
