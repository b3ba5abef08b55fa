// ops_quantize.cpp: grouped quantize / dequantize (fp8_current, fp8_block, mxfp8).
//
// A quantized grouped tensor travels as five tensors (data, scale_inv, columnwise_data,
// columnwise_scale_inv, amax); a copy the recipe or direction does not produce is an empty
// tensor. Sizes come from the core's group_quantize_shapes (host-known, never split values).
// The 4-bit recipes (nvfp4, mxfp4) serve expert weights: group_quantize_w4 in ops_w4.cpp.
#include <torch/library.h>

#include "binding.hpp"
#include "groupmm/quantize.hpp"

namespace groupmm_torch {
namespace {

// The recipes of this op (nvfp4 / mxfp4 weights: group_quantize_w4, ops_w4.cpp).
groupmm::QuantRecipe fp8_recipe_of(c10::string_view r, const char* op) {
  const groupmm::QuantRecipe q = recipe_of(r, op);
  TORCH_CHECK_VALUE(q != groupmm::QuantRecipe::nvfp4 && q != groupmm::QuantRecipe::mxfp4,
                    "groupmm.", op, ": recipe='", std::string(r),
                    "' must be 'fp8_current', 'fp8_block' or 'mxfp8' (4-bit weights: "
                    "group_quantize_w4)");
  return q;
}

groupmm::QuantDirection direction_of(c10::string_view d) {
  if (d == "rowwise") return groupmm::QuantDirection::rowwise;
  if (d == "columnwise") return groupmm::QuantDirection::columnwise;
  if (d == "both") return groupmm::QuantDirection::both;
  TORCH_CHECK_VALUE(false, "groupmm: direction='", std::string(d),
                    "' must be 'rowwise', 'columnwise' or 'both'");
}

groupmm::QuantizeConfig config_of(const char* op, c10::string_view recipe,
                                  std::optional<at::ScalarType> fp8_dtype,
                                  c10::string_view direction, c10::string_view scale_layout,
                                  bool pow2_scales, bool block_2d) {
  groupmm::QuantizeConfig c;
  c.recipe = fp8_recipe_of(recipe, op);
  c.fp8_dtype = to_groupmm(fp8_dtype.value_or(at::kFloat8_e4m3fn), op, "fp8_dtype");
  c.direction = direction_of(direction);
  c.scale_layout = layout_of(scale_layout, op);
  c.pow2_scales = pow2_scales;
  c.block_2d = block_2d;
  return c;
}

groupmm::TensorView maybe_view(Call& call, const at::Tensor& t, const char* arg) {
  return absent(t) ? groupmm::TensorView() : call.out(t, arg);
}

}  // namespace

// input [M, K] with splits [G] (activations), or [G, N, K] without (weights).
Bound bind_group_quantize(Call& call, const at::Tensor& input,
                          const std::optional<at::Tensor>& splits, c10::string_view recipe,
                          std::optional<at::ScalarType> fp8_dtype, c10::string_view direction,
                          c10::string_view scale_layout, bool pow2_scales, bool block_2d,
                          groupmm::SplitsTotal splits_total) {
  groupmm::GroupQuantizeArgs a;
  a.input = call.in(input, "input");
  a.splits = call.in(splits, "splits");
  a.splits_total = splits_total;
  a.config = config_of("group_quantize", recipe, fp8_dtype, direction, scale_layout, pow2_scales,
                       block_2d);
  TORCH_CHECK_VALUE(input.dim() == (splits ? 2 : 3), "groupmm.group_quantize: input must be ",
                    "[M, K] with splits or [G, N, K] without; got ", input.sizes());
  const int64_t G = splits ? splits->size(0) : input.size(0);
  const int64_t K = input.size(-1), rows = input.numel() / std::max<int64_t>(K, 1);
  const auto s = groupmm::group_quantize_shapes(rows, K, G, a.config);
  // Nothing is zeroed here: the core writes every scale byte, slack included (quantize.hpp).
  std::vector<at::Tensor> q{call.empty(s.data), call.empty(s.scale_inv),
                            call.empty(s.columnwise_data), call.empty(s.columnwise_scale_inv),
                            call.empty(s.amax)};
  a.out.data = maybe_view(call, q[0], "data");
  a.out.scale_inv = maybe_view(call, q[1], "scale_inv");
  a.out.columnwise_data = maybe_view(call, q[2], "columnwise_data");
  a.out.columnwise_scale_inv = maybe_view(call, q[3], "columnwise_scale_inv");
  a.out.amax = maybe_view(call, q[4], "amax");
  auto& ctx = call.ctx();
  const size_t bytes = groupmm::group_quantize_workspace_size(ctx, a);
  void* ws = call.workspace(bytes);
  return {[&ctx, a, ws, bytes] { groupmm::group_quantize(ctx, a, ws, bytes); }, std::move(q)};
}

namespace {

using Quantized = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

Quantized group_quantize(const at::Tensor& input, const std::optional<at::Tensor>& splits,
                         c10::string_view recipe, std::optional<at::ScalarType> fp8_dtype,
                         c10::string_view direction, c10::string_view scale_layout,
                         bool pow2_scales, bool block_2d, c10::string_view splits_total) {
  const groupmm::SplitsTotal total = splits_total_of(splits_total, "group_quantize");
  Call call("group_quantize", input);
  Bound op = bind_group_quantize(call, input, splits, recipe, fp8_dtype, direction, scale_layout,
                                 pow2_scales, block_2d, total);
  op.run();
  call.finish();
  const auto& q = op.outputs;
  return {q[0], q[1], q[2], q[3], q[4]};
}

// The dequantized [M, K] (activations, splits given) or [G, N, K] (weights, shape given).
at::Tensor group_dequantize(const at::Tensor& data, const at::Tensor& scale_inv,
                            const at::Tensor& columnwise_data,
                            const at::Tensor& columnwise_scale_inv, const at::Tensor& amax,
                            const std::optional<at::Tensor>& splits, at::IntArrayRef shape,
                            c10::string_view recipe, std::optional<at::ScalarType> fp8_dtype,
                            c10::string_view scale_layout, bool block_2d, bool from_columnwise,
                            std::optional<at::ScalarType> out_dtype) {
  const at::Tensor& anchor = from_columnwise ? columnwise_data : data;
  Call call("group_dequantize", anchor);
  groupmm::GroupDequantizeArgs a;
  a.config = config_of("group_dequantize", recipe, fp8_dtype,
                       from_columnwise ? "columnwise" : "rowwise", scale_layout, false, block_2d);
  TORCH_CHECK_VALUE(shape.size() == (splits ? 2u : 3u), "groupmm.group_dequantize: shape must ",
                    "be [M, K] with splits or [G, N, K] without; got ", shape);
  auto& in = a.in;
  in.num_groups = splits ? splits->size(0) : shape[0];
  in.splits = call.in(splits, "splits");
  in.recipe = a.config.recipe;
  in.scale_layout = a.config.scale_layout;
  in.block_2d = block_2d;
  auto input = [&](const at::Tensor& t, const char* arg) {
    return absent(t) ? groupmm::TensorView() : call.in(t, arg);
  };
  if (from_columnwise) {
    in.columnwise_data = input(columnwise_data, "columnwise_data");
    in.columnwise_scale_inv = input(columnwise_scale_inv, "columnwise_scale_inv");
  } else {
    in.data = input(data, "data");
  }
  // fp8_current keeps one per-expert scale_inv for both copies.
  if (!from_columnwise || a.config.recipe == groupmm::QuantRecipe::fp8_current)
    in.scale_inv = input(scale_inv, "scale_inv");
  in.amax = input(amax, "amax");
  at::Tensor out = call.empty(shape, out_dtype.value_or(at::kBFloat16));
  a.out = call.out(out, "out");
  a.from_columnwise = from_columnwise;
  auto& ctx = call.ctx();
  const size_t ws = groupmm::group_dequantize_workspace_size(ctx, a);
  groupmm::group_dequantize(ctx, a, call.workspace(ws), ws);
  call.finish();
  return out;
}

void register_quantize_impls(Kernels& m) {
  m.impl("group_quantize", &group_quantize);
  m.impl("group_dequantize", &group_dequantize);
}

// recipe_traits (quantize.hpp): the recipe's rules as the core states them, for the package's
// layers and fake kernels (python/groupmm/_meta.py reads every recipe's once, at import).
std::tuple<int64_t, int64_t, std::string, bool, int64_t, int64_t, int64_t, int64_t, int64_t, bool>
recipe_traits(c10::string_view recipe) {
  const groupmm::RecipeTraits t = groupmm::recipe_traits(recipe_of(recipe, "recipe_traits"));
  return {t.row_block,
          t.col_block,
          groupmm::dtype_name(t.scale_dtype),
          t.fp4,
          t.gemm_k_multiple,
          t.gemm_n_multiple,
          t.split_multiple,
          t.in_features_multiple,
          t.out_features_multiple,
          t.e5m2_gradients};
}

}  // namespace

GROUPMM_TORCH_CPU_AND_CUDA(register_quantize_impls)

// No tensor argument, so no backend key to dispatch on: one kernel for every key.
TORCH_LIBRARY_IMPL(groupmm, CompositeImplicitAutograd, m) {
  Kernels(m).impl("recipe_traits", &recipe_traits);
}

}  // namespace groupmm_torch
