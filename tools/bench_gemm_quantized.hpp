// The quantized-operand variant of `groupmm bench gemm` (bench_gemm_quantized.cpp).
#pragma once

#include <string>
#include <vector>

#include "groupmm/gemm.hpp"

namespace groupmm::tool {

struct BenchShape {
  const char* name;
  int64_t G, M, N, K;
  bool decode = false;  // forward only
};

struct QuantBenchOptions {
  QuantRecipe recipe = QuantRecipe::fp8_current;
  std::vector<BenchShape> shapes;
  std::string pass, pattern;  // filters (empty: all)
  int iters = 10;
  std::string json_path;
  bool fast_accum = false;  // fp8_current forward only
  std::string config;       // a kernel name instead of the heuristic's choice
  bool out_fp32 = false;    // wgrad into fp32 (the main_grad path) instead of bf16
};

// DeepGEMM's difference 1 - 2 sum(xy) / sum(x^2 + y^2) of two bf16 or fp32 views (any device).
double calc_diff_device(const TensorView& x, const TensorView& y);

// Runs the suite on a fresh Context of `stream`; returns 1 if a case failed validation.
int bench_gemm_quantized(const QuantBenchOptions& options, cudaStream_t stream);

}  // namespace groupmm::tool
