// groupmm/convert.hpp: bit-exact scalar conversions between fp32 and the storage formats.
//
// One implementation serves the host (CPU reference) and the device (CUDA kernels): every function
// is constexpr and __host__ __device__ under nvcc, so the two paths agree bit for bit by
// construction. The GPU tests also compare against the CUDA intrinsics.
//
// Rules (docs/numerics.md):
//  - fp32 -> bf16 / fp16: round-to-nearest-even, IEEE overflow to Inf, NaN -> 0x7FFF (the
//    canonical NaN the CUDA conversions produce).
//  - fp32 -> e4m3 / e5m2 / e2m1: round-to-nearest-even, saturating to the largest finite value
//    (Inf saturates too). NaN -> 0x7F|sign (e4m3, e5m2, as cvt.satfinite does); e2m1 has no NaN,
//    NaN -> +6 (0x7), like __nv_cvt_float_to_fp4. Signed zero keeps its sign.
//  - e8m0 (MX scale): biased exponent of v, +1 if v's mantissa is non-zero (round up to a power of
//    two); 0 -> 0, Inf -> 254, NaN -> 255, clamped to [0, 254]. Decode: 2^(e-127), 255 -> NaN.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define GROUPMM_HD __host__ __device__ __forceinline__
#else
#define GROUPMM_HD inline
#endif

namespace groupmm {

GROUPMM_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

GROUPMM_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

namespace detail {

// Rounds the magnitude of a finite fp32 value (bits without sign, normal or zero exponent) to a
// minifloat with EB exponent bits, MB mantissa bits and bias BIAS, round-to-nearest-even. Returns
// the unsaturated magnitude code (exponent << MB | mantissa); codes past the format's top are
// returned as is so that the caller decides between saturation and Inf.
template <int EB, int MB, int BIAS>
GROUPMM_HD uint32_t round_minifloat_mag(uint32_t abs_bits) {
  const int fexp = static_cast<int>(abs_bits >> 23);
  if (fexp == 0) return 0;  // fp32 zero/subnormal: far below half the smallest target subnormal
  const int e = fexp - 127 + BIAS;                          // target biased exponent
  const uint32_t sig = (abs_bits & 0x7FFFFFu) | 0x800000u;  // 24-bit significand
  const int shift = (e >= 1) ? (23 - MB) : (23 - MB + (1 - e));
  if (shift >= 25) return 0;  // below or at half the smallest subnormal: ties go to even (0)
  uint32_t q = sig >> shift;
  const uint32_t rem = sig & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  if (e >= 1) {
    // A carry out of the mantissa bumps the exponent by itself: (e << MB) + (q - 2^MB).
    const uint64_t code = (static_cast<uint64_t>(e) << MB) + (q - (1u << MB));
    return code > 0xFFFFFFu ? 0xFFFFFFu : static_cast<uint32_t>(code);
  }
  return q;  // subnormal (q == 2^MB is the smallest normal, which is also its code)
}

template <int EB, int MB, int BIAS>
GROUPMM_HD float decode_minifloat_mag(uint32_t code) {
  const uint32_t e = code >> MB;
  const uint32_t m = code & ((1u << MB) - 1u);
  if (e == 0) {
    // m * 2^(1 - BIAS - MB), exact in fp32 for every format here
    return static_cast<float>(m) * bits_float(static_cast<uint32_t>(127 + 1 - BIAS - MB) << 23);
  }
  return bits_float((static_cast<uint32_t>(static_cast<int>(e) - BIAS + 127) << 23) |
                    (m << (23 - MB)));
}

}  // namespace detail

// ---- bf16 ---------------------------------------------------------------------------------------
GROUPMM_HD uint16_t float_to_bf16_bits(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFFu;  // canonical NaN, as cvt.rn.bf16 does
  const uint32_t rounded = u + 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}
GROUPMM_HD float bf16_bits_to_float(uint16_t h) {
  return bits_float(static_cast<uint32_t>(h) << 16);
}

// ---- fp16 ---------------------------------------------------------------------------------------
GROUPMM_HD uint16_t float_to_fp16_bits(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0x7FFFu;          // canonical NaN, as cvt.rn.f16 does
  if (a == 0x7F800000u) return sign | 0x7C00u;  // Inf
  uint32_t code = detail::round_minifloat_mag<5, 10, 15>(a);
  if (code >= 0x7C00u) code = 0x7C00u;  // IEEE overflow to Inf
  return sign | static_cast<uint16_t>(code);
}
GROUPMM_HD float fp16_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t mag = h & 0x7FFFu;
  if (mag >= 0x7C00u) return bits_float(sign | 0x7F800000u | ((mag & 0x3FFu) << 13));
  return bits_float(sign | float_bits(detail::decode_minifloat_mag<5, 10, 15>(mag)));
}

// ---- fp8 e4m3 (OCP "fn": no Inf, NaN = S.1111.111, max 448) ------------------------------------
GROUPMM_HD uint8_t float_to_e4m3(float f) {
  const uint32_t u = float_bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7Fu;
  uint32_t code = (a == 0x7F800000u) ? 0x7Eu : detail::round_minifloat_mag<4, 3, 7>(a);
  if (code > 0x7Eu) code = 0x7Eu;
  return sign | static_cast<uint8_t>(code);
}
GROUPMM_HD float e4m3_to_float(uint8_t c) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t mag = c & 0x7Fu;
  if (mag == 0x7Fu) return bits_float(sign | 0x7FC00000u);
  return bits_float(sign | float_bits(detail::decode_minifloat_mag<4, 3, 7>(mag)));
}

// ---- fp8 e5m2 (IEEE-like: Inf = S.11111.00, max 57344) --------------------------------------
GROUPMM_HD uint8_t float_to_e5m2(float f) {
  const uint32_t u = float_bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7Fu;
  uint32_t code = (a == 0x7F800000u) ? 0x7Bu : detail::round_minifloat_mag<5, 2, 15>(a);
  if (code > 0x7Bu) code = 0x7Bu;
  return sign | static_cast<uint8_t>(code);
}
GROUPMM_HD float e5m2_to_float(uint8_t c) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t mag = c & 0x7Fu;
  if (mag > 0x7Cu) return bits_float(sign | 0x7FC00000u);
  if (mag == 0x7Cu) return bits_float(sign | 0x7F800000u);
  return bits_float(sign | float_bits(detail::decode_minifloat_mag<5, 2, 15>(mag)));
}

// ---- fp4 e2m1 (values 0 .5 1 1.5 2 3 4 6, no Inf/NaN) -----------------------------------------
GROUPMM_HD uint8_t float_to_e2m1(float f) {
  const uint32_t u = float_bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 28) & 0x8u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0x7u;  // NaN -> +6, as the CUDA conversion does
  uint32_t code = (a == 0x7F800000u) ? 0x7u : detail::round_minifloat_mag<2, 1, 1>(a);
  if (code > 0x7u) code = 0x7u;
  return sign | static_cast<uint8_t>(code);
}
GROUPMM_HD float e2m1_to_float(uint8_t c) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x8u) << 28;
  return bits_float(sign | float_bits(detail::decode_minifloat_mag<2, 1, 1>(c & 0x7u)));
}
// Packing: element 2j in the low nibble, 2j+1 in the high nibble.
GROUPMM_HD uint8_t pack_e2m1x2(uint8_t lo, uint8_t hi) {
  return static_cast<uint8_t>((lo & 0xFu) | ((hi & 0xFu) << 4));
}

// ---- e8m0 (MX block scale) ----------------------------------------------------------------------
GROUPMM_HD uint8_t float_to_e8m0_roundup(float v) {
  const uint32_t u = float_bits(v) & 0x7FFFFFFFu;  // scales are magnitudes
  if (u > 0x7F800000u) return 255;                 // NaN
  if (u == 0x7F800000u) return 254;                // Inf
  uint32_t e = u >> 23;
  if (u & 0x7FFFFFu) ++e;
  return static_cast<uint8_t>(e > 254u ? 254u : e);
}
GROUPMM_HD float e8m0_to_float(uint8_t e) {
  if (e == 255) return bits_float(0x7FC00000u);
  if (e == 0) return bits_float(0x00400000u);  // 2^-127 (fp32 subnormal)
  return bits_float(static_cast<uint32_t>(e) << 23);
}

// Largest finite values.
constexpr float kE4M3Max = 448.0f;
constexpr float kE5M2Max = 57344.0f;
constexpr float kE2M1Max = 6.0f;

}  // namespace groupmm
