// `groupmm bench layer --recipe fp8_current|fp8_block|mxfp8`: one GroupedLinear training step
// (forward, backward, wgrad into the fp32 main grad; quantization of x, W and dy included) with
// the quantized recipe against the same step of the bf16 layer, on the suite's expert shapes, in
// the same run. Splits are multiples of 16 (the FP8 wgrad rule; the MoE permute pads to it).
#include <cstdio>

#include "bench_common.hpp"
#include "bench_layer_quantized.hpp"
#include "groupmm/nn/grouped_linear.hpp"
#include "groupmm/random.hpp"

namespace groupmm::tool {
namespace {

// The training layers of the GEMM suite (its contiguous, decode and Llama 4 cases are left out).
bool is_training_layer(const SuiteShape& s) {
  for (const char* n : {"dsv3_gate_up", "dsv3_down", "mixtral_gate_up", "mixtral_down",
                        "qwen3_gate_up", "qwen3_down"})
    if (std::string(n) == s.name) return true;
  return false;
}

std::vector<int64_t> align16_splits(std::vector<int64_t> s) {
  int64_t rest = 0;
  for (auto& v : s) rest += v % 16, v -= v % 16;
  s[0] += rest;  // the totals here are multiples of 16
  return s;
}

}  // namespace

int bench_layer_quantized(QuantRecipe recipe, const std::string& case_filter,
                          const std::string& pattern, int iters) {
  cudaStream_t stream;
  GROUPMM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    Context ctx(Device::CUDA, stream);
    std::printf(
        "bench layer --recipe %s: GroupedLinear step (forward + backward + wgrad into fp32 "
        "main grad, quantization included) vs the bf16 layer, %s splits\n",
        recipe_name(recipe), pattern.c_str());
    std::printf("%-16s %5s %6s %6s %6s %10s %12s %8s %12s %8s\n", "case", "G", "M", "N", "K",
                "bf16 us", "new W us", "speedup", "W cached us", "speedup");
    for (const SuiteShape& s : kGemmSuite) {
      if (!is_training_layer(s)) continue;
      if (!case_filter.empty() && std::string(s.name).find(case_filter) == std::string::npos)
        continue;
      nn::GroupedLinearConfig cfg;
      cfg.experts = s.G;
      cfg.in_features = s.K;
      cfg.out_features = s.N;
      cfg.max_tokens = s.M;
      cfg.accumulate_into_main_grad = true;
      double t[2] = {0, 0}, cached = 0;
      for (int q = 0; q < 2; ++q) {
        cfg.recipe = q ? nn::quantized_recipe(recipe) : nullptr;
        nn::GroupedLinear layer(ctx, cfg);
        Tensor x = Tensor::empty({s.M, s.K}, DType::bf16, Device::CUDA, stream);
        Tensor dy = Tensor::empty({s.M, s.N}, DType::bf16, Device::CUDA, stream);
        Tensor sp = Tensor::empty({s.G}, DType::int64, Device::CUDA, stream);
        fill_uniform(ctx, x, -1.0f, 1.0f, 1);
        fill_uniform(ctx, dy, -0.05f, 0.05f, 2);
        std::vector<int64_t> splits = align16_splits(bench_splits(pattern, s.G, s.M));
        copy(sp, TensorView(splits.data(), DType::int64, Device::CPU, {s.G}), stream);
        // "new W": the optimizer changed W since the last step, so the quantized recipe
        // quantizes W inside the step; "W cached": a further micro-batch of the same step.
        for (bool new_w : {true, false}) {
          const double us = 1e3 * median_ms(stream, 2, iters, [&](int) {
                              if (new_w) layer.weights_changed();
                              layer.forward(ctx, x, sp);
                              layer.backward(ctx, dy);
                              layer.backward_dw(ctx);
                            });
          if (new_w) t[q] = us;
          if (!new_w && q == 1) cached = us;
        }
        ctx.check();
      }
      std::printf("%-16s %5lld %6lld %6lld %6lld %10.1f %12.1f %8.3f %12.1f %8.3f\n", s.name,
                  (long long)s.G, (long long)s.M, (long long)s.N, (long long)s.K, t[0], t[1],
                  t[0] / t[1], cached, t[0] / cached);
      std::fflush(stdout);
    }
  }
  GROUPMM_CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace groupmm::tool
