// SM90 grouped GEMM instantiation: wgrad_e4m3_bf16_128x192_coop_c21
// Epilogue subtile 128x96 (CUTLASS would pick 128x32): a wgrad's reduction per expert is short,
// so the dW write is a large share of each tile; 128x96 measured faster on the DeepSeek-V3 and
// Qwen3 shapes (bench/RESULTS.md, "FP8 epilogue subtiles"). The forward and dgrad at
// 128x192 and the fp32 main_grad wgrads measured slower with a wider subtile and keep CUTLASS's.
#include "gemm/cuda/sm90_grouped.cuh"

GROUPMM_SM90_KERNEL_IMPL(wgrad_e4m3_bf16_128x192_coop_c21, cutlass::float_e4m3_t,
                         cutlass::float_e4m3_t, cutlass::bfloat16_t, wgrad, 128, 192, 128, 2, 1,
                         cooperative, per_expert, false, 96)
