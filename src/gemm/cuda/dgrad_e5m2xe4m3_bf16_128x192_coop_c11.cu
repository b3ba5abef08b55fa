// SM90 grouped GEMM instantiation: dgrad_e5m2xe4m3_bf16_128x192_coop_c11
#include "gemm/cuda/sm90_grouped.cuh"

GROUPMM_SM90_KERNEL_SCALED(dgrad_e5m2xe4m3_bf16_128x192_coop_c11, cutlass::float_e5m2_t,
                           cutlass::float_e4m3_t, cutlass::bfloat16_t, dgrad, 128, 192, 128, 1, 1,
                           cooperative, per_expert, false)
