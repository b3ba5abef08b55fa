// The grouped quantize tile kernel (see tile_config.cuh for its parts), its launcher, and the
// dispatch-table rows of one recipe's variants.
#pragma once

#include <array>

#include "kernels/common/launch.cuh"
#include "quantize/cuda/slack.cuh"
#include "quantize/cuda/tile_columns.cuh"
#include "quantize/cuda/tile_rows.cuh"

namespace groupmm::cuda {

template <class V>
__global__ void __launch_bounds__(TileConfig::kThreads, V::kMinBlocks)
    quantize_tile_kernel(TileParams p) {
  using namespace tile;
  using Cfg = TileConfig;
  using E = typename V::E;
  using S = TileSmem<E>;
  constexpr QuantRecipe kRecipe = V::kRecipe;
  constexpr bool kFused = V::kFused, kEarly = V::kEarly;
  constexpr int kStages = Cfg::kStages, kRing = kStages + 1;
  extern __shared__ __align__(128) uint8_t smem[];  // [kStages] input tiles, then the plan cache
  // Everything else a CTA shares: written by thread 0 (or by the last warp's lane 0 for the early
  // amax), read by all. Item i uses ring[i % kRing] and input buffer i % kStages: while item i is
  // processed, items i + 1 .. i + kStages - 1 load and thread 0 schedules item i + kStages.
  // CTA-uniform values live here rather than in registers: held across the loop they pushed the
  // 64-register budget into spills, and recomputing them in every thread cost more than the
  // shared-memory reads. Separate variables, so that a variant that never reads one (e.g. the 2D
  // block amax of a recipe without 2D blocks) has its stores removed.
  __shared__ ItemInfo ring[kRing];
  __shared__ SchedState sched;
  // The current item's expert (raw storage: __shared__ variables run no initializers).
  __shared__ __align__(16) unsigned char expert_raw[sizeof(ExpertInfo)];
  ExpertInfo& expert = *reinterpret_cast<ExpertInfo*>(expert_raw);
  __shared__ uint32_t block_max;  // the current amax item's / expert's maximum (canonical bits)
  __shared__ EarlyAmaxShared early_state;  // TileSchedule::fused_amax_early
  __shared__ uint32_t block_amax_2d[64];   // [8][8] nvfp4 16x16 blocks, [16] fp8 128x128

  // Gathered rows: the row map may still be being written (this kernel starts before pdl_wait).
  if constexpr (!V::kGathered) prefetch_first_items<E>(p);
  pdl_wait();  // the plan (or the amax pass): this kernel may start before they finish
  // The next kernel in the stream (e.g. the next call's plan) may launch now: it waits for this
  // grid in its own pdl_wait, and it only becomes resident as this kernel's CTAs retire.
  pdl_launch_dependents();
  // Not const: laundered at every item (see the loop), so that nothing derived from it is hoisted.
  int tid = static_cast<int>(threadIdx.x);
  const int row_elems = static_cast<int>(p.K);  // K <= 65535 * 128: r * K fits in 32 bits
  const int64_t G = p.plan.G;
  EarlyAmax early;  // the last warp's pending slot loads (kEarly)

  const bool cache_plan = G <= Cfg::kPlanCacheG;
  int64_t* const plan_cache = reinterpret_cast<int64_t*>(smem + p.smem_plan);
  if (cache_plan) {
#pragma unroll
    for (int a = 0; a < Cfg::kPlanArrays; ++a)
      for (int i = tid; i <= G; i += Cfg::kThreads)
        plan_cache[a * (G + 1) + i] = plan_array(p.plan, a)[i];
  }
  // Thread 0: the ticket of the next schedule_item. Static: the first kStages items of CTA b are
  // b + q * grid, then the counter's tickets follow kStages * grid, each taken after an item's
  // barrier for the item kStages later. Fused: all from the counter, fetched one item ahead (the
  // atomic's latency would otherwise sit on thread 0's path before the barrier, which amax items,
  // almost no work, cannot hide).
  uint32_t ticket = 0;
  const uint32_t ticket0 = kFused ? 0u : uint32_t(kStages) * gridDim.x;
  __syncthreads();
  if (tid == 0) {
    sched.plan = p.plan;
    if (cache_plan) {
#pragma unroll
      for (int a = 0; a < Cfg::kPlanArrays; ++a)
        plan_array(sched.plan, a) = plan_cache + a * (G + 1);
    }
    sched.gi = 0;
    for (int q = 0; q < kStages; ++q) {
      ticket = kFused ? atomicAdd(p.plan.ticket, 1u) : blockIdx.x + uint32_t(q) * gridDim.x;
      schedule_item<E, kFused>(p, sched, ticket, ring[q]);
    }
    if (kFused) ticket = atomicAdd(p.plan.ticket, 1u);
    expert.gi = -1;
    block_max = 0;
    early_state.pending_q = -1;
    early_state.retry_q = -1;
    early_state.prepared_gi = -1;
  }
  // Per-expert scalars. Fused: only zero-row experts (no item; amax 0, zeroed by the plan); the
  // others are written where their amax is reduced. After an amax pass: all.
  if (V::kExpertAmax && blockIdx.x == 0) {
    for (int64_t g = tid; g < G; g += Cfg::kThreads) {
      if (kFused && p.plan.rows[g] == 0) write_expert_scalars<kRecipe>(p, g, 0.0f);
      if (!kFused) write_expert_scalars<kRecipe>(p, g, __uint_as_float(p.amax_bits[g]));
    }
  }
  __syncthreads();
  // The scale buffers' slack: every CTA's share once its items are done (also a CTA without
  // items). Not before the loop: the values live into the loop left no registers for it (spills
  // under the 64-register budget).
  auto zero_slack = [&] {
    const qnum::Geom end = sched.plan.geom(p.plan.G);
    const int64_t worker = int64_t(blockIdx.x) * Cfg::kThreads + threadIdx.x;
    const int64_t workers = int64_t(gridDim.x) * Cfg::kThreads;
    if (p.rowwise) zero_scale_slack(p.s_row, p.slack_row, end, worker, workers);
    if (p.colwise) zero_scale_slack(p.s_col, p.slack_col, end, worker, workers);
  };
  if (ring[0].kind == kItemNone) {
    zero_slack();
    return;
  }

  auto load_item = [&](const uint8_t* buf, const ItemInfo& it) {
    if constexpr (V::kGathered) {
      S::load_async_gathered(buf, it, tid, row_elems, p.x_rows, p.status);
    } else {
      S::load_async(buf, it, tid, row_elems);
    }
  };
#pragma unroll
  for (int q = 0; q + 1 < kStages; ++q) {
    if (ring[q].kind != kItemNone) load_item(smem + q * S::kBytes, ring[q]);
    cp_async_commit();
  }
  int buf_index = 0;  // input buffer of the current item
  for (int i = 0;; ++i) {
    // The per-thread addresses of every access pattern are loop invariant; hoisted out of the
    // loop they took ~30 registers for the whole kernel and forced spills under the 64-register
    // budget. Recomputing them costs a few integer operations per tile.
    asm volatile("" : "+r"(tid));
    const int lane = tid % 32, warp = tid / 32;
    const ItemInfo& it = ring[i % kRing];
    const bool has_next = ring[(i + 1) % kRing].kind != kItemNone;
    const ItemInfo& loading = ring[(i + kStages - 1) % kRing];  // loads into buffer of i - 1
    const bool load_next = loading.kind != kItemNone;
    if (kFused && tid == 0) {
      // Fused: thread 0 schedules item i + kStages (the early reduction reads it) and takes the
      // next ticket before it issues its own loads, while the other warps issue theirs.
      ItemInfo& scheduled = ring[(i + kStages) % kRing];
      if (load_next) {
        schedule_item<E, kFused>(p, sched, ticket, scheduled);
        ticket = atomicAdd(p.plan.ticket, 1u);  // used one item later
      } else {
        scheduled.kind = kItemNone;
      }
    }
    if (load_next)
      load_item(smem + (buf_index == 0 ? kStages - 1 : buf_index - 1) * S::kBytes, loading);
    cp_async_commit();
    if (!kFused && tid == 0 && it.gi != expert.gi) {  // static: the item's expert
      const float amax = V::kExpertAmax ? __uint_as_float(p.amax_bits[it.gi]) : 0.0f;
      load_expert<kRecipe>(p, it.gi, sched.plan.geom(it.gi), expert, amax);
    }
    // Fused: the expert of a quantize item whose amax the early reduction made, installed by
    // warp 1 while thread 0 schedules (in series on thread 0 they were the barrier's critical
    // path).
    if (kFused && tid == 32 && it.kind == kItemQuant && it.ready && it.gi != expert.gi)
      install_expert<kRecipe>(p, sched, it.gi, it.amax, expert);
    if (kEarly && warp == Cfg::kWarps - 1) early.first_try(ring, early_state, lane);
    cp_async_wait<kStages - 1>();  // item i's group is complete
    __syncthreads();
    const uint8_t* const buf = smem + buf_index * S::kBytes;
    // Static: the ticket of item i + kStages, taken now and used at the item's end (the atomic's
    // latency hides behind the item).
    if (!kFused && tid == 0 && load_next) ticket = ticket0 + atomicAdd(p.plan.ticket, 1u);
    // columnwise mapping of the amax reads: column pair cp, rows [16 seg, 16 seg + 16)
    const int cp = lane + 32 * (warp & 1), seg = warp >> 1;
    if (kEarly && warp == Cfg::kWarps - 1)
      early.second_try_and_issue(p, ring, early_state, lane, (i + kStages) % kRing);

    if (kFused && it.kind == kItemAmax) {  // ---- fused amax item: the tile's maximum
      run_amax_item<E>(p, buf, it, block_max, tid, seg, cp);
      if (!has_next) break;
      buf_index = buf_index + 1 == kStages ? 0 : buf_index + 1;
      continue;
    }
    if (kFused && it.gi != expert.gi)  // ---- first quantize item of an expert: its amax
      reduce_expert_amax<kRecipe>(p, sched, it, block_max, expert, tid);

    const TileCoords c{
        it.t, it.ct, it.lt, int64_t(it.lt) * Cfg::kRows, it.vr, int64_t(it.ct) * Cfg::kCols, it.vc};
    if (p.L.block_2d) reduce_block_amax_2d<E, V::kNvfp4>(buf, block_amax_2d, seg, cp, lane, warp);
    if (p.rowwise)
      quantize_rows<V>(p, buf, it, c, expert, block_amax_2d, tid, lane, warp, row_elems);
    quantize_columns<V>(p, buf, it, c, expert, block_amax_2d, tid, lane, warp);
    if (!kFused && tid == 0) {  // ---- static: schedule item i + kStages (it loads next item)
      // Late on purpose: a CTA claims work only kStages items ahead of the one it runs (claimed
      // one item earlier, a slow CTA held three items when the counter ran out).
      ItemInfo& scheduled = ring[(i + kStages) % kRing];
      if (load_next) {
        schedule_item<E, kFused>(p, sched, ticket, scheduled);
      } else {
        scheduled.kind = kItemNone;
      }
    }
    __syncthreads();  // buf and block_amax_2d are free for the next item
    if (!has_next) break;
    buf_index = buf_index + 1 == kStages ? 0 : buf_index + 1;
  }
  zero_slack();
}

namespace tile {

// The dynamic shared memory a variant may use: its input tiles and the plan cache.
template <class V>
constexpr int max_dynamic_smem() {
  return TileConfig::kStages * TileSmem<typename V::E>::kBytes + TileConfig::kPlanCache;
}

// After the plan kernel (or the amax pass): programmatic dependent launch, see pdl_wait.
template <class V>
void launch_tile_kernel(Context& ctx, const TileParams& p) {
  auto kernel = quantize_tile_kernel<V>;
  allow_dynamic_smem(ctx, kernel, max_dynamic_smem<V>());
  launch_pdl(kernel, dim3(p.grid), dim3(TileConfig::kThreads), p.smem_total, ctx.stream(), p);
}

// The dispatch-table rows of recipe kRecipe: every input element, fp8 format and schedule it has.
template <QuantRecipe kRecipe, class E, bool kE5m2>
constexpr void add_schedules(TileKernel* rows, int& n) {
  rows[n++] = {TileVariant<E, kRecipe, kE5m2, TileSchedule::tiles>::key(),
               &launch_tile_kernel<TileVariant<E, kRecipe, kE5m2, TileSchedule::tiles>>};
  if constexpr (kRecipe == QuantRecipe::fp8_current || kRecipe == QuantRecipe::nvfp4) {
    rows[n++] = {TileVariant<E, kRecipe, kE5m2, TileSchedule::fused_amax>::key(),
                 &launch_tile_kernel<TileVariant<E, kRecipe, kE5m2, TileSchedule::fused_amax>>};
    rows[n++] = {
        TileVariant<E, kRecipe, kE5m2, TileSchedule::fused_amax_early>::key(),
        &launch_tile_kernel<TileVariant<E, kRecipe, kE5m2, TileSchedule::fused_amax_early>>};
  }
}
template <QuantRecipe kRecipe, class E>
constexpr void add_formats(TileKernel* rows, int& n) {
  add_schedules<kRecipe, E, false>(rows, n);
  if constexpr (!qnum::is_fp4(kRecipe)) add_schedules<kRecipe, E, true>(rows, n);
}
// The gathered rows of the FP8 training recipes' bf16 activations: fp8_block (e4m3: its
// gradients are e4m3 too), fp8_current in both formats with the fused amax schedules.
template <class V>
constexpr void add_row(TileKernel* rows, int& n) {
  rows[n++] = {V::key(), &launch_tile_kernel<V>};
}
template <QuantRecipe kRecipe>
constexpr void add_gathered(TileKernel* rows, int& n) {
  if constexpr (kRecipe == QuantRecipe::fp8_block) {
    add_row<TileVariant<Bf16, kRecipe, false, TileSchedule::tiles, true>>(rows, n);
  } else if constexpr (kRecipe == QuantRecipe::fp8_current) {
    add_row<TileVariant<Bf16, kRecipe, false, TileSchedule::fused_amax, true>>(rows, n);
    add_row<TileVariant<Bf16, kRecipe, false, TileSchedule::fused_amax_early, true>>(rows, n);
    add_row<TileVariant<Bf16, kRecipe, true, TileSchedule::fused_amax, true>>(rows, n);
    add_row<TileVariant<Bf16, kRecipe, true, TileSchedule::fused_amax_early, true>>(rows, n);
  }
}
template <QuantRecipe kRecipe>
constexpr int variant_count() {
  const int schedules =
      kRecipe == QuantRecipe::fp8_current || kRecipe == QuantRecipe::nvfp4 ? 3 : 1;
  const int formats = qnum::is_fp4(kRecipe) ? 1 : 2;
  const int gathered = kRecipe == QuantRecipe::fp8_block     ? 1
                       : kRecipe == QuantRecipe::fp8_current ? 4
                                                             : 0;
  return 3 * formats * schedules + gathered;  // bf16, fp16, fp32 inputs; gathered bf16
}
template <QuantRecipe kRecipe>
constexpr std::array<TileKernel, variant_count<kRecipe>()> tile_kernels() {
  std::array<TileKernel, variant_count<kRecipe>()> rows{};
  int n = 0;
  add_formats<kRecipe, Bf16>(rows.data(), n);
  add_formats<kRecipe, Fp16>(rows.data(), n);
  add_formats<kRecipe, Fp32>(rows.data(), n);
  add_gathered<kRecipe>(rows.data(), n);
  return rows;
}

}  // namespace tile
}  // namespace groupmm::cuda

// One instance file per recipe (they compile in parallel) defines its dispatch-table rows with
// this: the function tile_config.cuh declares for the recipe.
#define GROUPMM_QUANTIZE_TILE_KERNELS(recipe)                                   \
  namespace groupmm::cuda {                                                     \
  TileKernelList recipe##_tile_kernels() {                                      \
    static constexpr auto kKernels = tile::tile_kernels<QuantRecipe::recipe>(); \
    return {kKernels.data(), static_cast<int>(kKernels.size())};                \
  }                                                                             \
  }
