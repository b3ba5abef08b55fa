// Numerics of 4-bit weights in bf16 GEMMs (gemm.hpp, W4GemmArgs), one source for the kernels and
// their tests (host + device).
//
// The rule: a weight is e2m1(c) * s, with s = fp32(s_b) / S_enc (nvfp4) or 2^(e - 127) (mxfp4);
// every e2m1(c) * fp32(s_b) and every e2m1(c) * 2^(e - 127) is a bf16 value (at most 6 significant
// bits, inside bf16's exponent range or past it as Inf). So the GEMMs multiply bf16 weights
//   nvfp4: e2m1(c) * fp32(s_b) * 2^-kW4NvfpShift   times alpha * 2^kW4NvfpShift / S_enc in fp32,
//   mxfp4: e2m1(c) * 2^(e - 127)                   times alpha,
// i.e. the exact dequantized weights up to the fp32 factor applied to the accumulator (nvfp4's
// 2^-10 keeps the bf16 scale multiplier below bf16's largest value, see w4_nvfp4_multiplier).
//
// The kernels' form: a word of 8 codes becomes 4 "raw" bf16x2 words by bit placement (no lookup):
// code c = s.e1.e0.m put at bits 15 (sign) and 8..6 (exponent LSBs, mantissa MSB) of a bf16 is
// e2m1(c) * 2^-126 exactly (the subnormal code 1 lands on the bf16 subnormal 2^-127). One bf16x2
// multiply by a per-block multiplier M (bf16(2^126 * block scale), split in two factors where one
// would overflow) then gives the weights above; the product is exact, so it equals the rule's value
// rounded to bf16, which is the value itself. The W4Numerics tests of tests/cpu/test_w4_formats.cpp
// check every (code, scale) pair on the host, tests/cuda/test_w4_numerics_gpu.cu on the device.
// The multiply must come before the tensor core sees the weights: raw words are subnormal or tiny,
// and a decode variant that fed them to the mma directly (block scales applied to the
// accumulator) gave wrong sums (see docs/decisions.md, "4-bit decode: block scales applied to the
// accumulator (not kept)").
#pragma once

#include <cstdint>

#include "numerics/quantize.hpp"

namespace groupmm::qnum {

constexpr int kW4NvfpShift = 10;  // nvfp4 weights in the GEMM are dequant * S_enc * 2^-10

// ---- the rule
// ------------------------------------------------------------------------------------ The bf16
// weight value of code c (low nibble) in a block with scale byte `scale` (fp32).
GROUPMM_HD float w4_weight_value(QuantRecipe r, uint8_t c, uint8_t scale) {
  if (r == QuantRecipe::nvfp4)
    return e2m1_to_float(c) * e4m3_to_float(scale) * bits_float((127u - kW4NvfpShift) << 23);
  return e2m1_to_float(c) * e8m0_to_float(scale);
}
// The fp32 factor of expert g's accumulator (s_enc: nvfp4's global_scale[g]).
GROUPMM_HD float w4_expert_factor(QuantRecipe r, float alpha, float s_enc) {
  if (r == QuantRecipe::nvfp4) return alpha * bits_float((127u + kW4NvfpShift) << 23) / s_enc;
  return alpha;
}

// ---- the kernels' form
// ---------------------------------------------------------------------------
GROUPMM_HD uint32_t bf16x2_dup(uint32_t h) {
  return (h & 0xFFFFu) | (h << 16);
}
// Element-wise a * b of two bf16x2 words, rounded to nearest even (bf16 subnormals kept).
GROUPMM_HD uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#else
  // A product of two bf16 values is exact in fp32 unless it is an fp32 subnormal; the kernels'
  // products never are.
  auto one = [](uint32_t x, uint32_t y) {
    return static_cast<uint32_t>(float_to_bf16_bits(bf16_bits_to_float(static_cast<uint16_t>(x)) *
                                                    bf16_bits_to_float(static_cast<uint16_t>(y))));
  };
  return one(a & 0xFFFFu, b & 0xFFFFu) | (one(a >> 16, b >> 16) << 16);
#endif
}

// The raw bf16x2 of the codes in nibbles 3 and 7 of X (bits 12..15 and 28..31).
GROUPMM_HD uint32_t e2m1_raw_pair(uint32_t X) {
  return (X & 0x80008000u) | ((X >> 6) & 0x01C001C0u);
}
// e2m1_raw_pair(q << 4 kP) for a pair of codes at nibble kP (0 or 1) of both 16-bit halves of q,
// in fewer integer-pipe operations: masked alone, one multiply by 2^(12 - 4 kP) + 2^(6 - 4 kP)
// makes the copy that puts the signs at bits 15, 31 and the copy that puts the magnitudes at
// 8..6, 24..22 (the copies share no bit, so the sum carries nothing), and a second mask keeps
// those bits. The multiply runs on the FMA pipe, the masks on the ALU pipe, which the rest of the
// conversion keeps busy.
template <int kP>
GROUPMM_HD uint32_t e2m1_raw_pair_at(uint32_t q) {
  static_assert(kP == 0 || kP == 1, "a code pair at nibble 0 or 1 of the halves");
  constexpr uint32_t kMask = 0x000F000Fu << (4 * kP);
  constexpr uint32_t kShifts = (1u << (12 - 4 * kP)) + (1u << (6 - 4 * kP));
#if defined(__CUDA_ARCH__)
  uint32_t d;
  // mul.lo with a register operand: an IMAD, not shifts and adds on the ALU pipe.
  asm("mul.lo.u32 %0, %1, %2;" : "=r"(d) : "r"(q & kMask), "r"(kShifts));
  return d & 0x81C081C0u;
#else
  return ((q & kMask) * kShifts) & 0x81C081C0u;
#endif
}
// The raw bf16x2 words of a word of 8 codes (code i in nibble i): r[i] holds codes 3 - i (low
// half) and 7 - i (high half), the bits of e2m1_raw_pair(q << 4i). The GEMM's K order follows
// this permutation (its activations are permuted the same way, w4_x_pairs).
GROUPMM_HD void e2m1x8_raw(uint32_t q, uint32_t (&r)[4]) {
#if defined(__CUDA_ARCH__)
  // q >> 8 on the FMA pipe: codes 2, 3, 6, 7 to nibbles 0, 1 of the halves.
  const uint32_t h = __umulhi(q, 1u << 24);
#else
  const uint32_t h = q >> 8;
#endif
  r[0] = e2m1_raw_pair_at<1>(h);  // codes 3, 7
  r[1] = e2m1_raw_pair_at<0>(h);  // codes 2, 6
  r[2] = e2m1_raw_pair_at<1>(q);  // codes 1, 5
  r[3] = e2m1_raw_pair_at<0>(q);  // codes 0, 4
}
// The raw bf16x2 of the two codes of byte b (b < 256): the low nibble (the even K element) in the
// low half, the high nibble in the high half, in natural K order (the RS GEMM's A registers:
// kernels/sm90/w4_rs_gemm.cuh). b * 0x01001000 = b << 12 | b << 24 (no overlap) puts the low nibble
// at bits 12-15 and the high one at 28-31, the only bits e2m1_raw_pair reads.
GROUPMM_HD uint32_t e2m1_byte_raw_pair(uint32_t b) {
  return e2m1_raw_pair(b * 0x01001000u);
}
// Eight activations (bf16 pairs (0,1) (2,3) (4,5) (6,7) in x0..x3) in the order of e2m1x8_raw:
// out[i] = (element 3 - i, element 7 - i).
GROUPMM_HD void w4_x_pairs(uint32_t x0, uint32_t x1, uint32_t x2, uint32_t x3, uint32_t (&out)[4]) {
  out[0] = (x1 >> 16) | (x3 & 0xFFFF0000u);
  out[1] = (x1 & 0xFFFFu) | (x3 << 16);
  out[2] = (x0 >> 16) | (x2 & 0xFFFF0000u);
  out[3] = (x0 & 0xFFFFu) | (x2 << 16);
}
// The inverse for the dequantized weights (natural order out[i] = elements 2i, 2i + 1).
GROUPMM_HD void w4_natural_pairs(const uint32_t (&r)[4], uint32_t (&out)[4]) {
  out[0] = (r[3] & 0xFFFFu) | (r[2] << 16);
  out[1] = (r[1] & 0xFFFFu) | (r[0] << 16);
  out[2] = (r[3] >> 16) | (r[2] & 0xFFFF0000u);
  out[3] = (r[1] >> 16) | (r[0] & 0xFFFF0000u);
}

// v in both halves of a bf16x2 word, for a v that is a bf16 value (no rounding happens).
GROUPMM_HD uint32_t bf16x2_of_exact(float v) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %1;" : "=r"(d) : "f"(v));
  return d;
#else
  return bf16x2_dup(float_to_bf16_bits(v));
#endif
}

// The per-block multipliers, as bf16x2 words (the same factor in both halves).
// nvfp4: s_b * 2^(126 - kW4NvfpShift) (at most 448 * 2^116: a bf16 value; NaN for a NaN scale),
// so raw * it = e2m1(c) * s_b * 2^-10.
GROUPMM_HD uint32_t w4_nvfp4_multiplier_of(float s_b) {  // s_b: the decoded scale
  return bf16x2_of_exact(s_b * bits_float((127u + 126u - kW4NvfpShift) << 23));
}
GROUPMM_HD uint32_t w4_nvfp4_multiplier(uint8_t s_b) {
  return w4_nvfp4_multiplier_of(e4m3_decode(s_b));
}
// The multipliers of the two scale bytes of sv (low byte first): on the device one
// cvt.rn.f16x2.e4m3x2 decodes both (the same values as w4_nvfp4_multiplier).
GROUPMM_HD void w4_nvfp4_multipliers(uint32_t sv, uint32_t (&m)[2]) {
#if defined(__CUDA_ARCH__)
  uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(static_cast<unsigned short>(sv)));
  m[0] = w4_nvfp4_multiplier_of(__half2float(__ushort_as_half(static_cast<unsigned short>(h2))));
  m[1] =
      w4_nvfp4_multiplier_of(__half2float(__ushort_as_half(static_cast<unsigned short>(h2 >> 16))));
#else
  m[0] = w4_nvfp4_multiplier(static_cast<uint8_t>(sv));
  m[1] = w4_nvfp4_multiplier(static_cast<uint8_t>(sv >> 8));
#endif
}
// mxfp4: 2^(e - 1) = 2^126 * 2^(e - 127) as two bf16 factors m1 * m2: m1 = 2^(min(e, 128) - 1),
// m2 = 2^(e - 128) for e > 128 (NaN for e = 255), else 1. Exponents <= 128 (block amax <= 12, the
// usual weights) need the first factor only (w4_mxfp4_needs_two).
GROUPMM_HD uint32_t w4_mxfp4_multiplier1(uint8_t e) {
  return bf16x2_dup((static_cast<uint32_t>(e > 128 ? 128 : e) + 126u) << 7);
}
GROUPMM_HD uint32_t w4_mxfp4_multiplier2(uint8_t e) {
  if (e == 255) return 0x7FC07FC0u;
  return bf16x2_dup(e > 128 ? (static_cast<uint32_t>(e) - 1u) << 7 : 0x3F80u);
}
GROUPMM_HD bool w4_mxfp4_needs_two(uint8_t e) {
  return e > 128;
}

// The 4 bf16x2 weight words of a word of 8 codes of one block (the order of e2m1x8_raw).
// nvfp4: m = w4_nvfp4_multiplier(s_b); mxfp4: m1, m2 = w4_mxfp4_multiplier1 / 2(e).
GROUPMM_HD void w4_weights8(uint32_t q, uint32_t m, uint32_t (&w)[4]) {
  e2m1x8_raw(q, w);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int i = 0; i < 4; ++i) w[i] = bf16x2_mul(w[i], m);
}
GROUPMM_HD void w4_weights8(uint32_t q, uint32_t m1, uint32_t m2, uint32_t (&w)[4]) {
  e2m1x8_raw(q, w);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int i = 0; i < 4; ++i) w[i] = bf16x2_mul(bf16x2_mul(w[i], m1), m2);
}

}  // namespace groupmm::qnum
