// `groupmm bench layer --recipe fp8_current|fp8_block|mxfp8`: one GroupedLinear training step
// (forward, backward, wgrad into the fp32 main grad; quantization of x, W and dy included) with
// the quantized recipe against the same step of the bf16 layer, on the suite's expert shapes, in
// the same run. Splits are multiples of 16 (the FP8 wgrad rule; the MoE permute pads to it).
#include <cstdio>

#include "bench/suites.hpp"
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

// One training step of the layer (`recipe` null: bf16) on a case: median us with W changed before
// each step (the quantized recipe quantizes W inside the step; 0 unless new_w) and with W cached
// (a further micro-batch of the same step).
std::pair<double, double> time_layer_step(Context& ctx, const SuiteShape& s,
                                          std::shared_ptr<const nn::LinearRecipe> recipe,
                                          const std::string& pattern, int iters, bool new_w) {
  nn::GroupedLinearConfig cfg;
  cfg.experts = s.G;
  cfg.in_features = s.K;
  cfg.out_features = s.N;
  cfg.max_tokens = s.M;
  cfg.accumulate_into_main_grad = true;
  cfg.recipe = std::move(recipe);
  nn::GroupedLinear layer(ctx, cfg);
  cudaStream_t st = ctx.stream();
  Tensor x = Tensor::empty({s.M, s.K}, DType::bf16, Device::CUDA, st);
  Tensor dy = Tensor::empty({s.M, s.N}, DType::bf16, Device::CUDA, st);
  Tensor sp = Tensor::empty({s.G}, DType::int64, Device::CUDA, st);
  fill_uniform(ctx, x, -1.0f, 1.0f, 1);
  fill_uniform(ctx, dy, -0.05f, 0.05f, 2);
  std::vector<int64_t> splits = align_splits16(bench_splits(pattern, s.G, s.M));
  copy(sp, TensorView(splits.data(), DType::int64, Device::CPU, {s.G}), st);
  double t[2] = {0, 0};
  for (const bool changed : {true, false}) {
    if (changed && !new_w) continue;
    t[changed ? 0 : 1] = 1e3 * median_ms(st, 2, iters, [&](int) {
                           if (changed) layer.weights_changed();
                           layer.forward(ctx, x, sp);
                           layer.backward(ctx, dy);
                           layer.backward_dw(ctx);
                         });
  }
  ctx.check();
  return {t[0], t[1]};
}

}  // namespace

int run_layer_quantized(QuantRecipe recipe, const std::string& case_filter,
                        const std::string& pattern, int iters) {
  const GpuStream stream;
  Context ctx(Device::CUDA, stream);
  std::printf(
      "bench layer --recipe %s: GroupedLinear step (forward + backward + wgrad into fp32 "
      "main grad, quantization included) vs the bf16 layer, %s splits\n",
      recipe_name(recipe), pattern.c_str());
  const Table t({text_col("case", 16), int_col("G", 5), int_col("M", 6), int_col("N", 6),
                 int_col("K", 6), num_col("bf16 us", 10, 1), num_col("new W us", 12, 1),
                 num_col("speedup", 8, 3), num_col("W cached us", 12, 1), num_col("speedup", 8, 3),
                 num_col("bf16 wgrad us", 13, 1), num_col("speedup", 8, 3)});
  t.print_header();
  for (const SuiteShape& s : kGemmSuite) {
    if (!is_training_layer(s) || !case_matches(case_filter, s.name)) continue;
    // bf16 has no weight cache: one timing.
    const double bf16 = time_layer_step(ctx, s, nullptr, pattern, iters, false).second;
    const auto [fresh, cached] =
        time_layer_step(ctx, s, nn::quantized_recipe(recipe), pattern, iters, true);
    // The same recipe with its wgrad in bf16 (QuantizedRecipeOptions::high_precision_wgrad), W
    // cached only.
    nn::QuantizedRecipeOptions hp;
    hp.high_precision_wgrad = true;
    const double hp_cached =
        time_layer_step(ctx, s, nn::quantized_recipe(recipe, hp), pattern, iters, false).second;
    t.print_row({s.name, s.G, s.M, s.N, s.K, bf16, fresh, bf16 / fresh, cached, bf16 / cached,
                 hp_cached, bf16 / hp_cached});
  }
  return 0;
}

}  // namespace groupmm::tool
