// Per-expert geometry of a quantized grouped tensor on the CPU backend (the rules of the CUDA plan
// kernel: negative splits count 0, rows clamped to the buffer; faults reported against `op`).
#pragma once

#include <algorithm>
#include <vector>

#include "numerics/quantize_layout.hpp"
#include "base/cpu_util.hpp"

namespace groupmm::cpu {

// splits absent: G experts of rows_total / G rows each (weights).
// end (optional): the geometry after the last expert (the plan kernel's entry G), the totals.
// total_at_most: SplitsTotal::at_most (a sum short of rows_total is no fault).
inline std::vector<qnum::Geom> quant_geoms(Context& ctx, const TensorView& splits,
                                           int64_t rows_total, int64_t G, int col_block, OpId op,
                                           qnum::Geom* end = nullptr, bool total_at_most = false) {
  std::vector<RowRange> rr;
  if (splits.present()) {
    rr = expert_rows(ctx, splits, rows_total, op, rows_total, total_at_most);
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
  if (end != nullptr) *end = {G > 0 ? out.back().start + out.back().rows : 0, 0, tiles, cbs, cs4};
  return out;
}

// Writes a scale buffer's slack (qnum::ScaleSlack) as 0, as the CUDA kernels do.
inline void zero_scale_slack(uint8_t* base, const qnum::ScaleSlack& s, const qnum::Geom& end) {
  const int64_t from = qnum::slack_start(s, end);
  for (int64_t l = 0; l < s.lines; ++l)
    std::fill(base + l * s.line_bytes + from, base + (l + 1) * s.line_bytes, uint8_t(0));
}

}  // namespace groupmm::cpu
