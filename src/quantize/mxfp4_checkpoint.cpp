// import_mxfp4_weights / export_mxfp4_weights: checkpoint blocks + scales <-> our MXFP4 weights.
// The data bytes are the same in both layouts and the plain scales too, so the relayout is stream
// copies, plus swizzle_scales for the 128x4 layout. Built on public ops only (both backends).
#include "quantize/backends.hpp"

namespace groupmm {

std::string Mxfp4CheckpointArgs::to_string() const {
  return detail::cat("Mxfp4CheckpointArgs(G=", G, ", N=", N, ", K=", K,
                     ", blocks=", blocks.to_string(), ", scales=", scales.to_string(),
                     ", weights=", weights.to_string(), ")");
}

namespace {

// Byte views of the four tensors, after validation.
struct Mxfp4Bytes {
  TensorView blocks, scales, data, scale_inv;
  bool swizzled = false;
};

TensorView as_bytes(const TensorView& v, int64_t bytes) {
  return TensorView(v.data, DType::e8m0, v.device, {bytes});
}

Mxfp4Bytes validate(const Context& ctx, const Mxfp4CheckpointArgs& a, const char* op) {
  GROUPMM_CHECK(a.G >= 1 && a.N >= 1 && a.K >= 1, op, ": G=", a.G, ", N=", a.N, ", K=", a.K,
                " must be >= 1");
  GROUPMM_CHECK(a.K % 32 == 0, op, ": K=", a.K, " must be a multiple of 32 (the mxfp4 block)");
  const ScaleLayout layout = a.weights.scale_layout;
  GROUPMM_CHECK(layout == ScaleLayout::plain || layout == ScaleLayout::swizzled, op,
                ": weights.scale_layout=", scale_layout_name(layout), " must be plain or swizzled");
  QuantizeConfig cfg;
  cfg.recipe = QuantRecipe::mxfp4;
  cfg.direction = QuantDirection::rowwise;
  cfg.scale_layout = layout;
  const QuantizedShapes s = group_quantize_shapes(a.G * a.N, a.K, a.G, cfg);
  const int64_t data_bytes = a.G * a.N * a.K / 2, scale_bytes = a.G * a.N * (a.K / 32);
  auto check = [&](const char* arg, const TensorView& v, int64_t bytes, bool fp4_ok) {
    GROUPMM_CHECK(v.present(), op, ": ", arg, " is required");
    GROUPMM_CHECK(v.dtype == DType::e8m0 || (fp4_ok && v.dtype == DType::fp4e2m1x2), op, ": ", arg,
                  ".dtype=", dtype_name(v.dtype), " must be e8m0 (uint8 bytes)",
                  fp4_ok ? " or fp4e2m1x2" : "");
    GROUPMM_CHECK(v.nbytes() == bytes, op, ": ", arg, " has ", v.nbytes(), " bytes (shape ",
                  v.shape_string(), "), expected ", bytes, " for G=", a.G, ", N=", a.N,
                  ", K=", a.K);
    GROUPMM_CHECK(v.device == ctx.device(), op, ": ", arg, " is on ", device_name(v.device),
                  " but the context is ", device_name(ctx.device()));
    GROUPMM_CHECK(v.data != nullptr, op, ": ", arg, ".data is null");
  };
  check("blocks", a.blocks, data_bytes, true);
  check("scales", a.scales, scale_bytes, false);
  auto check_ours = [&](const char* arg, const TensorView& v, const TensorSpec& spec) {
    GROUPMM_CHECK(v.present(), op, ": ", arg, " is required (", spec.to_string(), ")");
    GROUPMM_CHECK(v.dtype == spec.dtype, op, ": ", arg, ".dtype=", dtype_name(v.dtype), " must be ",
                  dtype_name(spec.dtype));
    GROUPMM_CHECK(v.numel() >= spec.numel(), op, ": ", arg, ".numel=", v.numel(),
                  " is too small: needs ", spec.to_string());
    GROUPMM_CHECK(v.device == ctx.device(), op, ": ", arg, " is on ", device_name(v.device),
                  " but the context is ", device_name(ctx.device()));
    GROUPMM_CHECK(v.data != nullptr, op, ": ", arg, ".data is null");
  };
  check_ours("weights.data", a.weights.data, s.data);
  check_ours("weights.scale_inv", a.weights.scale_inv, s.scale_inv);
  Mxfp4Bytes b;
  b.blocks = as_bytes(a.blocks, data_bytes);
  b.scales = as_bytes(a.scales, scale_bytes);
  b.data = as_bytes(a.weights.data, data_bytes);
  b.swizzled = layout == ScaleLayout::swizzled;
  b.scale_inv = as_bytes(a.weights.scale_inv, b.swizzled ? s.scale_inv.numel() : scale_bytes);
  return b;
}

void relayout(Context& ctx, const Mxfp4CheckpointArgs& a, const Mxfp4Bytes& b, bool to_ours,
              void* ws, size_t ws_bytes) {
  copy(to_ours ? b.data : b.blocks, to_ours ? b.blocks : b.data, ctx.stream());
  if (!b.swizzled) {
    copy(to_ours ? b.scale_inv : b.scales, to_ours ? b.scales : b.scale_inv, ctx.stream());
    return;
  }
  SwizzleScalesArgs s;
  s.groups = a.G;
  s.rows_total = a.G * a.N;
  s.cols = a.K / 32;
  s.unswizzle = !to_ours;
  s.plain = b.scales;
  s.swizzled = b.scale_inv;
  swizzle_scales(ctx, s, ws, ws_bytes);
}

}  // namespace

GroupedTensor import_mxfp4_weights(Context& ctx, const Mxfp4CheckpointArgs& a, void* ws,
                                   size_t ws_bytes) {
  const Mxfp4Bytes b = validate(ctx, a, "import_mxfp4_weights");
  relayout(ctx, a, b, true, ws, ws_bytes);
  GroupedTensor out = a.weights;
  out.num_groups = a.G;
  out.splits = TensorView();
  out.recipe = QuantRecipe::mxfp4;
  out.block_2d = false;
  return out;
}

void export_mxfp4_weights(Context& ctx, const Mxfp4CheckpointArgs& a, void* ws, size_t ws_bytes) {
  const char* op = "export_mxfp4_weights";
  GROUPMM_CHECK(a.weights.recipe == QuantRecipe::mxfp4, op,
                ": weights.recipe=", recipe_name(a.weights.recipe), " must be mxfp4");
  const Mxfp4Bytes b = validate(ctx, a, op);
  relayout(ctx, a, b, false, ws, ws_bytes);
}

}  // namespace groupmm
