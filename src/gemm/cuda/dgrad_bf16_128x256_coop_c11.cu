// SM90 grouped GEMM instantiation: dgrad_bf16_128x256_coop_c11
#include "gemm/cuda/sm90_grouped.cuh"

GROUPMM_SM90_KERNEL(dgrad_bf16_128x256_coop_c11, cutlass::bfloat16_t, cutlass::bfloat16_t, dgrad,
                    128, 256, 64, 1, 1, cooperative)
