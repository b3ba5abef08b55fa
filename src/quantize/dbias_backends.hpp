// Backend entry points of group_dbias (args already validated).
#pragma once

#include "base/cuda_entry.hpp"
#include "groupmm/dbias.hpp"

namespace groupmm::cpu {
void group_dbias(Context& ctx, const TensorView& dy, const TensorView& splits, const TensorView& db,
                 bool accumulate, SplitsTotal total);
}
namespace groupmm::cuda {
GROUPMM_CUDA_ENTRY size_t group_dbias_workspace_size(int64_t M, int64_t N, int64_t G);
GROUPMM_CUDA_ENTRY void group_dbias(Context& ctx, const TensorView& dy, const TensorView& splits,
                                    const TensorView& db, bool accumulate, SplitsTotal total,
                                    void* workspace, size_t workspace_bytes);
}  // namespace groupmm::cuda
