// The quantized-recipe variant of `groupmm bench layer` (bench_layer_quantized.cpp).
#pragma once

#include <string>

#include "groupmm/core.hpp"

namespace groupmm::tool {

// Times one GroupedLinear training step of `recipe` against the bf16 layer on the suite's expert
// shapes (those whose name contains case_filter), splits of `pattern`. Needs a GPU.
int bench_layer_quantized(QuantRecipe recipe, const std::string& case_filter,
                          const std::string& pattern, int iters);

}  // namespace groupmm::tool
