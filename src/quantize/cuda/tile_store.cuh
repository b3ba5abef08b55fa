// The tile kernel's stores that need more than one instruction: a column's run of codes in the
// expert's [K, m_g] block, and the zero padding of swizzled scale blocks.
#pragma once

#include "numerics/byte_realign.hpp"
#include "quantize/cuda/tile_convert.cuh"
#include "quantize/cuda/tile_schedule.cuh"

namespace groupmm::cuda::tile {

// ---- columnwise run store -----------------------------------------------------------------------
// One column's codes for the tile's rows, len bytes at `run` in the expert's [K, m_g] block, held
// by the lanes col_pair + 4 rg (rg = 0..7, 4N bytes each; col_pair: the lane's column pair). The
// run starts wherever col * m_g lands, unaligned for any m_g that is not a multiple of 16 (8 for
// fp4), i.e. for nearly every real routing: the warp then realigns each run across its 8 lanes
// (qnum::store_col_run_*: vector stores of whole chunks, byte stores spread over the lanes at the
// edges). A warp whose runs are all aligned skips the realignment. Every lane calls this
// (shuffles); `ok`: this lane's column is inside the tile.
template <int N>
__device__ __forceinline__ void store_col_run(uint8_t* run, int len, bool ok, int col_pair, int rg,
                                              const uint32_t (&w)[N]) {
  constexpr int kB = 4 * N;
  uint32_t tail_words[N];
  if (__all_sync(0xFFFFFFFFu, (reinterpret_cast<uintptr_t>(run) & (kB - 1)) == 0)) {
    if (ok) qnum::store_col_run_chunk<N>(run, len, rg, 0, w);
    if (len % kB != 0) {  // warp-uniform: len is the tile's valid rows
      const int t = qnum::col_run_tail_lane<N>(len, 0);
#pragma unroll
      for (int i = 0; i < N; ++i) tail_words[i] = __shfl_sync(0xFFFFFFFFu, w[i], col_pair + 4 * t);
      if (ok) qnum::store_col_run_edges<N, true>(run, len, rg, 0, tail_words, tail_words);
    }
    return;
  }
  uint32_t next[N], realigned[N], head_words[N];
#pragma unroll
  for (int i = 0; i < N; ++i) next[i] = __shfl_down_sync(0xFFFFFFFFu, w[i], 4);  // rg + 1's
  const int b = qnum::col_run_head<N>(run);
  qnum::realign_bytes<N>(w, next, b, realigned);
  if (ok) qnum::store_col_run_chunk<N>(run, len, rg, b, realigned);
  const int t = qnum::col_run_tail_lane<N>(len, b);
#pragma unroll
  for (int i = 0; i < N; ++i) {
    head_words[i] = __shfl_sync(0xFFFFFFFFu, w[i], col_pair);
    tail_words[i] = __shfl_sync(0xFFFFFFFFu, realigned[i], col_pair + 4 * t);
  }
  if (ok) qnum::store_col_run_edges<N, false>(run, len, rg, b, head_words, tail_words);
}

// ---- swizzled scale padding (ItemInfo::flags: only swizzled layouts have padding)
// ----------------- Rowwise: this tile's share of its expert's padded block: rows past the expert's
// valid rows and scale columns past K / B (the last column tile owns columns up to Kp).
__device__ __forceinline__ void pad_row_scales(const TileParams& p, const qnum::Geom& g,
                                               int64_t row0, int64_t col0, int ct, int valid_rows,
                                               int tid) {
  const qnum::Layout& L = p.L;
  const int64_t c_begin = col0 / L.rb;
  const int64_t c_end = ct == p.col_tiles - 1 ? L.row_kp : (col0 + TileConfig::kCols) / L.rb;
  const int width = static_cast<int>(c_end - c_begin);
#pragma unroll 1  // cold: one or two passes on the few tiles that pad
  for (int i = tid; i < TileConfig::kRows * width; i += TileConfig::kThreads) {
    const int r = i / width;
    const int64_t c = c_begin + i % width;
    if (r >= valid_rows || c >= L.row_ncols)
      static_cast<uint8_t*>(p.s_row)[qnum::row_scale_index_swizzled(L, g, row0 + r, c)] = 0;
  }
}
// Columnwise: rows k >= K (the last column tile owns rows up to roundup(K, 128)) and block
// columns j >= nb (the expert's last row tile owns columns up to roundup(nb, 4)).
__device__ __forceinline__ void pad_col_scales(const TileParams& p, const ExpertInfo& cur,
                                               int64_t row0, int64_t lt, int64_t col0, int ct,
                                               int tid) {
  const qnum::Layout& L = p.L;
  const int64_t nb = cur.nb, Jp = qnum::round_up(nb, 4);
  const int64_t per_tile = TileConfig::kRows / L.cb;
  const int64_t j_begin = lt * per_tile;
  const bool last_tile = row0 + TileConfig::kRows >= cur.g.rows;
  const int64_t j_end = last_tile ? Jp : j_begin + per_tile;
  const int64_t k_end = ct == p.col_tiles - 1 ? L.col_k128 : col0 + TileConfig::kCols;
  const int width = static_cast<int>(j_end - j_begin);
  const int height = static_cast<int>(k_end - col0);
#pragma unroll 1
  for (int i = tid; i < height * width; i += TileConfig::kThreads) {
    const int64_t k = col0 + i / width, j = j_begin + i % width;
    if (k >= p.K || j >= nb)
      static_cast<uint8_t*>(p.s_col)[qnum::col_scale_index_swizzled(L, cur.g, nb, k, j)] = 0;
  }
}

}  // namespace groupmm::cuda::tile
