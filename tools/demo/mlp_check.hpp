// The demo's check: every stage of one expert recomputed by naive loops in double precision,
// independent of both backends (the CPU backend must not be checked against itself).
#pragma once

#include <cstdint>
#include <string>

#include "groupmm/core.hpp"

namespace groupmm::tool {

// The demo MLP's tensors after one step (any device): activations [M, *] sorted by expert,
// weights and weight grads [G, N, K], all bf16.
struct MlpViews {
  int64_t H = 0, I = 0;         // hidden size, expert width (gate_up has 2I outputs)
  TensorView x, gu, h, y;       // forward: x [M,H], gu [M,2I], h [M,I], y [M,H]
  TensorView dy, da, dh, dx;    // backward: dy [M,H], da [M,I], dh [M,2I], dx [M,H]
  TensorView w1, w2, dw1, dw2;  // gate_up [G,2I,H], down [G,H,I] and their grads
};

struct ExpertCheck {
  double worst = 0;          // largest relative error over the stages
  std::string worst_stage;   // which stage
  int64_t rows_checked = 0;  // sampled rows per row-wise stage
  int64_t grad_entries = 0;  // sampled weight-grad entries per wgrad stage
};

// Checks expert g (rows [start, start + rows)) stage by stage, each from the run's own stage
// inputs: relative error ||out - ref|| / ||ref|| over up to 16 sampled rows (forward, dgrad,
// SwiGLU) and 256 sampled weight-grad entries (wgrad, summed over all of the expert's rows).
// A zero-row expert passes when its weight grads are exactly 0.
ExpertCheck check_expert_naive(const MlpViews& m, int64_t g, int64_t start, int64_t rows);

}  // namespace groupmm::tool
