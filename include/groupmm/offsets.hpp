// groupmm/offsets.hpp: per-expert row counts (splits) -> offsets, on the device, in one launch.
#pragma once

#include "groupmm/core.hpp"

namespace groupmm {

// ---- The splits rule ---------------------------------------------------------------------------
// Every op that takes per-expert row counts (splits) turns them into row ranges by this one rule,
// on every backend (the CUDA kernels share one device scan), and reports bad splits in the
// Context's status word (read with Context::check()) instead of reading or writing out of bounds.
// With M the rows the op's buffers hold and m_g = splits[g]:
//   - a negative m_g counts as 0                                          (kFaultNegativeSplit);
//   - start_g = min(sum_{j<g} m_j, M) and rows_g = min(m_g, M - start_g): an expert that runs
//     past row M is cut short there, the experts after it get no rows     (kFaultSplitsOverflow);
//   - a sum of the m_g other than M                                 (kFaultSplitsTotalMismatch);
//     ops with SplitsTotal::at_most (core.hpp) and weighted_swiglu's splits: only a sum above M.
// Rows past the last expert's range are left unwritten. group_offsets has no row buffer: it
// applies the rule with M unbounded and checks the sum against expected_total when one is given.

// Every output is optional (absent view = not written). With m_g = max(splits[g], 0):
//   start[g]            = sum_{j<g} m_j                      [G]    int32 or int64
//   end[g]              = sum_{j<=g} m_j  (torch "offs")     [G]    int32 or int64
//   element_start[s][g] = start[g] * row_strides[s]          [S, G] int64, S <= 4
//   scale_row_start[g]  = sum_{j<g} roundup(m_j, pad_rows)   [G]    int32 or int64
//                         (the per-expert padded scale rows of the swizzled 128x4 layout)
//   total[0]            = sum_j m_j                          [1]    int32 or int64
// Device faults (the splits rule above; never out-of-bounds writes):
//   a negative split -> kFaultNegativeSplit (counted as 0);
//   expected_total >= 0 and the sum differs -> kFaultSplitsTotalMismatch;
//   a value that does not fit an int32 output -> kFaultSplitsOverflow (clamped to INT32_MAX).
// Graph safe: one kernel of one block, no host read of splits, no allocation. Any G >= 1.
struct OffsetsArgs {
  TensorView splits;  // [G] int32 or int64, required
  int64_t expected_total = -1;
  TensorView start;
  TensorView end;
  TensorView element_start;
  std::array<int64_t, 4> row_strides{0, 0, 0, 0};
  TensorView scale_row_start;
  int64_t pad_rows = 128;
  TensorView total;
  std::string to_string() const;
};

void group_offsets(Context& ctx, const OffsetsArgs& args);

// Validates args against ctx (shared by both backends).
void validate_offsets_args(const Context& ctx, const OffsetsArgs& args);

}  // namespace groupmm
