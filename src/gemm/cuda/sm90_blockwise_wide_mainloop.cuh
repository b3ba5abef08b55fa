// Blockwise FP8 mainloop for a 128x192 tile (forward and dgrad).
//
// Why: a wider N' tile stores fewer tiles per FLOP and reads each activation tile for more
// columns; the per-expert FP8 kernels gained from 128x128 to 128x192 (bench/RESULTS.md, "FP8
// tiles"). CUTLASS's blockwise collective cannot run it: its promotion takes one scale per
// ScaleGranularityN columns and asserts that the scale fragment has the accumulator's shape.
//
// The weights' scales are one per 128x128 block, and 128 does not divide 192: a tile starting
// at n0 = 192 t has its first 128 columns in block n0 / 128 and the other 64 in the next when t
// is even, its first 64 in block n0 / 128 and the other 128 in the next when t is odd. The
// producer's auxiliary warp writes, per stage, the two blocks' scales and the tile's kind (0
// even, 1 odd) into the stage's three scale slots; the consumer, compiled once per kind, knows
// which accumulator values belong to which block.
//
// Each 128-deep K block is one 64x192 wgmma sum per warpgroup into a temporary set, then added,
// scaled, into the fp32 accumulators once the MMAs are done (wait, then promote: 96 + 96 floats
// per thread leave no room for a second temporary set). The promotion per element is CUTLASS's:
// acc += (sa_row * sb) * block_k for k = 0, 1, ..., each block a fresh wgmma sum. The two
// warpgroups share the tensor cores, so one's MMAs can run while the other promotes.
//
// The class derives from the CUTLASS collective and replaces the consumer's mma() and the scale
// loader (load_auxiliary). TMA loads, pipeline, tensormaps, parameters and shared storage are the
// collective's, built with ScaleGranularityN = 64 so that a stage has three scale slots.
// Contract kept with the kernel: mma() releases the first k_tile_count - 1 stages; mma_tail()
// the last one.
#pragma once

#include "cute/arch/copy_sm80.hpp"
#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/cutlass.h"

namespace groupmm::cuda::sm90 {

namespace wide_detail {
// Sources for the tile-kind slot and for scale slots past the weight's last block: every write
// to a stage's scale slots is a cp.async, so the stage's barrier covers them all.
static __device__ float kSlotValues[2] = {0.0f, 1.0f};
}  // namespace wide_detail

// Expert g's scale tensors as the auxiliary loader reads them: activation (A) scales one per row
// and 128-deep K block, K-major [m, kb]; weight (B) scales one per 128x128 block, K-major
// [n_blocks, kb].
struct WideScaleTensors {
  const float* sfa;
  const float* sfb;
  int m;         // rows of A (M')
  int n_blocks;  // ceil(N' / 128)
  int kb;        // ceil(K' / 128)
};

// From the collective's tensors (load_init, rebuilt per expert by tensors_perform_update), which
// keep the pointers and the problem's extents: SFA ((1, M'), (128, kb), L) K-major; SFB
// ((64, ceil(N' / 64)), (128, kb), L), whose 64-row indexing is the collective's and not read.
template <class TensorSFA, class TensorSFB>
CUTLASS_DEVICE WideScaleTensors scale_tensors(TensorSFA const& sfa, TensorSFB const& sfb) {
  using namespace cute;
  static_assert(decltype(get<0, 0>(shape(sfa)))::value == 1 &&
                    decltype(get<1, 0>(shape(sfa)))::value == 128 &&
                    decltype(get<0, 0>(shape(sfb)))::value == 64 &&
                    decltype(get<1, 0>(shape(sfb)))::value == 128,
                "1x128 activation scales; B's declared as 64 rows per scale");
  const int kb = int(get<1, 1>(shape(sfa)));
  return {raw_pointer_cast(sfa.data()), raw_pointer_cast(sfb.data()), int(get<0, 1>(shape(sfa))),
          (int(get<0, 1>(shape(sfb))) + 1) / 2, kb};
}

template <class Base>
struct BlockwiseWideMainloop : Base {
  using typename Base::MainloopPipeline;
  using typename Base::Params;
  using typename Base::PipelineState;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::SmemLayoutSFA;
  using typename Base::SmemLayoutSFB;
  using typename Base::TensorStorage;
  using typename Base::TiledMma;
  using typename Base::TileShape;

  static constexpr int kTileM = cute::size<0>(TileShape{});
  static constexpr int kTileN = cute::size<1>(TileShape{});
  static constexpr int kTileK = cute::size<2>(TileShape{});
  static_assert(kTileM == 128 && kTileN == 192 && kTileK == 128, "a 128x192x128 tile");
  static_assert(Base::ScaleNsPerTile == 3, "three scale slots per stage (ScaleGranularityN 64)");
  static_assert(Base::ScaleMsPerTile == kTileM, "one activation scale per row");
  static_assert(cute::size<0>(typename TiledMma::AtomShape_MNK{}) == 64 &&
                    cute::size<1>(typename TiledMma::AtomShape_MNK{}) == kTileN,
                "one 64x192 wgmma atom per warpgroup: the accumulator layout assumed below");

  // ---- producer side: the scale loader ----
  // One warp: per stage, the tile's 128 row scales of A, then slot 0 = the weight scale of the
  // block of the tile's first column, slot 1 = the next block's, slot 2 = the tile's kind.
  template <class TensorA, class TensorB, class TensorSFA, class TensorSFB, class KTileIterator,
            class BlockCoord>
  CUTLASS_DEVICE void load_auxiliary(
      Params const& /*mainloop_params*/, MainloopPipeline pipeline, PipelineState smem_pipe_write,
      cute::tuple<TensorA, TensorB, TensorSFA, TensorSFB> const& load_inputs,
      BlockCoord const& blk_coord, KTileIterator k_tile_iter, int k_tile_count, int thread_idx,
      uint32_t /*block_rank_in_cluster*/, TensorStorage& shared_tensors) {
    using namespace cute;
    using CpAsync = SM80_CP_ASYNC_CACHEALWAYS<float>;
    cute::Tensor sSFA = make_tensor(make_smem_ptr(shared_tensors.smem_SFA.data()), SmemLayoutSFA{});
    cute::Tensor sSFB = make_tensor(make_smem_ptr(shared_tensors.smem_SFB.data()), SmemLayoutSFB{});
    const WideScaleTensors s = scale_tensors(get<2>(load_inputs), get<3>(load_inputs));
    const int m0 = int(get<0>(blk_coord)) * kTileM;
    const int n_tile = int(get<1>(blk_coord));
    const bool odd = (n_tile & 1) != 0;
    const int n_blocks = s.n_blocks;
    const int slot_block = n_tile * kTileN / 128 + thread_idx;  // lanes 0 and 1

    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count) {
      pipeline.producer_acquire(smem_pipe_write);
      const int stage = smem_pipe_write.index();
      const int k = *k_tile_iter;
      CUTLASS_PRAGMA_UNROLL
      for (int i = thread_idx; i < kTileM; i += cutlass::NumThreadsPerWarp) {
        if (m0 + i < s.m) CpAsync::copy(s.sfa[int64_t(m0 + i) * s.kb + k], sSFA(i, 0, stage));
      }
      if (thread_idx < 2) {
        const float* src = slot_block < n_blocks ? s.sfb + int64_t(slot_block) * s.kb + k
                                                 : &wide_detail::kSlotValues[0];
        CpAsync::copy(*src, sSFB(thread_idx * 64, 0, stage));
      } else if (thread_idx == 2) {
        CpAsync::copy(wide_detail::kSlotValues[odd ? 1 : 0], sSFB(128, 0, stage));
      }
      pipeline.producer_commit(smem_pipe_write, cutlass::arch::cpasync_barrier_arrive_noinc);
      ++k_tile_iter;
      ++smem_pipe_write;
    }
  }

  // ---- consumer side ----
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read,
                          FrgTensorC& accum, int k_tile_count, int thread_idx,
                          TensorStorage& shared_tensors, Params const& /*mainloop_params*/) {
    using namespace cute;
    static_assert(is_rmem<FrgTensorC>::value, "accumulators in registers");
    static_assert(decltype(size(accum))::value == kTileN / 2, "96 accumulators per thread");
    warpgroup_fence_operand(accum);
    clear(accum);
    if (k_tile_count > 0) {
      pipeline.consumer_wait(smem_pipe_read);
      cute::Tensor sSFB =
          make_tensor(make_smem_ptr(shared_tensors.smem_SFB.data()), SmemLayoutSFB{});
      if (sSFB(128, 0, smem_pipe_read.index()) == 0.0f)
        run<false>(pipeline, smem_pipe_read, accum, k_tile_count, thread_idx, shared_tensors);
      else
        run<true>(pipeline, smem_pipe_read, accum, k_tile_count, thread_idx, shared_tensors);
    }
    warpgroup_fence_operand(accum);
  }

 private:
  template <bool kOdd, class FrgTensorC>
  CUTLASS_DEVICE void run(MainloopPipeline& pipeline, PipelineState read, FrgTensorC& accum,
                          int k_tile_count, int thread_idx, TensorStorage& shared_tensors) {
    using namespace cute;
    // Accumulator values of the tile's first weight block. In the fragment of a 64xN wgmma,
    // value v covers column pair v % 2, row half (v / 2) % 2 and column group v / 4 of 8, so
    // the first c columns are the values below c / 2: 128 columns (even tile) or 64 (odd).
    constexpr int kFirstBlockValues = kOdd ? 32 : 64;

    cute::Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});
    cute::Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});
    cute::Tensor sSFB = make_tensor(make_smem_ptr(shared_tensors.smem_SFB.data()), SmemLayoutSFB{});
    // Activation scales seen as (BLK_M, BLK_N, PIPE), constant along N'.
    cute::Tensor sSFA = make_tensor(
        make_smem_ptr(shared_tensors.smem_SFA.data()),
        make_layout(make_shape(shape<0>(SmemLayoutSFA{}), Int<kTileN>{}, shape<2>(SmemLayoutSFA{})),
                    make_stride(stride<0>(SmemLayoutSFA{}), _0{}, stride<2>(SmemLayoutSFA{}))));

    constexpr int kWarpGroups = size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
    const int warp_group = __shfl_sync(0xffffffff, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    TiledMma tiled_mma;
    auto wg_mma = tiled_mma.get_slice(
        make_layout(Int<kWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{})(warp_group));
    cute::Tensor tCrA = wg_mma.make_fragment_A(wg_mma.partition_A(sA));  // (MMA, 1, MMA_K, PIPE)
    cute::Tensor tCrB = wg_mma.make_fragment_B(wg_mma.partition_B(sB));  // (MMA, 1, MMA_K, PIPE)
    // This thread's two rows of A's scales: (row r, row r + 8) of its fragment.
    cute::Tensor tCsSFA = tiled_mma.get_slice(thread_idx).partition_C(sSFA);
    cute::Tensor block = make_fragment_like(accum);

    PipelineState release = read;
    // One K block: its wgmma sum, then the sum scaled into the fp32 accumulators.
    auto one_block = [&]() {
      pipeline.consumer_wait(read);
      const int stage = read.index();
      // The stage's scales are read before the wgmma is issued, never after: in a cluster one
      // thread of the warpgroup releases the stage (PipelineTmaAsync's signaling thread), once its
      // own warp's wait for the wgmma returns. That wgmma started only after every warp issued
      // it, so every warp's reads before the issue are done; a read after the issue could still
      // be pending in a lagging warp when the producer refills the stage (wrong values under
      // racecheck). The products are formed while the MMAs run.
      cute::Tensor rows = filter_zeros(tCsSFA(_, _, _, stage));
      const float r0 = rows(0), r1 = rows(1);
      const float sb0 = sSFB(0, 0, stage), sb1 = sSFB(64, 0, stage);
      tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
      warpgroup_fence_operand(block);
      warpgroup_arrive();
      CUTLASS_PRAGMA_UNROLL
      for (int kb = 0; kb < size<2>(tCrA); ++kb) {
        cute::gemm(tiled_mma, tCrA(_, _, kb, stage), tCrB(_, _, kb, stage), block);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      const float f00 = r0 * sb0, f10 = r1 * sb0;
      const float f01 = r0 * sb1, f11 = r1 * sb1;
      warpgroup_wait<0>();
      warpgroup_fence_operand(block);
      CUTLASS_PRAGMA_UNROLL
      for (int v = 0; v < size(block); ++v) {
        const float f = v < kFirstBlockValues ? ((v & 2) ? f10 : f00) : ((v & 2) ? f11 : f01);
        accum(v) += block(v) * f;
      }
      warpgroup_fence_operand(block);
      ++read;
    };
    CUTLASS_PRAGMA_NO_UNROLL
    for (int k = 0; k + 1 < k_tile_count; ++k) {
      one_block();
      pipeline.consumer_release(release);
      ++release;
    }
    one_block();  // the last block's stage is released by mma_tail()
  }
};

}  // namespace groupmm::cuda::sm90
