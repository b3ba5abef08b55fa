// Backend entry points of the quantize family (args already validated) and shared host helpers.
#pragma once

#include "core/quantize_numerics.hpp"
#include "groupmm/quantize.hpp"

namespace groupmm {

// The validated problem: rows M (G*N for weights), K, G, and the static layout.
struct QuantProblem {
  int64_t M = 0, K = 0, G = 0;
  bool uniform = false;  // weights: every expert has M/G rows
  qnum::Layout L;
  bool rowwise = false, columnwise = false;
};

// iname / qname: how messages name the bf16/fp16/fp32 tensor and the quantized GroupedTensor.
QuantProblem validate_quantize_args(const Context& ctx, const GroupQuantizeArgs& a, const char* op,
                                    const char* iname = "input", const char* qname = "out");
qnum::Layout make_layout(const QuantizeConfig& cfg, int64_t M, int64_t K, int64_t G);

// Workspace: the per-expert plan (5 arrays of G+1 int64, then one word for the tile kernel's
// ticket), then for fp8_current and nvfp4 one amax slot (uint32) per 128x128 tile (the fused amax
// schedule), then the dbias partials.
inline size_t plan_bytes(int64_t G) {
  return (static_cast<size_t>(5 * (G + 1) + 1) * 8 + 255) / 256 * 256;
}
inline int64_t tile_bound(int64_t M, int64_t G) {
  return M / qnum::kTileRows + G;
}
// log2(v) when v is a power of two, else -1 (column blocks: a shift instead of a division).
inline int log2_exact(int64_t v) {
  for (int sh = 0; sh < 62; ++sh)
    if (int64_t(1) << sh == v) return sh;
  return -1;
}
inline size_t amax_slot_bytes(int64_t M, int64_t K, int64_t G) {
  return (static_cast<size_t>(tile_bound(M, G) * qnum::ceil_div(K, 128)) * 4 + 255) / 256 * 256;
}

}  // namespace groupmm

namespace groupmm::cpu {
void group_quantize(Context& ctx, const GroupQuantizeArgs& a, const QuantProblem& p,
                    const TensorView& dbias);
void group_dequantize(Context& ctx, const GroupDequantizeArgs& a, const QuantProblem& p);
void swizzle_scales(Context& ctx, const SwizzleScalesArgs& a);
}  // namespace groupmm::cpu

namespace groupmm::cuda {
void group_quantize(Context& ctx, const GroupQuantizeArgs& a, const QuantProblem& p,
                    const TensorView& dbias, void* ws, size_t ws_bytes);
void group_dequantize(Context& ctx, const GroupDequantizeArgs& a, const QuantProblem& p, void* ws,
                      size_t ws_bytes);
void swizzle_scales(Context& ctx, const SwizzleScalesArgs& a, void* ws, size_t ws_bytes);
}  // namespace groupmm::cuda
