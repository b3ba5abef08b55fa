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

// The parameterized form (moe.hpp, SwigluForm), given the sigmoid function: the clamps as
// torch.clamp (a NaN passes through the forward; its gradient is 0), then swiglu's expression
// order with alpha in the sigmoid and up_offset on the up value.
struct SwigluFormElem {
  float alpha, limit, up_offset;
};
GROUPMM_SWIGLU_HD float swiglu_clamp_gate(float g, float limit) {
  return g > limit ? limit : g;
}
GROUPMM_SWIGLU_HD float swiglu_clamp_up(float u, float limit) {
  return u > limit ? limit : (u < -limit ? -limit : u);
}
template <class Sigmoid>
GROUPMM_SWIGLU_HD float swiglu_form_fwd(float g, float u, const SwigluFormElem& f, Sigmoid sig) {
  const float gc = swiglu_clamp_gate(g, f.limit), uc = swiglu_clamp_up(u, f.limit);
  return swiglu_fwd_given(gc, uc + f.up_offset, sig(f.alpha * gc));
}
template <class Sigmoid>
GROUPMM_SWIGLU_HD void swiglu_form_bwd(float dout, float g, float u, const SwigluFormElem& f,
                                       Sigmoid sig, float& dg, float& du) {
  const float gc = swiglu_clamp_gate(g, f.limit), uc = swiglu_clamp_up(u, f.limit);
  const float s = sig(f.alpha * gc), up = uc + f.up_offset;
  du = (u >= -f.limit && u <= f.limit) ? dout * (gc * s) : 0.0f;
  dg = g <= f.limit ? dout * up * (s * (1.0f + f.alpha * gc * (1.0f - s))) : 0.0f;
}
struct SwigluSigmoidExact {
  GROUPMM_SWIGLU_HD float operator()(float x) const { return swiglu_sigmoid(x); }
};

#if defined(__CUDACC__)
// The router-weighted SwiGLU's element math on the device (src/moe/cuda/weighted_swiglu.cu):
// swiglu's formulas, the sigmoid's division by __fdividef (at most 2 ulp, no slow path) instead of
// an IEEE division. Why: that kernel is bound by instruction issue, not bandwidth, and the IEEE
// division's slow-path check after every element is a large part of its instructions (see
// docs/decisions.md, "MoE block: weighted SwiGLU's sigmoid by __fdividef"). A sigmoid below
// 2^-126 (g < -87.3) becomes 0.
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
struct SwigluSigmoidFast {
  __device__ __forceinline__ float operator()(float x) const { return weighted_swiglu_sigmoid(x); }
};
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
