// CUDA group_quantize / bgrad_group_quantize: plan kernel, the per-expert amax pass of fp8_current
// / nvfp4 (or its fused form inside the tile kernel, see quantize_tile.cuh "item schedule"), the
// tile kernel, and the deterministic per-expert reduction of the bias-gradient partial sums. All
// stream-ordered, no host reads, no allocation: graph safe.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "cuda/quantize_tile.cuh"

namespace groupmm::cuda {
namespace {

// Tracks the expert of a CTA's (monotone) sequence of row tiles: [lo, hi) = the expert's tiles.
struct GroupCursor {
  int64_t gi = -1, lo = 0, hi = 0;
  __device__ __forceinline__ bool seek(const QuantPlan& plan, int64_t t) {
    if (gi < 0) {
      gi = find_group(plan.tile_start, plan.G, t);
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

struct AmaxConfig {
  static constexpr int kThreads = 256;
  static constexpr int kLoads = 8;  // 16-byte loads per thread per step: 32 KB per CTA in flight
  static_assert(kThreads % 32 == 0, "warps");
};

// The per-expert amax as a separate streaming pass before the tile kernel (the "separate" amax
// schedule of fp8_current / nvfp4; ~91% of DRAM peak). Items are 128x128 tiles in per-CTA ranges. A
// tile is one step (16-bit inputs) or two (fp32) of 8 independent 16-byte loads per thread; the
// next step's loads are issued before the current step is reduced, so every CTA keeps 32-64 KB in
// flight. Magnitudes are merged raw (two bf16/fp16 at a time) and canonicalized once; a warp merges
// its maximum into the expert's bits with one atomicMax whenever the CTA's items move to another
// expert (exact, order-free).
template <class In, class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads)
    expert_amax_kernel(const In* x, int64_t K, int64_t col_tiles, QuantPlan plan,
                       uint32_t* amax_bits) {
  pdl_launch_dependents();  // the tile kernel may start launching; it waits for this grid
  pdl_wait();               // the plan
  using E = tile_detail::Elt<In>;
  using Pair = typename E::Pair;
  constexpr int kVec = 16 / static_cast<int>(sizeof(In));
  constexpr int kChunksPerRow = TileConfig::kCols / kVec;
  constexpr int kSteps = TileConfig::kRows * kChunksPerRow / (Cfg::kThreads * Cfg::kLoads);
  static_assert(kSteps * Cfg::kThreads * Cfg::kLoads == TileConfig::kRows * kChunksPerRow,
                "step split");
  const int tid = threadIdx.x;
  const int64_t n_items = plan.tile_start[plan.G] * col_tiles;
  int64_t begin, end;
  tile_detail::item_range(n_items, blockIdx.x, gridDim.x, begin, end);
  if (begin >= end) return;

  struct Unit {  // one step of one tile
    const In* xg;
    int vr, vc, step;
  };
  GroupCursor cursor;
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
  Pair m = E::zero();
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
        m = E::absmax(m, make_uint2(a[j].x, a[j].y));
        m = E::absmax(m, make_uint2(a[j].z, a[j].w));
      } else {
        m = E::absmax(m, a[j].x);
        m = E::absmax(m, a[j].y);
        m = E::absmax(m, a[j].z);
        m = E::absmax(m, a[j].w);
      }
    }
    if (!has_next || nxt_gi != cur_gi) {  // uniform across the CTA
      uint32_t w = max(E::lo_bits(m), E::hi_bits(m));
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) w = max(w, __shfl_xor_sync(0xFFFFFFFFu, w, o));
      if (tid % 32 == 0 && w != 0) atomicMax(amax_bits + cur_gi, w);
      m = E::zero();
    }
    if (has_next) {
#pragma unroll
      for (int j = 0; j < Cfg::kLoads; ++j) a[j] = b[j];
      cur = nxt;
      cur_gi = nxt_gi;
    }
  }
}

struct ReduceConfig {
  static constexpr int kThreads = 256;
  static_assert(kThreads % 32 == 0, "warps");
};

// db[g, k] = sum over the expert's tiles, in tile order, of the per-tile partial sums.
template <class Out, class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads)
    dbias_reduce_kernel(const float* partial, int64_t K, QuantPlan plan, Out* db) {
  const int64_t g = blockIdx.y;
  const int64_t k = int64_t(blockIdx.x) * Cfg::kThreads + threadIdx.x;
  if (k >= K) return;
  float d = 0.0f;
  for (int64_t t = plan.tile_start[g]; t < plan.tile_start[g + 1]; ++t) d += partial[t * K + k];
  d = qnum::canon_nan(d);
  if constexpr (sizeof(Out) == 4) {
    db[g * K + k] = d;
  } else if constexpr (std::is_same_v<Out, __half>) {
    reinterpret_cast<uint16_t*>(db)[g * K + k] = float_to_fp16_bits(d);
  } else {
    reinterpret_cast<uint16_t*>(db)[g * K + k] = float_to_bf16_bits(d);
  }
}

template <class In>
void launch_amax(Context& ctx, const void* x, int64_t K, int64_t col_tiles, int grid,
                 const QuantPlan& plan, uint32_t* amax_bits) {
  launch_pdl(expert_amax_kernel<In, AmaxConfig>, dim3(grid), dim3(AmaxConfig::kThreads), 0,
             ctx.stream(), static_cast<const In*>(x), K, col_tiles, plan, amax_bits);
}

template <class Out>
void launch_reduce(Context& ctx, const float* partial, int64_t K, const QuantPlan& plan, void* db) {
  const dim3 grid(static_cast<unsigned>(qnum::ceil_div(K, ReduceConfig::kThreads)),
                  static_cast<unsigned>(plan.G));
  dbias_reduce_kernel<Out, ReduceConfig>
      <<<grid, ReduceConfig::kThreads, 0, ctx.stream()>>>(partial, K, plan, static_cast<Out*>(db));
  GROUPMM_CHECK_LAUNCH();
}

// The amax schedule of fp8_current / nvfp4 (QuantizeConfig::amax_schedule): fused or not.
// Measured on the H200 (bench/RESULTS.md, round 6, `groupmm bench quantize --amax ...`):
// fp8_current is faster fused (the input crosses DRAM once; separate: 0 to 7 points lower). nvfp4
// is faster separate (its quantization is ALU-bound; the fused kernel's two buffers and ticket
// waits cost 4% at best, 2x at lag 1).
bool choose_fused_amax(const QuantizeConfig& c) {
  if (c.recipe != QuantRecipe::fp8_current && c.recipe != QuantRecipe::nvfp4) return false;
  return c.amax_schedule == AmaxSchedule::fused ||
         (c.amax_schedule == AmaxSchedule::automatic && c.recipe == QuantRecipe::fp8_current);
}

// Items (128x128 tiles) of the average expert: what the fused schedule's host choices assume.
int64_t avg_expert_items(const QuantProblem& p, int64_t col_tiles) {
  return qnum::ceil_div(p.M / std::max<int64_t>(p.G, 1), 128) * col_tiles;
}

// The fused schedule's lag in experts (QuantizeConfig::amax_lag, 0 = this). Host-known values
// only (graph safe): the shape, G and the grid. The smallest lag whose quantize items find their
// expert's amax items finished when they run: the oldest unfinished tickets trail a quantize item
// that starts running by about kStages * grid (each CTA holds a running item, kStages - 1
// loading, one scheduled and one ticket fetched ahead: a ticket runs about kStages tickets per
// CTA after it is taken), and block k - lag's amax items lie lag blocks of 2 * (items per expert)
// tickets back. A smaller lag waits (blocking reductions, spinning); a larger one re-reads tiles
// from further back in L2. [32768, 2048] / 32 (128 items per expert, grid 264), % of copy at
// lag 3 / 4 / 5 / 6, rowwise: H200 61.8 / 62.3 / 60.5 / 59.8 (both 64.6 / 64.8 / 65.1 / 65.0),
// H100 69.8 / 63.7 / 61.5 / 60.6 (both 69.3 / 66.5 / 65.0 / 64.5); this gives 3. [65536, 7168]
// / 32 (896 items): lag 1 62.3%, 2 59.2% (H200); this gives 1.
int fused_amax_lag(const QuantizeConfig& c, const QuantProblem& p, int64_t col_tiles, int grid) {
  const int64_t G = std::max<int64_t>(p.G, 1);
  const int64_t per_expert = std::max<int64_t>(1, avg_expert_items(p, col_tiles));
  const int64_t in_flight = int64_t(TileConfig::kStages) * grid;
  const int64_t need = qnum::ceil_div(in_flight, 2 * per_expert);
  return static_cast<int>(std::clamp<int64_t>(c.amax_lag > 0 ? c.amax_lag : need, 1, G));
}

}  // namespace

// Shared memory: the input tile buffers and the plan cache. Persistent grid: as many CTAs as fit
// (two 512-thread CTAs per SM for 16-bit inputs: ~102 KB each; one for fp32), at most one per
// item.
void tile_layout(const Context& ctx, TileParams& p, int in_size) {
  int off = TileConfig::kStages * TileConfig::kRows * TileConfig::kCols * in_size;
  p.smem_plan = off;
  if (p.plan.G <= TileConfig::kPlanCacheG) off += TileConfig::kPlanCache;
  p.smem_total = off;
  const int by_smem =
      ctx.smem_per_sm() / (p.smem_total + 1024);  // 1 KB per CTA reserved by the driver
  const int per_sm = std::max(1, std::min(in_size == 4 ? 1 : TileConfig::kMinBlocks, by_smem));
  const int64_t items_bound = tile_bound(p.M, p.plan.G) * p.col_tiles;
  p.grid = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(items_bound, int64_t(ctx.sm_count()) * per_sm)));
}

void group_quantize(Context& ctx, const GroupQuantizeArgs& a, const QuantProblem& p,
                    const TensorView& dbias, void* ws, size_t ws_bytes) {
  (void)ws_bytes;  // checked by the caller
  GROUPMM_CHECK(!dbias.present() || p.G <= 65535, "bgrad_group_quantize: G=", p.G,
                " must be <= 65535");
  GROUPMM_CHECK(qnum::ceil_div(p.K, 128) <= 65535, "group_quantize: K=", p.K,
                " must be <= 65535*128");
  const int64_t col_tiles = qnum::ceil_div(p.K, 128);
  const QuantPlan plan = plan_view(ws, p.G);
  const int R = p.L.recipe;
  const int in_size = a.input.dtype == DType::fp32 ? 4 : 2;
  const bool fused = choose_fused_amax(a.config);
  // The tile kernel counts items (128x128 tiles; twice under the fused amax schedule) in 32 bits.
  GROUPMM_CHECK(tile_bound(p.M, p.G) * col_tiles < (int64_t(1) << 30), "group_quantize: M=", p.M,
                ", K=", p.K, " has too many 128x128 tiles (at most 2^30)");
  const bool need_amax = R == qnum::kFp8Current || R == qnum::kNvfp4;
  uint32_t* amax_bits = need_amax ? static_cast<uint32_t*>(a.out.amax.data) : nullptr;
  // Workspace: the plan, then the amax slots of fp8_current / nvfp4 (used by the fused schedule:
  // emptied by the plan kernel, no separate memset launch; filled by the tile kernel's amax
  // items), then the dbias partial sums.
  char* ws_next = static_cast<char*>(ws) + plan_bytes(p.G);
  uint32_t* const slots = fused ? reinterpret_cast<uint32_t*>(ws_next) : nullptr;
  if (need_amax) ws_next += amax_slot_bytes(p.M, p.K, p.G);
  launch_quant_plan(ctx, plan, a.splits, p.M, p.L.cb, amax_bits, OpId::group_quantize, slots,
                    col_tiles);
  TileParams tp{};
  tp.x = a.input.data;
  tp.M = p.M;
  tp.K = p.K;
  tp.plan = plan;
  tp.L = p.L;
  tp.rowwise = p.rowwise;
  tp.colwise = p.columnwise;
  tp.fused = fused;
  // The early expert-amax reduction when the average expert fits it (a larger expert takes the
  // blocking reduction; its CTAs get several of its items, which share one). Otherwise a kernel
  // without that code runs (H200, fp8_current [32768, 2048]: early 55.5 / 61.5% of copy rowwise
  // / both, blocking only 51.3 / 57.2%; on [65536, 7168], where no expert fits, the dormant code
  // cost 59.6 vs 60.8%).
  tp.early_amax = fused && avg_expert_items(p, col_tiles) <= 32 * TileConfig::kPendSlots;
  tp.q_row = static_cast<uint8_t*>(a.out.data.data);
  tp.q_col = static_cast<uint8_t*>(a.out.columnwise_data.data);
  tp.s_row = a.out.scale_inv.data;
  tp.s_col = a.out.columnwise_scale_inv.data;
  tp.amax_bits = amax_bits;
  tp.slots = slots;
  tp.scale_inv_g = R == qnum::kFp8Current ? static_cast<float*>(a.out.scale_inv.data) : nullptr;
  tp.global_scale = static_cast<float*>(a.out.global_scale.data);
  tp.dbias_partial = dbias.present() ? reinterpret_cast<float*>(ws_next) : nullptr;
  tp.col_tiles = col_tiles;
  tp.rcp_col_tiles = std::nextafter(1.0 / static_cast<double>(col_tiles), 2.0);
  tp.row_ncols = p.K / p.L.rb;
  tp.row_kp = qnum::round_up(tp.row_ncols, 4);
  tp.col_k128 = qnum::round_up(p.K, 128);
  tp.cb_shift = log2_exact(p.L.cb);
  GROUPMM_CHECK(tp.cb_shift == 4 || tp.cb_shift == 5 || tp.cb_shift == 7,
                "group_quantize: column block ", p.L.cb, " must be 16, 32 or 128");
  tp.status = ctx.status();
  tile_layout(ctx, tp, in_size);
  tp.lag = fused ? fused_amax_lag(a.config, p, col_tiles, tp.grid) : 1;
  if (need_amax && !fused) {
    switch (a.input.dtype) {
      case DType::bf16:
        launch_amax<uint16_t>(ctx, a.input.data, p.K, col_tiles, tp.grid, plan, amax_bits);
        break;
      case DType::fp16:
        launch_amax<__half>(ctx, a.input.data, p.K, col_tiles, tp.grid, plan, amax_bits);
        break;
      default:
        launch_amax<float>(ctx, a.input.data, p.K, col_tiles, tp.grid, plan, amax_bits);
        break;
    }
  }
  switch (R) {
    case qnum::kFp8Current:
    case qnum::kFp8Block:
      launch_quantize_fp8(ctx, tp, a.input.dtype);
      break;
    case qnum::kMxfp8:
      launch_quantize_mx(ctx, tp, a.input.dtype);
      break;
    default:
      launch_quantize_nvfp4(ctx, tp, a.input.dtype);
      break;
  }
  if (dbias.present()) {
    switch (dbias.dtype) {
      case DType::bf16:
        launch_reduce<uint16_t>(ctx, tp.dbias_partial, p.K, plan, dbias.data);
        break;
      case DType::fp16:
        launch_reduce<__half>(ctx, tp.dbias_partial, p.K, plan, dbias.data);
        break;
      default:
        launch_reduce<float>(ctx, tp.dbias_partial, p.K, plan, dbias.data);
        break;
    }
  }
}

}  // namespace groupmm::cuda
