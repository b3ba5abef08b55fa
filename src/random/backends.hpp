// Backend entry points of fill_uniform (args already validated).
#pragma once

#include "base/cuda_entry.hpp"
#include "groupmm/random.hpp"

namespace groupmm::cpu {
void fill_uniform(Context& ctx, const TensorView& v, float lo, float hi, uint64_t seed);
}
namespace groupmm::cuda {
GROUPMM_CUDA_ENTRY void fill_uniform(Context& ctx, const TensorView& v, float lo, float hi,
                                     uint64_t seed);
}
