// SM90 grouped GEMM instantiation: wgrad_bf16_f32_128x128_pp_c21
#include "gemm/cuda/sm90_grouped.cuh"

GROUPMM_SM90_KERNEL(wgrad_bf16_f32_128x128_pp_c21, cutlass::bfloat16_t, float, wgrad, 128, 128, 64,
                    2, 1, pingpong)
