// SM90 grouped GEMM instantiation: wgrad_fp16_fp16_128x256_coop, cutlass::half_t, cutlass::half_t,
// wgrad, 128, 256, 64, 1, 2, cooperative
#include "cuda/gemm/sm90_grouped.cuh"

GROUPMM_SM90_KERNEL(wgrad_fp16_fp16_128x256_coop, cutlass::half_t, cutlass::half_t, wgrad, 128, 256,
                    64, 1, 2, cooperative)
