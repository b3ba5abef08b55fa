// The tile kernel's fp8_current variants: FP8 current scaling (per-expert scale: the static and
// both fused amax schedules).
#include "quantize/cuda/tile_kernel.cuh"

GROUPMM_QUANTIZE_TILE_KERNELS(fp8_current)
