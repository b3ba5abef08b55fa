// swizzle_scales: sizes, validation and backend dispatch.
#include "quantize/backends.hpp"

namespace groupmm {

std::string SwizzleScalesArgs::to_string() const {
  return detail::cat("SwizzleScalesArgs(splits=", splits.to_string(), ", rows_total=", rows_total,
                     ", cols=", cols, columnwise ? ", columnwise block=" : ", rowwise",
                     columnwise ? std::to_string(block) : std::string(),
                     unswizzle ? ", unswizzle" : ", swizzle", ", plain=", plain.to_string(),
                     ", swizzled=", swizzled.to_string(), ")");
}

// Sizes past these bounds are refused (their products would overflow int64 below).
static void check_scales_dims(const char* fn, int64_t M, int64_t cols, int64_t G, bool columnwise,
                              int block) {
  GROUPMM_CHECK(M >= 0 && M <= (int64_t(1) << 40) && cols >= 1 && cols <= (int64_t(1) << 20) &&
                    G >= 1 && G <= 65535 && (!columnwise || block >= 1),
                fn, ": rows_total=", M, ", cols=", cols, ", G=", G, ", block=", block,
                " must be in [0, 2^40], [1, 2^20], [1, 65535], >= 1 (columnwise)");
}

int64_t swizzled_scales_numel(int64_t M, int64_t cols, int64_t G, bool columnwise, int block) {
  check_scales_dims("swizzled_scales_numel", M, cols, G, columnwise, block);
  if (columnwise) return (M / block + 4 * G) * qnum::round_up(cols, 128);
  return (M + 127 * G) * qnum::round_up(cols, 4);
}

int64_t plain_scales_numel(int64_t M, int64_t cols, int64_t G, bool columnwise, int block) {
  check_scales_dims("plain_scales_numel", M, cols, G, columnwise, block);
  return columnwise ? (M / block + G) * cols : M * cols;
}

size_t swizzle_scales_workspace_size(int64_t G) {
  GROUPMM_CHECK(G >= 1 && G <= (int64_t(1) << 40), "swizzle_scales_workspace_size: G=", G,
                " must be in [1, 2^40]");
  return cuda_kernels_built() ? cuda::quant_plan_workspace_size(G) : 0;
}

static void check_scales(const char* arg, const TensorView& v, int64_t need, Device dev) {
  const char* op = "swizzle_scales";
  GROUPMM_CHECK(v.present(), op, ": ", arg, " is required");
  GROUPMM_CHECK(v.dtype == DType::e8m0 || v.dtype == DType::fp8e4m3, op, ": ", arg,
                ".dtype=", dtype_name(v.dtype), " must be e8m0 or fp8e4m3 (1-byte scales)");
  GROUPMM_CHECK(v.device == dev, op, ": ", arg, " is on ", device_name(v.device),
                " but the context is ", device_name(dev));
  GROUPMM_CHECK(v.numel() >= need, op, ": ", arg, ".numel=", v.numel(), " (shape ",
                v.shape_string(), ") is too small: needs ", need);
  GROUPMM_CHECK(v.data != nullptr || need == 0, op, ": ", arg, ".data is null");
}

void swizzle_scales(Context& ctx, const SwizzleScalesArgs& a, void* ws, size_t ws_bytes) {
  const char* op = "swizzle_scales";
  int64_t G = a.groups;
  if (a.splits.present()) {
    check_splits(op, a.splits, -1, ctx.device());
    G = a.splits.dim(0);
    GROUPMM_CHECK(G >= 1, op, ": splits.shape[0]=", G, " must be >= 1");
  } else {
    GROUPMM_CHECK(G >= 1, op, ": groups=", G, " must be >= 1 when splits is absent (weights)");
    GROUPMM_CHECK(a.rows_total % G == 0, op, ": rows_total=", a.rows_total,
                  " must be a multiple of groups=", G, " when splits is absent (weights)");
  }
  GROUPMM_CHECK(G <= 65535, op, ": the number of groups G=", G, " must be <= 65535");
  GROUPMM_CHECK(a.rows_total >= 0 && a.rows_total <= (int64_t(1) << 40), op,
                ": rows_total=", a.rows_total, " must be in [0, 2^40]");
  GROUPMM_CHECK(a.cols >= 1 && a.cols <= (int64_t(1) << 20), op, ": cols=", a.cols,
                " must be in [1, 2^20]");
  GROUPMM_CHECK(!a.columnwise || a.block == 16 || a.block == 32, op, ": block=", a.block,
                " must be 16 or 32");
  check_scales("plain", a.plain, plain_scales_numel(a.rows_total, a.cols, G, a.columnwise, a.block),
               ctx.device());
  check_scales("swizzled", a.swizzled,
               swizzled_scales_numel(a.rows_total, a.cols, G, a.columnwise, a.block), ctx.device());
  // The destination's slack (quantize.hpp "Layouts"), written 0 by both backends: the layout
  // group_quantize writes for these 1-byte scales (mxfp8's, or nvfp4's for 16-row column blocks).
  QuantizeConfig c;
  c.recipe = a.columnwise && a.block == 16 ? QuantRecipe::nvfp4 : QuantRecipe::mxfp8;
  c.scale_layout = a.unswizzle ? ScaleLayout::plain : ScaleLayout::swizzled;
  const int64_t K = a.columnwise ? a.cols : a.cols * c.row_block();
  TensorSpec dest;
  dest.dtype = DType::e8m0;
  dest.rank = 1;
  dest.shape[0] = a.unswizzle
                      ? plain_scales_numel(a.rows_total, a.cols, G, a.columnwise, a.block)
                      : swizzled_scales_numel(a.rows_total, a.cols, G, a.columnwise, a.block);
  const qnum::ScaleSlack slack =
      scale_slack(make_layout(c, a.rows_total, K, G), dest, a.columnwise);
  if (ctx.device() == Device::CPU) {
    cpu::swizzle_scales(ctx, a, slack);
  } else {
    const size_t need = swizzle_scales_workspace_size(G);
    if (ws == nullptr) {
      ws = ctx.workspace(need);
      ws_bytes = need;
    }
    GROUPMM_CHECK(ws_bytes >= need, op, ": workspace_bytes=", ws_bytes, " must be >= ", need);
    cuda::swizzle_scales(ctx, a, slack, ws, ws_bytes);
  }
  ctx.after_op();
}

}  // namespace groupmm
