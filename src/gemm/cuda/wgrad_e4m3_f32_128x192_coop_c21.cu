// SM90 grouped GEMM instantiation: wgrad_e4m3_f32_128x192_coop_c21
#include "gemm/cuda/sm90_grouped.cuh"

GROUPMM_SM90_KERNEL_SCALED(wgrad_e4m3_f32_128x192_coop_c21, cutlass::float_e4m3_t,
                           cutlass::float_e4m3_t, float, wgrad, 128, 192, 128, 2, 1, cooperative,
                           per_expert, false)
