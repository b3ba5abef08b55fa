// Amax inside the tile kernel: the expert amax of the fused schedule (fp8_current / nvfp4, see
// tile_schedule.cuh) and the 2D block amax of weights.
//
// Fused expert amax. Each amax item publishes its tile's maximum in its own slot (one relaxed
// store: the slot is data and flag in one word, kSlotEmpty until written; no atomics or fences on
// the item's path). An expert's amax is the maximum of its slots; it is reduced either
//  - blocking: by the CTA's first quantize item of the expert, every thread spinning on its share
//    of still-empty slots (two CTA barriers and an L2 round trip), or
//  - early (TileSchedule::fused_amax_early, experts of at most 32 * kPendSlots items): the last
//    warp loads the slots of item i + kStages's expert after the barrier of item i and reduces
//    them before the next barrier, for item i + kStages - 1, so the load latency hides behind an
//    item's work. A slot still empty then is loaded once more after the next barrier (the second
//    try); only if it is empty then too does the item take the blocking reduction. Not warp 0:
//    thread 0's scheduling is on every item's critical path.
// Every CTA that reduces an expert writes the same per-expert outputs.
#pragma once

#include "kernels/common/ptx.cuh"
#include "quantize/cuda/tile_convert.cuh"
#include "quantize/cuda/tile_schedule.cuh"
#include "quantize/cuda/tile_smem.cuh"

namespace groupmm::cuda::tile {

// Per-expert outputs of the fused recipes from the expert's final amax.
template <QuantRecipe kRecipe>
__device__ __forceinline__ void write_expert_scalars(const TileParams& p, int64_t g, float amax) {
  if constexpr (kRecipe == QuantRecipe::fp8_current)
    p.scale_inv_g[g] = qnum::fp8_current_scale(amax, p.L.e5m2, p.L.pow2).scale_inv;
  if constexpr (kRecipe == QuantRecipe::nvfp4) p.global_scale[g] = qnum::nvfp4_s_enc(amax);
}

// Fused: expert gi's amax is reduced: its outputs, and the CTA's current expert.
template <QuantRecipe kRecipe>
__device__ __forceinline__ void install_expert(const TileParams& p, const SchedState& s, int64_t gi,
                                               uint32_t amax, ExpertInfo& cur) {
  p.amax_bits[gi] = amax;
  write_expert_scalars<kRecipe>(p, gi, __uint_as_float(amax));
  load_expert<kRecipe>(p, gi, s.plan.geom(gi), cur, __uint_as_float(amax));
}

// The canonical amax bits of column pair cp over rows [16 seg, 16 seg + 16) of the tile.
template <class E>
__device__ __forceinline__ uint32_t column_pair_amax(const uint8_t* buf, int seg, int cp) {
  typename E::Pair m = E::pair_zero();
#pragma unroll
  for (int j = 0; j < TileConfig::kColSeg; ++j)
    m = E::pair_abs_max(m, TileSmem<E>::pair(buf, seg * 16 + j, cp));
  return max(E::pair_lo_abs(m), E::pair_hi_abs(m));
}

__device__ __forceinline__ uint32_t warp_max(uint32_t a) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) a = max(a, __shfl_xor_sync(0xFFFFFFFFu, a, o));
  return a;
}

// Fused amax item: the tile's maximum into its slot (block_max: a shared word, 0 on entry and on
// return). Ends with the CTA's barrier.
template <class E>
__device__ __forceinline__ void run_amax_item(const TileParams& p, const uint8_t* buf,
                                              const ItemInfo& it, uint32_t& block_max, int tid,
                                              int seg, int cp) {
  const uint32_t a = warp_max(column_pair_amax<E>(buf, seg, cp));
  if (tid % 32 == 0 && a != 0) atomicMax(&block_max, a);
  __syncthreads();
  if (tid == 0) {  // publish
    st_relaxed_gpu(p.slots + it.t * p.col_tiles + it.ct, block_max);
    block_max = 0;
  }
}

// Fused, blocking: the expert amax from its slots [slot0, slot1), waiting for empty ones, then
// the expert installed as the CTA's current one. Every thread calls it; two CTA barriers.
template <QuantRecipe kRecipe>
__device__ __forceinline__ void reduce_expert_amax(const TileParams& p, const SchedState& s,
                                                   const ItemInfo& it, uint32_t& block_max,
                                                   ExpertInfo& cur, int tid) {
  uint32_t m = 0;
  for (int64_t j = it.slot0 + tid; j < it.slot1; j += TileConfig::kThreads) {
    uint32_t v;
    while ((v = ld_relaxed_gpu(p.slots + j)) == kSlotEmpty) __nanosleep(32);
    m = max(m, v);
  }
  m = warp_max(m);
  if (tid % 32 == 0 && m != 0) atomicMax(&block_max, m);
  __syncthreads();
  if (tid == 0) {
    install_expert<kRecipe>(p, s, it.gi, block_max, cur);
    block_max = 0;
  }
  __syncthreads();
}

// The early reduction's shared state (written by the last warp's lane 0).
struct EarlyAmaxShared {
  int32_t pending_q;    // the ring slot whose expert's slots are in flight in pend (or -1)
  int32_t retry_q;      // the ring slot whose reduction found an empty slot (or -1)
  int64_t prepared_gi;  // the last expert reduced, and its amax
  uint32_t prepared_amax;
};

// The last warp's registers: kPendSlots slot values per lane of the expert in flight.
struct EarlyAmax {
  static constexpr int kPendSlots = TileConfig::kPendSlots;
  uint32_t pend[kPendSlots] = {};

  // The expert amax in pend when no slot is empty: then lane 0 marks ring item q ready with it
  // and records it as the last prepared expert. False when a slot is empty.
  __device__ __forceinline__ bool reduce(ItemInfo* ring, EarlyAmaxShared& sh, int q, int lane,
                                         uint32_t& m) {
    bool ok = true;
    m = 0;
#pragma unroll
    for (int k = 0; k < kPendSlots; ++k) {
      ok = ok && pend[k] != kSlotEmpty;
      m = max(m, pend[k]);
    }
    m = warp_max(m);
    const bool all_ok = __all_sync(0xFFFFFFFFu, ok);
    if (all_ok && lane == 0) {
      ItemInfo& it = ring[q];
      it.amax = m;
      it.ready = 1;
      sh.prepared_gi = it.gi;
      sh.prepared_amax = m;
    }
    return all_ok;
  }

  // Before item i's barrier: the first try for the loads issued one item ago (for item
  // i + kStages - 1). retry_q is written here on every item and read after the barrier, so no
  // write of it follows a read without a barrier between.
  __device__ __forceinline__ void first_try(ItemInfo* ring, EarlyAmaxShared& sh, int lane) {
    const int q = sh.pending_q;
    uint32_t m;
    const int retry = q >= 0 && !reduce(ring, sh, q, lane, m) ? q : -1;
    if (lane == 0) sh.retry_q = retry;
    __syncwarp();
  }

  // After item i's barrier: the second try, then the loads for item i + kStages (ring slot
  // next_q). Item i + kStages - 1 is still in the ring; what this sets is seen by warp 1 after
  // this item's closing barrier.
  __device__ __forceinline__ void second_try_and_issue(const TileParams& p, ItemInfo* ring,
                                                       EarlyAmaxShared& sh, int lane, int next_q) {
    // The last prepared expert: read by lane 0 only and broadcast, since lane 0 may write it
    // below (no other lane may read shared memory that lane 0 then writes without a barrier
    // between). Volatile: a plain load was speculated into every lane (a racecheck hazard).
    long long prep_gi = -1;
    uint32_t prep_amax = 0;
    if (lane == 0) {
      prep_gi = *static_cast<volatile int64_t*>(&sh.prepared_gi);
      prep_amax = *static_cast<volatile uint32_t*>(&sh.prepared_amax);
    }
    prep_gi = __shfl_sync(0xFFFFFFFFu, prep_gi, 0);
    prep_amax = __shfl_sync(0xFFFFFFFFu, prep_amax, 0);
    if (sh.retry_q >= 0) {  // the slots still empty before the barrier: loaded again, waited for
      const int q = sh.retry_q;
      const int64_t s0 = ring[q].slot0 + lane;
#pragma unroll
      for (int k = 0; k < kPendSlots; ++k)  // slots past the expert hold 0, never empty
        if (pend[k] == kSlotEmpty) pend[k] = ld_relaxed_gpu(p.slots + s0 + 32 * k);
      uint32_t m;
      if (reduce(ring, sh, q, lane, m)) {
        prep_gi = ring[q].gi;
        prep_amax = m;
      }
    }
    const ItemInfo& next = ring[next_q];
    int pending = -1;
    if (next.kind == kItemQuant) {
      if (next.gi == prep_gi) {  // same expert as the last prepared item
        if (lane == 0) {
          ring[next_q].amax = prep_amax;
          ring[next_q].ready = 1;
        }
      } else if (next.slot1 - next.slot0 <= 32 * kPendSlots) {
        const int64_t s0 = next.slot0 + lane, s1 = next.slot1;
#pragma unroll
        for (int k = 0; k < kPendSlots; ++k)
          pend[k] = s0 + 32 * k < s1 ? ld_relaxed_gpu(p.slots + s0 + 32 * k) : 0u;
        pending = next_q;
      }
    }
    __syncwarp();
    if (lane == 0) sh.pending_q = pending;
  }
};

// ---- 2D block amax (weights): 16x16 (nvfp4) or the whole 128x128 tile (fp8_block) -----------
// Writes block_amax_2d ([8][8] nvfp4 16x16 blocks, or one entry per warp for fp8_block); ends
// with a CTA barrier.
template <class E, bool k16x16>
__device__ __forceinline__ void reduce_block_amax_2d(const uint8_t* buf, uint32_t* block_amax,
                                                     int seg, int cp, int lane, int warp) {
  uint32_t a0 = column_pair_amax<E>(buf, seg, cp);
  if constexpr (k16x16) {  // the 8 lanes of a 16-column block: lanes 8m .. 8m+7
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) a0 = max(a0, __shfl_xor_sync(0xFFFFFFFFu, a0, o));
    if (lane % 8 == 0) block_amax[seg * 8 + cp / 8] = a0;
  } else {
    a0 = warp_max(a0);
    if (lane == 0) block_amax[warp] = a0;
  }
  __syncthreads();
}
// fp8_block 128x128: the tile's amax from the per-warp entries.
__device__ __forceinline__ uint32_t tile_amax_2d(const uint32_t* block_amax) {
  uint32_t m = 0;
#pragma unroll
  for (int w = 0; w < TileConfig::kWarps; ++w) m = max(m, block_amax[w]);
  return m;
}

}  // namespace groupmm::cuda::tile
