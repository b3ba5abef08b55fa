// Blockwise FP8 mainloop whose fp32 promotion overlaps the tensor cores (forward and dgrad).
//
// Why: CUTLASS's blockwise consumer issues a 128-deep K block into one temporary accumulator set,
// waits for it, and only then adds it, scaled, into the fp32 accumulators; the next block's MMAs
// start after that. The two consumer warpgroups of a cooperative tile run in step, so the tensor
// cores idle while both promote: 64 FFMAs per thread per 128 K, against 512 tensor-core cycles
// for the K block of a 128x128 tile. Here each warpgroup keeps two temporary sets and issues block
// k+1 into one before it promotes block k from the other (wgmma.wait_group 1, not 0), so the MMAs
// of k+1 run during the promotion of k. Three accumulator sets of 64 floats per thread fit the
// consumer's 232 registers only when the weight's scale is one per tile (128x128 weight blocks, N'
// tile 128): the per-row activation scales are 2 registers per thread, the weight's 1.
//
// Same arithmetic as the in-place promotion, in the same order: acc += (sa_row * sb) * block_k
// for k = 0, 1, ..., each block a fresh wgmma sum (ScaleOut::Zero on its first K step).
//
// Measurements: bench/RESULTS.md, "Blockwise promotion overlapped with the MMAs". ptxas inserts
// one wgmma wait after block 0 (C7517: block 0 is issued at its own site before the loop). A
// loop with one issue site per set has no such wait but measured slower, and issuing the next
// tile's block 0 before the epilogue makes ptxas wait before the epilogue; both in "Overlapping
// the blockwise epilogue from the mainloop".
//
// The class derives from the CUTLASS collective and replaces only the consumer's mma(): loads,
// pipeline, tensormaps, parameters and shared storage are the collective's. Contract kept with
// the kernel: mma() releases the first k_tile_count - 1 stages; mma_tail() the last one.
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"

namespace groupmm::cuda::sm90 {

template <class Base>
struct BlockwiseOverlappedMainloop : Base {
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

  static_assert(Base::ScaleNsPerTile == 1, "one weight scale per N' tile (128x128 weight blocks)");
  static_assert(Base::ScaleMsPerTile == cute::size<0>(TileShape{}), "one activation scale per row");
  static_assert(Base::ScalePromotionInterval * cute::size<2>(typename TiledMma::AtomShape_MNK{}) ==
                    cute::size<2>(TileShape{}),
                "one promotion per K tile");
  static_assert(cute::size<0>(TileShape{}) == 128 && cute::size<1>(TileShape{}) == 128,
                "three accumulator sets fit the registers at 128x128");

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read,
                          FrgTensorC& accum, int k_tile_count, int thread_idx,
                          TensorStorage& shared_tensors, Params const& /*mainloop_params*/) {
    using namespace cute;
    static_assert(is_rmem<FrgTensorC>::value, "accumulators in registers");

    cute::Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});
    cute::Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});
    // Activation scales seen as (BLK_M, BLK_N, PIPE), constant along N' (and along the K tile,
    // whose single scale mode is dropped); the weight's one scale per stage at (0, 0, stage).
    cute::Tensor sSFA = make_tensor(
        make_smem_ptr(shared_tensors.smem_SFA.data()),
        make_layout(
            make_shape(shape<0>(SmemLayoutSFA{}), get<1>(TileShape{}), shape<2>(SmemLayoutSFA{})),
            make_stride(stride<0>(SmemLayoutSFA{}), _0{}, stride<2>(SmemLayoutSFA{}))));
    cute::Tensor sSFB = make_tensor(make_smem_ptr(shared_tensors.smem_SFB.data()), SmemLayoutSFB{});

    constexpr int kWarpGroups = size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
    const int warp_group = __shfl_sync(0xffffffff, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    TiledMma tiled_mma;
    auto wg_mma = tiled_mma.get_slice(
        make_layout(Int<kWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{})(warp_group));
    cute::Tensor tCrA =
        wg_mma.make_fragment_A(wg_mma.partition_A(sA));  // (MMA, MMA_M, MMA_K, PIPE)
    cute::Tensor tCrB =
        wg_mma.make_fragment_B(wg_mma.partition_B(sB));  // (MMA, MMA_N, MMA_K, PIPE)
    cute::Tensor tCsSFA =
        tiled_mma.get_slice(thread_idx).partition_C(sSFA);  // (MMA, MMA_M, MMA_N, PIPE)

    // Two temporary accumulator sets and their scales (sa_row * sb; 2 registers each).
    cute::Tensor acc0 = make_fragment_like(accum);
    cute::Tensor acc1 = make_fragment_like(accum);
    cute::Tensor sc0 = make_tensor_like<float>(tCsSFA(_, _, _, _0{}));
    cute::Tensor sc1 = make_tensor_like<float>(tCsSFA(_, _, _, _0{}));

    // Wait for the next stage, read its scales, issue its K block into `acc` (async).
    PipelineState read = smem_pipe_read;
    auto issue = [&](auto& acc, auto& sc) {
      pipeline.consumer_wait(read);
      const int stage = read.index();
      const float sb = sSFB(0, 0, stage);
      cute::Tensor src = filter_zeros(tCsSFA(_, _, _, stage));
      cute::Tensor dst = filter_zeros(sc);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(dst); ++i) dst(i) = src(i) * sb;
      tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
      warpgroup_fence_operand(acc);
      warpgroup_arrive();
      CUTLASS_PRAGMA_UNROLL
      for (int kb = 0; kb < size<2>(tCrA); ++kb) {
        cute::gemm(tiled_mma, tCrA(_, _, kb, stage), tCrB(_, _, kb, stage), acc);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_fence_operand(acc);
      ++read;
    };
    // Add a completed block, scaled, into the fp32 accumulators.
    auto promote = [&](auto& acc, auto const& sc) {
      warpgroup_fence_operand(acc);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accum); ++i) accum(i) += acc(i) * sc(i);
      warpgroup_fence_operand(acc);
    };
    PipelineState release = smem_pipe_read;
    auto release_one = [&]() {
      pipeline.consumer_release(release);
      ++release;
    };

    warpgroup_fence_operand(accum);
    clear(accum);
    if (k_tile_count <= 0) {
      warpgroup_fence_operand(accum);
      return;
    }
    issue(acc0, sc0);  // block 0
    int k = 1;
    // Invariant at the top: block k-1 is in flight in acc0.
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k + 1 < k_tile_count; k += 2) {
      issue(acc1, sc1);  // block k
      warpgroup_wait<1>();
      release_one();
      promote(acc0, sc0);  // block k-1, while block k runs
      issue(acc0, sc0);    // block k+1
      warpgroup_wait<1>();
      release_one();
      promote(acc1, sc1);  // block k, while block k+1 runs
    }
    if (k < k_tile_count) {  // one block left: k = k_tile_count - 1
      issue(acc1, sc1);
      warpgroup_wait<1>();
      release_one();
      promote(acc0, sc0);
      warpgroup_wait<0>();
      promote(acc1, sc1);
    } else {
      warpgroup_wait<0>();
      promote(acc0, sc0);
    }
    warpgroup_fence_operand(accum);
  }
};

}  // namespace groupmm::cuda::sm90
