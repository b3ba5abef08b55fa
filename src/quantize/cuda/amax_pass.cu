// The separate expert amax pass (amax_pass.cuh).
//
// Items are the tile kernel's 128x128 tiles in per-CTA contiguous ranges. A tile is one step
// (16-bit inputs) or two (fp32) of 8 independent 16-byte loads per thread; the next step's loads
// are issued before the current step is reduced, so every CTA keeps 32-64 KB in flight.
// Magnitudes are merged raw (two bf16 / fp16 at a time) and canonicalized once; a warp merges its
// maximum into the expert's bits with one atomicMax whenever the CTA's items move to another
// expert (exact and order-free).
#include "kernels/common/element.cuh"
#include "quantize/cuda/amax_pass.cuh"
#include "quantize/cuda/tile_config.cuh"

namespace groupmm::cuda {
namespace {

struct AmaxConfig {
  static constexpr int kThreads = 256;
  static constexpr int kLoads = 8;  // 16-byte loads per thread per step: 32 KB per CTA in flight
  static_assert(kThreads % 32 == 0, "warps");
};

// Tracks the expert of a CTA's (monotone) sequence of row tiles: [lo, hi) = the expert's tiles.
struct ExpertCursor {
  int64_t gi = -1, lo = 0, hi = 0;
  // Moves to the expert of row tile t; true when it changed.
  __device__ __forceinline__ bool seek(const QuantPlan& plan, int64_t t) {
    if (gi < 0) {
      gi = find_expert(plan.tile_start, plan.G, t);
      lo = plan.tile_start[gi];
      hi = plan.tile_start[gi + 1];
      return true;
    }
    if (t >= lo && t < hi) return false;
    while (t < lo) {  // empty experts have lo == hi and are stepped over
      --gi;
      hi = lo;
      lo = plan.tile_start[gi];
    }
    while (t >= hi) {
      ++gi;
      lo = hi;
      hi = plan.tile_start[gi + 1];
    }
    return true;
  }
};

struct AmaxParams {
  const void* x;
  int64_t K, col_tiles;
  QuantPlan plan;
  uint32_t* amax_bits;
};

template <class E, class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) expert_amax_kernel(AmaxParams p) {
  pdl_launch_dependents();  // the tile kernel may start launching; it waits for this grid
  pdl_wait();               // the plan
  using Pair = typename E::Pair;
  using In = typename E::Storage;
  constexpr int kVec = 16 / static_cast<int>(sizeof(In));
  constexpr int kChunksPerRow = TileConfig::kCols / kVec;
  constexpr int kSteps = TileConfig::kRows * kChunksPerRow / (Cfg::kThreads * Cfg::kLoads);
  static_assert(kSteps * Cfg::kThreads * Cfg::kLoads == TileConfig::kRows * kChunksPerRow,
                "step split");
  const In* const x = static_cast<const In*>(p.x);
  const int64_t K = p.K, col_tiles = p.col_tiles;
  const QuantPlan& plan = p.plan;
  const int tid = threadIdx.x;
  // Items [begin, end) of this CTA (range sizes differ by at most one).
  const int64_t n_items = plan.tile_start[plan.G] * col_tiles;
  const int64_t cta = blockIdx.x, ctas = gridDim.x;
  const int64_t begin = n_items * cta / ctas, end = n_items * (cta + 1) / ctas;
  if (begin >= end) return;

  struct Unit {  // one step of one tile
    const In* xg;
    int vr, vc, step;
  };
  ExpertCursor cursor;
  qnum::Geom g;
  int64_t t = begin / col_tiles, ct = begin % col_tiles;
  cursor.seek(plan, t);
  g = plan.geom(cursor.gi);
  auto make_unit = [&](int step) {
    const int64_t row0 = (t - g.tile_start) * TileConfig::kRows, col0 = ct * TileConfig::kCols;
    return Unit{x + (g.start + row0) * K + col0,
                static_cast<int>(min(int64_t(TileConfig::kRows), g.rows - row0)),
                static_cast<int>(min(int64_t(TileConfig::kCols), K - col0)), step};
  };
  auto load = [&](const Unit& u, uint4(&b)[Cfg::kLoads]) {
#pragma unroll
    for (int j = 0; j < Cfg::kLoads; ++j) {
      const int i = tid + (u.step * Cfg::kLoads + j) * Cfg::kThreads;
      const int r = i / kChunksPerRow, ch = i % kChunksPerRow;
      b[j] = make_uint4(0, 0, 0, 0);
      if (r < u.vr && ch * kVec < u.vc)
        b[j] = __ldg(reinterpret_cast<const uint4*>(u.xg + r * K + ch * kVec));
    }
  };

  Unit cur = make_unit(0);
  int64_t cur_gi = cursor.gi;
  uint4 a[Cfg::kLoads];
  load(cur, a);
  Pair m = E::pair_zero();
  const int64_t n_units = (end - begin) * kSteps;
  for (int64_t u = 0; u < n_units; ++u) {
    const bool has_next = u + 1 < n_units;
    Unit nxt = cur;
    int64_t nxt_gi = cur_gi;
    uint4 b[Cfg::kLoads];
    if (has_next) {
      if (cur.step + 1 < kSteps) {
        nxt.step = cur.step + 1;
      } else {
        if (++ct == col_tiles) {
          ct = 0;
          ++t;
          if (cursor.seek(plan, t)) g = plan.geom(cursor.gi);
        }
        nxt = make_unit(0);
        nxt_gi = cursor.gi;
      }
      load(nxt, b);
    }
#pragma unroll
    for (int j = 0; j < Cfg::kLoads; ++j) {
      if constexpr (sizeof(In) == 4) {
        m = E::pair_abs_max(m, make_uint2(a[j].x, a[j].y));
        m = E::pair_abs_max(m, make_uint2(a[j].z, a[j].w));
      } else {
        m = E::pair_abs_max(m, a[j].x);
        m = E::pair_abs_max(m, a[j].y);
        m = E::pair_abs_max(m, a[j].z);
        m = E::pair_abs_max(m, a[j].w);
      }
    }
    if (!has_next || nxt_gi != cur_gi) {  // uniform across the CTA
      uint32_t w = max(E::pair_lo_abs(m), E::pair_hi_abs(m));
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) w = max(w, __shfl_xor_sync(0xFFFFFFFFu, w, o));
      if (tid % 32 == 0 && w != 0) atomicMax(p.amax_bits + cur_gi, w);
      m = E::pair_zero();
    }
    if (has_next) {
#pragma unroll
      for (int j = 0; j < Cfg::kLoads; ++j) a[j] = b[j];
      cur = nxt;
      cur_gi = nxt_gi;
    }
  }
}

}  // namespace

void launch_amax_pass(Context& ctx, const AmaxPassArgs& a) {
  const AmaxParams p{a.input.data, a.K, a.col_tiles, a.plan, a.amax_bits};
  dispatch_element(a.input.dtype, "group_quantize: input.dtype", [&](auto e) {
    launch_pdl(expert_amax_kernel<decltype(e), AmaxConfig>, dim3(a.grid),
               dim3(AmaxConfig::kThreads), 0, ctx.stream(), p);
  });
}

}  // namespace groupmm::cuda
