// SM90 grouped GEMM instantiation: wgrad_bf16_bf16_256x128_coop_c21 (tuning candidate)
#include "cuda/gemm/sm90_grouped.cuh"

GROUPMM_SM90_KERNEL(wgrad_bf16_bf16_256x128_coop_c21, cutlass::bfloat16_t, cutlass::bfloat16_t, wgrad, 256, 128, 64, 2, 1, cooperative)
