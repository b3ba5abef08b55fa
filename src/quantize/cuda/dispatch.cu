// CUDA group_quantize / bgrad_group_quantize: the host side. One call is, stream-ordered with no
// host reads and no allocation (graph safe):
//   1. the plan kernel (plan.cuh): per-expert offsets by the splits rule;
//   2. fp8_current / nvfp4 with the separate amax schedule: the amax pass (amax_pass.cuh);
//   3. the tile kernel variant the dispatch table holds for (recipe, input, fp8 format, schedule);
//   4. bgrad: the per-expert reduction of the tile kernel's bias-gradient partial sums.
#include <algorithm>
#include <cmath>

#include "quantize/backends.hpp"
#include "quantize/cuda/amax_pass.cuh"
#include "quantize/cuda/dbias_reduce.cuh"
#include "quantize/cuda/tile_config.cuh"
#include "quantize/cuda/workspace.cuh"

namespace groupmm::cuda {

const char* tile_schedule_name(TileSchedule s) {
  constexpr const char* kNames[] = {"tiles", "fused_amax", "fused_amax_early"};
  const auto i = static_cast<size_t>(s);
  return i < sizeof(kNames) / sizeof(kNames[0]) ? kNames[i] : "?";
}

std::string TileKernelKey::to_string() const {
  return detail::cat("quantize tile kernel (", recipe_name(recipe), ", ", dtype_name(input),
                     gathered ? " gathered" : "", " input, ", e5m2 ? "e5m2" : "e4m3", " data, ",
                     tile_schedule_name(schedule), " schedule)");
}

namespace {

bool has_expert_amax(QuantRecipe r) {
  return r == QuantRecipe::fp8_current || r == QuantRecipe::nvfp4;
}

// The amax schedule (QuantizeConfig::amax_schedule): automatic is fused for fp8_current (the input
// crosses DRAM once) and separate for nvfp4 (its tile kernel is bound by arithmetic, and the
// fused kernel's second buffer and ticket waits cost more than the extra read).
bool choose_fused_amax(const QuantizeConfig& c) {
  if (!has_expert_amax(c.recipe)) return false;
  return c.amax_schedule == AmaxSchedule::fused ||
         (c.amax_schedule == AmaxSchedule::automatic && c.recipe == QuantRecipe::fp8_current);
}

// Items (128x128 tiles) of the average expert: what the fused schedule's host choices assume.
int64_t avg_expert_items(const QuantProblem& p, int64_t col_tiles) {
  return qnum::ceil_div(p.M / std::max<int64_t>(p.G, 1), 128) * col_tiles;
}

// The fused schedule's lag in experts (QuantizeConfig::amax_lag, 0 = this), from host-known
// values only (graph safe): the shape, G and the grid. The smallest lag whose quantize items find
// their expert's amax items finished when they run: the oldest unfinished tickets trail a
// quantize item that starts running by about kStages * grid (each CTA holds a running item,
// kStages - 1 loading, one scheduled and one ticket fetched ahead), and block k - lag's amax items
// lie lag blocks of 2 * (items per expert) tickets back. A smaller lag waits (blocking
// reductions, spinning); a larger one re-reads tiles from further back in L2.
int fused_amax_lag(const QuantizeConfig& c, const QuantProblem& p, int64_t col_tiles, int grid) {
  const int64_t G = std::max<int64_t>(p.G, 1);
  const int64_t per_expert = std::max<int64_t>(1, avg_expert_items(p, col_tiles));
  const int64_t in_flight = int64_t(TileConfig::kStages) * grid;
  const int64_t need = qnum::ceil_div(in_flight, 2 * per_expert);
  return static_cast<int>(std::clamp<int64_t>(c.amax_lag > 0 ? c.amax_lag : need, 1, G));
}

TileSchedule choose_schedule(const QuantizeConfig& c, const QuantProblem& p, int64_t col_tiles) {
  if (!choose_fused_amax(c)) return TileSchedule::tiles;
  // The early reduction when the average expert fits it (a larger expert takes the blocking
  // reduction; its CTAs get several of its items, which share one).
  return avg_expert_items(p, col_tiles) <= 32 * TileConfig::kPendSlots
             ? TileSchedule::fused_amax_early
             : TileSchedule::fused_amax;
}

TileLaunch find_tile_kernel(const TileKernelKey& key) {
  for (const TileKernelList list :
       {fp8_current_tile_kernels(), fp8_block_tile_kernels(), mxfp8_tile_kernels(),
        nvfp4_tile_kernels(), mxfp4_tile_kernels()})
    for (int i = 0; i < list.count; ++i)
      if (list.rows[i].key == key) return list.rows[i].launch;
  GROUPMM_CHECK(false, "group_quantize: no ", key.to_string());
  return nullptr;
}

}  // namespace

size_t group_quantize_workspace_size(int64_t M, int64_t K, int64_t G, QuantRecipe recipe,
                                     bool with_dbias) {
  return QuantWorkspace::of(M, K, G, has_expert_amax(recipe), with_dbias).total();
}

// Shared memory: the input tile buffers and the plan cache. Persistent grid: as many CTAs as fit
// (two 512-thread CTAs per SM for 16-bit inputs: ~75 KB each; one for fp32), at most one per
// item.
void set_tile_geometry(const Context& ctx, TileParams& p, int in_bytes) {
  int off = TileConfig::kStages * TileConfig::kRows * TileConfig::kCols * in_bytes;
  p.smem_plan = off;
  if (p.plan.G <= TileConfig::kPlanCacheG) off += TileConfig::kPlanCache;
  p.smem_total = off;
  const int by_smem =
      ctx.smem_per_sm() / (p.smem_total + 1024);  // 1 KB per CTA reserved by the driver
  const int per_sm = std::max(1, std::min(in_bytes == 4 ? 1 : TileConfig::kMinBlocks, by_smem));
  const int64_t items_bound = qnum::tile_bound(p.M, p.plan.G) * p.col_tiles;
  p.grid = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(items_bound, int64_t(ctx.sm_count()) * per_sm)));
}

void group_quantize(Context& ctx, const GroupQuantizeArgs& a, const QuantProblem& p,
                    const TensorView& dbias, void* ws, size_t ws_bytes) {
  (void)ws_bytes;  // checked by the caller
  GROUPMM_CHECK(qnum::ceil_div(p.K, 128) <= 65535, "group_quantize: K=", p.K,
                " must be <= 65535*128");
  const int64_t col_tiles = qnum::ceil_div(p.K, 128);
  const QuantRecipe recipe = p.L.recipe;
  // The tile kernel counts items (128x128 tiles; twice under the fused amax schedule) in 32 bits.
  GROUPMM_CHECK(qnum::tile_bound(p.M, p.G) * col_tiles < (int64_t(1) << 30),
                "group_quantize: M=", p.M, ", K=", p.K,
                " has too many 128x128 tiles (at most 2^30)");
  const TileSchedule schedule = choose_schedule(a.config, p, col_tiles);
  const bool fused = schedule != TileSchedule::tiles;
  const TileLaunch launch_tiles =
      find_tile_kernel({recipe, a.input.dtype, p.L.e5m2, schedule, p.gathered});
  const bool expert_amax = has_expert_amax(recipe);
  const QuantWorkspace layout = QuantWorkspace::of(p.M, p.K, p.G, expert_amax, dbias.present());
  const QuantPlan plan = plan_view(QuantWorkspace::plan(ws), p.G);
  uint32_t* const amax_bits = expert_amax ? static_cast<uint32_t*>(a.out.amax.data) : nullptr;

  QuantPlanArgs pa;
  pa.splits = a.splits;
  pa.rows_total = p.M;
  pa.total_at_most = a.splits_total == SplitsTotal::at_most;
  pa.col_block = p.L.cb;
  pa.amax_bits = amax_bits;
  pa.amax_slots = fused ? layout.amax_slots(ws) : nullptr;  // emptied by the plan kernel
  pa.slot_count = QuantWorkspace::slot_count(p.M, p.K, p.G);
  pa.op = OpId::group_quantize;
  launch_quant_plan(ctx, plan, pa);

  TileParams tp{};
  tp.x = a.input.data;
  tp.M = p.M;
  tp.K = p.K;
  tp.row_map = p.gathered ? static_cast<const int32_t*>(a.row_map.data) : nullptr;
  tp.x_rows = a.input.dim(0);
  tp.plan = plan;
  tp.L = p.L;
  tp.rowwise = p.rowwise;
  tp.colwise = p.columnwise;
  tp.q_row = static_cast<uint8_t*>(a.out.data.data);
  tp.q_col = static_cast<uint8_t*>(a.out.columnwise_data.data);
  tp.s_row = a.out.scale_inv.data;
  tp.s_col = a.out.columnwise_scale_inv.data;
  tp.slack_row = p.row_slack;
  tp.slack_col = p.col_slack;
  tp.amax_bits = amax_bits;
  tp.slots = pa.amax_slots;
  tp.scale_inv_g =
      recipe == QuantRecipe::fp8_current ? static_cast<float*>(a.out.scale_inv.data) : nullptr;
  tp.global_scale = static_cast<float*>(a.out.global_scale.data);
  tp.dbias_partial = layout.dbias_partial(ws);
  tp.col_tiles = col_tiles;
  tp.rcp_col_tiles = std::nextafter(1.0 / static_cast<double>(col_tiles), 2.0);
  tp.status = ctx.status();
  const int in_bytes = a.input.dtype == DType::fp32 ? 4 : 2;
  set_tile_geometry(ctx, tp, in_bytes);
  tp.lag = fused ? fused_amax_lag(a.config, p, col_tiles, tp.grid) : 1;

  if (expert_amax && !fused) {
    AmaxPassArgs aa;
    aa.input = a.input;
    aa.K = p.K;
    aa.col_tiles = col_tiles;
    aa.grid = tp.grid;
    aa.plan = plan;
    aa.amax_bits = amax_bits;
    launch_amax_pass(ctx, aa);
  }
  launch_tiles(ctx, tp);
  if (dbias.present()) {
    DbiasReduceArgs ra;
    ra.partial = tp.dbias_partial;
    ra.K = p.K;
    ra.plan = plan;
    ra.db = dbias;
    launch_dbias_reduce(ctx, ra);
  }
}

}  // namespace groupmm::cuda
