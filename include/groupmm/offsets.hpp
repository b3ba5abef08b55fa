// groupmm/offsets.hpp: per-expert row counts (splits) -> offsets, on the device, in one launch.
#pragma once

#include "groupmm/core.hpp"

namespace groupmm {

// Every output is optional (absent view = not written). With m_g = max(splits[g], 0):
//   start[g]            = sum_{j<g} m_j                      [G]    int32 or int64
//   end[g]              = sum_{j<=g} m_j  (torch "offs")     [G]    int32 or int64
//   element_start[s][g] = start[g] * row_strides[s]          [S, G] int64, S <= 4
//   scale_row_start[g]  = sum_{j<g} roundup(m_j, pad_rows)   [G]    int32 or int64
//                         (the per-expert padded scale rows of the swizzled 128x4 layout)
//   total[0]            = sum_j m_j                          [1]    int32 or int64
// Device faults (never out-of-bounds writes; read with Context::check()):
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
