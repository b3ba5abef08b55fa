// Element traits of the 16- and 32-bit floating-point tensors the CUDA kernels read and write
// (bf16, fp16, fp32): storage type, exact conversions to and from fp32, and the two-element
// ("pair") operations of the quantize kernels' amax. One definition for every op family.
//
// Conversions follow convert.hpp bit for bit: fp32 -> 16-bit is convert.hpp's rounding itself
// (pair_from_floats: the hardware's cvt.rn, which rounds the same way, to nearest even, with no
// flush and the canonical NaN 0x7FFF; kernels whose inputs are wgmma accumulators use it, since
// integer arithmetic on accumulator bits makes ptxas serialize the wgmma pipeline);
// 16-bit -> fp32 is exact, so the hardware conversion gives the same value (a NaN's payload may
// differ, which no output shows: every result passes through fp32 arithmetic, which returns the
// canonical NaN, or through a 16-bit encoder, which writes the canonical 0x7FFF).
#pragma once

#include <cuda_fp16.h>

#include "numerics/quantize.hpp"
#include "kernels/common/ptx.cuh"
#include "groupmm/convert.hpp"

namespace groupmm::cuda {

// Pairs: two adjacent elements of a row, element 2i in the low half (16-bit) or in .x (fp32).
// The amax works on raw magnitude bits: for non-negative floats the unsigned order of the bits is
// the numeric order with NaN above Inf, so the maximum of the raw |x| bits, canonicalized once
// (pair_lo_abs / pair_hi_abs: qnum::canon_abs_bits), is exactly qnum::amax_merge over
// qnum::abs_bits of every element.

struct Bf16 {
  static constexpr DType kDType = DType::bf16;
  using Storage = uint16_t;
  using Pair = uint32_t;
  static __device__ __forceinline__ float to_float(Storage v) { return bf16_bits_to_float(v); }
  static __device__ __forceinline__ Storage from_float(float v) { return float_to_bf16_bits(v); }
  // from_float of two values, lo in the low half, by the hardware conversion (the same bits).
  static __device__ __forceinline__ Pair pair_from_floats(float lo, float hi) {
    Pair r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  }
  static __device__ __forceinline__ float2 pair_to_float2(Pair w) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xFFFF0000u));
  }
  static __device__ __forceinline__ Pair pair_zero() { return 0u; }
  // max(m, |w|) per element, on raw magnitude bits.
  static __device__ __forceinline__ Pair pair_abs_max(Pair m, Pair w) {
    return max_u16x2(m, w & 0x7FFF7FFFu);
  }
  static __device__ __forceinline__ Pair pair_max(Pair a, Pair b) { return max_u16x2(a, b); }
  // Canonical fp32 |x| bits of the low / high element of a pair of magnitudes.
  static __device__ __forceinline__ uint32_t pair_lo_abs(Pair m) {
    return qnum::canon_abs_bits(m << 16);
  }
  static __device__ __forceinline__ uint32_t pair_hi_abs(Pair m) {
    return qnum::canon_abs_bits(m & 0xFFFF0000u);
  }
};

struct Fp16 {
  static constexpr DType kDType = DType::fp16;
  using Storage = uint16_t;
  using Pair = uint32_t;
  static __device__ __forceinline__ float to_float(Storage v) {
    return __half2float(__ushort_as_half(v));
  }
  static __device__ __forceinline__ Storage from_float(float v) { return float_to_fp16_bits(v); }
  static __device__ __forceinline__ Pair pair_from_floats(float lo, float hi) {
    Pair r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  }
  static __device__ __forceinline__ float2 pair_to_float2(Pair w) {
    return make_float2(to_float(static_cast<Storage>(w)), to_float(static_cast<Storage>(w >> 16)));
  }
  static __device__ __forceinline__ Pair pair_zero() { return 0u; }
  static __device__ __forceinline__ Pair pair_abs_max(Pair m, Pair w) {
    return max_u16x2(m, w & 0x7FFF7FFFu);
  }
  static __device__ __forceinline__ Pair pair_max(Pair a, Pair b) { return max_u16x2(a, b); }
  static __device__ __forceinline__ uint32_t pair_lo_abs(Pair m) {
    return qnum::abs_bits(to_float(static_cast<Storage>(m)));
  }
  static __device__ __forceinline__ uint32_t pair_hi_abs(Pair m) {
    return qnum::abs_bits(to_float(static_cast<Storage>(m >> 16)));
  }
};

struct Fp32 {
  static constexpr DType kDType = DType::fp32;
  using Storage = float;
  using Pair = uint2;
  static __device__ __forceinline__ float to_float(Storage v) { return v; }
  static __device__ __forceinline__ Storage from_float(float v) { return v; }
  static __device__ __forceinline__ float2 pair_to_float2(Pair w) {
    return make_float2(__uint_as_float(w.x), __uint_as_float(w.y));
  }
  static __device__ __forceinline__ Pair pair_zero() { return make_uint2(0u, 0u); }
  static __device__ __forceinline__ Pair pair_abs_max(Pair m, Pair w) {
    return make_uint2(max(m.x, w.x & 0x7FFFFFFFu), max(m.y, w.y & 0x7FFFFFFFu));
  }
  static __device__ __forceinline__ Pair pair_max(Pair a, Pair b) {
    return make_uint2(max(a.x, b.x), max(a.y, b.y));
  }
  static __device__ __forceinline__ uint32_t pair_lo_abs(Pair m) {
    return qnum::canon_abs_bits(m.x);
  }
  static __device__ __forceinline__ uint32_t pair_hi_abs(Pair m) {
    return qnum::canon_abs_bits(m.y);
  }
};

// A pair from lane (lane ^ mask) of the warp.
__device__ __forceinline__ uint32_t shfl_xor_pair(uint32_t v, int mask) {
  return __shfl_xor_sync(0xFFFFFFFFu, v, mask);
}
__device__ __forceinline__ uint2 shfl_xor_pair(uint2 v, int mask) {
  return make_uint2(__shfl_xor_sync(0xFFFFFFFFu, v.x, mask),
                    __shfl_xor_sync(0xFFFFFFFFu, v.y, mask));
}

// kCount consecutive elements, aligned to their size (one vector load or store).
template <class E, int kCount>
struct alignas(sizeof(typename E::Storage) * kCount) ElementVec {
  typename E::Storage v[kCount];
};

// Calls f(Bf16{}), f(Fp16{}) or f(Fp32{}) for dtype t; any other dtype is an error naming `what`.
template <class F>
void dispatch_element(DType t, const char* what, F&& f) {
  switch (t) {
    case DType::bf16:
      f(Bf16{});
      return;
    case DType::fp16:
      f(Fp16{});
      return;
    case DType::fp32:
      f(Fp32{});
      return;
    default:
      break;
  }
  GROUPMM_CHECK(false, what, "=", dtype_name(t), " must be bf16, fp16 or fp32");
}

}  // namespace groupmm::cuda
