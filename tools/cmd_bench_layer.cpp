// `groupmm bench layer`: GroupedLinear forward + backward of the Qwen3-30B-A3B expert layers
// (gate_up G=128 K=2048 N=1536, down G=128 K=768 N=2048; bf16, 65536 routed rows) against the
// sum of the same grouped GEMMs called directly, measured in the same run, and the host time of
// one eager forward. Targets (issue 5): layer time <= 1.10x the GEMM sum; host time per forward
// <= 30 us (no graphs). Each case is validated first against the cuBLAS per-expert loop.
#include <cstdio>
#include <fstream>

#include "bench_common.hpp"
#include "bench_layer_quantized.hpp"
#include "cli.hpp"
#include "groupmm/gemm.hpp"
#include "groupmm/nn/grouped_linear.hpp"
#include "groupmm/random.hpp"

namespace groupmm::tool {
namespace {

struct LayerShape {
  const char* name;
  int64_t G, K, N;
};
const LayerShape kLayers[] = {{"qwen3_gate_up", 128, 2048, 1536}, {"qwen3_down", 128, 768, 2048}};

double rel_err(const TensorView& a, const TensorView& b) {
  std::vector<uint16_t> ha(size_t(a.numel())), hb(ha.size());
  copy(TensorView(ha.data(), a.dtype, Device::CPU, {a.numel()}), a);
  copy(TensorView(hb.data(), b.dtype, Device::CPU, {b.numel()}), b);
  double num = 0, den = 0;
  for (size_t i = 0; i < ha.size(); ++i) {
    const double x = bf16_bits_to_float(ha[i]), y = bf16_bits_to_float(hb[i]);
    if (!std::isfinite(x)) return INFINITY;
    num += (x - y) * (x - y);
    den += y * y;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

struct LayerOptions {
  bool cpu = false;
  int64_t rows = 0;
  int iters = 0;
  std::vector<std::string> patterns = kSplitPatterns;
  std::string json_path;
  std::string recipe = "bf16", case_filter;  // quantized recipes: their own suite
  CLI::Option *rows_opt, *iters_opt;
};

// Bytes one layer case allocates: the layer (W, dW, y, dx) and the bench's x, dy, y2, dx2, dw2.
double layer_bytes(int64_t G, int64_t rows, int64_t N, int64_t K) {
  const double M = double(rows);
  return 2.0 * (3.0 * double(G) * double(N) * double(K) + 3 * M * N + 3 * M * K) * 1.1;
}

// A quantized recipe's training step vs the bf16 layer (bench_layer_quantized.cpp), per pattern.
int run_quantized(const LayerOptions& o) {
  if (o.cpu) throw UsageError("--recipe " + o.recipe + " needs a GPU (--cpu runs bf16 only)");
  if (o.rows_opt->count() || !o.json_path.empty())
    throw UsageError("--rows and --json are not supported with --recipe " + o.recipe);
  GROUPMM_CHECK(cuda_available(), "bench layer: --recipe needs an sm_90 GPU (none visible)");
  const QuantRecipe r = o.recipe == "fp8_current" ? QuantRecipe::fp8_current
                        : o.recipe == "fp8_block" ? QuantRecipe::fp8_block
                                                  : QuantRecipe::mxfp8;
  int rc = 0;
  for (const std::string& pat : o.patterns)
    rc |= bench_layer_quantized(r, o.case_filter, pat, o.iters_opt->count() ? o.iters : 5);
  return rc;
}

int run_bench_layer(const LayerOptions& o) {
  if (o.recipe != "bf16") return run_quantized(o);
  if (!o.case_filter.empty()) throw UsageError("--case needs a quantized --recipe");
  const bool on_cpu = o.cpu;  // smoke run of the code path on small shapes
  GROUPMM_CHECK(on_cpu || cuda_available(),
                "bench layer: needs an sm_90 GPU (none visible); --cpu "
                "runs a small smoke version on the CPU reference");
  const Device dev = on_cpu ? Device::CPU : Device::CUDA;
  const int64_t rows = o.rows_opt->count() ? o.rows : on_cpu ? 512 : 65536;
  const int64_t scale = on_cpu ? 16 : 1;  // CPU smoke: every dim / 16
  const int iters = o.iters_opt->count() ? o.iters : on_cpu ? 2 : 20;
  for (const LayerShape& ls : kLayers)
    check_fits_memory("bench layer: " + std::string(ls.name),
                      layer_bytes(ls.G / (on_cpu ? 8 : 1), rows, ls.N / scale, ls.K / scale), dev,
                      "--rows");
  std::ofstream json;
  if (!o.json_path.empty()) {
    json = open_json(o.json_path);  // a wrong path fails before any work
    json << "{\"suite\": \"layer\", \"device\": \"" << device_name(dev) << "\", \"cases\": [\n";
  }
  bool first_record = true, all_met = true;

  cudaStream_t stream = nullptr;
  if (!on_cpu) GROUPMM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    Context ctx(dev, stream);
    std::printf(
        "bench layer: GroupedLinear forward + backward (immediate wgrad) vs its grouped GEMMs, "
        "bf16, "
        "%lld rows, %s\n",
        (long long)rows, on_cpu ? "CPU reference smoke run (dims / 16)" : "CUDA");
    // The CPU smoke run does a few GFLOP/s: its rate column is in GFLOP/s, the GPU's in TFLOP/s.
    const double rate_unit = on_cpu ? 1e9 : 1e12;
    std::printf("%-14s %-8s %-22s %10s %10s %10s %10s %10s %7s %9s %8s\n", "case", "pattern",
                "shape (G,M,N,K)", "layer us", "fwd us", "dgrad us", "wgrad us", "gemm sum",
                "ratio", "host us", on_cpu ? "GFLOP/s" : "TFLOP/s");
    for (const LayerShape& ls : kLayers) {
      const int64_t G = ls.G / (on_cpu ? 8 : 1), K = ls.K / scale, N = ls.N / scale;
      nn::GroupedLinearConfig cfg;
      cfg.experts = G;
      cfg.in_features = K;
      cfg.out_features = N;
      cfg.max_tokens = rows;
      nn::GroupedLinear layer(ctx, cfg);
      Tensor x = Tensor::empty({rows, K}, DType::bf16, dev, stream);
      Tensor dy = Tensor::empty({rows, N}, DType::bf16, dev, stream);
      Tensor y2 = Tensor::empty({rows, N}, DType::bf16, dev, stream);
      Tensor dx2 = Tensor::empty({rows, K}, DType::bf16, dev, stream);
      Tensor dw2 = Tensor::empty({G, N, K}, DType::bf16, dev, stream);
      Tensor sp = Tensor::empty({G}, DType::int32, dev, stream);
      fill_uniform(ctx, x, -1.0f, 1.0f, 1);
      fill_uniform(ctx, dy, -0.05f, 0.05f, 2);
      for (const std::string& pat : o.patterns) {
        const auto s64 = bench_splits(pat, G, rows);
        std::vector<int32_t> s32(s64.begin(), s64.end());
        copy(sp, TensorView(s32.data(), DType::int32, Device::CPU, {G}), stream);

        // validate: the layer's y and dx against the cuBLAS per-expert loop (GPU) or the ops (CPU)
        const TensorView y = layer.forward(ctx, x, sp);
        const TensorView dx = layer.backward(ctx, dy);
        GroupedGemmArgs ref;
        ref.engine = on_cpu ? GemmEngine::reference : GemmEngine::cublas_loop;
        ref.pass = GemmPass::forward, ref.a = x, ref.b = layer.weight(), ref.out = y2,
        ref.splits = sp;
        grouped_gemm(ctx, ref);
        ref.pass = GemmPass::dgrad, ref.a = dy, ref.out = dx2;
        grouped_gemm(ctx, ref);
        ctx.check();
        const double ey = rel_err(y, y2), edx = rel_err(dx, dx2);
        GROUPMM_CHECK(ey <= 1e-2 && edx <= 1e-2, "bench layer: ", ls.name, "/", pat,
                      " failed validation: rel err y ", ey, ", dx ", edx);

        // time: the layer, then each of its GEMMs alone (same buffers and splits)
        const double layer_us = time_us(ctx, 3, iters, [&](int) {
          layer.forward(ctx, x, sp);
          layer.backward(ctx, dy);
        });
        const double fwd_us =
            time_us(ctx, 3, iters, [&](int) { gemm_forward(ctx, x, layer.weight(), sp, y2); });
        const double dgrad_us =
            time_us(ctx, 3, iters, [&](int) { gemm_dgrad(ctx, dy, layer.weight(), sp, dx2); });
        const double wgrad_us =
            time_us(ctx, 3, iters, [&](int) { gemm_wgrad(ctx, dy, x, sp, dw2, false); });
        const double sum_us = fwd_us + dgrad_us + wgrad_us, ratio = layer_us / sum_us;

        // host time per eager forward: batches of 16 calls without sync, median per call
        const std::vector<double> host = host_batch_us(ctx, on_cpu ? 1 : 20, on_cpu ? 1 : 16,
                                                       [&] { layer.forward(ctx, x, sp); });
        const double host_us = host[host.size() / 2];
        const double flops = 6.0 * double(rows) * double(N) * double(K);
        char shape[64];
        std::snprintf(shape, sizeof shape, "%lld,%lld,%lld,%lld", (long long)G, (long long)rows,
                      (long long)N, (long long)K);
        const bool met = ratio <= 1.10 && host_us <= 30.0;
        all_met = all_met && met;
        std::printf("%-14s %-8s %-22s %10.1f %10.1f %10.1f %10.1f %10.1f %6.3fx %9.2f %8.1f%s\n",
                    ls.name, pat.c_str(), shape, layer_us, fwd_us, dgrad_us, wgrad_us, sum_us,
                    ratio, host_us, flops / (layer_us * 1e-6) / rate_unit,
                    on_cpu ? "" : (met ? "  [targets met]" : "  [TARGET MISSED]"));
        if (json.is_open()) {
          json << (first_record ? "" : ",\n") << "  {\"case\": \"" << ls.name
               << "\", \"pattern\": \"" << pat << "\", \"G\": " << G << ", \"M\": " << rows
               << ", \"N\": " << N << ", \"K\": " << K << ", \"layer_us\": " << layer_us
               << ", \"fwd_us\": " << fwd_us << ", \"dgrad_us\": " << dgrad_us
               << ", \"wgrad_us\": " << wgrad_us << ", \"ratio\": " << ratio
               << ", \"host_us_per_forward\": " << host_us << "}";
          first_record = false;
        }
      }
    }
    std::printf("targets (GPU): layer <= 1.10x GEMM sum, host <= 30 us per forward: %s\n",
                on_cpu ? "n/a on CPU" : (all_met ? "all met" : "MISSED (see rows above)"));
  }
  if (json.is_open()) {
    json << "\n]}\n";
    close_json(json, o.json_path);
  }
  if (stream) cudaStreamDestroy(stream);
  return 0;
}

void add_layer_options(CLI::App& app, LayerOptions& o) {
  app.add_flag("--cpu", o.cpu, "smoke run on the CPU reference backend (every dim / 16, G / 8)");
  add_choice_list(app, "--pattern", o.patterns, kSplitPatterns,
                  "split patterns to run (comma separated; default all three)");
  o.rows_opt =
      add_int(app, "--rows", o.rows, 1, INT32_MAX, "routed rows M (default: GPU 65536, CPU 512)");
  o.iters_opt = add_iters(app, o.iters,
                          "timed runs per measurement, median (default: GPU 20, "
                          "CPU 2)");
  add_json(app, o.json_path);
  add_choice(app, "--recipe", o.recipe, {"bf16", "fp8_current", "fp8_block", "mxfp8"},
             "bf16: the layer vs its grouped GEMMs; a quantized recipe: its training step vs the "
             "bf16 layer on the DeepSeek-V3, Mixtral and Qwen3 expert shapes (GPU)")
      ->capture_default_str();
  app.add_option("--case", o.case_filter,
                 "quantized recipes: only the shapes whose name contains this (e.g. qwen3)")
      ->type_name("TEXT");
}

Register reg_cmd_bench_layer(command<LayerOptions>(
    "bench", "layer",
    "GroupedLinear forward + backward vs its grouped GEMMs timed alone (Qwen3-30B "
    "expert layers) and host time per forward (GPU; --cpu: a small smoke run)",
    add_layer_options, run_bench_layer));

}  // namespace
}  // namespace groupmm::tool
