// Fuzz cases kept outside fuzz_api.cpp (its table in run() lists them): the quantized grouped GEMM
// and the MoE ops and block. Each builds mostly valid arguments, then breaks one at random.
#pragma once

#include "fuzz_gen.hpp"
#include "groupmm/core.hpp"

namespace groupmm::fuzz {

void case_quantized_gemm(Gen& g, Arena& a, Context& ctx);
void case_moe_ops(Gen& g, Arena& a, Context& ctx);
void case_moe_block(Gen& g, Arena& a, Context& ctx);

}  // namespace groupmm::fuzz
