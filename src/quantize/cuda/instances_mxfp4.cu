// The tile kernel's mxfp4 variants: MXFP4 (1x32 / 32x1 blocks, E8M0 scales, E2M1 data).
#include "quantize/cuda/tile_kernel.cuh"

GROUPMM_QUANTIZE_TILE_KERNELS(mxfp4)
