// SM90 grouped GEMM instantiation: fwd_bf16_alpha_128x256_coop_c12 (bf16 with a per-expert alpha:
// the prefill path of the 4-bit weight GEMM)
#include "gemm/cuda/sm90_grouped.cuh"

GROUPMM_SM90_KERNEL_SCALED(fwd_bf16_alpha_128x256_coop_c12, cutlass::bfloat16_t,
                           cutlass::bfloat16_t, cutlass::bfloat16_t, forward, 128, 256, 64, 1, 2,
                           cooperative, per_expert, false)
