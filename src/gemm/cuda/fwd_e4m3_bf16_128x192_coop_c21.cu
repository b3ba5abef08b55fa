// SM90 grouped GEMM instantiation: fwd_e4m3_bf16_128x192_coop_c21
#include "gemm/cuda/sm90_grouped.cuh"

GROUPMM_SM90_KERNEL_SCALED(fwd_e4m3_bf16_128x192_coop_c21, cutlass::float_e4m3_t,
                           cutlass::float_e4m3_t, cutlass::bfloat16_t, forward, 128, 192, 128, 2, 1,
                           cooperative, per_expert, false)
