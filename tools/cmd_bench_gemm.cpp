// `groupmm bench gemm`: the public grouped GEMM suite (docs/testing.md, "Benchmarks"). Each case is
// validated against the cuBLAS per-expert loop, then timed (CUDA events, median) for our engine,
// the cuBLAS loop and one dense cuBLAS GEMM of the same total size. --json writes every record
// (with the splits) for bench/peers_torch.py, which adds torch._grouped_mm from the same device
// call.
#include <cublas_v2.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "bench_common.hpp"
#include "bench_gemm_quantized.hpp"
#include "bench_gemm_w4.hpp"
#include "cli.hpp"
#include "groupmm/gemm.hpp"
#include "groupmm/random.hpp"

namespace groupmm::tool {
namespace {

double rel_err_device(const TensorView& a, const TensorView& b) {
  std::vector<uint16_t> ha(size_t(a.numel())), hb(ha.size());
  std::vector<float> fa, fb;
  if (a.dtype == DType::fp32) {
    fa.resize(size_t(a.numel()));
    fb.resize(fa.size());
    copy(TensorView(fa.data(), DType::fp32, Device::CPU, {a.numel()}), a);
    copy(TensorView(fb.data(), DType::fp32, Device::CPU, {b.numel()}), b);
  } else {
    copy(TensorView(ha.data(), a.dtype, Device::CPU, {a.numel()}), a);
    copy(TensorView(hb.data(), b.dtype, Device::CPU, {b.numel()}), b);
  }
  double num = 0, den = 0;
  const int64_t n = a.numel();
#pragma omp parallel for reduction(+ : num, den)
  for (int64_t i = 0; i < n; ++i) {
    const double x = a.dtype == DType::fp32 ? fa[size_t(i)] : bf16_bits_to_float(ha[size_t(i)]);
    const double y = b.dtype == DType::fp32 ? fb[size_t(i)] : bf16_bits_to_float(hb[size_t(i)]);
    if (!std::isfinite(x)) num += INFINITY;
    num += (x - y) * (x - y);
    den += y * y;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

struct GemmOptions {
  std::string case_filter, pass, pattern, json_path, config;
  std::string recipe = "bf16";  // bf16: the 16-bit engine; else quantized operands
  std::string weights;          // nvfp4 | mxfp4: the 4-bit weight suite (bench_gemm_w4.cpp)
  std::string suite;            // moe | ragged | fine | all; empty: all (bf16), moe (quantized)
  std::string out = "bf16";     // bf16 only: output dtype of every pass (bf16 | fp32)
  int iters = 10;
  bool list_configs = false;
  bool fast_accum = false;
  bool quick = false;  // tuning sweeps: no validation, no cuBLAS loop
};

// The bf16 cases of --suite (the quantized recipes run the MoE suite).
std::vector<SuiteShape> suite_shapes(const std::string& suite) {
  std::vector<SuiteShape> v;
  auto add = [&](const auto& table) {
    for (const SuiteShape& s : table) v.push_back(s);
  };
  if (suite == "moe" || suite == "all") add(kGemmSuite);
  if (suite == "ragged" || suite == "all") add(kRaggedSuite);
  if (suite == "fine" || suite == "all") add(kFineSuite);
  return v;
}

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

// "auto" = the heuristic's choice (an empty config), "auto@along_n" its kernel in that tile order.
std::string config_arg(const std::string& c) {
  return c.rfind("auto", 0) == 0 ? c.substr(4) : c;
}

// The quantized-operand suite (bench_gemm_quantized.cpp) on the same shapes.
int run_quantized(const GemmOptions& o, cudaStream_t stream) {
  QuantBenchOptions q;
  q.recipe = o.recipe == "fp8_current" ? QuantRecipe::fp8_current
             : o.recipe == "fp8_block" ? QuantRecipe::fp8_block
                                       : QuantRecipe::mxfp8;
  for (const SuiteShape& s : suite_shapes(o.suite))
    if (o.case_filter.empty() || std::string(s.name).find(o.case_filter) != std::string::npos)
      q.shapes.push_back(
          {s.name, s.G, s.M, s.N, s.K, std::string(s.name).find("decode") != std::string::npos});
  q.pass = o.pass;
  q.pattern = o.pattern;
  q.iters = o.iters;
  q.json_path = o.json_path;
  q.fast_accum = o.fast_accum;
  q.config = config_arg(o.config);  // "auto": the heuristic's kernel, "auto@along_n" its order
  q.out_fp32 = o.out == "fp32";
  return bench_gemm_quantized(q, stream);
}

// --weights nvfp4|mxfp4: the 4-bit weight suite, its own cases (bf16 activations, forward).
int run_w4(const GemmOptions& o) {
  if (o.recipe != "bf16")
    throw UsageError("--weights " + o.weights + " does not combine with --recipe " + o.recipe +
                     " (4-bit weights take bf16 activations)");
  for (const auto& [set, name] : {std::pair{!o.pass.empty(), "--pass"},
                                  {!o.pattern.empty(), "--pattern"},
                                  {!o.config.empty(), "--config"},
                                  {o.fast_accum, "--fast-accum"}})
    if (set)
      throw UsageError(std::string(name) + " does not apply to --weights " + o.weights +
                       " (its cases are forward passes with their own routings)");
  const std::vector<std::string> names = w4_bench_case_names();
  if (!o.case_filter.empty() && std::none_of(names.begin(), names.end(), [&](const std::string& n) {
        return n.find(o.case_filter) != std::string::npos;
      })) {
    std::string all;
    for (const std::string& n : names) all += (all.empty() ? "" : ", ") + n;
    throw UsageError("--case '" + o.case_filter + "' matches no --weights case (cases: " + all +
                     ")");
  }
  W4BenchOptions w;
  w.recipe = o.weights == "nvfp4" ? QuantRecipe::nvfp4 : QuantRecipe::mxfp4;
  w.filter = o.case_filter;
  w.iters = o.iters;
  w.json_path = o.json_path;
  GROUPMM_CHECK(cuda_available(), "bench gemm: needs an sm_90 GPU (none visible)");
  cudaStream_t stream;
  GROUPMM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int rc = bench_gemm_w4(w, stream);  // its Context and buffers are gone before the stream
  GROUPMM_CHECK_CUDA(cudaStreamDestroy(stream));
  return rc;
}

int bench_gemm(const GemmOptions& o, cudaStream_t stream);

int run_bench_gemm(const GemmOptions& options) {
  GemmOptions o = options;
  // The quantized recipes run the MoE cases unless asked (some ragged widths are not multiples
  // of the 128-wide scale blocks).
  if (o.suite.empty()) o.suite = o.recipe == "bf16" ? "all" : "moe";
  if (o.list_configs) {  // host only: no GPU needed
    for (const std::string& n : gemm_config_names()) std::printf("%s\n", n.c_str());
    return 0;
  }
  if (!o.weights.empty()) return run_w4(o);
  if (!o.case_filter.empty()) {
    const auto shapes = suite_shapes(o.suite);
    bool any = false;
    for (const SuiteShape& s : shapes)
      any = any || std::string(s.name).find(o.case_filter) != std::string::npos;
    if (!any) {
      std::string names;
      for (const SuiteShape& s : shapes) names += std::string(names.empty() ? "" : ", ") + s.name;
      throw UsageError("--case '" + o.case_filter + "' matches no case (cases: " + names + ")");
    }
  }
  if (o.fast_accum && o.recipe != "fp8_current")
    throw UsageError("--fast-accum needs --recipe fp8_current (got --recipe " + o.recipe + ")");
  if (!o.config.empty()) {
    if (o.recipe != "bf16" && o.config.find(',') != std::string::npos)
      throw UsageError("--config with several names is a bf16 sweep (got --recipe " + o.recipe +
                       ")");
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
  if (o.out != "bf16" && o.recipe != "bf16" && o.pass != "wgrad")
    throw UsageError("--out " + o.out + " with --recipe " + o.recipe +
                     " needs --pass wgrad (the FP8 GEMMs into fp32 are the wgrads: main_grad)");
  if (o.quick && o.recipe != "bf16")
    throw UsageError("--quick applies to the bf16 suite (got --recipe " + o.recipe + ")");
  GROUPMM_CHECK(cuda_available(), "bench gemm: needs an sm_90 GPU (none visible)");
  cudaStream_t stream;
  GROUPMM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // Each suite's Context and buffers are gone before the stream.
  const int rc = o.recipe == "bf16" ? bench_gemm(o, stream) : run_quantized(o, stream);
  GROUPMM_CHECK_CUDA(cudaStreamDestroy(stream));
  return rc;
}

int bench_gemm(const GemmOptions& o, cudaStream_t stream) {
  const std::string& filter = o.case_filter;
  const std::string& pass_filter = o.pass;
  const std::string& pattern_filter = o.pattern;
  const int iters = o.iters;
  const std::string& json_path = o.json_path;
  // --config A,B,...: time these kernel configurations (cases of their passes only; "auto" = the
  // heuristic's choice) instead of the heuristic's alone: tuning A/B runs in one device call.
  const std::vector<std::string> configs = config_list(o.config);
  std::ofstream json;
  if (!json_path.empty()) json = open_json(json_path);  // a wrong path fails before any work
  Context ctx(Device::CUDA, stream);
  auto blas = static_cast<cublasHandle_t>(ctx.cublas_handle());
  const double copy_gbs = copy_bandwidth_gbs(stream);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, ctx.device_index());
  std::printf("groupmm bench gemm on %s (%d SMs); copy bandwidth %.0f GB/s (read+write)\n",
              prop.name, prop.multiProcessorCount, copy_gbs);
  std::printf("%-22s %-6s %-8s %5s %6s %6s %6s %9s %7s %7s %8s %8s %7s %s\n", "case", "pass",
              "pattern", "G", "M", "N", "K", "us", "TFLOP/s", "GB/s", "xdense", "xloop", "relerr",
              "config");
  if (json.is_open()) {
    json << "{\"suite\": \"gemm\", \"device\": \"" << prop.name << "\", \"copy_gbs\": " << copy_gbs
         << ", \"cases\": [\n";
  }
  bool first = true;
  int failures = 0;
  uint64_t seed = 1;
  for (const SuiteShape& s : suite_shapes(o.suite)) {
    if (!filter.empty() && std::string(s.name).find(filter) == std::string::npos) continue;
    const int64_t G = s.G, M = s.M, N = s.N, K = s.K;
    for (const char* pass_name : {"fwd", "dgrad", "wgrad"}) {
      if (!pass_filter.empty() && pass_filter != pass_name) continue;
      if (std::none_of(configs.begin(), configs.end(),
                       [&](const std::string& c) { return config_of_pass(c, pass_name); }))
        continue;
      const GemmPass pass = pass_name[0] == 'f'   ? GemmPass::forward
                            : pass_name[0] == 'd' ? GemmPass::dgrad
                                                  : GemmPass::wgrad;
      if (pass != GemmPass::forward && std::string(s.name).find("decode") != std::string::npos)
        continue;
      // Operand sizes (elements) and rotation copies past 3x L2.
      const int64_t a_cols = pass == GemmPass::forward ? K : N;
      const int64_t a_el = M * a_cols, b_el = pass == GemmPass::wgrad ? M * K : G * N * K;
      const int R = rotation_copies((a_el + b_el) * 2);
      Tensor a = Tensor::empty({R, a_el}, DType::bf16, Device::CUDA, stream);
      Tensor b = Tensor::empty({R, b_el}, DType::bf16, Device::CUDA, stream);
      fill_uniform(ctx, a, -1.0f, 1.0f, seed++);
      fill_uniform(ctx, b, -0.05f, 0.05f, seed++);
      // bf16 out by default, like torch._grouped_mm (--out fp32: every pass writes fp32, wgrad's
      // main_grad dtype, twice the output bytes).
      const DType out_t = o.out == "fp32" ? DType::fp32 : DType::bf16;
      const cudaDataType_t blas_out = o.out == "fp32" ? CUDA_R_32F : CUDA_R_16BF;
      const int64_t out_el =
          pass == GemmPass::wgrad ? G * N * K : M * (pass == GemmPass::forward ? N : K);
      Tensor out = Tensor::empty({out_el}, out_t, Device::CUDA, stream);
      Tensor ref = Tensor::empty({out_el}, out_t, Device::CUDA, stream);
      Tensor dsplits = Tensor::empty({G}, DType::int64, Device::CUDA, stream);
      auto view_a = [&](int r) {
        return TensorView(static_cast<char*>(a.data()) + r * a_el * 2, DType::bf16, Device::CUDA,
                          {M, a_cols});
      };
      auto view_b = [&](int r) {
        void* p = static_cast<char*>(b.data()) + r * b_el * 2;
        return pass == GemmPass::wgrad ? TensorView(p, DType::bf16, Device::CUDA, {M, K})
                                       : TensorView(p, DType::bf16, Device::CUDA, {G, N, K});
      };
      auto view_out = [&](const Tensor& t) {
        return pass == GemmPass::wgrad ? TensorView(t.data(), out_t, Device::CUDA, {G, N, K})
                                       : TensorView(t.data(), out_t, Device::CUDA, {M, out_el / M});
      };
      for (const std::string& pattern : kSplitPatterns) {
        if (!pattern_filter.empty() && pattern_filter != pattern) continue;
        std::vector<int64_t> splits = bench_splits(pattern, G, M);
        copy(dsplits, TensorView(splits.data(), DType::int64, Device::CPU, {G}), stream);
        std::string config;  // the configuration being timed ("" = the heuristic's)
        auto make = [&](int r, GemmEngine e, const Tensor& o) {
          GroupedGemmArgs x;
          x.pass = pass;
          x.a = view_a(r);
          x.b = view_b(r);
          x.out = view_out(o);
          x.splits = dsplits;
          x.engine = e;
          if (e == GemmEngine::cutlass_sm90) x.config = config;
          return x;
        };
        // The peers, once per case: the cuBLAS loop (also the validation reference) and one
        // dense cuBLAS GEMM of the same total size (the roofline peer; it writes into `out`,
        // which each configuration's validation poisons again).
        double t_loop = 0;
        if (!o.quick) {
          t_loop = median_ms(stream, 1, std::max(3, iters / 2), [&](int i) {
            grouped_gemm(ctx, make(i % R, GemmEngine::cublas_loop, ref));
          });
          grouped_gemm(ctx, make(0, GemmEngine::cublas_loop, ref));  // the reference: copy 0
        }
        const float one = 1, zero = 0;
        const int iM = int(M), iN = int(N), iK = int(K);
        const double t_dense = median_ms(stream, 2, iters, [&](int i) {
          const void* A = view_a(i % R).data;
          const void* B = view_b(i % R).data;
          if (pass == GemmPass::forward)
            GROUPMM_CHECK_CUBLAS(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, iN, iM, iK, &one, B,
                                              CUDA_R_16BF, iK, A, CUDA_R_16BF, iK, &zero,
                                              out.data(), blas_out, iN, CUBLAS_COMPUTE_32F,
                                              CUBLAS_GEMM_DEFAULT));
          else if (pass == GemmPass::dgrad)
            GROUPMM_CHECK_CUBLAS(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, iK, iM, iN, &one, B,
                                              CUDA_R_16BF, iK, A, CUDA_R_16BF, iN, &zero,
                                              out.data(), blas_out, iK, CUBLAS_COMPUTE_32F,
                                              CUBLAS_GEMM_DEFAULT));
          else
            GROUPMM_CHECK_CUBLAS(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_T, iK, iN, iM, &one, B,
                                              CUDA_R_16BF, iK, A, CUDA_R_16BF, iN, &zero,
                                              out.data(), blas_out, iK, CUBLAS_COMPUTE_32F,
                                              CUBLAS_GEMM_DEFAULT));
        });
        int64_t active = 0;
        for (auto v : splits) active += v > 0;
        const double flops = 2.0 * double(M) * double(N) * double(K);
        double bytes = double(a_el) * 2 + double(out_el) * (out_t == DType::fp32 ? 4 : 2);
        bytes += pass == GemmPass::wgrad ? double(b_el) * 2 : double(active) * double(N * K) * 2;
        // Each configuration of this pass: validated once, then timed. Several configurations
        // are timed in interleaved rounds (median of the rounds) so that clock drift during the
        // sweep does not favour one of them. Each round starts one configuration later, so that
        // none always runs first, after the pause between cases: a power-limited GPU's clock
        // depends on the load just before.
        std::vector<std::string> mine;
        for (const std::string& c : configs)
          if (config_of_pass(c, pass_name)) mine.push_back(config_arg(c));
        std::vector<double> err(mine.size(), -1.0);  // --quick: not validated
        if (!o.quick) {
          for (size_t ci = 0; ci < mine.size(); ++ci) {
            config = mine[ci];
            fill_bytes(out, 0xFF, stream);
            grouped_gemm(ctx, make(0, GemmEngine::cutlass_sm90, out));
            ctx.check();
            err[ci] = rel_err_device(view_out(out), view_out(ref));
          }
        }
        const size_t n_cfg = mine.size();
        const int rounds = n_cfg > 1 ? int(std::max<size_t>(3, n_cfg)) : 1;
        std::vector<std::vector<double>> times(n_cfg);
        for (int round = 0; round < rounds; ++round) {
          for (size_t j = 0; j < n_cfg; ++j) {
            const size_t ci = (size_t(round) + j) % n_cfg;
            config = mine[ci];
            const size_t ws_need =
                grouped_gemm_workspace_size(ctx, make(0, GemmEngine::cutlass_sm90, out));
            ctx.reserve_workspace(ws_need);
            times[ci].push_back(median_ms(stream, 3, iters, [&](int i) {
              grouped_gemm(ctx, make(i % R, GemmEngine::cutlass_sm90, out), ctx.workspace(ws_need),
                           ctx.workspace_size());
            }));
          }
        }
        for (size_t ci = 0; ci < mine.size(); ++ci) {
          config = mine[ci];
          std::sort(times[ci].begin(), times[ci].end());
          const double t_ours = times[ci][times[ci].size() / 2];
          const bool ok = o.quick || err[ci] <= 1e-2;
          failures += ok ? 0 : 1;
          const double us = t_ours * 1e3;
          const std::string config_name =
              gemm_config_name(ctx, make(0, GemmEngine::cutlass_sm90, out));
          std::printf(
              "%-22s %-6s %-8s %5lld %6lld %6lld %6lld %9.1f %7.1f %7.0f %8.3f %8.3f %7.1e %s%s\n",
              s.name, pass_name, pattern.c_str(), (long long)G, (long long)M, (long long)N,
              (long long)K, us, flops / (t_ours * 1e-3) / 1e12, bytes / (t_ours * 1e-3) / 1e9,
              t_dense / t_ours, t_loop / t_ours, err[ci], config_name.c_str(),
              ok ? "" : "  FAILED");
          std::fflush(stdout);
          if (json.is_open()) {
            json << (first ? "" : ",\n") << "{\"case\": \"" << s.name << "\", \"pass\": \""
                 << pass_name << "\", \"pattern\": \"" << pattern << "\", \"G\": " << G
                 << ", \"M\": " << M << ", \"N\": " << N << ", \"K\": " << K << ", \"out\": \""
                 << dtype_name(out_t) << "\", \"us\": " << us << ", \"dense_us\": " << t_dense * 1e3
                 << ", \"loop_us\": " << t_loop * 1e3 << ", \"flops\": " << flops
                 << ", \"bytes\": " << bytes << ", \"rel_err\": " << err[ci] << ", \"config\": \""
                 << config_name << "\", \"splits\": [";
            for (size_t i = 0; i < splits.size(); ++i) json << (i ? "," : "") << splits[i];
            json << "]}";
            first = false;
          }
        }
      }
    }
  }
  // Host time of one grouped GEMM call (no sync; the device queue absorbs the launches): the
  // decode forward (one launch pair) and a Qwen3-sized wgrad (the split configuration: two pairs).
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
    GroupedGemmArgs x_args;
    x_args.pass = pass;
    x_args.a = a;
    x_args.b = b;
    x_args.out = y;
    x_args.splits = sp;
    const size_t ws = grouped_gemm_workspace_size(ctx, x_args);
    void* wsp = ctx.workspace(ws);
    for (int i = 0; i < 5; ++i) grouped_gemm(ctx, x_args, wsp, ws);
    ctx.synchronize();
    // Five batches of 20 calls: the best batch is the host cost, the spread is printed.
    const std::vector<double> batch_us =
        host_batch_us(ctx, 5, 20, [&] { grouped_gemm(ctx, x_args, wsp, ws); });
    if (fwd) host_us = batch_us.front();
    std::printf(
        "host time per grouped_gemm call (%s, %s, no sync): %.2f us (best of 5 batches of 20; "
        "median %.2f, worst %.2f)\n",
        fwd ? "decode forward" : "qwen3 wgrad", gemm_config_name(ctx, x_args).c_str(),
        batch_us.front(), batch_us[2], batch_us.back());
    std::fflush(stdout);
  }
  if (json.is_open()) {
    json << "\n], \"host_us_per_call\": " << host_us << "}\n";
    close_json(json, json_path);
  }
  std::printf("%s: %d case(s) failed validation\n", failures ? "FAIL" : "ok", failures);
  std::fflush(stdout);
  return failures ? 1 : 0;
}

void add_gemm_options(CLI::App& app, GemmOptions& o) {
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

Register reg_cmd_bench_gemm(command<GemmOptions>(
    "bench", "gemm",
    "grouped GEMM suite (forward, dgrad, wgrad on MoE shapes) vs the cuBLAS per-expert "
    "loop and one dense cuBLAS GEMM (GPU)",
    add_gemm_options, run_bench_gemm));

}  // namespace
}  // namespace groupmm::tool
