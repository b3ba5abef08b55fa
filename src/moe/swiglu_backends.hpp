// Backend entry points of swiglu_forward / swiglu_backward (args already validated), and the
// scalar math both backends share.
#pragma once

#include "base/cuda_entry.hpp"
#include <cmath>

#include "groupmm/moe.hpp"

#if defined(__CUDACC__)
#define GROUPMM_SWIGLU_HD __host__ __device__ __forceinline__
#else
#define GROUPMM_SWIGLU_HD inline
#endif

namespace groupmm {

// One element of each direction in fp32 (same expression order on host and device).
GROUPMM_SWIGLU_HD float swiglu_sigmoid(float g) {
#if defined(__CUDA_ARCH__)
  return 1.0f / (1.0f + expf(-g));
#else
  return 1.0f / (1.0f + std::exp(-g));
#endif
}
// The formulas given the sigmoid s = sigmoid(g), so that each sigmoid variant shares them.
GROUPMM_SWIGLU_HD float swiglu_fwd_given(float g, float u, float s) {
  return g * s * u;
}
GROUPMM_SWIGLU_HD void swiglu_bwd_given(float dout, float g, float u, float s, float& dg,
                                        float& du) {
  du = dout * (g * s);
  dg = dout * u * (s * (1.0f + g * (1.0f - s)));
}
GROUPMM_SWIGLU_HD float swiglu_fwd_elem(float g, float u) {
  return swiglu_fwd_given(g, u, swiglu_sigmoid(g));
}
GROUPMM_SWIGLU_HD void swiglu_bwd_elem(float dout, float g, float u, float& dg, float& du) {
  swiglu_bwd_given(dout, g, u, swiglu_sigmoid(g), dg, du);
}

#if defined(__CUDACC__)
// The router-weighted SwiGLU's element math on the device (src/moe/cuda/weighted_swiglu.cu):
// swiglu's formulas, the sigmoid's division by __fdividef (at most 2 ulp, no slow path) instead of
// an IEEE division. Why: that kernel is bound by instruction issue, not bandwidth, and the IEEE
// division's slow-path check after every element is a large part of its instructions
// (measurements: bench/RESULTS.md, MoE block). A sigmoid below 2^-126 (g < -87.3) becomes 0.
// The plain swiglu keeps the IEEE division (the shared expert's activation, a small share).
__device__ __forceinline__ float weighted_swiglu_sigmoid(float g) {
  return __fdividef(1.0f, 1.0f + expf(-g));
}
__device__ __forceinline__ float weighted_swiglu_fwd_elem(float g, float u) {
  return swiglu_fwd_given(g, u, weighted_swiglu_sigmoid(g));
}
__device__ __forceinline__ void weighted_swiglu_bwd_elem(float dout, float g, float u, float& dg,
                                                         float& du) {
  swiglu_bwd_given(dout, g, u, weighted_swiglu_sigmoid(g), dg, du);
}
#endif

// Validation shared with weighted_swiglu: gate_up [M, 2I] (bf16/fp16/fp32) and a [M, I] partner
// `half` of the same dtype on ctx's device; returns I.
int64_t check_swiglu_pair(const Context& ctx, const char* op, const TensorView& gate_up,
                          const TensorView& half, const char* half_arg);

}  // namespace groupmm

namespace groupmm::cpu {
void swiglu_forward(Context& ctx, const TensorView& gate_up, const TensorView& out);
void swiglu_backward(Context& ctx, const TensorView& dout, const TensorView& gate_up,
                     const TensorView& dgate_up);
}  // namespace groupmm::cpu
namespace groupmm::cuda {
GROUPMM_CUDA_ENTRY void swiglu_forward(Context& ctx, const TensorView& gate_up,
                                       const TensorView& out);
GROUPMM_CUDA_ENTRY void swiglu_backward(Context& ctx, const TensorView& dout,
                                        const TensorView& gate_up, const TensorView& dgate_up);
}  // namespace groupmm::cuda
