// ops_w4.cpp: 4-bit expert weights for inference (quantize.hpp nvfp4 / mxfp4, gemm.hpp
// W4GemmArgs): quantizing [G, N, K] weights, the 4-bit weight x bf16 activation grouped GEMM, and
// the MXFP4 checkpoint relayout (import / export).
//
// Packed e2m1 pairs travel as uint8 [G, N, K/2] (element 2j in the low nibble): the byte layout of
// the core and of MXFP4 checkpoints, and a dtype every torch we build against has. Scales are
// float8_e4m3fn (nvfp4) or float8_e8m0fnu (mxfp4) in the shape group_quantize_shapes gives for
// G * N rows (plain [G*N, K/16 or K/32], or swizzled); nvfp4 adds its per-expert fp32 S_enc
// (global_scale [G]); mxfp4 has none (an empty tensor).
#include <torch/library.h>

#include "binding.hpp"
#include "groupmm/gemm.hpp"

namespace groupmm_torch {
namespace {

groupmm::QuantRecipe w4_recipe_of(c10::string_view r, const char* op) {
  const groupmm::QuantRecipe q = recipe_of(r, op);
  TORCH_CHECK_VALUE(q == groupmm::QuantRecipe::nvfp4 || q == groupmm::QuantRecipe::mxfp4,
                    "groupmm.", op, ": recipe='", std::string(r),
                    "' must be 'nvfp4' or 'mxfp4' (FP8 recipes: group_quantize)");
  return q;
}

groupmm::QuantizeConfig w4_config(groupmm::QuantRecipe r, groupmm::ScaleLayout l) {
  groupmm::QuantizeConfig c;
  c.recipe = r;
  c.direction = groupmm::QuantDirection::rowwise;
  c.scale_layout = l;
  return c;
}

std::string w4_what(const groupmm::QuantizeConfig& c, int64_t G, int64_t N, int64_t K) {
  return groupmm::detail::cat("group_quantize_w4(recipe='", groupmm::recipe_name(c.recipe),
                              "', scale_layout='", groupmm::scale_layout_name(c.scale_layout),
                              "') of [", G, ", ", N, ", ", K, "] weights");
}

// w [G, N, K] (bf16, fp16 or fp32) -> data uint8 [G, N, K/2], scale_inv, global_scale [G] (nvfp4).
std::tuple<at::Tensor, at::Tensor, at::Tensor> group_quantize_w4(const at::Tensor& w,
                                                                 c10::string_view recipe,
                                                                 c10::string_view scale_layout) {
  const char* op = "group_quantize_w4";
  Call call(op, w);
  TORCH_CHECK_VALUE(w.dim() == 3, "groupmm.", op, ": w must be [G, N, K]; got ", w.sizes());
  groupmm::GroupQuantizeArgs a;
  a.input = call.in(w, "w");
  a.config = w4_config(w4_recipe_of(recipe, op), layout_of(scale_layout, op));
  const int64_t G = w.size(0), N = w.size(1), K = w.size(2);
  const auto s = groupmm::group_quantize_shapes(G * N, K, G, a.config);
  at::Tensor data = call.empty(s.data), scale = call.empty(s.scale_inv);  // the core writes slack
  at::Tensor amax = call.empty(s.amax), global = call.empty(s.global_scale);
  a.out.data = call.bytes(data, "data", groupmm::DType::fp4e2m1x2, {G * N, K});
  a.out.scale_inv = call.out(scale, "scale_inv");
  if (s.amax.present()) a.out.amax = call.out(amax, "amax");
  if (s.global_scale.present()) a.out.global_scale = call.out(global, "global_scale");
  auto& ctx = call.ctx();
  const size_t ws = groupmm::group_quantize_workspace_size(ctx, a);
  groupmm::group_quantize(ctx, a, call.workspace(ws), ws);
  call.finish();
  return {data.view({G, N, K / 2}), scale, global};
}

// The weights' GroupedTensor over [data, scale_inv(, global_scale)], every part checked against
// what group_quantize_w4 writes for their [G, N, K].
groupmm::GroupedTensor w4_weights(Call& call, const char* op, at::TensorList w,
                                  groupmm::QuantRecipe r, groupmm::ScaleLayout l) {
  const bool nv = r == groupmm::QuantRecipe::nvfp4;
  TORCH_CHECK_VALUE(w.size() == 3 || (!nv && w.size() == 2), "groupmm.", op,
                    ": w must be [data, scale_inv, global_scale] as group_quantize_w4 returns "
                    "them (mxfp4: global_scale may be left out); got ",
                    w.size(), " tensors");
  TORCH_CHECK_VALUE(w[0].dim() == 3, "groupmm.", op,
                    ": w[0] (data) must be uint8 [G, N, K/2]; got ", w[0].sizes());
  const int64_t G = w[0].size(0), N = w[0].size(1), K = 2 * w[0].size(2);
  const groupmm::QuantizeConfig c = w4_config(r, l);
  const auto s = groupmm::group_quantize_shapes(G * N, K, G, c);
  const std::string what = w4_what(c, G, N, K);
  check_spec(op, "w[1] (scale_inv)", w[1], s.scale_inv, what);
  if (w.size() == 3) check_spec(op, "w[2] (global_scale)", w[2], s.global_scale, what);
  groupmm::GroupedTensor t;
  t.num_groups = G;
  t.data = call.bytes(w[0], "w[0] (data)", groupmm::DType::fp4e2m1x2, {G, N, K});
  t.scale_inv = call.in(w[1], "w[1] (scale_inv)");
  if (nv) t.global_scale = call.in(w[2], "w[2] (global_scale)");
  t.recipe = r;
  t.scale_layout = l;
  return t;
}

groupmm::W4Path path_of(c10::string_view p) {
  using groupmm::W4Path;
  for (W4Path v : {W4Path::automatic, W4Path::decode, W4Path::prefill, W4Path::fused})
    if (p == groupmm::w4_path_name(v)) return v;
  TORCH_CHECK_VALUE(false, "groupmm.grouped_mm_w4: path='", std::string(p),
                    "' must be 'automatic', 'decode', 'prefill' or 'fused'");
}

// y [M, N] bf16 = x_g dequant(W_g)^T (+ b_g), x [M, K] bf16.
at::Tensor grouped_mm_w4(const at::Tensor& x, at::TensorList w, const at::Tensor& splits,
                         c10::string_view recipe, c10::string_view scale_layout,
                         const std::optional<at::Tensor>& bias, c10::string_view path,
                         c10::string_view splits_total, int64_t expected_rows) {
  const char* op = "grouped_mm_w4";
  Call call(op, x);
  TORCH_CHECK_VALUE(x.dim() == 2, "groupmm.", op, ": x must be [M, K]; got ", x.sizes());
  groupmm::W4GemmArgs a;
  a.w = w4_weights(call, op, w, w4_recipe_of(recipe, op), layout_of(scale_layout, op));
  a.x = call.in(x, "x");
  a.splits = call.in(splits, "splits");
  a.bias = call.in(bias, "bias");
  a.path = path_of(path);
  a.splits_total = splits_total_of(splits_total, op);
  a.expected_rows = expected_rows;  // validated by the core (at_most only, at most the rows)
  at::Tensor y = call.empty({x.size(0), a.w.data.dim(1)}, at::kBFloat16);
  a.out = call.out(y, "out");
  auto& ctx = call.ctx();
  const size_t ws = groupmm::grouped_gemm_workspace_size(ctx, a);
  groupmm::grouped_gemm(ctx, a, call.workspace(ws), ws);
  call.finish();
  return y;
}

// The checkpoint side of Mxfp4CheckpointArgs: blocks uint8 [G, N, K/32, 16], scales [G, N, K/32].
struct Checkpoint {
  int64_t G, N, K;
};

Checkpoint checkpoint_dims(const char* op, const at::Tensor& blocks, const at::Tensor& scales) {
  TORCH_CHECK_VALUE(blocks.dim() == 4 && blocks.size(3) == 16, "groupmm.", op,
                    ": blocks must be uint8 [G, N, K/32, 16]; got ", blocks.sizes());
  const Checkpoint c{blocks.size(0), blocks.size(1), 32 * blocks.size(2)};
  TORCH_CHECK_VALUE(scales.sizes() == at::IntArrayRef({c.G, c.N, c.K / 32}), "groupmm.", op,
                    ": scales must be uint8 [G, N, K/32] = [", c.G, ", ", c.N, ", ", c.K / 32,
                    "] to match blocks ", blocks.sizes(), "; got ", scales.sizes());
  return c;
}

void run_relayout(Call& call, groupmm::Mxfp4CheckpointArgs& a, bool import) {
  auto& ctx = call.ctx();
  const size_t ws = groupmm::swizzle_scales_workspace_size(a.G);
  if (import)
    groupmm::import_mxfp4_weights(ctx, a, call.workspace(ws), ws);
  else
    groupmm::export_mxfp4_weights(ctx, a, call.workspace(ws), ws);
  call.finish();
}

// Checkpoint blocks + scales -> our mxfp4 weights (data uint8 [G, N, K/2], scale_inv e8m0).
std::tuple<at::Tensor, at::Tensor> import_mxfp4_weights(const at::Tensor& blocks,
                                                        const at::Tensor& scales,
                                                        c10::string_view scale_layout) {
  const char* op = "import_mxfp4_weights";
  Call call(op, blocks);
  const Checkpoint c = checkpoint_dims(op, blocks, scales);
  groupmm::Mxfp4CheckpointArgs a;
  a.G = c.G, a.N = c.N, a.K = c.K;
  a.blocks = call.bytes(blocks, "blocks", groupmm::DType::e8m0, {c.G * c.N, c.K / 2});
  a.scales = call.bytes(scales, "scales", groupmm::DType::e8m0, {c.G * c.N, c.K / 32});
  const auto cfg = w4_config(groupmm::QuantRecipe::mxfp4, layout_of(scale_layout, op));
  const auto s = groupmm::group_quantize_shapes(c.G * c.N, c.K, c.G, cfg);
  at::Tensor data = call.empty(s.data), scale = call.empty(s.scale_inv);  // the core writes slack
  a.weights.data = call.bytes(data, "data", groupmm::DType::fp4e2m1x2, {c.G * c.N, c.K});
  a.weights.scale_inv = call.out(scale, "scale_inv");
  a.weights.scale_layout = cfg.scale_layout;
  run_relayout(call, a, true);
  return {data.view({c.G, c.N, c.K / 2}), scale};
}

// Our mxfp4 weights -> checkpoint blocks uint8 [G, N, K/32, 16] and scales uint8 [G, N, K/32].
std::tuple<at::Tensor, at::Tensor> export_mxfp4_weights(const at::Tensor& data,
                                                        const at::Tensor& scale_inv,
                                                        c10::string_view scale_layout) {
  const char* op = "export_mxfp4_weights";
  Call call(op, data);
  const auto cfg = w4_config(groupmm::QuantRecipe::mxfp4, layout_of(scale_layout, op));
  groupmm::Mxfp4CheckpointArgs a;
  a.weights = w4_weights(call, op, {data, scale_inv}, cfg.recipe, cfg.scale_layout);
  a.G = data.size(0), a.N = data.size(1), a.K = 2 * data.size(2);
  at::Tensor blocks = call.empty({a.G, a.N, a.K / 32, 16}, at::kByte);
  at::Tensor scales = call.empty({a.G, a.N, a.K / 32}, at::kByte);
  a.blocks = call.bytes(blocks, "blocks", groupmm::DType::e8m0, {a.G * a.N, a.K / 2});
  a.scales = call.bytes(scales, "scales", groupmm::DType::e8m0, {a.G * a.N, a.K / 32});
  run_relayout(call, a, false);
  return {blocks, scales};
}

void register_w4_impls(Kernels& m) {
  m.impl("group_quantize_w4", &group_quantize_w4);
  m.impl("grouped_mm_w4", &grouped_mm_w4);
  m.impl("import_mxfp4_weights", &import_mxfp4_weights);
  m.impl("export_mxfp4_weights", &export_mxfp4_weights);
}

}  // namespace

GROUPMM_TORCH_CPU_AND_CUDA(register_w4_impls)

}  // namespace groupmm_torch
