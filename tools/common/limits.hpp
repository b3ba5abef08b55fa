// The library's limits that the command line checks before anything runs, so that going past one
// is a usage error naming the option (exit 2) instead of a library error after the set-up.
//
// The library states these in its public headers' comments only, and checks them in src/ (no
// constant is exported): the values here mirror them, each with its source.
#pragma once

#include <cstdint>

namespace groupmm::tool {

// groupmm/moe.hpp, RouterConfig: "E, 1..1024", "k, 1..min(E, 32)" (checked by moe_router_forward
// and nn::MoE's config check); moe_permute_plan: "E <= 1024".
inline constexpr int64_t kMaxExperts = 1024;
inline constexpr int64_t kMaxTopk = 32;

// groupmm/gemm.hpp, "Alignment (CUDA engines): N and K multiples of 8 (16-byte rows for TMA)": the
// MoE block's hidden size and expert width are the N and K of its expert GEMMs.
inline constexpr int64_t kGemmAlign = 8;

}  // namespace groupmm::tool
