// Backend entry points of group_offsets (args already validated).
#pragma once

#include "base/cuda_entry.hpp"
#include "groupmm/offsets.hpp"

namespace groupmm::cpu {
void group_offsets(Context& ctx, const OffsetsArgs& args);
}
namespace groupmm::cuda {
GROUPMM_CUDA_ENTRY void group_offsets(Context& ctx, const OffsetsArgs& args);
}
