// Scalar rules and layout index functions of grouped quantization, shared by the CPU reference and
// the CUDA kernels (host + device) so the two agree bit for bit by construction. docs/numerics.md.
#pragma once

#include <cmath>
#include <cstdint>

#include "groupmm/convert.hpp"

namespace groupmm::qnum {

enum Recipe : int { kFp8Current = 0, kFp8Block = 1, kMxfp8 = 2, kNvfp4 = 3 };

// ---- amax: canonical |x| bits (every NaN -> 0x7FC00000), merged with an unsigned max -----------
// For non-negative floats the unsigned order of the bits is the numeric order and NaN sorts above
// Inf, so a block containing a NaN has a NaN amax, on any backend, in any order.
GROUPMM_HD uint32_t abs_bits(float x) {
  const uint32_t a = float_bits(x) & 0x7FFFFFFFu;
  return a > 0x7F800000u ? 0x7FC00000u : a;
}
GROUPMM_HD uint32_t amax_merge(uint32_t a, uint32_t b) {
  return a > b ? a : b;
}
GROUPMM_HD bool is_finite_bits(uint32_t abs) {
  return abs < 0x7F800000u;
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

GROUPMM_HD float fp8_max(bool e5m2) {
  return e5m2 ? kE5M2Max : kE4M3Max;
}
GROUPMM_HD uint8_t to_fp8_soft(float v, bool e5m2) {
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
// Eight float_to_e2m1 codes packed in a word (element j in nibble j), for the kernels' inner
// loop: ~10 integer/fp32 operations per element, no branches. Bit-identical to convert.hpp's
// float_to_e2m1 (the pinned rule) for every non-NaN input (tests/cpu/test_quantize_formats.cpp
// sweeps them); NaN inputs are the caller's business (a NaN block encodes as all 7s).
// The fp32 adder does the rounding: |p| saturated at 6 (code 7 either way), E = its exponent
// clamped to >= 0 (E2M1 steps: 0.5 below 2, then 1, 2), the power of two m = 2^(E+22) has ulp
// 2^(E-1), so |p| + m rounds |p| to the E2M1 step with ties to even and leaves the number of
// steps n in the mantissa field; code = n + 2E. The 2E + 254 terms are summed into the word as
// (n + (bits(m) >> 22)) << 4j and the 254s are subtracted once (exact: the sum is linear mod
// 2^32 and every final nibble is <= 7); the sign bits are ORed in last.
GROUPMM_HD uint32_t e2m1x8_nonan(const float (&p)[8]) {
  uint32_t w = 0, sign = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int j = 0; j < 8; ++j) {
    const uint32_t u = float_bits(p[j]);
    const float a = fminf(fabsf(p[j]), kE2M1Max);
    uint32_t e = float_bits(a) & 0x7F800000u;
    e = e < 0x3F800000u ? 0x3F800000u : e;
    const uint32_t n = float_bits(a + bits_float(e + (22u << 23))) & 0x7FFFFFu;
    w += (n + (e >> 22)) << (4 * j);
    sign |= (u >> (28 - 4 * j)) & (8u << (4 * j));
  }
  return (w - 254u * 0x11111111u) | sign;
}

// Element code; `scale` = nvfp4_elem_scale(S_enc, fp32(s_b)). A zero block scale encodes 0.
GROUPMM_HD uint8_t nvfp4_code(float x, uint8_t s_b, float scale) {
  if ((s_b & 0x7Fu) == 0) return 0;
  return float_to_e2m1(x * scale);  // e2m1 ignores the sign of NaN
}

// Everything needed to quantize the elements of one block. fp8 recipes: code = fp8(x * mul);
// nvfp4: code = nvfp4_code(x, code, mul).
struct BlockQuant {
  float mul = 1.0f;        // fp8 recipes: the scale; nvfp4: S_enc / fp32(s_b)
  float scale_inv = 1.0f;  // fp8_current / fp8_block: the stored fp32 scale
  uint8_t code = 0;        // mxfp8: e8m0 exponent; nvfp4: e4m3 block scale
};

// amax_block: canonical amax bits of the block (ignored by fp8_current); expert_amax: the
// expert's amax (fp8_current, nvfp4).
GROUPMM_HD BlockQuant make_block_quant(int recipe, bool e5m2, bool pow2, uint32_t amax_block,
                                       float expert_amax) {
  BlockQuant q;
  if (recipe == kFp8Current) {
    const ScalePair s = fp8_current_scale(expert_amax, e5m2, pow2);
    q.mul = s.scale;
    q.scale_inv = s.scale_inv;
  } else if (recipe == kFp8Block) {
    const ScalePair s = fp8_block_scale(bits_float(amax_block), e5m2, pow2);
    q.mul = s.scale;
    q.scale_inv = s.scale_inv;
  } else if (recipe == kMxfp8) {
    q.code = mx_e8m0(bits_float(amax_block), e5m2);
    q.mul = mx_quant_mul(q.code);
  } else {
    const float s_enc = nvfp4_s_enc(expert_amax);
    q.code = nvfp4_block_scale(bits_float(amax_block), s_enc / kE2M1Max);
    q.mul = nvfp4_elem_scale(s_enc, e4m3_to_float(q.code));
  }
  return q;
}

// ---- layouts
// -------------------------------------------------------------------------------------
GROUPMM_HD int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
GROUPMM_HD int64_t round_up(int64_t a, int64_t b) {
  return ceil_div(a, b) * b;
}
GROUPMM_HD int64_t swizzle_128x4(int64_t r, int64_t c, int64_t Kp) {
  return (r / 128) * 128 * Kp + (c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + (c % 4);
}

constexpr int kTileRows = 128;  // expert-local row tile; every swizzle block and column block
                                // boundary is a tile boundary

// One expert's derived offsets (see quantize.hpp "Layouts").
struct Geom {
  int64_t start = 0, rows = 0, tile_start = 0, cb_start = 0, cs4_start = 0;
};

// Static layout parameters of one quantized tensor.
struct Layout {
  int recipe = kMxfp8;
  int64_t K = 0;
  int rb = 32;  // rowwise block along K (fp8_current: 16, only for tiling)
  int cb = 32;  // columnwise block along M
  bool fp8_2d = false;
  bool swizzled = false;
  bool mn_major = false;  // fp8_block: scales with the token (M) dimension contiguous
  int64_t rs_ld = 0;      // mn_major rowwise scales: leading dimension (see quantize.hpp)
  bool e5m2 = false;
  bool pow2 = false;
  bool block_2d = false;
};

GROUPMM_HD int64_t row_scale_index(const Layout& L, const Geom& g, int64_t lr, int64_t sc) {
  if (L.mn_major) return sc * L.rs_ld + (L.fp8_2d ? g.tile_start + lr / 128 : g.start + lr);
  if (L.fp8_2d) return (g.tile_start + lr / 128) * (L.K / 128) + sc;
  const int64_t ncols = L.K / L.rb;
  if (!L.swizzled) return (g.start + lr) * ncols + sc;
  return swizzle_128x4(g.tile_start * 128 + lr, sc, round_up(ncols, 4));
}

// Scale (k, j) of expert g's transposed [K, m_g] block, j = block index along m (for fp8_2d k is
// the 128-column block index).
GROUPMM_HD int64_t col_scale_index(const Layout& L, const Geom& g, int64_t k, int64_t j) {
  if (L.mn_major) return (L.fp8_2d ? L.K / 128 : L.K) * (g.cb_start + j) + k;
  const int64_t nb = ceil_div(g.rows, L.cb);
  if (L.fp8_2d) return (L.K / 128) * g.cb_start + k * nb + j;
  if (!L.swizzled) return L.K * g.cb_start + k * nb + j;
  return round_up(L.K, 128) * g.cs4_start + swizzle_128x4(k, j, round_up(nb, 4));
}

// Dequantized value of element (lr, k) of expert g (index gi), read from the rowwise copy or the
// columnwise copy. scales: the block scales (fp32, e8m0 or e4m3 bytes); per_expert: scale_inv [G]
// (fp8_current) or S_enc [G] (nvfp4).
GROUPMM_HD float dequant_value(const Layout& L, const Geom& g, int64_t gi, int64_t lr, int64_t k,
                               bool col, const uint8_t* data, const void* scales,
                               const float* per_expert) {
  const int64_t e = col ? L.K * g.start + k * g.rows + lr : (g.start + lr) * L.K + k;
  int64_t si = 0;
  if (L.recipe != kFp8Current) {
    if (col) {
      si = col_scale_index(L, g, L.fp8_2d ? k / 128 : k, lr / L.cb);
    } else {
      si = row_scale_index(L, g, lr, L.fp8_2d ? k / 128 : k / L.rb);
    }
  }
  if (L.recipe == kNvfp4) {
    const uint8_t b = data[e / 2];
    const uint8_t c = (e & 1) ? static_cast<uint8_t>(b >> 4) : static_cast<uint8_t>(b & 0xFu);
    const float sbf = e4m3_to_float(static_cast<const uint8_t*>(scales)[si]);
    return canon_nan((e2m1_to_float(c) * sbf) / per_expert[gi]);
  }
  const float q = fp8_to_float(data[e], L.e5m2);
  if (L.recipe == kFp8Current) return canon_nan(q * per_expert[gi]);
  if (L.recipe == kFp8Block) return canon_nan(q * static_cast<const float*>(scales)[si]);
  return canon_nan(q * e8m0_to_float(static_cast<const uint8_t*>(scales)[si]));
}

}  // namespace groupmm::qnum
