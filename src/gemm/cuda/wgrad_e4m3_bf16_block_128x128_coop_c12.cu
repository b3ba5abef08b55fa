// SM90 grouped GEMM instantiation: wgrad_e4m3_bf16_block_128x128_coop_c12
// Epilogue subtile 128x64 (CUTLASS would pick 128x32): half the staged stores and barriers per
// tile while the mainloop keeps its stages (128x128 takes one); measured faster in every pass
// on the DeepSeek-V3 shapes (bench/RESULTS.md, "FP8 epilogue subtiles").
#include "gemm/cuda/sm90_grouped.cuh"

GROUPMM_SM90_KERNEL_IMPL(wgrad_e4m3_bf16_block_128x128_coop_c12, cutlass::float_e4m3_t,
                         cutlass::float_e4m3_t, cutlass::bfloat16_t, wgrad, 128, 128, 128, 1, 2,
                         cooperative, blockwise, false, 64)
