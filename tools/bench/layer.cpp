// `groupmm bench layer`: GroupedLinear forward + backward of the Qwen3-30B-A3B expert layers
// (gate_up G=128 K=2048 N=1536, down G=128 K=768 N=2048; bf16, 65536 routed rows) against the
// sum of the same grouped GEMMs called directly, measured in the same run, and the host time of
// one eager forward. Targets (issue 5): layer time <= 1.10x the GEMM sum; host time per forward
// <= 30 us (no graphs). Each case is validated first against the cuBLAS per-expert loop.
#include <cstdio>
#include <fstream>

#include "bench/suites.hpp"
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

struct BenchLayerOptions {
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
int run_bench_layer_quantized(const BenchLayerOptions& o) {
  if (o.cpu) throw UsageError("--recipe " + o.recipe + " needs a GPU (--cpu runs bf16 only)");
  if (o.rows_opt->count() || !o.json_path.empty())
    throw UsageError("--rows and --json are not supported with --recipe " + o.recipe);
  require_gpu("bench layer: --recipe");
  int rc = 0;
  for (const std::string& pat : o.patterns)
    rc |= run_layer_quantized(training_recipe_of(o.recipe), o.case_filter, pat,
                              o.iters_opt->count() ? o.iters : 5);
  return rc;
}

// The CPU smoke run does a few GFLOP/s: its rate column is in GFLOP/s, the GPU's in TFLOP/s.
Table layer_table(bool cpu) {
  return Table({text_col("case", 14), text_col("pattern", 8), text_col("shape (G,M,N,K)", 22),
                num_col("layer us", 10, 1), num_col("fwd us", 10, 1), num_col("dgrad us", 10, 1),
                num_col("wgrad us", 10, 1), num_col("gemm sum", 10, 1),
                num_col("ratio", 7, 3, 'f', "x"), num_col("host us", 9, 2),
                num_col(cpu ? "GFLOP/s" : "TFLOP/s", 8, 1)});
}

// Where the bf16 suite runs: the device and its sizes (the CPU smoke run divides them).
struct LayerRun {
  Device dev;
  bool cpu;
  int64_t rows, scale;  // routed rows; every dim / scale (CPU: 16), G / (CPU: 8)
  int iters;
  Table table;
};

// The layer's y and dx against the cuBLAS per-expert loop (GPU) or the reference ops (CPU).
void validate_layer(Context& ctx, nn::GroupedLinear& layer, const LayerRun& r, const Tensor& x,
                    const Tensor& dy, const Tensor& sp, const Tensor& y2, const Tensor& dx2,
                    const std::string& what) {
  const TensorView y = layer.forward(ctx, x, sp);
  const TensorView dx = layer.backward(ctx, dy);
  GroupedGemmArgs ref;
  ref.engine = r.cpu ? GemmEngine::reference : GemmEngine::cublas_loop;
  ref.pass = GemmPass::forward, ref.a = x, ref.b = layer.weight(), ref.out = y2, ref.splits = sp;
  grouped_gemm(ctx, ref);
  ref.pass = GemmPass::dgrad, ref.a = dy, ref.out = dx2;
  grouped_gemm(ctx, ref);
  ctx.check();
  const double ey = rel_err(y, y2), edx = rel_err(dx, dx2);
  GROUPMM_CHECK(ey <= 1e-2 && edx <= 1e-2, "bench layer: ", what, " failed validation: rel err y ",
                ey, ", dx ", edx);
}

// One layer shape on every chosen pattern: validated, then the layer and each of its GEMMs alone
// timed (same buffers and splits), and the host time per eager forward. Returns whether the
// targets were met.
bool run_layer_shape(Context& ctx, const BenchLayerOptions& o, const LayerRun& r,
                     const LayerShape& ls, JsonFile& json) {
  const int64_t G = ls.G / (r.cpu ? 8 : 1), K = ls.K / r.scale, N = ls.N / r.scale, M = r.rows;
  nn::GroupedLinearConfig cfg;
  cfg.experts = G, cfg.in_features = K, cfg.out_features = N, cfg.max_tokens = M;
  nn::GroupedLinear layer(ctx, cfg);
  cudaStream_t st = ctx.stream();
  Tensor x = Tensor::empty({M, K}, DType::bf16, r.dev, st);
  Tensor dy = Tensor::empty({M, N}, DType::bf16, r.dev, st);
  Tensor y2 = Tensor::empty({M, N}, DType::bf16, r.dev, st);
  Tensor dx2 = Tensor::empty({M, K}, DType::bf16, r.dev, st);
  Tensor dw2 = Tensor::empty({G, N, K}, DType::bf16, r.dev, st);
  Tensor sp = Tensor::empty({G}, DType::int32, r.dev, st);
  fill_uniform(ctx, x, -1.0f, 1.0f, 1);
  fill_uniform(ctx, dy, -0.05f, 0.05f, 2);
  bool all_met = true;
  for (const std::string& pat : o.patterns) {
    const auto s64 = bench_splits(pat, G, M);
    std::vector<int32_t> s32(s64.begin(), s64.end());
    copy(sp, TensorView(s32.data(), DType::int32, Device::CPU, {G}), st);
    validate_layer(ctx, layer, r, x, dy, sp, y2, dx2, std::string(ls.name) + "/" + pat);
    const double layer_us = time_us(ctx, 3, r.iters, [&](int) {
      layer.forward(ctx, x, sp);
      layer.backward(ctx, dy);
    });
    const TensorView w = layer.weight();
    const double fwd_us = time_us(ctx, 3, r.iters, [&](int) { gemm_forward(ctx, x, w, sp, y2); });
    const double dgrad_us = time_us(ctx, 3, r.iters, [&](int) { gemm_dgrad(ctx, dy, w, sp, dx2); });
    const double wgrad_us =
        time_us(ctx, 3, r.iters, [&](int) { gemm_wgrad(ctx, dy, x, sp, dw2, false); });
    const double sum_us = fwd_us + dgrad_us + wgrad_us, ratio = layer_us / sum_us;
    // host time per eager forward: batches of 16 calls without sync, median per call
    const std::vector<double> host =
        host_batch_us(ctx, r.cpu ? 1 : 20, r.cpu ? 1 : 16, [&] { layer.forward(ctx, x, sp); });
    const double host_us = host[host.size() / 2];
    const double flops = 6.0 * double(M) * double(N) * double(K), unit = r.cpu ? 1e9 : 1e12;
    const bool met = ratio <= 1.10 && host_us <= 30.0;
    all_met = all_met && met;
    const std::string shape = std::to_string(G) + "," + std::to_string(M) + "," +
                              std::to_string(N) + "," + std::to_string(K);
    r.table.print_row({ls.name, pat, shape, layer_us, fwd_us, dgrad_us, wgrad_us, sum_us, ratio,
                       host_us, flops / (layer_us * 1e-6) / unit},
                      r.cpu ? "" : (met ? "  [targets met]" : "  [TARGET MISSED]"));
    json.add(JsonRecord()
                 .add("case", ls.name)
                 .add("pattern", pat)
                 .add("G", G)
                 .add("M", M)
                 .add("N", N)
                 .add("K", K)
                 .add("layer_us", layer_us)
                 .add("fwd_us", fwd_us)
                 .add("dgrad_us", dgrad_us)
                 .add("wgrad_us", wgrad_us)
                 .add("ratio", ratio)
                 .add("host_us_per_forward", host_us));
  }
  return all_met;
}

int run_bench_layer(const BenchLayerOptions& o) {
  if (o.recipe != "bf16") return run_bench_layer_quantized(o);
  if (!o.case_filter.empty()) throw UsageError("--case needs a quantized --recipe");
  if (!o.cpu)  // --cpu: a smoke run of the code path on small shapes
    require_gpu("bench layer", "; --cpu runs a small smoke version on the CPU reference");
  const bool cpu = o.cpu;
  const LayerRun r{cpu ? Device::CPU : Device::CUDA,
                   cpu,
                   o.rows_opt->count() ? o.rows
                   : cpu               ? 512
                                       : 65536,
                   cpu ? 16 : 1,
                   o.iters_opt->count() ? o.iters
                   : cpu                ? 2
                                        : 20,
                   layer_table(cpu)};
  for (const LayerShape& ls : kLayers)
    check_fits_memory("bench layer: " + std::string(ls.name),
                      layer_bytes(ls.G / (cpu ? 8 : 1), r.rows, ls.N / r.scale, ls.K / r.scale),
                      r.dev, "--rows");
  JsonFile json(o.json_path);
  bool all_met = true;
  {
    const GpuStream stream(!cpu);
    Context ctx(r.dev, stream);
    std::printf(
        "bench layer: GroupedLinear forward + backward (immediate wgrad) vs its grouped GEMMs, "
        "bf16, %lld rows, %s\n",
        (long long)r.rows, cpu ? "CPU reference smoke run (dims / 16)" : "CUDA");
    r.table.print_header();
    for (const LayerShape& ls : kLayers) all_met = run_layer_shape(ctx, o, r, ls, json) && all_met;
    std::printf("targets (GPU): layer <= 1.10x GEMM sum, host <= 30 us per forward: %s\n",
                cpu ? "n/a on CPU" : (all_met ? "all met" : "MISSED (see rows above)"));
  }
  json.write(JsonRecord().add("suite", "layer").add("device", device_name(r.dev)));
  return 0;
}

void add_bench_layer_options(CLI::App& app, BenchLayerOptions& o) {
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

Register reg_bench_layer(command<BenchLayerOptions>(
    "bench", "layer",
    "GroupedLinear forward + backward vs its grouped GEMMs timed alone (Qwen3-30B "
    "expert layers) and host time per forward (GPU; --cpu: a small smoke run)",
    add_bench_layer_options, run_bench_layer));

}  // namespace
}  // namespace groupmm::tool
