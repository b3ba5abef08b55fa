// SM90 grouped GEMM instantiation: wgrad_fp16_f32_128x256_coop_c21
#include "gemm/cuda/sm90_grouped.cuh"

GROUPMM_SM90_KERNEL(wgrad_fp16_f32_128x256_coop_c21, cutlass::half_t, float, wgrad, 128, 256, 64, 2,
                    1, cooperative)
