// SM90 grouped GEMM instantiation: fwdswap_fp16_128x32_pp_c11
#include "gemm/cuda/sm90_grouped.cuh"

GROUPMM_SM90_KERNEL(fwdswap_fp16_128x32_pp_c11, cutlass::half_t, cutlass::half_t, forward_swap, 128,
                    32, 128, 1, 1, pingpong)
