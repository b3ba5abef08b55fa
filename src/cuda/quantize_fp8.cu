// Instantiations of the grouped quantize kernel for FP8 current scaling and FP8 blockwise.
#include "cuda/quantize_tile.cuh"

namespace groupmm::cuda {

void launch_quantize_fp8(Context& ctx, const TileParams& p, DType in) {
  if (p.L.recipe == qnum::kFp8Current) {
    launch_quantize_any<qnum::kFp8Current>(ctx, p, in);
  } else {
    launch_quantize_any<qnum::kFp8Block>(ctx, p, in);
  }
}

}  // namespace groupmm::cuda
