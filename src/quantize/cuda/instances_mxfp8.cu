// The tile kernel's mxfp8 variants: MXFP8 (1x32 / 32x1 blocks, E8M0 scales).
#include "quantize/cuda/tile_kernel.cuh"

GROUPMM_QUANTIZE_TILE_KERNELS(mxfp8)
