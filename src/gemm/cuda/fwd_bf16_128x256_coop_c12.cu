// SM90 grouped GEMM instantiation: fwd_bf16_128x256_coop_c12
#include "gemm/cuda/sm90_grouped.cuh"

GROUPMM_SM90_KERNEL(fwd_bf16_128x256_coop_c12, cutlass::bfloat16_t, cutlass::bfloat16_t, forward,
                    128, 256, 64, 1, 2, cooperative)
