// Instantiations of the grouped quantize kernel for NVFP4 (1x16 / 16x1 / 16x16 blocks, E4M3
// block scales, per-expert fp32 S_enc).
#include "cuda/quantize_tile.cuh"

namespace groupmm::cuda {

void launch_quantize_nvfp4(Context& ctx, const TileParams& p, DType in) {
  launch_quantize_any<qnum::kNvfp4>(ctx, p, in);
}

}  // namespace groupmm::cuda
