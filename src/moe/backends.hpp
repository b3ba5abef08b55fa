// Backend entry points of the MoE ops in groupmm/moe.hpp (router, permute plan, permute /
// unpermute, weighted SwiGLU, the fused gate_up projection). Arguments arrive validated by
// src/moe/{router,permute,weighted_swiglu,gate_up_swiglu}.cpp.
#pragma once

#include "base/cuda_entry.hpp"
#include "numerics/quantize_layout.hpp"  // qnum::ceil_div, qnum::round_up
#include "groupmm/moe.hpp"

namespace groupmm {
// Per-token chunk of the router and permute-plan kernels, fixed so that their partial sums (and so
// the losses' rounding) do not depend on the device. Both backends size workspaces from it.
inline constexpr int64_t kRouterChunkTokens = 8;
inline constexpr int64_t kPlanChunkTokens = 64;

// The workspace an op runs with: the caller's (checked against `need`), else ctx's (grown outside
// capture; reserved beforehand inside one). `bytes` is updated to the usable size.
inline void* moe_workspace(Context& ctx, const char* op, size_t need, void* ws, size_t& bytes,
                           const char* size_fn) {
  if (ws == nullptr) {
    ws = ctx.workspace(need);
    bytes = ctx.workspace_size();
  }
  GROUPMM_CHECK(bytes >= need, op, ": workspace_bytes=", bytes, " must be >= ", need, " (", size_fn,
                ")");
  return ws;
}

// The PermuteMap checks every op taking a map runs (sizes, dtypes, rows == moe_permuted_rows).
void check_permute_map(const Context& ctx, const char* op, const PermuteMap& m);
}  // namespace groupmm

// Entry points both backends implement with one signature (declared in each namespace below):
//   moe_scatter_rows: dst[dest_row[t, j]] = src[t] (+ probs[dest] = weights[t, j]), padding and
//     tail rows 0 (moe_permute, moe_unpermute_backward);
//   moe_gather_rows: dst[t] = sum_j src[dest_row[t, j]] (+ the routed bias) + add[t]
//     (+ d_weights[t, j] = d_probs[dest]) (moe_unpermute, moe_permute_backward);
//   weighted_swiglu_forward / _backward (any SwigluForm; the plain one on its own path; splits
//     absent: every row, else the rows [0, sum) only, moe.hpp);
//   moe_gate_up_swiglu and moe_down_dgrad_swiglu (the fused projections: CPU composes the unfused
//     ops, CUDA runs the kernel layer's gathered GEMM) and moe_permute_sources (dest_row's inverse
//     and the row probs).
#define GROUPMM_MOE_ROW_OPS(ENTRY)                                                               \
  ENTRY void moe_scatter_rows(Context& ctx, const TensorView& src, const PermuteMap& map,        \
                              const TensorView& dst, const TensorView& weights,                  \
                              const TensorView& probs);                                          \
  ENTRY void moe_gather_rows(Context& ctx, const TensorView& src, const PermuteMap& map,         \
                             const TensorView& dst, const TensorView& add,                       \
                             const TensorView& d_probs, const TensorView& d_weights,             \
                             const RoutedBias& routed);                                          \
  ENTRY void weighted_swiglu_forward(Context& ctx, const TensorView& gate_up,                    \
                                     const TensorView& prob, const TensorView& out,              \
                                     const SwigluForm& form, const TensorView& splits);          \
  ENTRY void moe_gate_up_swiglu(Context& ctx, const MoeGateUpArgs& args);                        \
  ENTRY void moe_down_dgrad_swiglu(Context& ctx, const MoeDownDgradArgs& args);                  \
  ENTRY void moe_permute_sources(Context& ctx, const PermuteMap& map, const TensorView& src_row, \
                                 const TensorView& weights, const TensorView& probs);            \
  ENTRY void weighted_swiglu_backward(Context& ctx, const TensorView& dout,                      \
                                      const TensorView& gate_up, const TensorView& prob,         \
                                      const TensorView& dgate_up, const TensorView& dprob,       \
                                      const SwigluForm& form, const TensorView& splits);

namespace groupmm::cpu {
void moe_router_logits(Context& ctx, const TensorView& x, const TensorView& w,
                       const TensorView& bias, const TensorView& logits);
void moe_router_logits_backward(Context& ctx, const TensorView& d_logits, const TensorView& x,
                                const TensorView& w, const TensorView& dx, const TensorView& dw,
                                bool accumulate_dx, bool accumulate_dw);
void moe_router_forward(Context& ctx, const RouterConfig& cfg, const RouterArgs& args);
void moe_router_backward(Context& ctx, const RouterConfig& cfg, const RouterBackwardArgs& args);
void moe_permute_plan(Context& ctx, const TensorView& expert_ids, const PermuteMap& map);
GROUPMM_MOE_ROW_OPS()
}  // namespace groupmm::cpu

namespace groupmm::cuda {
// GEMMs of the router (src/moe/cuda/router_gemm.cu); workspace = cuBLAS workspace + the rounded
// d_logits.
GROUPMM_CUDA_ENTRY size_t moe_router_logits_workspace_size(int64_t tokens, int64_t experts);
GROUPMM_CUDA_ENTRY void moe_router_logits(Context& ctx, const TensorView& x, const TensorView& w,
                                          const TensorView& bias, const TensorView& logits,
                                          void* workspace, size_t workspace_bytes);
GROUPMM_CUDA_ENTRY void moe_router_logits_backward(Context& ctx, const TensorView& d_logits,
                                                   const TensorView& x, const TensorView& w,
                                                   const TensorView& dx, const TensorView& dw,
                                                   bool accumulate_dx, bool accumulate_dw,
                                                   void* workspace, size_t workspace_bytes);
GROUPMM_CUDA_ENTRY size_t moe_router_workspace_size(const RouterConfig& cfg, int64_t tokens);
GROUPMM_CUDA_ENTRY void moe_router_forward(Context& ctx, const RouterConfig& cfg,
                                           const RouterArgs& args, void* workspace);
GROUPMM_CUDA_ENTRY void moe_router_backward(Context& ctx, const RouterConfig& cfg,
                                            const RouterBackwardArgs& args);
GROUPMM_CUDA_ENTRY size_t moe_permute_plan_workspace_size(int64_t tokens, int64_t topk,
                                                          int64_t experts);
GROUPMM_CUDA_ENTRY void moe_permute_plan(Context& ctx, const TensorView& expert_ids,
                                         const PermuteMap& map, void* workspace);
GROUPMM_MOE_ROW_OPS(GROUPMM_CUDA_ENTRY)
}  // namespace groupmm::cuda

#undef GROUPMM_MOE_ROW_OPS
