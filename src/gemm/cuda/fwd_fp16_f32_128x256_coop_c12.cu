// SM90 grouped GEMM instantiation: fwd_fp16_f32_128x256_coop_c12
#include "gemm/cuda/sm90_grouped.cuh"

GROUPMM_SM90_KERNEL(fwd_fp16_f32_128x256_coop_c12, cutlass::half_t, float, forward, 128, 256, 64, 1,
                    2, cooperative)
