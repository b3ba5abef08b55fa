// groupmm/dbias.hpp: grouped bias gradient, db_g = sum over expert g's rows of dy.
#pragma once

#include "groupmm/core.hpp"

namespace groupmm {

// group_dbias: db[g][n] = sum_{m in rows of expert g} dy[m][n]   (fp32 accumulation)
//
// clang-format off
//   dy          [M, N]  bf16, fp16 or fp32, row-major; expert g owns rows
//                       [start_g, start_g + splits[g])
//   splits      [G]     int32 or int64 row counts, on the context's device
//   db          [G, N]  fp32 or dy's dtype (the fp32 sum rounded once)
//   accumulate          false: db_g = sum (a zero-row expert gets 0);
//                       true:  db_g += sum (fp32 db only; a zero-row expert is left unchanged)
// clang-format on
//
// Numerics: fp32 sums. The CPU reference adds rows in order; the CUDA kernels add fixed 128-row
// chunks in a fixed tree, then the chunks in order, so results are deterministic run to run and
// equal to the reference within fp32 sum-order differences (rel <= 1e-5).
//
// Faults (device side, read with Context::check()): a negative split counts as 0
// (kFaultNegativeSplit, reported by the offsets step); rows past M are clamped
// (kFaultSplitsOverflow); a sum different from M sets kFaultSplitsTotalMismatch.
//
// Graph safe on CUDA: three launches (offsets, per-chunk column sums, per-expert chunk sums), no
// host read of splits, no sync; the workspace comes from the argument or the Context (reserve
// group_dbias_workspace_size() before capture). Any N, G >= 1; 16-byte aligned dy with N a
// multiple of 16/sizeof(dtype) takes the vectorized path. Minimum SM: sm_90 (CUDA); CPU anywhere.
void group_dbias(Context& ctx, const TensorView& dy, const TensorView& splits, const TensorView& db,
                 bool accumulate = false, void* workspace = nullptr, size_t workspace_bytes = 0);

// Workspace bytes group_dbias needs for M rows, N columns and G groups (0 on a CPU context).
size_t group_dbias_workspace_size(const Context& ctx, int64_t M, int64_t N, int64_t G);

}  // namespace groupmm
