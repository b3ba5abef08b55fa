// SM90 grouped GEMM instantiation: fwd_e4m3_bf16_block_128x128_coop_c21
// Epilogue subtile 128x64 (CUTLASS would pick 128x32): half the staged stores and barriers per
// tile while the mainloop keeps its stages (128x128 takes one); measured faster in every pass
// on the DeepSeek-V3 shapes (bench/RESULTS.md, "FP8 epilogue subtiles").
// Promotion overlapped with the next K block's MMAs (sm90_blockwise_mainloop.cuh); measured
// in bench/RESULTS.md, "Blockwise promotion overlapped with the MMAs".
#include "cuda/gemm/sm90_grouped.cuh"

GROUPMM_SM90_KERNEL_FULL(fwd_e4m3_bf16_block_128x128_coop_c21, cutlass::float_e4m3_t,
                         cutlass::float_e4m3_t, cutlass::bfloat16_t, forward, 128, 128, 128, 2, 1,
                         cooperative, blockwise, false, 64, true)
