// SM90 grouped GEMM instantiation: fwd_bf16_128x256_coop, cutlass::bfloat16_t, cutlass::bfloat16_t,
// forward, 128, 256, 64, 1, 2, cooperative
#include "cuda/gemm/sm90_grouped.cuh"

GROUPMM_SM90_KERNEL(fwd_bf16_128x256_coop, cutlass::bfloat16_t, cutlass::bfloat16_t, forward, 128,
                    256, 64, 1, 2, cooperative)
