// The tile kernel's fp8_block variants: FP8 blockwise (1x128 / 128x1 / 128x128 blocks, fp32
// scales).
#include "quantize/cuda/tile_kernel.cuh"

GROUPMM_QUANTIZE_TILE_KERNELS(fp8_block)
