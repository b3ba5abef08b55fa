// SM90 grouped GEMM instantiation: fwd_e4m3_bf16_block_128x128_coop_c21
#include "cuda/gemm/sm90_grouped.cuh"

GROUPMM_SM90_KERNEL_SCALED(fwd_e4m3_bf16_block_128x128_coop_c21, cutlass::float_e4m3_t,
                           cutlass::float_e4m3_t, cutlass::bfloat16_t, forward, 128, 128, 128, 2, 1,
                           cooperative, blockwise, false)
