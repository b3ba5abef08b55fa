// The separate expert amax pass of fp8_current / nvfp4 (AmaxSchedule::separate): a streaming
// read of the input before the tile kernel, merging each expert's amax into amax_bits.
#pragma once

#include "quantize/cuda/plan.cuh"

namespace groupmm::cuda {

struct AmaxPassArgs {
  TensorView input;  // [M, K] bf16 / fp16 / fp32
  int64_t K = 0;
  int64_t col_tiles = 0;  // ceil(K / 128)
  int grid = 1;           // CTAs (the tile kernel's persistent grid)
  QuantPlan plan;
  uint32_t* amax_bits = nullptr;  // [G] canonical amax bits, zeroed by the plan
};

// Launched with PDL after the plan; the tile kernel after it waits for it in pdl_wait.
void launch_amax_pass(Context& ctx, const AmaxPassArgs& args);

}  // namespace groupmm::cuda
