// Device pieces shared by the MoE kernels (src/cuda/moe/): element formats of the activations,
// 16-byte vectors, the fp32 dtype dispatch, warp helpers. Self-contained until the shared element
// traits of src/cuda/common/ land (issue 16); then these aliases should point there.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/common/status.cuh"
#include "groupmm/convert.hpp"
#include "groupmm/core.hpp"

namespace groupmm::cuda::moe {

// The float storage formats of activations, as a compile-time tag.
enum class Fmt { bf16, fp16, fp32 };

template <Fmt F>
using Storage = std::conditional_t<F == Fmt::fp32, float, uint16_t>;

template <Fmt F>
__device__ __forceinline__ float to_f32(Storage<F> v) {
  if constexpr (F == Fmt::bf16)
    return bf16_bits_to_float(v);
  else if constexpr (F == Fmt::fp16)
    return fp16_bits_to_float(v);
  else
    return v;
}

// fp32 -> storage with the library's rounding (round-to-nearest-even, canonical NaN).
template <Fmt F>
__device__ __forceinline__ Storage<F> from_f32(float v) {
  if constexpr (F == Fmt::bf16)
    return float_to_bf16_bits(v);
  else if constexpr (F == Fmt::fp16)
    return float_to_fp16_bits(v);
  else
    return v;
}

// N elements of storage S moved as one aligned access (N * sizeof(S) == 16 for the vector path).
template <class S, int N>
struct alignas(sizeof(S) * N) Pack {
  S v[N];
};

// Elements per 16-byte vector of format F.
template <Fmt F>
constexpr int kVec16 = 16 / int(sizeof(Storage<F>));

// Calls fn(std::integral_constant<Fmt, ...>{}) for a bf16 / fp16 / fp32 dtype.
template <class Fn>
void dispatch_fmt(DType t, Fn&& fn) {
  switch (t) {
    case DType::bf16:
      fn(std::integral_constant<Fmt, Fmt::bf16>{});
      break;
    case DType::fp16:
      fn(std::integral_constant<Fmt, Fmt::fp16>{});
      break;
    default:
      fn(std::integral_constant<Fmt, Fmt::fp32>{});
      break;
  }
}

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

inline unsigned grid_size(int64_t blocks) {
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

constexpr unsigned kFullMask = 0xFFFFFFFFu;

}  // namespace groupmm::cuda::moe
