// `groupmm bench gemm`: the public grouped GEMM suite (docs/testing.md, "Benchmarks"). Each case is
// validated against the cuBLAS per-expert loop, then timed (CUDA events, median) for our engine,
// the cuBLAS loop and one dense cuBLAS GEMM of the same total size. --json writes every record
// (with the splits) for bench/peers_torch.py, which adds torch._grouped_mm from the same device
// call. The command's options and checks are here too; --recipe and --weights run the variants of
// gemm_quantized.cpp and gemm_w4.cpp.
#include <algorithm>
#include <cstdio>

#include "bench/suites.hpp"
#include "groupmm/gemm.hpp"
#include "groupmm/random.hpp"

namespace groupmm::tool {

std::vector<SuiteShape> gemm_suite_shapes(const std::string& suite) {
  std::vector<SuiteShape> v;
  auto add = [&](const auto& table) {
    for (const SuiteShape& s : table) v.push_back(s);
  };
  if (suite == "moe" || suite == "all") add(kGemmSuite);
  if (suite == "ragged" || suite == "all") add(kRaggedSuite);
  if (suite == "fine" || suite == "all") add(kFineSuite);
  return v;
}

std::string gemm_config_arg(const std::string& c) {
  return c.rfind("auto", 0) == 0 ? c.substr(4) : c;
}

namespace {

// ---- options -----------------------------------------------------------------------------------

// --config A,B,...: the configurations a sweep times ("auto" = the heuristic's choice).
std::vector<std::string> config_list(const std::string& csv) {
  std::vector<std::string> v;
  size_t at = 0;
  while (at <= csv.size() && !csv.empty()) {
    const size_t end = std::min(csv.find(',', at), csv.size());
    v.push_back(csv.substr(at, end - at));
    at = end + 1;
  }
  if (v.empty()) v.push_back("auto");
  return v;
}

bool config_of_pass(const std::string& config, const char* pass_name) {
  return config.rfind("auto", 0) == 0 || config.rfind(pass_name, 0) == 0;
}

void check_w4_options(const BenchGemmOptions& o) {
  if (o.recipe != "bf16")
    throw UsageError("--weights " + o.weights + " does not combine with --recipe " + o.recipe +
                     " (4-bit weights take bf16 activations)");
  for (const auto& [set, name] : {std::pair{!o.pass.empty(), "--pass"},
                                  {!o.pattern.empty(), "--pattern"},
                                  {!o.config.empty(), "--config"},
                                  {o.fast_accum, "--fast-accum"}})
    reject_option(
        set, name,
        "to --weights " + o.weights + " (its cases are forward passes with their own routings)");
  if (!o.case_filter.empty())
    check_case_filter(o.case_filter, gemm_w4_case_names(), "--weights case");
}

void check_configs(const BenchGemmOptions& o) {
  if (o.recipe != "bf16" && o.config.find(',') != std::string::npos)
    throw UsageError("--config with several names is a bf16 sweep (got --recipe " + o.recipe + ")");
  const auto names = gemm_config_names();
  for (const std::string& c : config_list(o.config)) {
    const size_t at = c.find('@');  // "@along_m|n": the tile order
    const std::string base = c.substr(0, at);
    if (at != std::string::npos && c.substr(at) != "@along_m" && c.substr(at) != "@along_n")
      throw UsageError("--config '" + c + "': a tile order suffix is @along_m or @along_n");
    if (base != "auto" && std::find(names.begin(), names.end(), base) == names.end())
      throw UsageError("--config '" + c +
                       "' is not a kernel configuration (list them with --list-configs)");
    if (!o.pass.empty() && !config_of_pass(c, o.pass.c_str()))
      throw UsageError("--config " + c + " is not a configuration of --pass " + o.pass);
  }
}

// The combinations of options the suites do not run, as usage errors (before any GPU work).
void check_gemm_options(const BenchGemmOptions& o) {
  if (!o.weights.empty()) return check_w4_options(o);
  if (!o.case_filter.empty()) {
    std::vector<std::string> names;
    for (const SuiteShape& s : gemm_suite_shapes(o.suite)) names.push_back(s.name);
    check_case_filter(o.case_filter, names);
  }
  if (o.fast_accum && o.recipe != "fp8_current")
    throw UsageError("--fast-accum needs --recipe fp8_current (got --recipe " + o.recipe + ")");
  if (!o.config.empty()) check_configs(o);
  if (o.out != "bf16" && o.recipe != "bf16" && o.pass != "wgrad")
    throw UsageError("--out " + o.out + " with --recipe " + o.recipe +
                     " needs --pass wgrad (the FP8 GEMMs into fp32 are the wgrads: main_grad)");
  if (o.quick && o.recipe != "bf16")
    throw UsageError("--quick applies to the bf16 suite (got --recipe " + o.recipe + ")");
}

// ---- the bf16 suite ----------------------------------------------------------------------------

GemmPass gemm_pass_of(const char* name) {
  return name[0] == 'f' ? GemmPass::forward : name[0] == 'd' ? GemmPass::dgrad : GemmPass::wgrad;
}

// One case's operands: R copies of a and b (rotating through them touches more than 3x L2), the
// output, the reference output and the device splits.
struct GemmOperands {
  GemmPass pass;
  int64_t G, M, N, K, a_cols, a_el, b_el, out_el;
  int R;
  DType out_t;
  Tensor a, b, out, ref, dsplits;

  GemmOperands(Context& ctx, const SuiteShape& s, GemmPass p, DType out_dtype, uint64_t& seed)
      : pass(p), G(s.G), M(s.M), N(s.N), K(s.K), out_t(out_dtype) {
    cudaStream_t st = ctx.stream();
    a_cols = pass == GemmPass::forward ? K : N;
    a_el = M * a_cols;
    b_el = pass == GemmPass::wgrad ? M * K : G * N * K;
    out_el = pass == GemmPass::wgrad ? G * N * K : M * (pass == GemmPass::forward ? N : K);
    R = rotation_copies((a_el + b_el) * 2);
    a = Tensor::empty({R, a_el}, DType::bf16, Device::CUDA, st);
    b = Tensor::empty({R, b_el}, DType::bf16, Device::CUDA, st);
    fill_uniform(ctx, a, -1.0f, 1.0f, seed++);
    fill_uniform(ctx, b, -0.05f, 0.05f, seed++);
    out = Tensor::empty({out_el}, out_t, Device::CUDA, st);
    ref = Tensor::empty({out_el}, out_t, Device::CUDA, st);
    dsplits = Tensor::empty({G}, DType::int64, Device::CUDA, st);
  }
  TensorView view_a(int r) const {
    return TensorView(static_cast<char*>(a.data()) + r * a_el * 2, DType::bf16, Device::CUDA,
                      {M, a_cols});
  }
  TensorView view_b(int r) const {
    void* p = static_cast<char*>(b.data()) + r * b_el * 2;
    return pass == GemmPass::wgrad ? TensorView(p, DType::bf16, Device::CUDA, {M, K})
                                   : TensorView(p, DType::bf16, Device::CUDA, {G, N, K});
  }
  TensorView view_out(const Tensor& t) const {
    return pass == GemmPass::wgrad ? TensorView(t.data(), out_t, Device::CUDA, {G, N, K})
                                   : TensorView(t.data(), out_t, Device::CUDA, {M, out_el / M});
  }
  GroupedGemmArgs args(int r, GemmEngine e, const Tensor& o, const std::string& config) const {
    GroupedGemmArgs x;
    x.pass = pass;
    x.a = view_a(r);
    x.b = view_b(r);
    x.out = view_out(o);
    x.splits = dsplits;
    x.engine = e;
    if (e == GemmEngine::cutlass_sm90) x.config = config;
    return x;
  }
  // Bytes moved: a read, out written, b read (the weights of the experts with rows).
  double bytes(const std::vector<int64_t>& splits) const {
    int64_t active = 0;
    for (auto v : splits) active += v > 0;
    double n = double(a_el) * 2 + double(out_el) * (out_t == DType::fp32 ? 4 : 2);
    return n + (pass == GemmPass::wgrad ? double(b_el) * 2 : double(active) * double(N * K) * 2);
  }
};

// One dense cuBLAS GEMM of the case's total size (the roofline peer), into op.out: median ms.
double time_dense_bf16(Context& ctx, const GemmOperands& op, int iters) {
  return dense_gemm_ms(
      ctx, op.pass, op.M, op.N, op.K,
      [&](int i) {
        return std::pair<const void*, const void*>(op.view_a(i % op.R).data,
                                                   op.view_b(i % op.R).data);
      },
      op.out.data(), op.out_t, iters);
}

// Each configuration validated against op.ref (the cuBLAS loop's output): its rel err.
std::vector<double> validate_configs(Context& ctx, const GemmOperands& op,
                                     const std::vector<std::string>& configs) {
  std::vector<double> err;
  for (const std::string& c : configs) {
    fill_bytes(op.out, 0xFF, ctx.stream());
    grouped_gemm(ctx, op.args(0, GemmEngine::cutlass_sm90, op.out, c));
    ctx.check();
    err.push_back(rel_err(op.view_out(op.out), op.view_out(op.ref)));
  }
  return err;
}

// Several configurations are timed in interleaved rounds (median of the rounds) so that clock
// drift during the sweep does not favour one of them. Each round starts one configuration later,
// so that none always runs first, after the pause between cases: a power-limited GPU's clock
// depends on the load just before. Returns each configuration's median ms.
std::vector<double> time_configs(Context& ctx, const GemmOperands& op,
                                 const std::vector<std::string>& configs, int iters) {
  const size_t n = configs.size();
  const int rounds = n > 1 ? int(std::max<size_t>(3, n)) : 1;
  std::vector<std::vector<double>> times(n);
  for (int round = 0; round < rounds; ++round)
    for (size_t j = 0; j < n; ++j) {
      const size_t ci = (size_t(round) + j) % n;
      const std::string& c = configs[ci];
      const size_t ws =
          grouped_gemm_workspace_size(ctx, op.args(0, GemmEngine::cutlass_sm90, op.out, c));
      ctx.reserve_workspace(ws);
      times[ci].push_back(median_ms(ctx.stream(), 3, iters, [&](int i) {
        grouped_gemm(ctx, op.args(i % op.R, GemmEngine::cutlass_sm90, op.out, c), ctx.workspace(ws),
                     ctx.workspace_size());
      }));
    }
  std::vector<double> med;
  for (auto& t : times) {
    std::sort(t.begin(), t.end());
    med.push_back(t[t.size() / 2]);
  }
  return med;
}

const Table kGemmTable({text_col("case", 22), text_col("pass", 6), text_col("pattern", 8),
                        int_col("G", 5), int_col("M", 6), int_col("N", 6), int_col("K", 6),
                        num_col("us", 9, 1), num_col("TFLOP/s", 7, 1), num_col("GB/s", 7, 0),
                        num_col("xdense", 8, 3), num_col("xloop", 8, 3),
                        num_col("relerr", 7, 1, 'e'), text_col("config", 0)});

// Where a pass's case runs: its name, pattern, splits and the peers' times (ms).
struct GemmRun {
  const char *name, *pass;
  std::string pattern;
  std::vector<int64_t> splits;
  double t_dense = 0, t_loop = 0;
};

// One case x pattern: the peers, then each configuration of this pass validated and timed.
void run_gemm_case(Context& ctx, const BenchGemmOptions& o, const GemmOperands& op, GemmRun& r,
                   const std::vector<std::string>& configs, Failures& failures, JsonFile& json) {
  copy(op.dsplits, TensorView(r.splits.data(), DType::int64, Device::CPU, {op.G}), ctx.stream());
  // The peers, once per case: the cuBLAS loop (also the validation reference) and the dense GEMM
  // (it writes into `out`, which each configuration's validation poisons again).
  if (!o.quick) {
    r.t_loop = median_ms(ctx.stream(), 1, std::max(3, o.iters / 2), [&](int i) {
      grouped_gemm(ctx, op.args(i % op.R, GemmEngine::cublas_loop, op.ref, ""));
    });
    grouped_gemm(ctx, op.args(0, GemmEngine::cublas_loop, op.ref, ""));  // the reference: copy 0
  }
  r.t_dense = time_dense_bf16(ctx, op, o.iters);
  const double flops = 2.0 * double(op.M) * double(op.N) * double(op.K), bytes = op.bytes(r.splits);
  const std::vector<double> err =
      o.quick ? std::vector<double>(configs.size(), -1.0) : validate_configs(ctx, op, configs);
  const std::vector<double> t = time_configs(ctx, op, configs, o.iters);
  for (size_t ci = 0; ci < configs.size(); ++ci) {
    const bool ok = failures.check(o.quick || err[ci] <= 1e-2);
    const std::string cfg =
        gemm_config_name(ctx, op.args(0, GemmEngine::cutlass_sm90, op.out, configs[ci]));
    kGemmTable.print_row({r.name, r.pass, r.pattern, op.G, op.M, op.N, op.K, t[ci] * 1e3,
                          flops / (t[ci] * 1e-3) / 1e12, bytes / (t[ci] * 1e-3) / 1e9,
                          r.t_dense / t[ci], r.t_loop / t[ci], err[ci], cfg},
                         ok ? "" : "  FAILED");
    json.add(JsonRecord()
                 .add("case", r.name)
                 .add("pass", r.pass)
                 .add("pattern", r.pattern)
                 .add("G", op.G)
                 .add("M", op.M)
                 .add("N", op.N)
                 .add("K", op.K)
                 .add("out", dtype_name(op.out_t))
                 .add("us", t[ci] * 1e3)
                 .add("dense_us", r.t_dense * 1e3)
                 .add("loop_us", r.t_loop * 1e3)
                 .add("flops", flops)
                 .add("bytes", bytes)
                 .add("rel_err", err[ci])
                 .add("config", cfg)
                 .add("splits", r.splits));
  }
}

// Host time of one grouped GEMM call (no sync; the device queue absorbs the launches): the decode
// forward (one launch pair) and a Qwen3-sized wgrad (the split configuration: two pairs). Returns
// the decode forward's.
double time_host_per_call(Context& ctx) {
  cudaStream_t stream = ctx.stream();
  double host_us = 0;
  for (const GemmPass pass : {GemmPass::forward, GemmPass::wgrad}) {
    const bool fwd = pass == GemmPass::forward;
    const int64_t G = 128, M = fwd ? 1024 : 65536, N = 1536, K = 2048;
    Tensor a = Tensor::empty({M, fwd ? K : N}, DType::bf16, Device::CUDA, stream);
    Tensor b = fwd ? Tensor::empty({G, N, K}, DType::bf16, Device::CUDA, stream)
                   : Tensor::empty({M, K}, DType::bf16, Device::CUDA, stream);
    Tensor y = fwd ? Tensor::empty({M, N}, DType::bf16, Device::CUDA, stream)
                   : Tensor::empty({G, N, K}, DType::bf16, Device::CUDA, stream);
    Tensor sp = Tensor::empty({G}, DType::int32, Device::CUDA, stream);
    fill_uniform(ctx, a, -1, 1, 99);
    fill_uniform(ctx, b, -1, 1, 98);
    std::vector<int32_t> hs(size_t(G), int32_t(M / G));
    copy(sp, TensorView(hs.data(), DType::int32, Device::CPU, {G}), stream);
    GroupedGemmArgs x;
    x.pass = pass;
    x.a = a;
    x.b = b;
    x.out = y;
    x.splits = sp;
    const size_t ws = grouped_gemm_workspace_size(ctx, x);
    void* wsp = ctx.workspace(ws);
    for (int i = 0; i < 5; ++i) grouped_gemm(ctx, x, wsp, ws);
    ctx.synchronize();
    // Five batches of 20 calls: the best batch is the host cost, the spread is printed.
    const std::vector<double> batch =
        host_batch_us(ctx, 5, 20, [&] { grouped_gemm(ctx, x, wsp, ws); });
    if (fwd) host_us = batch.front();
    std::printf(
        "host time per grouped_gemm call (%s, %s, no sync): %.2f us (best of 5 batches of 20; "
        "median %.2f, worst %.2f)\n",
        fwd ? "decode forward" : "qwen3 wgrad", gemm_config_name(ctx, x).c_str(), batch.front(),
        batch[2], batch.back());
    std::fflush(stdout);
  }
  return host_us;
}

int run_gemm_bf16(const BenchGemmOptions& o, cudaStream_t stream) {
  // --config A,B,...: time these kernel configurations (cases of their passes only; "auto" = the
  // heuristic's choice) instead of the heuristic's alone: tuning A/B runs in one device call.
  const std::vector<std::string> configs = config_list(o.config);
  JsonFile json(o.json_path);
  Context ctx(Device::CUDA, stream);
  const double copy_gbs = copy_bandwidth_gbs(stream);
  const GpuInfo gpu = gpu_info(ctx);
  std::printf("groupmm bench gemm on %s (%d SMs); copy bandwidth %.0f GB/s (read+write)\n",
              gpu.name.c_str(), gpu.sms, copy_gbs);
  kGemmTable.print_header();
  Failures failures;
  uint64_t seed = 1;
  const DType out_t = o.out == "fp32" ? DType::fp32 : DType::bf16;
  for (const SuiteShape& s : gemm_suite_shapes(o.suite)) {
    if (!case_matches(o.case_filter, s.name)) continue;
    for (const char* pass_name : {"fwd", "dgrad", "wgrad"}) {
      std::vector<std::string> mine;  // this pass's configurations
      for (const std::string& c : configs)
        if (config_of_pass(c, pass_name)) mine.push_back(gemm_config_arg(c));
      const GemmPass pass = gemm_pass_of(pass_name);
      if ((!o.pass.empty() && o.pass != pass_name) || mine.empty() ||
          (pass != GemmPass::forward && std::string(s.name).find("decode") != std::string::npos))
        continue;
      const GemmOperands op(ctx, s, pass, out_t, seed);
      for (const std::string& pattern : kSplitPatterns) {
        if (!o.pattern.empty() && o.pattern != pattern) continue;
        GemmRun r{s.name, pass_name, pattern, bench_splits(pattern, s.G, s.M)};
        run_gemm_case(ctx, o, op, r, mine, failures, json);
      }
    }
  }
  const double host_us = time_host_per_call(ctx);
  json.write(JsonRecord().add("suite", "gemm").add("device", gpu.name).add("copy_gbs", copy_gbs),
             JsonRecord().add("host_us_per_call", host_us));
  return failures.summary();
}

// ---- the command -------------------------------------------------------------------------------

int run_bench_gemm(const BenchGemmOptions& options) {
  BenchGemmOptions o = options;
  // The quantized recipes run the MoE cases unless asked (some ragged widths are not multiples
  // of the 128-wide scale blocks).
  if (o.suite.empty()) o.suite = o.recipe == "bf16" ? "all" : "moe";
  if (o.list_configs) {  // host only: no GPU needed
    for (const std::string& n : gemm_config_names()) std::printf("%s\n", n.c_str());
    return 0;
  }
  check_gemm_options(o);
  require_gpu("bench gemm");
  const GpuStream stream;  // each suite's Context and buffers are gone before the stream
  if (!o.weights.empty()) return run_gemm_w4(o, stream);
  return o.recipe == "bf16" ? run_gemm_bf16(o, stream) : run_gemm_quantized(o, stream);
}

void add_bench_gemm_options(CLI::App& app, BenchGemmOptions& o) {
  app.add_option("--case", o.case_filter, "only the cases whose name contains this (e.g. qwen3)")
      ->type_name("TEXT");
  add_choice(app, "--pass", o.pass, {"fwd", "dgrad", "wgrad"}, "only this pass");
  add_choice(app, "--pattern", o.pattern, kSplitPatterns, "only this split pattern");
  add_iters(app, o.iters, "timed runs per case (median)")->capture_default_str();
  add_json(app, o.json_path);
  app.add_option("--config", o.config,
                 "time these kernel configurations (comma-separated; auto = the heuristic's "
                 "choice) instead of the heuristic's alone, on the cases of their passes "
                 "(names from --list-configs; a name may end in @along_m or @along_n to force "
                 "the tile order)")
      ->type_name("NAME[,NAME...]");
  add_choice(app, "--suite", o.suite, {"moe", "ragged", "fine", "all"},
             "cases: the MoE model shapes, ragged widths (not multiples of the tile), "
             "fine-grained experts (G 512-2048, 16-64 rows each), or all (default: all for "
             "bf16, moe for --recipe)");
  add_choice(app, "--out", o.out, {"bf16", "fp32"},
             "output dtype of the bf16 suite's passes (fp32: wgrad's main_grad, fp32 forward and "
             "dgrad outputs); with an FP8 --recipe, of its wgrad (--pass wgrad; the dense "
             "ceiling stays bf16-out)")
      ->capture_default_str();
  app.add_flag("--quick", o.quick,
               "tuning sweeps: skip the validation and the cuBLAS loop (relerr -1, xloop 0)");
  app.add_flag("--list-configs", o.list_configs, "print the kernel configurations and exit");
  add_choice(app, "--recipe", o.recipe, {"bf16", "fp8_current", "fp8_block", "mxfp8"},
             "operand format: bf16 (the 16-bit engine) or quantized operands (FP8 per-expert, "
             "DeepSeek blockwise FP8, MXFP8) vs torch._scaled_grouped_mm via --json")
      ->capture_default_str();
  app.add_flag("--fast-accum", o.fast_accum,
               "fp8_current forward with FP8 fast accumulation (no promotion every 4 k-blocks)");
  add_choice(app, "--weights", o.weights, {"nvfp4", "mxfp4"},
             "4-bit expert weights x bf16 activations instead: decode and prefill cases vs our "
             "bf16 engine on the same shapes and splits (time, ratio, GB/s of the bytes read vs "
             "the copy bandwidth of the same run)");
}

Register reg_bench_gemm(command<BenchGemmOptions>(
    "bench", "gemm",
    "grouped GEMM suite (forward, dgrad, wgrad on MoE shapes) vs the cuBLAS per-expert "
    "loop and one dense cuBLAS GEMM (GPU)",
    add_bench_gemm_options, run_bench_gemm));

}  // namespace
}  // namespace groupmm::tool
