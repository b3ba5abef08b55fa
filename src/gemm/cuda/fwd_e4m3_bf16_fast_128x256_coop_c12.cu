// SM90 grouped GEMM instantiation: fwd_e4m3_bf16_fast_128x256_coop_c12
#include "gemm/cuda/sm90_grouped.cuh"

GROUPMM_SM90_KERNEL_SCALED(fwd_e4m3_bf16_fast_128x256_coop_c12, cutlass::float_e4m3_t,
                           cutlass::float_e4m3_t, cutlass::bfloat16_t, forward, 128, 256, 128, 1, 2,
                           cooperative, per_expert, true)
