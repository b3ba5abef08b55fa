// SM90 grouped GEMM instantiation: fwdswap_e4m3_bf16_block_128x32_pp_c11
#include "gemm/cuda/sm90_grouped.cuh"

GROUPMM_SM90_KERNEL_SCALED(fwdswap_e4m3_bf16_block_128x32_pp_c11, cutlass::float_e4m3_t,
                           cutlass::float_e4m3_t, cutlass::bfloat16_t, forward_swap, 128, 32, 128,
                           1, 1, pingpong, blockwise, false)
