// The per-expert end of the grouped bias gradient, shared by bgrad_group_quantize and
// group_dbias (dbias.hpp's summation order): each 128-row tile of an expert has left its column
// sums in a [tiles, K] fp32 array; db[g, k] = the expert's tile sums added in tile order from +0.
#pragma once

#include "quantize/cuda/plan.cuh"

namespace groupmm::cuda {

struct DbiasReduceArgs {
  const float* partial = nullptr;  // [tile_bound(M, G), K]: row t = tile t's column sums
  int64_t K = 0;
  QuantPlan plan;           // tile_start: the experts' tiles
  TensorView db;            // [G, K] bf16 / fp16 / fp32
  bool accumulate = false;  // db += sums (fp32 db); a zero-row expert is left unchanged
};

// One launch after the kernel that wrote the partial sums (stream-ordered, graph safe).
void launch_dbias_reduce(Context& ctx, const DbiasReduceArgs& args);

}  // namespace groupmm::cuda
