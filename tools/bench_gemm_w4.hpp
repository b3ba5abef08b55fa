// The 4-bit weight variant of `groupmm bench gemm` (bench_gemm_w4.cpp): --weights nvfp4|mxfp4.
#pragma once

#include <string>
#include <vector>

#include "groupmm/core.hpp"

namespace groupmm::tool {

struct W4BenchOptions {
  QuantRecipe recipe = QuantRecipe::nvfp4;  // nvfp4 or mxfp4
  std::string filter;                       // case name substring (empty: all)
  int iters = 20;
  std::string json_path;
};

// The names of the cases (for --case validation).
std::vector<std::string> w4_bench_case_names();

// Runs the decode and prefill cases on a fresh Context of `stream`, each against our bf16 engine
// on the same shapes and splits; returns 1 if a case failed validation.
int bench_gemm_w4(const W4BenchOptions& options, cudaStream_t stream);

}  // namespace groupmm::tool
