// Backend entry points of group_offsets (args already validated).
#pragma once

#include "groupmm/offsets.hpp"

namespace groupmm::cpu {
void group_offsets(Context& ctx, const OffsetsArgs& args);
}
namespace groupmm::cuda {
void group_offsets(Context& ctx, const OffsetsArgs& args);
}
