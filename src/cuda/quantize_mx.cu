// Instantiations of the grouped quantize kernel for MXFP8 (1x32 / 32x1 blocks, E8M0 scales).
#include "cuda/quantize_tile.cuh"

namespace groupmm::cuda {

void launch_quantize_mx(Context& ctx, const TileParams& p, DType in) {
  launch_quantize_any<qnum::kMxfp8>(ctx, p, in);
}

}  // namespace groupmm::cuda
