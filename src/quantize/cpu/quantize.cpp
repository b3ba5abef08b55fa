// CPU reference of group_quantize / bgrad_group_quantize: plain loops over experts and blocks,
// using the shared scalar rules (numerics/quantize.hpp).
#include <algorithm>

#include "quantize/backends.hpp"
#include "quantize/cpu/geom.hpp"

namespace groupmm::cpu {
namespace {

using qnum::Geom;
using qnum::Layout;

struct Quantizer {
  const GroupQuantizeArgs& a;
  const QuantProblem& p;
  const Layout& L;
  std::vector<float> x;  // the input as fp32, [M, K]

  float at(const Geom& g, int64_t lr, int64_t k) const {
    return x[static_cast<size_t>((g.start + lr) * p.K + k)];
  }
  // amax over local rows [r0, r1) x columns [k0, k1) of expert g.
  uint32_t amax(const Geom& g, int64_t r0, int64_t r1, int64_t k0, int64_t k1) const {
    uint32_t m = 0;
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t k = k0; k < k1; ++k) m = qnum::amax_merge(m, qnum::abs_bits(at(g, r, k)));
    return m;
  }
  uint8_t code(const qnum::BlockQuant& q, float v) const {
    if (L.recipe == QuantRecipe::nvfp4) return qnum::nvfp4_code(v, q.code, q.mul);
    if (L.recipe == QuantRecipe::mxfp4) return qnum::mxfp4_code(v, q.mul);
    return qnum::fp8_encode(qnum::canon_nan(v * q.mul), L.e5m2);
  }
  static void put(const TensorView& t, int64_t i, uint8_t c, bool fp4) {
    uint8_t* b = t.ptr<uint8_t>();
    if (!fp4) {
      b[i] = c;
    } else if (i % 2 == 0) {
      b[i / 2] = static_cast<uint8_t>((b[i / 2] & 0xF0u) | c);
    } else {
      b[i / 2] = static_cast<uint8_t>((b[i / 2] & 0x0Fu) | (c << 4));
    }
  }
  void put_scale(const TensorView& t, int64_t i, const qnum::BlockQuant& q) const {
    if (L.recipe == QuantRecipe::fp8_block) {
      t.ptr<float>()[i] = q.scale_inv;
    } else {
      t.ptr<uint8_t>()[i] = q.code;
    }
  }
};

// The input rows the outputs quantize, [M, K] as fp32: row r of each expert's rows is input row
// row_map[r] (-1, or a faulting entry, a zero row); rows past the experts' stay 0 (never read).
std::vector<float> gather_rows(Context& ctx, const GroupQuantizeArgs& a, const QuantProblem& p,
                               const std::vector<Geom>& geo) {
  const std::vector<float> x = to_floats(a.input);
  const int64_t T = a.input.dim(0), K = p.K;
  const int32_t* map = a.row_map.ptr<int32_t>();
  std::vector<float> out(static_cast<size_t>(p.M * K), 0.0f);
  for (int64_t gi = 0; gi < p.G; ++gi) {
    const Geom& g = geo[static_cast<size_t>(gi)];
    for (int64_t r = g.start; r < g.start + g.rows; ++r) {
      const int64_t src = map[r];
      if (src < -1 || src >= T)
        report_fault_host(ctx.status(), kFaultBadIndex, OpId::group_quantize,
                          static_cast<int32_t>(gi), src);
      if (src < 0 || src >= T) continue;
      std::copy_n(x.begin() + src * K, K, out.begin() + r * K);
    }
  }
  return out;
}

}  // namespace

void group_quantize(Context& ctx, const GroupQuantizeArgs& a, const QuantProblem& p,
                    const TensorView& dbias) {
  const Layout& L = p.L;
  Geom end;  // after the last expert: where the scales' slack starts
  const std::vector<Geom> geo = quant_geoms(ctx, a.splits, p.M, p.G, L.cb, OpId::group_quantize,
                                            &end, a.splits_total == SplitsTotal::at_most);
  Quantizer Q{a, p, L, p.gathered ? gather_rows(ctx, a, p, geo) : to_floats(a.input)};
  const bool fp4 = qnum::is_fp4(L.recipe);
  const bool need_expert_amax =
      L.recipe == QuantRecipe::fp8_current || L.recipe == QuantRecipe::nvfp4;

  for (int64_t gi = 0; gi < p.G; ++gi) {
    const Geom& g = geo[static_cast<size_t>(gi)];
    const uint32_t ea_bits = Q.amax(g, 0, g.rows, 0, p.K);
    const float ea = bits_float(ea_bits);
    if (need_expert_amax) a.out.amax.ptr<float>()[gi] = ea;
    if (L.recipe == QuantRecipe::fp8_current)
      a.out.scale_inv.ptr<float>()[gi] = qnum::fp8_current_scale(ea, L.e5m2, L.pow2).scale_inv;
    if (L.recipe == QuantRecipe::nvfp4) a.out.global_scale.ptr<float>()[gi] = qnum::nvfp4_s_enc(ea);

    // Block amax of the block holding (lr, k): rowwise blocks are 1 x rb (or 2D), columnwise
    // blocks cb x 1 (or 2D); 2D blocks are the same for both copies.
    auto block_amax = [&](int64_t lr, int64_t k, bool col) -> uint32_t {
      if (L.recipe == QuantRecipe::fp8_current) return 0;
      if (L.block_2d) {
        const int64_t bs = L.fp8_2d ? 128 : 16;
        const int64_t r0 = lr / bs * bs, k0 = k / bs * bs;
        return Q.amax(g, r0, std::min(r0 + bs, g.rows), k0, k0 + bs);
      }
      if (!col) {
        const int64_t k0 = k / L.rb * L.rb;
        return Q.amax(g, lr, lr + 1, k0, k0 + L.rb);
      }
      const int64_t r0 = lr / L.cb * L.cb;
      return Q.amax(g, r0, std::min(r0 + L.cb, g.rows), k, k + 1);
    };

    if (p.rowwise) {
      const int64_t ncols = L.fp8_2d ? p.K / 128 : p.K / L.rb;
      for (int64_t lr = 0; lr < g.rows; ++lr)
        for (int64_t k0 = 0; k0 < p.K; k0 += L.rb) {
          const auto q =
              qnum::make_block_quant(L.recipe, L.e5m2, L.pow2, block_amax(lr, k0, false), ea);
          for (int64_t k = k0; k < k0 + L.rb; ++k)
            Quantizer::put(a.out.data, (g.start + lr) * p.K + k, Q.code(q, Q.at(g, lr, k)), fp4);
          if (L.recipe == QuantRecipe::fp8_current) continue;
          if (L.fp8_2d && (lr % 128 != 0 || k0 % 128 != 0)) continue;
          const int64_t sc = L.fp8_2d ? k0 / 128 : k0 / L.rb;
          Q.put_scale(a.out.scale_inv, qnum::row_scale_index(L, g, lr, sc), q);
        }
      if (L.swizzled && g.rows > 0) {
        const int64_t Kp = qnum::round_up(ncols, 4);
        for (int64_t r = 0; r < qnum::round_up(g.rows, 128); ++r)
          for (int64_t c = 0; c < Kp; ++c)
            if (r >= g.rows || c >= ncols)
              a.out.scale_inv.ptr<uint8_t>()[qnum::row_scale_index_swizzled(L, g, r, c)] = 0;
      }
    }

    if (p.columnwise) {
      if (fp4 && g.rows % 2 != 0) {
        report_fault_host(ctx.status(), kFaultSplitAlignment, OpId::group_quantize,
                          static_cast<int32_t>(gi), g.rows);
        continue;
      }
      const int64_t nb = qnum::col_blocks(L, g.rows);
      for (int64_t k = 0; k < p.K; ++k)
        for (int64_t j = 0; j < nb; ++j) {
          const int64_t r0 = j * L.cb, r1 = std::min(r0 + L.cb, g.rows);
          const auto q =
              qnum::make_block_quant(L.recipe, L.e5m2, L.pow2, block_amax(r0, k, true), ea);
          for (int64_t lr = r0; lr < r1; ++lr)
            Quantizer::put(a.out.columnwise_data, p.K * g.start + k * g.rows + lr,
                           Q.code(q, Q.at(g, lr, k)), fp4);
          if (L.recipe == QuantRecipe::fp8_current) continue;
          if (L.fp8_2d && k % 128 != 0) continue;
          Q.put_scale(a.out.columnwise_scale_inv,
                      qnum::col_scale_index(L, g, nb, L.fp8_2d ? k / 128 : k, j), q);
        }
      if (L.swizzled && g.rows > 0) {
        const int64_t Jp = qnum::round_up(nb, 4);
        for (int64_t k = 0; k < qnum::round_up(p.K, 128); ++k)
          for (int64_t j = 0; j < Jp; ++j)
            if (k >= p.K || j >= nb)
              a.out.columnwise_scale_inv
                  .ptr<uint8_t>()[qnum::col_scale_index_swizzled(L, g, nb, k, j)] = 0;
      }
    }

    if (dbias.present()) {  // the summation order of dbias.hpp
      std::vector<float> d(static_cast<size_t>(p.K));
      expert_column_sums(
          g.rows, p.K, [&](int64_t lr, int64_t k) { return Q.at(g, lr, k); }, d.data());
      for (int64_t k = 0; k < p.K; ++k) store_f(dbias, gi * p.K + k, d[static_cast<size_t>(k)]);
    }
  }
  if (p.rowwise) zero_scale_slack(a.out.scale_inv.ptr<uint8_t>(), p.row_slack, end);
  if (p.columnwise) zero_scale_slack(a.out.columnwise_scale_inv.ptr<uint8_t>(), p.col_slack, end);
}

}  // namespace groupmm::cpu
