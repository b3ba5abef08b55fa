// Backend entry points of the quantize family (args already validated) and the validated problem.
#pragma once

#include "base/cuda_entry.hpp"
#include "numerics/quantize_layout.hpp"
#include "groupmm/quantize.hpp"

namespace groupmm {

// The validated problem: rows M (G*N for weights), K, G, and the static layout.
struct QuantProblem {
  int64_t M = 0, K = 0, G = 0;
  bool uniform = false;   // weights: every expert has M/G rows
  bool gathered = false;  // GroupQuantizeArgs::row_map: M output rows gathered from the input
  qnum::Layout L;
  bool rowwise = false, columnwise = false;
  qnum::ScaleSlack row_slack, col_slack;  // of the scale buffers this call writes (lines 0: none)
};

// The slack of a scale buffer of spec `s` (group_quantize_shapes) in layout L.
qnum::ScaleSlack scale_slack(const qnum::Layout& L, const TensorSpec& s, bool columnwise);

// iname / qname: how messages name the bf16/fp16/fp32 tensor and the quantized GroupedTensor.
QuantProblem validate_quantize_args(const Context& ctx, const GroupQuantizeArgs& a, const char* op,
                                    const char* iname = "input", const char* qname = "out");
qnum::Layout make_layout(const QuantizeConfig& cfg, int64_t M, int64_t K, int64_t G);

}  // namespace groupmm

namespace groupmm::cpu {
void group_quantize(Context& ctx, const GroupQuantizeArgs& a, const QuantProblem& p,
                    const TensorView& dbias);
void group_dequantize(Context& ctx, const GroupDequantizeArgs& a, const QuantProblem& p);
void swizzle_scales(Context& ctx, const SwizzleScalesArgs& a, const qnum::ScaleSlack& dest_slack);
}  // namespace groupmm::cpu

namespace groupmm::cuda {
// Workspace bytes (the layout is src/quantize/cuda/workspace.cuh): group_quantize and
// bgrad_group_quantize of M x K in G experts; the ops that only need the per-expert plan
// (dequantize, swizzle).
GROUPMM_CUDA_ENTRY size_t group_quantize_workspace_size(int64_t M, int64_t K, int64_t G,
                                                        QuantRecipe recipe, bool with_dbias);
GROUPMM_CUDA_ENTRY size_t quant_plan_workspace_size(int64_t G);

GROUPMM_CUDA_ENTRY void group_quantize(Context& ctx, const GroupQuantizeArgs& a,
                                       const QuantProblem& p, const TensorView& dbias, void* ws,
                                       size_t ws_bytes);
GROUPMM_CUDA_ENTRY void group_dequantize(Context& ctx, const GroupDequantizeArgs& a,
                                         const QuantProblem& p, void* ws, size_t ws_bytes);
GROUPMM_CUDA_ENTRY void swizzle_scales(Context& ctx, const SwizzleScalesArgs& a,
                                       const qnum::ScaleSlack& dest_slack, void* ws,
                                       size_t ws_bytes);
}  // namespace groupmm::cuda
