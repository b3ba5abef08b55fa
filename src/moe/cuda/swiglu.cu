// CUDA SwiGLU forward / backward: one memory-bound pass each way, grid-stride over 16-byte vectors
// (8 bf16/fp16 or 4 fp32 values) of the [M, I] side; each vector reads its gate and up halves.
#include "moe/swiglu_backends.hpp"
#include "kernels/common/element.cuh"
#include "kernels/common/occupancy.cuh"

namespace groupmm::cuda {
namespace {

struct SwigluConfig {
  static constexpr int kThreads = 256;
  static constexpr int kBlocksPerSm = 8;  // grid: min(vectors / threads, SMs * this, resident)
  static_assert(kThreads % 32 == 0, "whole warps");
};

struct SwigluParams {
  const void* gate_up;  // [M, 2I]
  const void* dout;     // [M, I] (backward)
  void* out;            // [M, I] (forward) or dgate_up [M, 2I] (backward)
  int64_t M, I;
};

// E: the element type (common/element.cuh); VEC elements per access.
template <class E, int VEC, bool kBackward>
__global__ void __launch_bounds__(SwigluConfig::kThreads) swiglu_kernel(SwigluParams p) {
  using S = typename E::Storage;
  using V = ElementVec<E, VEC>;
  const int64_t per_row = p.I / VEC;
  const int64_t total = p.M * per_row;
  const S* gu = static_cast<const S*>(p.gate_up);
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < total;
       v += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = v / per_row, i = (v - m * per_row) * VEC;
    const V g = *reinterpret_cast<const V*>(gu + m * 2 * p.I + i);
    const V u = *reinterpret_cast<const V*>(gu + m * 2 * p.I + p.I + i);
    if constexpr (!kBackward) {
      V o;
#pragma unroll
      for (int k = 0; k < VEC; ++k)
        o.v[k] = E::from_float(swiglu_fwd_elem(E::to_float(g.v[k]), E::to_float(u.v[k])));
      *reinterpret_cast<V*>(static_cast<S*>(p.out) + m * p.I + i) = o;
    } else {
      const V d = *reinterpret_cast<const V*>(static_cast<const S*>(p.dout) + m * p.I + i);
      V dg, du;
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        float a, b;
        swiglu_bwd_elem(E::to_float(d.v[k]), E::to_float(g.v[k]), E::to_float(u.v[k]), a, b);
        dg.v[k] = E::from_float(a);
        du.v[k] = E::from_float(b);
      }
      S* dgu = static_cast<S*>(p.out) + m * 2 * p.I + i;
      *reinterpret_cast<V*>(dgu) = dg;
      *reinterpret_cast<V*>(dgu + p.I) = du;
    }
  }
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

template <class E, bool kBackward>
void launch(Context& ctx, const SwigluParams& p) {
  constexpr int kVec = 16 / int(sizeof(typename E::Storage));
  const bool vec = p.I % kVec == 0 && aligned16(p.gate_up) && aligned16(p.out) &&
                   (p.dout == nullptr || aligned16(p.dout));
  const int64_t vectors = p.M * (vec ? p.I / kVec : p.I);
  if (vectors == 0) return;
  const int64_t want = (vectors + SwigluConfig::kThreads - 1) / SwigluConfig::kThreads;
  auto kernel = vec ? swiglu_kernel<E, kVec, kBackward> : swiglu_kernel<E, 1, kBackward>;
  const unsigned blocks =
      resident_grid(ctx, kernel, SwigluConfig::kThreads, want, SwigluConfig::kBlocksPerSm);
  kernel<<<blocks, SwigluConfig::kThreads, 0, ctx.stream()>>>(p);
  GROUPMM_CHECK_LAUNCH();
}

template <bool kBackward>
void dispatch(Context& ctx, DType t, const SwigluParams& p) {
  dispatch_element(t, "swiglu: dtype", [&](auto e) { launch<decltype(e), kBackward>(ctx, p); });
}

}  // namespace

void swiglu_forward(Context& ctx, const TensorView& gate_up, const TensorView& out) {
  const SwigluParams p{gate_up.data, nullptr, out.data, out.dim(0), out.dim(1)};
  dispatch<false>(ctx, gate_up.dtype, p);
}

void swiglu_backward(Context& ctx, const TensorView& dout, const TensorView& gate_up,
                     const TensorView& dgate_up) {
  const SwigluParams p{gate_up.data, dout.data, dgate_up.data, dout.dim(0), dout.dim(1)};
  dispatch<true>(ctx, gate_up.dtype, p);
}

}  // namespace groupmm::cuda
