// The columnwise copy of one tile and its bias-gradient sums: a warp owns 8 whole columns.
//
// Lane (rg, col_pair) = (lane / 4, lane % 4) holds column pair 4 warp + col_pair (tile columns
// cc, cc + 1) over rows [16 rg, 16 rg + 16). A column's 128 rows lie in one warp, so the
// 32x1 / 128x1 block amax and the bias-gradient sum merge by shuffles (no CTA barrier), and the 8
// lanes of a column write its codes as 8 pieces of one contiguous run of the expert's [K, m_g]
// block straight from registers (tile_store.cuh; no transposed staging in shared memory).
#pragma once

#include "quantize/cuda/tile_amax.cuh"
#include "quantize/cuda/tile_store.cuh"

namespace groupmm::cuda::tile {

// The bias-gradient sums of columns cc, cc + 1 over the tile (dbias.hpp's order): per 16-row
// segment a sequential sum from +0 (rows past the expert are zero-filled), then the 8 segment
// sums in row order from +0. Lanes rg == 0 store them into the tile's partial row.
template <class E>
__device__ __forceinline__ void column_dbias_sums(const TileParams& p, const TileCoords& c,
                                                  const typename E::Pair (&v)[TileConfig::kColSeg],
                                                  int col_pair, int rg, int cc) {
  float sx = 0.0f, sy = 0.0f;
#pragma unroll
  for (int j = 0; j < TileConfig::kColSeg; ++j) {
    const float2 f = E::pair_to_float2(v[j]);
    sx += f.x;
    sy += f.y;
  }
  float tx = 0.0f, ty = 0.0f;
#pragma unroll
  for (int rs = 0; rs < TileConfig::kColSegs; ++rs) {
    tx += __shfl_sync(0xFFFFFFFFu, sx, col_pair + 4 * rs);
    ty += __shfl_sync(0xFFFFFFFFu, sy, col_pair + 4 * rs);
  }
  if (rg == 0) {
    float* const dp = p.dbias_partial + c.t * p.K + c.col0 + cc;
    if (cc < c.valid_cols) dp[0] = tx;
    if (cc + 1 < c.valid_cols) dp[1] = ty;
  }
}

template <class V>
__device__ __forceinline__ void quantize_columns(const TileParams& p, const uint8_t* buf,
                                                 const ItemInfo& it, const TileCoords& c,
                                                 const ExpertInfo& cur, const uint32_t* block_amax,
                                                 int tid, int lane, int warp) {
  using E = typename V::E;
  using Pair = typename V::Pair;
  constexpr QuantRecipe kRecipe = V::kRecipe;
  constexpr bool kFp4 = V::kFp4;
  const qnum::Layout& L = p.L;
  const qnum::Geom& g = cur.g;
  const bool odd_fp4 = kFp4 && (g.rows & 1);  // packed nibbles would belong to two rows
  if (kFp4 && p.colwise && odd_fp4 && c.lt == 0 && c.ct == 0 && tid == 0)
    report_fault(p.status, kFaultSplitAlignment, OpId::group_quantize, static_cast<int32_t>(cur.gi),
                 g.rows);
  const bool do_col = p.colwise && !odd_fp4;
  const bool do_sum = p.dbias_partial != nullptr;
  if (!do_col && !do_sum) return;
  const int col_pair = lane & 3, rg = lane >> 2;
  const int cpw = 4 * warp + col_pair;  // column pair
  const int cc = 2 * cpw;               // its first tile column
  Pair v[TileConfig::kColSeg];
#pragma unroll
  for (int j = 0; j < TileConfig::kColSeg; ++j) v[j] = TileSmem<E>::pair(buf, rg * 16 + j, cpw);
  if (do_sum) column_dbias_sums<E>(p, c, v, col_pair, rg, cc);
  if (!do_col) return;

  // Column block amax of columns cc, cc + 1: merged raw (canon(max) = max(canon)).
  uint32_t am[2] = {0, 0};
  if constexpr (kRecipe != QuantRecipe::fp8_current) {
    if (!L.block_2d) {
      Pair mc = E::pair_zero();
#pragma unroll
      for (int j = 0; j < TileConfig::kColSeg; ++j) mc = E::pair_abs_max(mc, v[j]);
      if constexpr (kRecipe == QuantRecipe::mxfp8 || kRecipe == QuantRecipe::mxfp4) {
        // 32x1: row groups 2b, 2b + 1
        mc = E::pair_max(mc, shfl_xor_pair(mc, 4));
      } else if constexpr (kRecipe == QuantRecipe::fp8_block) {  // 128x1: all 8 row groups
        mc = E::pair_max(mc, shfl_xor_pair(mc, 4));
        mc = E::pair_max(mc, shfl_xor_pair(mc, 8));
        mc = E::pair_max(mc, shfl_xor_pair(mc, 16));
      }
      am[0] = E::pair_lo_abs(mc);
      am[1] = E::pair_hi_abs(mc);
    } else if constexpr (V::kNvfp4) {  // 16x16: row block rg, column block warp / 2
      am[0] = am[1] = block_amax[rg * 8 + warp / 2];
    } else {
      am[0] = am[1] = tile_amax_2d(block_amax);
    }
  }
  const qnum::BlockQuant qk[2] = {block_quant<kRecipe>(am[0], cur, L),
                                  block_quant<kRecipe>(am[1], cur, L)};
  // Element (row row0, column col0 + cc) of the expert's [K, m_g] block: the start of the
  // column's run (store_col_run). fp4: every term is even (K even, m_g even here), so runs start
  // on a byte.
  const int64_t ebase = p.K * g.start + (c.col0 + cc) * g.rows + c.row0;
  if constexpr (kFp4) {
    uint32_t w[2][2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float e0[8], e1[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float2 x2 = E::pair_to_float2(v[8 * h + j]);
        e0[j] = x2.x;
        e1[j] = x2.y;
      }
      if constexpr (V::kInBytes == 4) {
        w[0][h] = qnum::fp4_encode8<kRecipe>(e0, qk[0].mul, qk[0].code);
        w[1][h] = qnum::fp4_encode8<kRecipe>(e1, qk[1].mul, qk[1].code);
      } else {  // rows 8h + j; the signs of column cc / cc + 1
        uint32_t sign_lo, sign_hi;
        column_signs8(v + 8 * h, sign_lo, sign_hi);
        w[0][h] = qnum::fp4_encode8_signed<kRecipe>(e0, qk[0].mul, qk[0].code, sign_lo);
        w[1][h] = qnum::fp4_encode8_signed<kRecipe>(e1, qk[1].mul, qk[1].code, sign_hi);
      }
    }
#pragma unroll
    for (int k = 0; k < 2; ++k)
      store_col_run<2>(p.q_col + (ebase + k * g.rows) / 2, c.valid_rows / 2, cc + k < c.valid_cols,
                       col_pair, rg, w[k]);
  } else {
    uint32_t w[2][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 a = E::pair_to_float2(v[4 * i]), b = E::pair_to_float2(v[4 * i + 1]),
                   d = E::pair_to_float2(v[4 * i + 2]), f = E::pair_to_float2(v[4 * i + 3]);
      w[0][i] = qnum::fp8x4_encode<V::kE5m2>(a.x, b.x, d.x, f.x, qk[0].mul);
      w[1][i] = qnum::fp8x4_encode<V::kE5m2>(a.y, b.y, d.y, f.y, qk[1].mul);
    }
#pragma unroll
    for (int k = 0; k < 2; ++k)
      store_col_run<4>(p.q_col + ebase + k * g.rows, c.valid_rows, cc + k < c.valid_cols, col_pair,
                       rg, w[k]);
  }
  // Scales. Entries past K or past the expert's column blocks (swizzle padding) are written by
  // pad_col_scales.
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int col = cc + k;
    if (col >= c.valid_cols) continue;
    if constexpr (kRecipe == QuantRecipe::fp8_block) {
      float* sc = static_cast<float*>(p.s_col);
      if (!L.fp8_2d && rg == 0)
        sc[qnum::col_scale_index(L, g, cur.nb, c.col0 + col, c.lt)] = qk[k].scale_inv;
      if (L.fp8_2d && tid == 0 && k == 0)
        sc[qnum::col_scale_index(L, g, cur.nb, c.col0 / 128, c.lt)] = qk[0].scale_inv;
    } else if constexpr (kRecipe == QuantRecipe::mxfp8 || kRecipe == QuantRecipe::mxfp4) {
      // block j = 4 lt + rg / 2
      const int64_t j = c.lt * 4 + rg / 2;
      if ((rg & 1) == 0 && j < cur.nb)
        static_cast<uint8_t*>(p.s_col)[qnum::col_scale_index(L, g, cur.nb, c.col0 + col, j)] =
            qk[k].code;
    } else if constexpr (V::kNvfp4) {  // block j = 8 lt + rg
      const int64_t j = c.lt * 8 + rg;
      if (j < cur.nb)
        static_cast<uint8_t*>(p.s_col)[qnum::col_scale_index(L, g, cur.nb, c.col0 + col, j)] =
            qk[k].code;
    }
  }
  if (V::kMaySwizzle && (it.flags & kPadCol))
    pad_col_scales(p, cur, c.row0, c.lt, c.col0, c.ct, tid);
}

}  // namespace groupmm::cuda::tile
