// CPU reference of swizzle_scales: walk every entry of each expert's padded swizzled block.
#include "quantize/backends.hpp"
#include "quantize/cpu/geom.hpp"

namespace groupmm::cpu {

void swizzle_scales(Context& ctx, const SwizzleScalesArgs& a, const qnum::ScaleSlack& dest_slack) {
  const int64_t G = a.splits.present() ? a.splits.dim(0) : a.groups;
  qnum::Geom end;
  const auto geo = quant_geoms(ctx, a.splits, a.rows_total, G, a.columnwise ? a.block : 128,
                               OpId::swizzle_scales, &end);
  uint8_t* plain = a.plain.ptr<uint8_t>();
  uint8_t* swz = a.swizzled.ptr<uint8_t>();
  for (const qnum::Geom& g : geo) {
    if (g.rows == 0) continue;
    // The expert's scale matrix: R x C plain at `pbase`, padded Rp x Cp swizzled at `sbase`.
    int64_t R, C, pbase, sbase;
    if (a.columnwise) {
      R = a.cols;
      C = qnum::ceil_div(g.rows, a.block);
      pbase = a.cols * g.cb_start;
      sbase = qnum::round_up(a.cols, 128) * g.cs4_start;
    } else {
      R = g.rows;
      C = a.cols;
      pbase = g.start * a.cols;
      sbase = g.tile_start * 128 * qnum::round_up(a.cols, 4);
    }
    const int64_t Rp = qnum::round_up(R, 128), Cp = qnum::round_up(C, 4);
    for (int64_t r = 0; r < Rp; ++r)
      for (int64_t c = 0; c < Cp; ++c) {
        const bool valid = r < R && c < C;
        const int64_t si = sbase + qnum::swizzle_128x4(r, c, Cp);
        if (!a.unswizzle) {
          swz[si] = valid ? plain[pbase + r * C + c] : 0;
        } else if (valid) {
          plain[pbase + r * C + c] = swz[si];
        }
      }
  }
  zero_scale_slack(a.unswizzle ? plain : swz, dest_slack, end);  // past the last expert's blocks
}

}  // namespace groupmm::cpu
