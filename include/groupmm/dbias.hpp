// groupmm/dbias.hpp: grouped bias gradient, db_g = sum over expert g's rows of dy.
#pragma once

#include "groupmm/core.hpp"

namespace groupmm {

// group_dbias: db[g][n] = sum_{m in rows of expert g} dy[m][n]   (fp32 accumulation)
//
// clang-format off
//   dy          [M, N]  bf16, fp16 or fp32, row-major; expert g owns its rows by the splits rule
//   splits      [G]     int32 or int64 row counts, on the context's device
//   db          [G, N]  fp32 or dy's dtype (the fp32 sum rounded once)
//   accumulate          false: db_g = sum (a zero-row expert gets 0);
//                       true:  db_g += sum (fp32 db only; a zero-row expert is left unchanged)
// clang-format on
//
// Numerics: one summation order on both backends, bit for bit, the same as the bias gradient of
// bgrad_group_quantize (quantize.hpp): fp32; per 128-row tile of the expert (tiles start at the
// expert's first row), per 16-row segment a sequential sum from +0; the tile adds its 8 segment
// sums in order from +0; the expert adds its tile sums in order from +0; a NaN sum is the
// canonical 0x7FC00000. accumulate adds db last (db + sum, NaN canonical). Deterministic run to
// run; results differ from a row-by-row sum only by fp32 rounding.
//
// Faults: the splits rule of offsets.hpp with M = dy.shape[0] (negative -> 0, ranges past M cut
// short, a sum other than M reported), against OpId::group_dbias.
//
// total (SplitsTotal, core.hpp): exact (the default) or at_most: sum(splits) <= M, the dy rows
// past the sum are not read (they belong to no expert) and a short sum is no fault; a sum above M
// is still reported (kFaultSplitsOverflow + kFaultSplitsTotalMismatch). db is [G, N] and is
// written as with exact splits. On the rows the experts own, the result is exact mode's bit for
// bit (the same per-expert tiles and order).
//
// Graph safe on CUDA: three launches (per-expert plan, per-tile column sums, per-expert sums), no
// host read of splits, no sync; the workspace comes from the argument or the Context (reserve
// group_dbias_workspace_size() before capture). Any N, G >= 1; 16-byte aligned dy with N a
// multiple of 16/sizeof(dtype) takes the vectorized path. Minimum SM: sm_90 (CUDA); CPU anywhere.
void group_dbias(Context& ctx, const TensorView& dy, const TensorView& splits, const TensorView& db,
                 bool accumulate = false, void* workspace = nullptr, size_t workspace_bytes = 0);
void group_dbias(Context& ctx, const TensorView& dy, const TensorView& splits, const TensorView& db,
                 bool accumulate, SplitsTotal total, void* workspace = nullptr,
                 size_t workspace_bytes = 0);

// Workspace bytes group_dbias needs for M rows, N columns and G groups (0 on a CPU context).
size_t group_dbias_workspace_size(const Context& ctx, int64_t M, int64_t N, int64_t G);

}  // namespace groupmm
