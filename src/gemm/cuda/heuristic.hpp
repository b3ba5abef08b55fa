// The cutlass_sm90 engine's heuristic: which configuration of configs.def a launch runs, and in
// which tile order. Host-known inputs only (pass, dtypes, recipe, M or expected_rows, N, K, G;
// never the split values), so the choice is the same for every routing a captured graph replays.
#pragma once

#include <cstdint>

#include "gemm/backends.hpp"
#include "gemm/cuda/configs.hpp"

namespace groupmm::cuda {

// A kernel row or a split of two. Throws when no configuration computes the launch.
GemmConfig heuristic_config(const GemmLaunch& l);

// Whether each expert's output tiles are visited across N' (else down M', CUTLASS's default).
bool heuristic_along_n(const GemmLaunch& l);

// The experts a split's first launch (its inside kernel) computes: lo <= m_g <= hi; the second
// launch computes every other expert.
struct SplitRows {
  int64_t lo, hi;
};
SplitRows split_rows(GemmConfig split);

}  // namespace groupmm::cuda
