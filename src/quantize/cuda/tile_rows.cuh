// The rowwise copy of one tile: one 1x32 slab per thread, 4 lanes per row.
//
// Lane s of a row reads two 16-element runs: fp4 [32s, 32s + 32) (nvfp4: its two 1x16 blocks;
// mxfp4: its 1x32 block; one 16-byte store of codes); fp8 [16s, 16s + 16) and [64 + 16s, 80 + 16s),
// so that each of the two 16-byte stores of a warp writes 64 contiguous bytes of each of 8 rows
// (whole sectors). mxfp8 blocks (1x32) then span two lanes: s / 2 and 2 + s / 2 (one shuffle);
// fp8_block's 1x128 block spans the row's 4 lanes (two shuffles).
#pragma once

#include "quantize/cuda/tile_amax.cuh"
#include "quantize/cuda/tile_store.cuh"

namespace groupmm::cuda::tile {

template <class V>
__device__ __forceinline__ void quantize_rows(const TileParams& p, const uint8_t* buf,
                                              const ItemInfo& it, const TileCoords& c,
                                              const ExpertInfo& cur, const uint32_t* block_amax,
                                              int tid, int lane, int warp, int row_elems) {
  using E = typename V::E;
  constexpr QuantRecipe kRecipe = V::kRecipe;
  constexpr bool kFp4 = V::kFp4;
  const int64_t K = p.K;
  const qnum::Layout& L = p.L;
  const qnum::Geom& g = cur.g;
  {
    const int r = warp * 8 + lane / 4, s = lane % 4;
    const int e_run0 = kFp4 ? 32 * s : 16 * s, e_run1 = e_run0 + (kFp4 ? 16 : 64);
    typename V::Pair v[16];
    TileSmem<E>::run16(buf, r, e_run0, v);
    TileSmem<E>::run16(buf, r, e_run1, v + 8);
    uint32_t am0 = 0, am1 = 0;  // amax of run 0 / run 1 (or of their blocks)
    if constexpr (kRecipe != QuantRecipe::fp8_current) {
      if (!L.block_2d) {
        typename V::Pair m0 = E::pair_zero(), m1 = E::pair_zero();
#pragma unroll
        for (int i = 0; i < 8; ++i) m0 = E::pair_abs_max(m0, v[i]);
#pragma unroll
        for (int i = 8; i < 16; ++i) m1 = E::pair_abs_max(m1, v[i]);
        am0 = max(E::pair_lo_abs(m0), E::pair_hi_abs(m0));
        am1 = max(E::pair_lo_abs(m1), E::pair_hi_abs(m1));
        if constexpr (kRecipe == QuantRecipe::fp8_block) {  // 1x128: the 4 lanes of the row
          am0 = max(am0, am1);
          am0 = max(am0, __shfl_xor_sync(0xFFFFFFFFu, am0, 1));
          am0 = max(am0, __shfl_xor_sync(0xFFFFFFFFu, am0, 2));
        } else if constexpr (kRecipe == QuantRecipe::mxfp8) {  // 1x32: lanes s, s ^ 1
          am0 = max(am0, __shfl_xor_sync(0xFFFFFFFFu, am0, 1));
          am1 = max(am1, __shfl_xor_sync(0xFFFFFFFFu, am1, 1));
        } else if constexpr (kRecipe == QuantRecipe::mxfp4) {  // 1x32: the lane's two runs
          am0 = am1 = max(am0, am1);
        }
      } else if constexpr (V::kNvfp4) {
        am0 = block_amax[(r / 16) * 8 + 2 * s];
        am1 = block_amax[(r / 16) * 8 + 2 * s + 1];
      } else {
        am0 = tile_amax_2d(block_amax);
      }
    }
    constexpr bool kTwoBlocks = V::kNvfp4 || kRecipe == QuantRecipe::mxfp8;
    const qnum::BlockQuant q0 = block_quant<kRecipe>(am0, cur, L);
    const qnum::BlockQuant q1 = kTwoBlocks ? block_quant<kRecipe>(am1, cur, L) : q0;
    const bool row_ok = r < c.valid_rows;
    const int64_t e = (g.start + c.row0) * K + c.col0 + r * row_elems;  // row r, column col0
    const bool ok0 = row_ok && e_run0 < c.valid_cols, ok1 = row_ok && e_run1 < c.valid_cols;
    if constexpr (kFp4) {
      uint32_t w[4];
#pragma unroll
      for (int h = 0; h < 4; ++h) {
        const qnum::BlockQuant& q = h < 2 ? q0 : q1;
        w[h] = fp4_row_word<E, kRecipe>(v + 4 * h, q.mul, q.code);
      }
      uint8_t* const dst = p.q_row + (e + e_run0) / 2;
      // K % 32 == 0: every row's 16-byte pieces are 16-byte aligned.
      const bool v16 = (reinterpret_cast<uintptr_t>(p.q_row) & 15) == 0 && (K & 31) == 0;
      if (v16 && ok1) {
        __stcs(reinterpret_cast<uint4*>(dst), make_uint4(w[0], w[1], w[2], w[3]));
      } else {
        if (ok0) __stcs(reinterpret_cast<uint2*>(dst), make_uint2(w[0], w[1]));
        if (ok1) __stcs(reinterpret_cast<uint2*>(dst + 8), make_uint2(w[2], w[3]));
      }
      uint8_t* sr = static_cast<uint8_t*>(p.s_row);
      if constexpr (kRecipe == QuantRecipe::mxfp4) {  // one 1x32 block per lane
        if (ok0)
          sr[qnum::row_scale_index_in_tile(L, g, c.lt, r,
                                           static_cast<int>((c.col0 + e_run0) / 32))] = q0.code;
      } else {
        const int64_t sc = (c.col0 + e_run0) / 16;  // even
        const int64_t si = qnum::row_scale_index_in_tile(L, g, c.lt, r, static_cast<int>(sc));
        // Scales sc, sc + 1 are adjacent in both layouts (sc even; plain: K / 16 even).
        if (ok1 && ((reinterpret_cast<uintptr_t>(sr) | uintptr_t(si)) & 1) == 0) {
          *reinterpret_cast<uint16_t*>(sr + si) =
              static_cast<uint16_t>(q0.code | (uint32_t(q1.code) << 8));
        } else {
          if (ok0) sr[si] = q0.code;
          if (ok1)
            sr[qnum::row_scale_index_in_tile(L, g, c.lt, r, static_cast<int>(sc) + 1)] = q1.code;
        }
      }
    } else {
      uint32_t w[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float2 a = E::pair_to_float2(v[2 * i]), b = E::pair_to_float2(v[2 * i + 1]);
        w[i] = qnum::fp8x4_encode<V::kE5m2>(a.x, a.y, b.x, b.y, i < 4 ? q0.mul : q1.mul);
      }
      if (ok0)
        __stcs(reinterpret_cast<uint4*>(p.q_row + e + e_run0), make_uint4(w[0], w[1], w[2], w[3]));
      if (ok1)
        __stcs(reinterpret_cast<uint4*>(p.q_row + e + e_run1), make_uint4(w[4], w[5], w[6], w[7]));
      if constexpr (kRecipe == QuantRecipe::fp8_block) {
        float* sr = static_cast<float*>(p.s_row);
        if (!L.fp8_2d && row_ok && s == 0)
          sr[qnum::row_scale_index_in_tile(L, g, c.lt, r, c.ct)] = q0.scale_inv;
        if (L.fp8_2d && tid == 0)
          sr[qnum::row_scale_index(L, g, c.row0, c.col0 / 128)] = q0.scale_inv;
      } else if constexpr (kRecipe == QuantRecipe::mxfp8) {
        // Lane s stores block b = s / 2 (s even, run 0) or 2 + s / 2 (s odd, run 1).
        const int b = (s & 1) ? 2 + s / 2 : s / 2;
        if (row_ok && 32 * b < c.valid_cols)
          static_cast<uint8_t*>(
              p.s_row)[qnum::row_scale_index_in_tile(L, g, c.lt, r, 4 * c.ct + b)] =
              (s & 1) ? q1.code : q0.code;
      }
    }
  }
  // This tile's share of the expert's zero padding (swizzled).
  if (V::kMaySwizzle && (it.flags & kPadRow))
    pad_row_scales(p, g, c.row0, c.col0, c.ct, c.valid_rows, tid);
}

}  // namespace groupmm::cuda::tile
