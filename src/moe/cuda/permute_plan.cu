// CUDA moe_permute_plan without a sort, in three launches:
//   1. count: one warp per chunk of kPlanChunkTokens tokens counts its entries per expert
//      (shared-memory counters; 32 entries a step, equal experts grouped by __match_any_sync)
//      into hist [E][chunks];
//   2. scan: one CTA turns each expert's row of hist into exclusive chunk prefixes, then scans the
//      experts' padded kept counts into row_start / kept / splits;
//   3. rank: each warp walks its chunk again in (token, choice) order; an entry's rank within its
//      expert is the chunk prefix + the counter + the lower lanes of its match group, so positions
//      are stable, with no atomics and no dependence on scheduling.
// At decode batches (at most one chunk per warp of one CTA, the counters in its shared memory) the
// three run as one CTA's phases (plan_small_kernel): the same counts, prefixes and ranks, one
// launch.
#include <cub/block/block_scan.cuh>

#include "moe/backends.hpp"
#include "moe/cuda/moe_common.cuh"

namespace groupmm::cuda {
namespace {

using namespace moe;

struct PlanConfig {
  static constexpr int kWarps = 4;  // chunks per CTA in the count and rank kernels
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kScanThreads = 1024;  // one expert per thread (E <= 1024)
  static constexpr int kMaxExperts = 1024;
  static constexpr int kIdBatch = 8;  // count / rank: steps of 32 entries whose ids load together
  // plan_small_kernel's dynamic shared memory at most (no opt-in; with its static arrays under
  // the 48 KiB a CTA gets by default): the counters of 32 chunks of 256 experts.
  static constexpr size_t kSmallSmem = 33 * 256 * 4;
  static_assert(kScanThreads >= kMaxExperts, "the scan kernel gives each expert a thread");
  static_assert(kScanThreads % 32 == 0, "whole warps");
};

struct PlanParams {
  const int32_t* ids;  // [T * k]
  int32_t* dest;       // [T * k]
  int32_t* row_start;  // [E]
  int32_t* kept;       // [E]
  int32_t* splits;     // [E]
  int32_t* hist;       // [E][NC] counts, then exclusive prefixes (workspace)
  StatusBlock* status;
  int64_t T, k, NC, align, capacity, rows;
  int E;
};

// One warp's pass over chunk c: kRank = false counts its entries per expert into cnt [E] (from
// zero); true ranks them from cnt (the chunk's exclusive prefixes) and writes dest with starts
// [E] (row_start). The warp's lanes must all call it.
template <bool kRank>
__device__ __forceinline__ void chunk_pass(const PlanParams& p, int64_t c, int lane, int32_t* cnt,
                                           const int32_t* starts) {
  const int64_t end = min(p.T, (c + 1) * kPlanChunkTokens) * p.k;
  // The ids of kIdBatch steps are loaded before the first of them is ranked: one global-load
  // latency per batch, not per step (the steps are serial through the counters).
  constexpr int B = PlanConfig::kIdBatch;
  for (int64_t base0 = c * kPlanChunkTokens * p.k; base0 < end; base0 += 32 * B) {
    int32_t batch[B];
#pragma unroll
    for (int b = 0; b < B; ++b) {
      const int64_t i = base0 + 32 * b + lane;
      batch[b] = i < end ? p.ids[i] : -1;
    }
#pragma unroll
    for (int b = 0; b < B; ++b) {
      const int64_t base = base0 + 32 * b;
      if (base >= end) break;  // warp-uniform
      const int64_t i = base + lane;
      const bool in = i < end;
      const int e = batch[b];
      const bool valid = in && e >= 0 && e < p.E;
      if (!kRank && in && !valid)
        report_fault(p.status, kFaultBadIndex, OpId::moe_permute, int32_t(i / p.k), e);
      // lanes naming the same expert: the lower lanes are earlier entries
      const unsigned peers = __match_any_sync(kFullMask, valid ? e : -1);
      const int before = __popc(peers & ((1u << lane) - 1u));
      const int rank = valid ? cnt[e] + before : 0;
      __syncwarp();  // every lane has read its counter before the group's first lane bumps it
      if (valid && before == 0) cnt[e] += __popc(peers);
      __syncwarp();
      if (kRank && in)
        p.dest[i] = valid && (p.capacity == 0 || rank < p.capacity) ? starts[e] + rank : -1;
    }
  }
}

// kRank = false: count pass; true: rank pass (needs the scanned hist and row_start).
template <bool kRank>
__global__ void __launch_bounds__(PlanConfig::kThreads) plan_chunk_kernel(PlanParams p) {
  extern __shared__ int32_t smem[];  // [kWarps][E] counters, then [E] row starts (rank pass)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int32_t* cnt = smem + warp * p.E;
  int32_t* starts = smem + PlanConfig::kWarps * p.E;
  if constexpr (kRank) {
    for (int e = threadIdx.x; e < p.E; e += PlanConfig::kThreads) starts[e] = p.row_start[e];
    __syncthreads();
  }
  const int64_t c = int64_t(blockIdx.x) * PlanConfig::kWarps + warp;
  if (c >= p.NC) return;
  for (int e = lane; e < p.E; e += 32) cnt[e] = kRank ? p.hist[e * p.NC + c] : 0;
  __syncwarp();
  chunk_pass<kRank>(p, c, lane, cnt, starts);
  if constexpr (!kRank) {
    for (int e = lane; e < p.E; e += 32) p.hist[e * p.NC + c] = cnt[e];
  }
}

using PlanScan = cub::BlockScan<int64_t, PlanConfig::kScanThreads>;

// The experts' kept and padded counts from their totals, scanned into row_start / kept / splits
// (thread e: expert e); returns expert e's row start. Every thread of the CTA must call it.
__device__ __forceinline__ int32_t scan_experts(const PlanParams& p, const int32_t* total,
                                                typename PlanScan::TempStorage& tmp) {
  const int e = threadIdx.x;
  int64_t kept = 0, padded = 0;
  if (e < p.E) {
    kept = p.capacity > 0 ? min(int64_t(total[e]), p.capacity) : int64_t(total[e]);
    padded = qnum::round_up(kept, p.align);
  }
  int64_t start = 0, sum = 0;
  PlanScan(tmp).ExclusiveSum(padded, start, sum);
  if (e < p.E) {
    p.row_start[e] = int32_t(start);
    p.kept[e] = int32_t(kept);
    int64_t s = padded;
    if (e == p.E - 1) {  // the zero tail joins the last expert (moe_permuted_rows bounds sum)
      int64_t tail = p.rows - sum;
      if (tail < 0) {
        report_fault(p.status, kFaultSplitsOverflow, OpId::moe_permute, e, sum);
        tail = 0;
      }
      s += tail;
    }
    p.splits[e] = int32_t(s);
  }
  return int32_t(start);
}

__global__ void __launch_bounds__(PlanConfig::kScanThreads) plan_scan_kernel(PlanParams p) {
  __shared__ typename PlanScan::TempStorage tmp;
  __shared__ int32_t total[PlanConfig::kMaxExperts];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr int kWarps = PlanConfig::kScanThreads / 32;
  for (int e = warp; e < p.E; e += kWarps) {  // a warp per expert row: exclusive chunk prefixes
    int32_t* row = p.hist + e * p.NC;
    int32_t carry = 0;
    for (int64_t c0 = 0; c0 < p.NC; c0 += 32) {
      const int64_t c = c0 + lane;
      const int32_t v = c < p.NC ? row[c] : 0;
      int32_t incl = v;
#pragma unroll
      for (int d = 1; d < 32; d *= 2) {
        const int32_t o = __shfl_up_sync(kFullMask, incl, d);
        if (lane >= d) incl += o;
      }
      if (c < p.NC) row[c] = carry + incl - v;
      carry += __shfl_sync(kFullMask, incl, 31);
    }
    if (lane == 0) total[e] = carry;
  }
  __syncthreads();
  scan_experts(p, total, tmp);
}

// The three passes in one CTA (NC <= its warps): warp c counts chunk c into its shared counters
// [c][E]; thread e turns expert e's counters into exclusive chunk prefixes (integer sums: the
// same values as the scan kernel's); the expert scan; warp c ranks chunk c from its prefixes.
__global__ void __launch_bounds__(PlanConfig::kScanThreads) plan_small_kernel(PlanParams p) {
  extern __shared__ int32_t small_smem[];  // [NC][E] counters, then [E] row starts
  __shared__ typename PlanScan::TempStorage tmp;
  __shared__ int32_t total[PlanConfig::kMaxExperts];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int32_t* starts = small_smem + p.NC * p.E;
  int32_t* cnt = small_smem + warp * p.E;
  if (warp < p.NC) {
    for (int e = lane; e < p.E; e += 32) cnt[e] = 0;
    __syncwarp();
    chunk_pass<false>(p, warp, lane, cnt, nullptr);
  }
  __syncthreads();
  const int e = threadIdx.x;
  if (e < p.E) {
    int32_t carry = 0;
    for (int64_t c = 0; c < p.NC; ++c) {
      const int32_t v = small_smem[c * p.E + e];
      small_smem[c * p.E + e] = carry;
      carry += v;
    }
    total[e] = carry;
  }
  __syncthreads();
  const int32_t start = scan_experts(p, total, tmp);
  if (e < p.E) starts[e] = start;
  __syncthreads();
  if (warp < p.NC) chunk_pass<true>(p, warp, lane, cnt, starts);
}

}  // namespace

size_t moe_permute_plan_workspace_size(int64_t tokens, int64_t, int64_t experts) {
  return size_t(qnum::round_up(experts * qnum::ceil_div(tokens, kPlanChunkTokens) * 4, 256));
}

void moe_permute_plan(Context& ctx, const TensorView& ids, const PermuteMap& m, void* ws) {
  PlanParams p{};
  p.ids = ids.ptr<int32_t>();
  p.dest = m.dest_row.ptr<int32_t>();
  p.row_start = m.row_start.ptr<int32_t>();
  p.kept = m.kept.ptr<int32_t>();
  p.splits = m.splits.ptr<int32_t>();
  p.hist = static_cast<int32_t*>(ws);
  p.status = ctx.status();
  p.T = m.tokens;
  p.k = m.topk;
  p.NC = qnum::ceil_div(m.tokens, kPlanChunkTokens);
  p.align = m.align;
  p.capacity = m.capacity;
  p.rows = m.rows;
  p.E = int(m.experts);
  const size_t smem_small = size_t(p.NC + 1) * m.experts * 4;
  if (p.NC <= PlanConfig::kScanThreads / 32 && smem_small <= PlanConfig::kSmallSmem) {
    plan_small_kernel<<<1, PlanConfig::kScanThreads, smem_small, ctx.stream()>>>(p);
    GROUPMM_CHECK_LAUNCH();
    return;
  }
  const unsigned blocks = grid_size(qnum::ceil_div(p.NC, PlanConfig::kWarps));
  const size_t smem_count = size_t(PlanConfig::kWarps) * m.experts * 4;
  if (p.NC > 0) {
    plan_chunk_kernel<false><<<blocks, PlanConfig::kThreads, smem_count, ctx.stream()>>>(p);
    GROUPMM_CHECK_LAUNCH();
  }
  plan_scan_kernel<<<1, PlanConfig::kScanThreads, 0, ctx.stream()>>>(p);
  GROUPMM_CHECK_LAUNCH();
  if (p.NC > 0) {
    plan_chunk_kernel<true>
        <<<blocks, PlanConfig::kThreads, smem_count + m.experts * 4, ctx.stream()>>>(p);
    GROUPMM_CHECK_LAUNCH();
  }
}

}  // namespace groupmm::cuda
