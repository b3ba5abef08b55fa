// Per-expert geometry of a quantized grouped tensor on the CPU backend (the rules of the CUDA plan
// kernel: negative splits count 0, rows clamped to the buffer; faults reported against `op`).
#pragma once

#include <vector>

#include "core/quantize_numerics.hpp"
#include "cpu/cpu_util.hpp"

namespace groupmm::cpu {

// splits absent: G experts of rows_total / G rows each (weights).
inline std::vector<qnum::Geom> quant_geoms(Context& ctx, const TensorView& splits,
                                           int64_t rows_total, int64_t G, int col_block, OpId op) {
  std::vector<RowRange> rr;
  if (splits.present()) {
    rr = expert_rows(ctx, splits, rows_total, op);
  } else {
    for (int64_t g = 0; g < G; ++g) rr.push_back({g * (rows_total / G), rows_total / G});
  }
  std::vector<qnum::Geom> out(static_cast<size_t>(G));
  int64_t tiles = 0, cbs = 0, cs4 = 0;
  for (int64_t g = 0; g < G; ++g) {
    qnum::Geom& e = out[static_cast<size_t>(g)];
    e.start = rr[static_cast<size_t>(g)].start;
    e.rows = rr[static_cast<size_t>(g)].rows;
    e.tile_start = tiles;
    e.cb_start = cbs;
    e.cs4_start = cs4;
    const int64_t nb = qnum::ceil_div(e.rows, col_block);
    tiles += qnum::ceil_div(e.rows, qnum::kTileRows);
    cbs += nb;
    cs4 += qnum::round_up(nb, 4);
  }
  return out;
}

// The geometry after the last expert (the plan kernel's entry G): the totals of rows, tiles and
// column blocks.
inline qnum::Geom quant_end_geom(const std::vector<qnum::Geom>& geo, int col_block) {
  if (geo.empty()) return {};
  const qnum::Geom& l = geo.back();
  const int64_t nb = qnum::ceil_div(l.rows, col_block);
  return {l.start + l.rows, 0, l.tile_start + qnum::ceil_div(l.rows, qnum::kTileRows),
          l.cb_start + nb, l.cs4_start + qnum::round_up(nb, 4)};
}

}  // namespace groupmm::cpu
