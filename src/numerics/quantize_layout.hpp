// Layout index functions of grouped quantization (quantize.hpp "Layouts"), shared by the CPU
// reference and the CUDA kernels (host + device). Where a kernel needs a cheaper form of an index
// it sits here beside the plain one, with an equality test (tests/cpu/test_quantize_numerics.cpp).
#pragma once

#include <cstdint>

#include "numerics/quantize.hpp"

namespace groupmm::qnum {

GROUPMM_HD int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
GROUPMM_HD int64_t round_up(int64_t a, int64_t b) {
  return ceil_div(a, b) * b;
}
GROUPMM_HD int64_t swizzle_128x4(int64_t r, int64_t c, int64_t Kp) {
  return (r / 128) * 128 * Kp + (c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + (c % 4);
}
// log2(v) when v is a power of two, else -1.
inline int log2_exact(int64_t v) {
  for (int sh = 0; sh < 62; ++sh)
    if (int64_t(1) << sh == v) return sh;
  return -1;
}

// Expert-local row tile. Every swizzle block and every column block boundary is a tile boundary.
constexpr int kTileRows = 128;
// Host-known bound on the row tiles of M rows in G experts (sum of ceil(m_g / 128)).
GROUPMM_HD int64_t tile_bound(int64_t M, int64_t G) {
  return M / kTileRows + G;
}

// One expert's derived offsets (quantize.hpp "Layouts").
struct Geom {
  int64_t start = 0, rows = 0, tile_start = 0, cb_start = 0, cs4_start = 0;
};

// Static layout of one quantized tensor (make_layout fills every field).
struct Layout {
  QuantRecipe recipe = QuantRecipe::mxfp8;
  int64_t K = 0;
  int rb = 32;          // rowwise block along K (fp8_current: 16, only for tiling)
  int cb = 32;          // columnwise block along M
  int cb_shift = 5;     // log2(cb): cb is 16, 32 or 128
  bool fp8_2d = false;  // fp8_block 128x128 blocks
  bool swizzled = false;
  bool mn_major = false;  // fp8_block: scales with the token (M) dimension contiguous
  int64_t rs_ld = 0;      // mn_major rowwise scales: leading dimension (see quantize.hpp)
  bool e5m2 = false;
  bool pow2 = false;
  bool block_2d = false;
  int64_t row_ncols = 0;  // rowwise scale columns: K / rb (K / 128 for fp8_block)
  int64_t row_kp = 0;     // swizzled rowwise scale columns: round_up(row_ncols, 4)
  int64_t col_k128 = 0;   // swizzled columnwise scale rows: round_up(K, 128)
};

// Column blocks of an expert of `rows` rows: ceil(rows / cb), by a shift.
GROUPMM_HD int64_t col_blocks(const Layout& L, int64_t rows) {
  return (rows + L.cb - 1) >> L.cb_shift;
}

// Rowwise scale (local row lr, scale column sc) of expert g; the swizzled layout's index also
// for the padding entries (lr < roundup(rows, 128), sc < row_kp).
GROUPMM_HD int64_t row_scale_index_swizzled(const Layout& L, const Geom& g, int64_t lr,
                                            int64_t sc) {
  return swizzle_128x4(g.tile_start * 128 + lr, sc, L.row_kp);
}
GROUPMM_HD int64_t row_scale_index(const Layout& L, const Geom& g, int64_t lr, int64_t sc) {
  if (L.mn_major) return sc * L.rs_ld + (L.fp8_2d ? g.tile_start + lr / 128 : g.start + lr);
  if (L.fp8_2d) return (g.tile_start + lr / 128) * (L.K / 128) + sc;
  if (!L.swizzled) return (g.start + lr) * L.row_ncols + sc;
  return row_scale_index_swizzled(L, g, lr, sc);
}
// row_scale_index(L, g, lr, sc) - row_scale_index(L, g, lr, 0) for the plain and swizzled 1-byte
// layouts (mxfp8, nvfp4, mxfp4): the column part of the index, the same for every row.
GROUPMM_HD int64_t row_scale_col_offset(const Layout& L, int64_t sc) {
  return L.swizzled ? (sc >> 2) * 512 + (sc & 3) : sc;
}
// The row part of row_scale_index for row r (0 <= r < 128) of a 128-row tile, for the plain and
// swizzled 1-byte layouts: index(r, sc) = index(0, 0) + row_scale_row_in_tile(L, r) +
// row_scale_col_offset(L, sc) within one tile.
GROUPMM_HD int64_t row_scale_row_in_tile(const Layout& L, int r) {
  const unsigned ur = static_cast<unsigned>(r);
  return L.swizzled ? int64_t((ur & 31u) * 16u + (ur >> 5) * 4u) : int64_t(ur) * L.row_ncols;
}
// row_scale_index of row r (0 <= r < 128) of the expert's row tile lt and scale column sc < 2^16:
// the tile's part in 64 bits, the in-tile part in 32 (the kernels' per-thread form).
GROUPMM_HD int64_t row_scale_index_in_tile(const Layout& L, const Geom& g, int64_t lt, int r,
                                           int sc) {
  if (L.fp8_2d || L.mn_major) return row_scale_index(L, g, lt * 128 + r, sc);
  const unsigned ur = static_cast<unsigned>(r), us = static_cast<unsigned>(sc);
  if (!L.swizzled)
    return (g.start + lt * 128) * L.row_ncols + int64_t(ur * unsigned(L.row_ncols) + us);
  return (g.tile_start + lt) * 128 * L.row_kp +
         int64_t((us >> 2) * 512u + (ur & 31u) * 16u + (ur >> 5) * 4u + (us & 3u));
}

// Columnwise scale (k, j) of expert g's transposed [K, m_g] block: j = block index along m, nb =
// col_blocks(L, g.rows); for fp8_2d k is the 128-column block index. The swizzled layout's index
// also for the padding entries (k < roundup(K, 128), j < roundup(nb, 4)).
GROUPMM_HD int64_t col_scale_index_swizzled(const Layout& L, const Geom& g, int64_t nb, int64_t k,
                                            int64_t j) {
  return L.col_k128 * g.cs4_start + swizzle_128x4(k, j, round_up(nb, 4));
}
GROUPMM_HD int64_t col_scale_index(const Layout& L, const Geom& g, int64_t nb, int64_t k,
                                   int64_t j) {
  if (L.mn_major) return (L.fp8_2d ? L.K / 128 : L.K) * (g.cb_start + j) + k;
  if (L.fp8_2d) return L.row_ncols * g.cb_start + k * nb + j;
  if (!L.swizzled) return L.K * g.cb_start + k * nb + j;
  return col_scale_index_swizzled(L, g, nb, k, j);
}

// ---- Scale slack ------------------------------------------------------------------------------
// A scale buffer is sized for any routing (host-known bounds); its entries past the blocks the
// experts own are the slack, and group_quantize writes them 0 (quantize.hpp "Layouts"), so a
// buffer's bytes never depend on what an allocator handed out. The slack is the tail of `lines`
// runs of `line_bytes` each (one run; one per scale column for the mn_major rowwise layout, whose
// tokens are contiguous): run l owns its first unit_bytes * (a total of `end`, the geometry after
// the last expert) bytes. lines = 0: nothing written (fp8_current's [G] scales have no slack; plain
// 1xB rowwise scales leave rows past the splits' sum unwritten, as their data rows).
enum class SlackUnit : uint8_t { rows, tiles, col_blocks, col_blocks4 };
struct ScaleSlack {
  int64_t lines = 0;
  int64_t line_bytes = 0;
  int64_t unit_bytes = 0;
  SlackUnit unit = SlackUnit::rows;
};
// The first slack byte of each run, given the end geometry (the plan's entry G).
GROUPMM_HD int64_t slack_start(const ScaleSlack& s, const Geom& end) {
  const int64_t n = s.unit == SlackUnit::rows         ? end.start
                    : s.unit == SlackUnit::tiles      ? end.tile_start
                    : s.unit == SlackUnit::col_blocks ? end.cb_start
                                                      : end.cs4_start;
  const int64_t b = n * s.unit_bytes;
  return b < s.line_bytes ? b : s.line_bytes;
}

// Dequantization in two parts, so that a kernel can read a block's scale once for all of its
// elements and still compute exactly dequant_value: the scale part every element of one scale
// block shares (value = canon_nan(q * mul), or canon_nan((q * mul) / div) for nvfp4; mxfp4: e2m1
// codes times 2^(e - 127), exact in fp32 or Inf past it) ...
struct BlockScale {
  float mul = 1.0f;
  float div = 1.0f;  // nvfp4: S_enc of the expert
};
// ... of element (lr, k) of expert g (index gi), read from the rowwise or the columnwise copy's
// scales: the block scales (fp32, e8m0 or e4m3 bytes); per_expert: scale_inv [G] (fp8_current)
// or S_enc [G] (nvfp4). Every element of one block gives the same BlockScale.
GROUPMM_HD BlockScale dequant_scale(const Layout& L, const Geom& g, int64_t gi, int64_t lr,
                                    int64_t k, bool col, const void* scales,
                                    const float* per_expert) {
  if (L.recipe == QuantRecipe::fp8_current) return {per_expert[gi], 1.0f};
  const int64_t si =
      col ? col_scale_index(L, g, col_blocks(L, g.rows), L.fp8_2d ? k / 128 : k, lr >> L.cb_shift)
          : row_scale_index(L, g, lr, L.fp8_2d ? k / 128 : k / L.rb);
  if (L.recipe == QuantRecipe::nvfp4)
    return {e4m3_to_float(static_cast<const uint8_t*>(scales)[si]), per_expert[gi]};
  if (L.recipe == QuantRecipe::fp8_block) return {static_cast<const float*>(scales)[si], 1.0f};
  return {e8m0_to_float(static_cast<const uint8_t*>(scales)[si]), 1.0f};
}
// ... and the element part: its code (an fp8 byte, or an e2m1 nibble for nvfp4 and mxfp4) times
// the scale.
GROUPMM_HD float dequant_code(const Layout& L, uint8_t code, BlockScale s) {
  if (L.recipe == QuantRecipe::nvfp4) return canon_nan((e2m1_to_float(code) * s.mul) / s.div);
  if (L.recipe == QuantRecipe::mxfp4) return canon_nan(e2m1_to_float(code) * s.mul);
  return canon_nan(fp8_to_float(code, L.e5m2) * s.mul);
}

// Dequantized value of element (lr, k) of expert g (index gi), read from the rowwise copy or the
// columnwise copy (data: the copy's bytes).
GROUPMM_HD float dequant_value(const Layout& L, const Geom& g, int64_t gi, int64_t lr, int64_t k,
                               bool col, const uint8_t* data, const void* scales,
                               const float* per_expert) {
  const int64_t e = col ? L.K * g.start + k * g.rows + lr : (g.start + lr) * L.K + k;
  uint8_t code = 0;
  if (is_fp4(L.recipe)) {
    const uint8_t b = data[e / 2];
    code = (e & 1) ? static_cast<uint8_t>(b >> 4) : static_cast<uint8_t>(b & 0xFu);
  } else {
    code = data[e];
  }
  return dequant_code(L, code, dequant_scale(L, g, gi, lr, k, col, scales, per_expert));
}

}  // namespace groupmm::qnum
