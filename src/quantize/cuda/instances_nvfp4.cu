// The tile kernel's nvfp4 variants: NVFP4 (1x16 / 16x1 / 16x16 blocks, E4M3 block scales,
// per-expert S_enc; all three amax schedules).
#include "quantize/cuda/tile_kernel.cuh"

GROUPMM_QUANTIZE_TILE_KERNELS(nvfp4)
