// SM90 grouped GEMM instantiation: wgrad_e4m3_f32_block_128x128_coop_c12
#include "gemm/cuda/sm90_grouped.cuh"

GROUPMM_SM90_KERNEL_SCALED(wgrad_e4m3_f32_block_128x128_coop_c12, cutlass::float_e4m3_t,
                           cutlass::float_e4m3_t, float, wgrad, 128, 128, 128, 1, 2, cooperative,
                           blockwise, false)
