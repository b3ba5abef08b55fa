// SM90 grouped GEMM instantiation: dgrad_e4m3_bf16_block_128x192_coop_c11
// A 128x192 tile over the weights' 128x128 scale blocks (sm90_blockwise_wide_mainloop.cuh);
// epilogue subtile 128x64 as the 128x128 tile's.
#include "gemm/cuda/sm90_grouped.cuh"

GROUPMM_SM90_KERNEL_FULL(dgrad_e4m3_bf16_block_128x192_coop_c11, cutlass::float_e4m3_t,
                         cutlass::float_e4m3_t, cutlass::bfloat16_t, dgrad, 128, 192, 128, 1, 1,
                         cooperative, blockwise, false, 64, true)
