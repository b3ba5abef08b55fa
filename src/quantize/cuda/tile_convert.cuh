// The tile kernel's conversions: the current expert's scalars, block scales (qnum's fast twins),
// and packed fp8 / e2m1 codes from the tile's element pairs.
#pragma once

#include "numerics/quantize.hpp"
#include "kernels/common/element.cuh"
#include "kernels/common/ptx.cuh"
#include "quantize/cuda/tile_config.cuh"

namespace groupmm::cuda::tile {

// The expert of a CTA's current item, reloaded only when the item moves to another expert.
struct ExpertInfo {
  qnum::Geom g;
  int64_t gi = -1;
  int64_t nb = 0;           // column blocks of the expert: ceil(rows / cb)
  qnum::ExpertQuant quant;  // the per-expert part of its block quantization
};

// gi's geometry g (from the scheduler's plan copy); amax: its amax (fp8_current, nvfp4).
template <QuantRecipe kRecipe>
__device__ __forceinline__ void load_expert(const TileParams& p, int64_t gi, const qnum::Geom& g,
                                            ExpertInfo& info, float amax = 0.0f) {
  info.gi = gi;
  info.g = g;
  info.nb = qnum::col_blocks(p.L, info.g.rows);
  qnum::set_expert_quant<kRecipe>(info.quant, amax, p.L.e5m2, p.L.pow2);
}

// The block quantization of a block with canonical amax bits `amax_bits` in the current expert.
template <QuantRecipe kRecipe>
__device__ __forceinline__ qnum::BlockQuant block_quant(uint32_t amax_bits,
                                                        const ExpertInfo& expert,
                                                        const qnum::Layout& L) {
  return qnum::block_quant_fast<kRecipe>(amax_bits, expert.quant, L.e5m2, L.pow2);
}

// ---- fp4 with 16-bit inputs: the e2m1 sign bits straight from the input words ------------------
// The multiplier is positive (finite, at most FLT_MAX) or NaN, and a NaN multiplier overrides the
// word with all 7s; otherwise sign(x * mul) = sign(x) for every x (zeros and underflows included:
// an IEEE product's sign is the XOR of its operands' signs), so nibble j's bit 3 is the sign bit
// of input element j. prmt with a selector nibble >= 8 replicates the sign of the selected byte.

// P = sign bytes (0x00 / 0xFF) of elements 0, 2, 4, 6; Q = of elements 1, 3, 5, 7.
__device__ __forceinline__ uint32_t sign_nibbles(uint32_t P, uint32_t Q) {
  return (P & 0x08080808u) | (Q & 0x80808080u);
}
// Eight consecutive elements of a row: pair words w0..w3 (element 2i in the low half of wi).
__device__ __forceinline__ uint32_t row_signs8(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3) {
  const uint32_t a = prmt(w0, w1, 0xFBD9u);  // s0 s2 s1 s3
  const uint32_t b = prmt(w2, w3, 0xFBD9u);  // s4 s6 s5 s7
  return sign_nibbles(prmt(a, b, 0x5410u), prmt(a, b, 0x7632u));
}
// Rows 0..7 of a column pair (u[j]: row j's pair): the sign nibbles of the low column (`lo`) and
// of the high column (`hi`).
__device__ __forceinline__ void column_signs8(const uint32_t* u, uint32_t& lo, uint32_t& hi) {
  const uint32_t a = prmt(u[0], u[2], 0xFBD9u);  // L0 L2 H0 H2
  const uint32_t b = prmt(u[4], u[6], 0xFBD9u);  // L4 L6 H4 H6
  const uint32_t c = prmt(u[1], u[3], 0xFBD9u);  // L1 L3 H1 H3
  const uint32_t d = prmt(u[5], u[7], 0xFBD9u);  // L5 L7 H5 H7
  lo = sign_nibbles(prmt(a, b, 0x5410u), prmt(c, d, 0x5410u));
  hi = sign_nibbles(prmt(a, b, 0x7632u), prmt(c, d, 0x7632u));
}

// Eight consecutive elements of a row (4 pairs) -> one word of e2m1 codes (nvfp4, mxfp4; code:
// the block's BlockQuant::code).
template <class E, QuantRecipe kRecipe>
__device__ __forceinline__ uint32_t fp4_row_word(const typename E::Pair* v, float mul,
                                                 uint8_t code) {
  float f[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 x2 = E::pair_to_float2(v[i]);
    f[2 * i] = x2.x;
    f[2 * i + 1] = x2.y;
  }
  if constexpr (sizeof(typename E::Storage) == 4) {
    return qnum::fp4_encode8<kRecipe>(f, mul, code);
  } else {
    return qnum::fp4_encode8_signed<kRecipe>(f, mul, code, row_signs8(v[0], v[1], v[2], v[3]));
  }
}

}  // namespace groupmm::cuda::tile
