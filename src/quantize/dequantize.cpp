// group_dequantize: validation and backend dispatch.
#include "quantize/backends.hpp"

namespace groupmm {

std::string GroupDequantizeArgs::to_string() const {
  return detail::cat("GroupDequantizeArgs(in=", in.to_string(), ", ", config.to_string(),
                     from_columnwise ? ", from columnwise" : ", from rowwise",
                     splits_total == SplitsTotal::at_most ? ", splits_total=at_most" : "",
                     ", out=", out.to_string(), ")");
}

static QuantProblem validate_dequantize(const Context& ctx, const GroupDequantizeArgs& a) {
  const char* op = "group_dequantize";
  const TensorView& o = a.out;
  GROUPMM_CHECK(o.present(), op, ": out is required");
  GROUPMM_CHECK(o.dtype == DType::bf16 || o.dtype == DType::fp16 || o.dtype == DType::fp32, op,
                ": out.dtype=", dtype_name(o.dtype), " must be bf16, fp16 or fp32");
  GROUPMM_CHECK(a.in.recipe == a.config.recipe, op, ": in.recipe=", recipe_name(a.in.recipe),
                " must equal config.recipe=", recipe_name(a.config.recipe));
  GROUPMM_CHECK(a.in.scale_layout == a.config.scale_layout, op,
                ": in.scale_layout=", scale_layout_name(a.in.scale_layout),
                " must equal config.scale_layout=", scale_layout_name(a.config.scale_layout));
  // Reuse the quantize validation with the output/input roles swapped: the quantized views must
  // have the sizes group_quantize would have required.
  GroupQuantizeArgs q;
  q.input = o;
  q.splits = a.in.splits;
  q.splits_total = a.splits_total;
  q.config = a.config;
  q.config.direction = a.from_columnwise ? QuantDirection::columnwise : QuantDirection::rowwise;
  q.out = a.in;
  return validate_quantize_args(ctx, q, op, "out", "in");
}

size_t group_dequantize_workspace_size(const Context& ctx, const GroupDequantizeArgs& a) {
  const int64_t G =
      a.in.splits.present() ? a.in.splits.dim(0) : (a.out.rank == 3 ? a.out.dim(0) : 1);
  GROUPMM_CHECK(G >= 1 && G <= (int64_t(1) << 40), "group_dequantize_workspace_size: G=", G,
                " must be in [1, 2^40]");
  return ctx.device() == Device::CUDA ? cuda::quant_plan_workspace_size(G) : 0;
}

void group_dequantize(Context& ctx, const GroupDequantizeArgs& a, void* ws, size_t ws_bytes) {
  const QuantProblem p = validate_dequantize(ctx, a);
  if (ctx.device() == Device::CPU) {
    cpu::group_dequantize(ctx, a, p);
  } else {
    const size_t need = group_dequantize_workspace_size(ctx, a);
    if (ws == nullptr) {
      ws = ctx.workspace(need);
      ws_bytes = need;
    }
    GROUPMM_CHECK(ws_bytes >= need, "group_dequantize: workspace_bytes=", ws_bytes,
                  " must be >= ", need);
    cuda::group_dequantize(ctx, a, p, ws, ws_bytes);
  }
  ctx.after_op();
}

}  // namespace groupmm
