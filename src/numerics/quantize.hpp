// Scalar rules of grouped quantization (docs/numerics.md), one source for the CPU reference
// and the CUDA kernels (host + device). The plain functions are the rules; the CPU reference
// calls them. Where a kernel needs a faster form, it sits in "Fast twins" below, next to the
// rule it reproduces, and is tested against it: on the host by tests/cpu/
// test_quantize_numerics.cpp (randomized and edge inputs), on the device, where the twin uses
// instructions the host cannot run, by tests/cuda/test_block_scale_gpu.cu and
// tests/cuda/test_qnum_gpu.cu (exhaustive where the input space allows).
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif

#include "groupmm/convert.hpp"
#include "groupmm/core.hpp"

namespace groupmm::qnum {

// ---- amax: canonical |x| bits (every NaN -> 0x7FC00000), merged with an unsigned max -----------
// For non-negative floats the unsigned order of the bits is the numeric order and NaN sorts above
// Inf, so a block containing a NaN has a NaN amax, on any backend, in any order.
GROUPMM_HD uint32_t canon_abs_bits(uint32_t abs) {  // abs: fp32 bits without the sign
  return abs > 0x7F800000u ? 0x7FC00000u : abs;
}
GROUPMM_HD uint32_t abs_bits(float x) {
  return canon_abs_bits(float_bits(x) & 0x7FFFFFFFu);
}
GROUPMM_HD uint32_t amax_merge(uint32_t a, uint32_t b) {
  return a > b ? a : b;
}
GROUPMM_HD bool is_finite(float f) {
  return (float_bits(f) & 0x7FFFFFFFu) < 0x7F800000u;
}

// GPU arithmetic returns a positive NaN whatever its operands; the host propagates an operand's
// sign and payload. Values that reach an encoder or an output go through canon_nan on the host
// (and the device) so NaN results agree bit for bit.
GROUPMM_HD float canon_nan(float f) {
  return (float_bits(f) & 0x7FFFFFFFu) > 0x7F800000u ? bits_float(0x7FC00000u) : f;
}

// The recipes whose data is E2M1, two codes per byte (element 2j in the low nibble).
GROUPMM_HD constexpr bool is_fp4(QuantRecipe r) {
  return r == QuantRecipe::nvfp4 || r == QuantRecipe::mxfp4;
}

GROUPMM_HD float fp8_max(bool e5m2) {
  return e5m2 ? kE5M2Max : kE4M3Max;
}
GROUPMM_HD uint8_t fp8_encode(float v, bool e5m2) {
  return e5m2 ? float_to_e5m2(v) : float_to_e4m3(v);
}
GROUPMM_HD float fp8_to_float(uint8_t c, bool e5m2) {
  return e5m2 ? e5m2_to_float(c) : e4m3_to_float(c);
}

struct ScalePair {
  float scale;      // multiplies x before rounding
  float scale_inv;  // stored; dequant multiplies by it
};

// FP8 per-expert current scaling.
GROUPMM_HD ScalePair fp8_current_scale(float amax, bool e5m2, bool pow2) {
  float s = 1.0f;
  if (amax > 0.0f && is_finite(amax)) {
    s = fp8_max(e5m2) / amax;
    if (!is_finite(s)) s = 1.0f;
  }
  if (pow2) s = bits_float(float_bits(s) & 0xFF800000u);  // s is normal here: round down
  return {s, 1.0f / s};
}

// FP8 blockwise (1x128, 128x1, 128x128).
GROUPMM_HD ScalePair fp8_block_scale(float amax, bool e5m2, bool pow2) {
  const float fmax = fp8_max(e5m2);
  if (!(amax > 0.0f) || !is_finite(amax)) return {1.0f, 1.0f};
  float v = amax / fmax;
  const uint32_t vb = float_bits(v);
  if ((vb >> 23) == 0) return {1.0f, 1.0f};  // subnormal: its reciprocal overflows
  if (pow2) {
    v = bits_float(((vb & 0x7FFFFFu) ? (vb >> 23) + 1u : (vb >> 23)) << 23);  // round up
    return {1.0f / v, v};
  }
  return {fmax / amax, v};
}

// MXFP8: the E8M0 exponent of a block and the multiplier 2^(127-e) (NaN for e = 255).
GROUPMM_HD uint8_t mx_e8m0(float amax, bool e5m2) {
  return float_to_e8m0_roundup(amax * (e5m2 ? (1.0f / kE5M2Max) : (1.0f / kE4M3Max)));
}
// MXFP4: the MXFP8 rule with fmax = 6 (E2M1's largest value).
GROUPMM_HD uint8_t mxfp4_e8m0(float amax) {
  return float_to_e8m0_roundup(amax * (1.0f / kE2M1Max));
}
GROUPMM_HD float mx_quant_mul(uint8_t e) {
  if (e == 255) return bits_float(0x7FC00000u);
  if (e == 254) return bits_float(0x00400000u);  // 2^-127, subnormal
  return bits_float(static_cast<uint32_t>(254 - e) << 23);
}

// NVFP4: per-expert S_enc, block scale s_b (e4m3 code), element code.
GROUPMM_HD float nvfp4_s_enc(float amax) {
  if (amax > 0.0f && is_finite(amax)) {
    const float s = (kE4M3Max * kE2M1Max) / amax;
    if (is_finite(s)) return s;
  }
  return 1.0f;
}
GROUPMM_HD uint8_t nvfp4_block_scale(float amax_block, float s_enc_div6) {
  return float_to_e4m3(amax_block * s_enc_div6);
}
// The multiplier of a block's elements. The formula q = e2m1(x * S_enc / fp32(s_b)) is
// evaluated as x * (S_enc / s_b), as TransformerEngine does; one division per block. A quotient
// past the fp32 range (only when amax_g is below ~1e-32) saturates to FLT_MAX, so that x = 0 still
// encodes as 0 and not as NaN (0 * Inf); a NaN s_b keeps a NaN multiplier.
GROUPMM_HD float nvfp4_elem_scale(float s_enc, float s_b_f) {
  const float s = s_enc / s_b_f;
  return s > 3.40282347e38f ? 3.40282347e38f : s;
}
// Element code; `scale` = nvfp4_elem_scale(S_enc, fp32(s_b)). A zero block scale encodes 0.
GROUPMM_HD uint8_t nvfp4_code(float x, uint8_t s_b, float scale) {
  if ((s_b & 0x7Fu) == 0) return 0;
  return float_to_e2m1(x * scale);  // e2m1 ignores the sign of NaN
}
// MXFP4 element code; `mul` = mx_quant_mul(e) of the block's exponent (a NaN block: all 6s).
GROUPMM_HD uint8_t mxfp4_code(float x, float mul) {
  return float_to_e2m1(x * mul);
}

// Eight float_to_e2m1 magnitude codes packed in a word (element j in nibble j, sign bits clear),
// for the kernels' inner loop: ~10 integer/fp32 operations per element, no branches. Equal to
// float_to_e2m1(|p|) for every non-NaN input (tests/cpu/test_quantize_formats.cpp sweeps them).
// The fp32 adder does the rounding: |p| saturated at 6 (code 7 either way), E = its exponent
// clamped to >= 0 (E2M1 steps: 0.5 below 2, then 1, 2), the power of two m = 2^(E+22) has ulp
// 2^(E-1), so |p| + m rounds |p| to the E2M1 step with ties to even and leaves the number of
// steps n in the mantissa field; code = n + 2E. The 2E + 254 terms are summed into the word as
// (n + (bits(m) >> 22)) << 4j and the 254s are subtracted once (exact: the sum is linear mod
// 2^32 and every final nibble is <= 7).
GROUPMM_HD uint32_t e2m1x8_magnitudes(const float (&p)[8]) {
  uint32_t w = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int j = 0; j < 8; ++j) {
    const float a = fminf(fabsf(p[j]), kE2M1Max);
    uint32_t e = float_bits(a) & 0x7F800000u;
    e = e < 0x3F800000u ? 0x3F800000u : e;
    const uint32_t n = float_bits(a + bits_float(e + (22u << 23))) & 0x7FFFFFu;
    w += (n + (e >> 22)) << (4 * j);
  }
  return w - 254u * 0x11111111u;
}
// The sign bits of eight e2m1 codes (bit 3 of nibble j = the sign of p[j]).
GROUPMM_HD uint32_t e2m1x8_signs(const float (&p)[8]) {
  uint32_t sign = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int j = 0; j < 8; ++j) sign |= (float_bits(p[j]) >> (28 - 4 * j)) & (8u << (4 * j));
  return sign;
}
// Eight float_to_e2m1 codes for non-NaN inputs (a NaN block is the caller's business).
GROUPMM_HD uint32_t e2m1x8_nonan(const float (&p)[8]) {
  return e2m1x8_magnitudes(p) | e2m1x8_signs(p);
}

// Everything needed to quantize the elements of one block. fp8 recipes: code = fp8(x * mul);
// nvfp4: code = nvfp4_code(x, code, mul); mxfp4: code = mxfp4_code(x, mul).
struct BlockQuant {
  float mul = 1.0f;        // fp8 recipes, mxfp4: the scale; nvfp4: S_enc / fp32(s_b)
  float scale_inv = 1.0f;  // fp8_current / fp8_block: the stored fp32 scale
  uint8_t code = 0;        // mxfp8, mxfp4: e8m0 exponent; nvfp4: e4m3 block scale
};

// amax_block: canonical amax bits of the block (ignored by fp8_current); expert_amax: the
// expert's amax (fp8_current, nvfp4).
GROUPMM_HD BlockQuant make_block_quant(QuantRecipe recipe, bool e5m2, bool pow2,
                                       uint32_t amax_block, float expert_amax) {
  BlockQuant q;
  if (recipe == QuantRecipe::fp8_current) {
    const ScalePair s = fp8_current_scale(expert_amax, e5m2, pow2);
    q.mul = s.scale;
    q.scale_inv = s.scale_inv;
  } else if (recipe == QuantRecipe::fp8_block) {
    const ScalePair s = fp8_block_scale(bits_float(amax_block), e5m2, pow2);
    q.mul = s.scale;
    q.scale_inv = s.scale_inv;
  } else if (recipe == QuantRecipe::mxfp8) {
    q.code = mx_e8m0(bits_float(amax_block), e5m2);
    q.mul = mx_quant_mul(q.code);
  } else if (recipe == QuantRecipe::mxfp4) {
    q.code = mxfp4_e8m0(bits_float(amax_block));
    q.mul = mx_quant_mul(q.code);
  } else {
    const float s_enc = nvfp4_s_enc(expert_amax);
    q.code = nvfp4_block_scale(bits_float(amax_block), s_enc / kE2M1Max);
    q.mul = nvfp4_elem_scale(s_enc, e4m3_to_float(q.code));
  }
  return q;
}

// ================================================================================================
// Fast twins: the kernels' forms of the rules above
// ================================================================================================
// Each is equal to its rule over the inputs the kernels give it (stated per function). On the
// host a twin runs the rule's own arithmetic where the device uses an instruction the host lacks.

// a * b and a * b + c, each rounded once: never contracted into (or out of) an fma.
GROUPMM_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
GROUPMM_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// min(x, m) that keeps a NaN x (fminf would return m).
GROUPMM_HD float min_keep_nan(float x, float m) {
#if defined(__CUDA_ARCH__)
  float d;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(x), "f"(m));
  return d;
#else
  return x > m ? m : x;
#endif
}

// a / b rounded to nearest even, for b and 1 / b normal, a >= 2^-64 and a / b normal. Device:
// div.rn.f32 compiles to a fast path (MUFU.RCP, one Newton step on the reciprocal, the quotient
// and one residual correction: correctly rounded whenever the operands and the result are normal
// and far from overflow) plus FCHK and a branch to a slow-path subroutine for the other cases;
// in the block-scale code that branch and its reconvergence cost as much as the division. The
// callers keep the operands in range by power-of-two prescaling (exact) and take the fast path
// alone. tests/cuda/test_block_scale_gpu.cu runs every caller over every input it can get.
GROUPMM_HD float div_rn_inrange(float a, float b) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(b));
  const float y = __fmaf_rn(r, __fmaf_rn(-b, r, 1.0f), r);
  const float q = __fmul_rn(a, y);
  return __fmaf_rn(__fmaf_rn(-b, q, a), y, q);
#else
  return a / b;
#endif
}

// e4m3_to_float(c). Device: one cvt through f16 (every e4m3 value is exact in f16); a NaN code
// gives a NaN with another payload.
GROUPMM_HD float e4m3_decode(uint8_t c) {
#if defined(__CUDA_ARCH__)
  uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(static_cast<unsigned short>(c)));
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h2 & 0xFFFFu)));
#else
  return e4m3_to_float(c);
#endif
}

// fp8_encode(a) | fp8_encode(b) << 8 for operands that are not negative NaNs (products of GPU
// arithmetic never are). Device: one cvt.rn.satfinite. The format is a template parameter (of
// the kernels): a run-time flag put every conversion in its own basic block behind a uniform
// branch, which serialized them.
template <bool kE5m2>
GROUPMM_HD uint32_t fp8x2_encode(float a, float b) {
#if defined(__CUDA_ARCH__)
  uint16_t r;
  if constexpr (kE5m2) {
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %2, %1;" : "=h"(r) : "f"(a), "f"(b));
  } else {
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;" : "=h"(r) : "f"(a), "f"(b));
  }
  return r;
#else
  return fp8_encode(canon_nan(a), kE5m2) | (uint32_t(fp8_encode(canon_nan(b), kE5m2)) << 8);
#endif
}
// Four elements times mul -> one word of fp8 codes (element 0 in the low byte).
template <bool kE5m2>
GROUPMM_HD uint32_t fp8x4_encode(float a, float b, float c, float d, float mul) {
  return fp8x2_encode<kE5m2>(a * mul, b * mul) | (fp8x2_encode<kE5m2>(c * mul, d * mul) << 16);
}

// Eight float_to_e2m1(x[j] * mul) in one word (element j in nibble j), for a block whose
// elements satisfy |x| <= the block amax (finite or Inf) and whose multiplier is positive and
// finite, or NaN (its amax was NaN). A NaN multiplier makes every product NaN, i.e. code 7;
// otherwise no product can be NaN, so the NaN-free encoder applies. `sign`: the sign bits of the
// codes (e2m1x8_signs of the products, which are the inputs' own: a positive multiplier).
GROUPMM_HD uint32_t e2m1_encode8_signed(const float (&x)[8], float mul, uint32_t sign) {
  float p[8];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int j = 0; j < 8; ++j) p[j] = x[j] * mul;
  return mul != mul ? 0x77777777u : (e2m1x8_magnitudes(p) | sign);
}
GROUPMM_HD uint32_t e2m1_encode8(const float (&x)[8], float mul) {
  float p[8];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int j = 0; j < 8; ++j) p[j] = x[j] * mul;
  return mul != mul ? 0x77777777u : e2m1x8_nonan(p);
}
// Eight nvfp4_code(x[j], s_b, mul) (the e2m1 encoder; a zero block scale encodes 0) and eight
// mxfp4_code(x[j], mul), for blocks as above.
GROUPMM_HD uint32_t nvfp4_encode8_signed(const float (&x)[8], float mul, uint8_t s_b,
                                         uint32_t sign) {
  const uint32_t w = e2m1_encode8_signed(x, mul, sign);
  return (s_b & 0x7Fu) == 0 ? 0u : w;
}
GROUPMM_HD uint32_t nvfp4_encode8(const float (&x)[8], float mul, uint8_t s_b) {
  const uint32_t w = e2m1_encode8(x, mul);
  return (s_b & 0x7Fu) == 0 ? 0u : w;
}
// The encoder of an fp4 recipe (code: its BlockQuant::code).
template <QuantRecipe kRecipe>
GROUPMM_HD uint32_t fp4_encode8(const float (&x)[8], float mul, uint8_t code) {
  static_assert(is_fp4(kRecipe), "an fp4 recipe");
  if constexpr (kRecipe == QuantRecipe::nvfp4) return nvfp4_encode8(x, mul, code);
  return e2m1_encode8(x, mul);
}
template <QuantRecipe kRecipe>
GROUPMM_HD uint32_t fp4_encode8_signed(const float (&x)[8], float mul, uint8_t code,
                                       uint32_t sign) {
  static_assert(is_fp4(kRecipe), "an fp4 recipe");
  if constexpr (kRecipe == QuantRecipe::nvfp4) return nvfp4_encode8_signed(x, mul, code, sign);
  return e2m1_encode8_signed(x, mul, sign);
}

// The per-expert part of make_block_quant, computed once per expert.
struct ExpertQuant {
  float mul = 1.0f;    // fp8_current: the expert's scale
  float s_enc = 1.0f;  // nvfp4: S_enc and S_enc / 6
  float s_enc_div6 = 1.0f / 6.0f;
  // nvfp4: S_enc * 2^k and 2^-k (k = -64, 0, 64), so that every per-block S_enc / s_b (s_b in
  // [2^-9, 448]) is in div_rn_inrange's range; S_enc is in [2^-117, FLT_MAX].
  float s_enc_scaled = 1.0f, s_enc_unscale = 1.0f;
};
GROUPMM_HD void set_nvfp4_s_enc(ExpertQuant& e, float s_enc) {
  e.s_enc = s_enc;
  e.s_enc_div6 = e.s_enc / kE2M1Max;  // the same fp32 operation as make_block_quant
  const float k = e.s_enc >= 0x1p64f ? 0x1p-64f : (e.s_enc < 0x1p-64f ? 0x1p64f : 1.0f);
  e.s_enc_scaled = e.s_enc * k;
  e.s_enc_unscale = 1.0f / k;
}
// Sets the fields recipe kRecipe uses from the expert's amax (the others are left as they are).
template <QuantRecipe kRecipe>
GROUPMM_HD void set_expert_quant(ExpertQuant& e, float expert_amax, bool e5m2, bool pow2) {
  if constexpr (kRecipe == QuantRecipe::fp8_current) {
    e.mul = fp8_current_scale(expert_amax, e5m2, pow2).scale;
  } else if constexpr (kRecipe == QuantRecipe::nvfp4) {
    set_nvfp4_s_enc(e, nvfp4_s_enc(expert_amax));
  }
}

// nvfp4_elem_scale(S_enc, fp32(s_b)) for s_b != 0: the division on the prescaled S_enc, scaled
// back (exact, or Inf past FLT_MAX: clamped). Device: a zero s_b gives NaN instead of FLT_MAX;
// its block encodes as 0 either way (nvfp4_encode8).
GROUPMM_HD float nvfp4_block_mul(const ExpertQuant& e, uint8_t s_b) {
  const float s = div_rn_inrange(e.s_enc_scaled, e4m3_decode(s_b));
  return min_keep_nan(mul_rn(s, e.s_enc_unscale), 3.40282347e38f);
}

// make_block_quant(kRecipe, e5m2, pow2, amax_block, amax_g) with the per-expert part taken from
// e = set_expert_quant<kRecipe>(amax_g), for every field the recipe's encoders read (fp8_current:
// mul; its scale_inv is per expert). The same operations as the rules, written without their early
// returns: the compiler turned those into branches and reconvergence points that cost ~35
// instructions per block.
template <QuantRecipe kRecipe>
GROUPMM_HD BlockQuant block_quant_fast(uint32_t amax_block, const ExpertQuant& e, bool e5m2,
                                       bool pow2) {
  BlockQuant q;
  if constexpr (kRecipe == QuantRecipe::fp8_current) {
    q.mul = e.mul;
  } else if constexpr (kRecipe == QuantRecipe::fp8_block) {
    // fp8_block_scale: {1, 1} unless 0 < amax < Inf and v = amax / fmax is normal. v by one
    // residual correction of amax * RN(1 / fmax) (Markstein: exact; a subnormal quotient stays
    // subnormal); fmax / amax by div_rn_inrange, amax >= 2^64 prescaled by 2^-64 (amax >= 2^-117
    // when v is normal, so 1 / amax stays normal).
    const float fmax = e5m2 ? kE5M2Max : kE4M3Max;
    const float rfmax = e5m2 ? (1.0f / kE5M2Max) : (1.0f / kE4M3Max);
    const float a = bits_float(amax_block);
    const float q0 = mul_rn(a, rfmax);
    const float v = fma_rn(fma_rn(-fmax, q0, a), rfmax, q0);
    const uint32_t vb = float_bits(v);
    const bool ok = amax_block != 0u && amax_block < 0x7F800000u && (vb >> 23) != 0u;
    float mul, inv;
    if (pow2) {  // round v up to a power of two 2^(E - 127); 1 / it = 2^(127 - E) (E <= 247)
      const uint32_t E = (vb >> 23) + ((vb & 0x7FFFFFu) != 0u ? 1u : 0u);
      inv = bits_float(E << 23);
      mul = bits_float((254u - E) << 23);
    } else {
      inv = v;
      const float k = a >= 0x1p64f ? 0x1p-64f : 1.0f;
      mul = mul_rn(div_rn_inrange(fmax, mul_rn(a, k)), k);
    }
    q.mul = ok ? mul : 1.0f;
    q.scale_inv = ok ? inv : 1.0f;
  } else if constexpr (kRecipe == QuantRecipe::mxfp8 || kRecipe == QuantRecipe::mxfp4) {
    // mx_e8m0 / mxfp4_e8m0 (float_to_e8m0_roundup of amax / fmax) and mx_quant_mul.
    const float rcp = kRecipe == QuantRecipe::mxfp4 ? (1.0f / kE2M1Max)
                      : e5m2                        ? (1.0f / kE5M2Max)
                                                    : (1.0f / kE4M3Max);
    const float v = bits_float(amax_block) * rcp;
    const uint32_t u = float_bits(v) & 0x7FFFFFFFu;
    uint32_t x = (u + 0x7FFFFFu) >> 23;  // exponent, +1 if any mantissa bit
    x = x < 254u ? x : 254u;
    x = u > 0x7F800000u ? 255u : x;  // NaN
    const uint32_t m = x >= 254u ? (x == 255u ? 0x7FC00000u : 0x00400000u) : (254u - x) << 23;
    q.code = static_cast<uint8_t>(x);
    q.mul = bits_float(m);
  } else {
    // nvfp4_block_scale with the e4m3 encode done by the fp8 data conversion (the same code).
    q.code = static_cast<uint8_t>(
        fp8x2_encode<false>(mul_rn(bits_float(amax_block), e.s_enc_div6), 0.0f));
    q.mul = nvfp4_block_mul(e, q.code);
  }
  return q;
}

}  // namespace groupmm::qnum
