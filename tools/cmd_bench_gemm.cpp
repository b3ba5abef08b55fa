// `groupmm bench gemm`: the public grouped GEMM suite (docs/testing.md, "Benchmarks"). Each case is
// validated against the cuBLAS per-expert loop, then timed (CUDA events, median) for our engine,
// the cuBLAS loop and one dense cuBLAS GEMM of the same total size. --json writes every record
// (with the splits) for bench/peers_torch.py, which adds torch._grouped_mm from the same device
// call.
#include <cublas_v2.h>

#include <algorithm>
#include <chrono>
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
  int iters = 10;
  bool list_configs = false;
  bool fast_accum = false;
};

// The quantized-operand suite (bench_gemm_quantized.cpp) on the same shapes.
int run_quantized(const GemmOptions& o, cudaStream_t stream) {
  QuantBenchOptions q;
  q.recipe = o.recipe == "fp8_current" ? QuantRecipe::fp8_current
             : o.recipe == "fp8_block" ? QuantRecipe::fp8_block
                                       : QuantRecipe::mxfp8;
  for (const SuiteShape& s : kGemmSuite)
    if (o.case_filter.empty() || std::string(s.name).find(o.case_filter) != std::string::npos)
      q.shapes.push_back(
          {s.name, s.G, s.M, s.N, s.K, std::string(s.name).find("decode") != std::string::npos});
  q.pass = o.pass;
  q.pattern = o.pattern;
  q.iters = o.iters;
  q.json_path = o.json_path;
  q.fast_accum = o.fast_accum;
  q.config = o.config;
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

int run_bench_gemm(const GemmOptions& o) {
  if (o.list_configs) {  // host only: no GPU needed
    for (const std::string& n : gemm_config_names()) std::printf("%s\n", n.c_str());
    return 0;
  }
  if (!o.weights.empty()) return run_w4(o);
  if (!o.case_filter.empty()) {
    bool any = false;
    for (const SuiteShape& s : kGemmSuite)
      any = any || std::string(s.name).find(o.case_filter) != std::string::npos;
    if (!any) {
      std::string names;
      for (const SuiteShape& s : kGemmSuite)
        names += std::string(names.empty() ? "" : ", ") + s.name;
      throw UsageError("--case '" + o.case_filter + "' matches no case (cases: " + names + ")");
    }
  }
  if (o.fast_accum && o.recipe != "fp8_current")
    throw UsageError("--fast-accum needs --recipe fp8_current (got --recipe " + o.recipe + ")");
  if (!o.config.empty() && o.recipe == "bf16") {
    const auto names = gemm_config_names();
    if (std::find(names.begin(), names.end(), o.config) == names.end())
      throw UsageError("--config '" + o.config +
                       "' is not a kernel configuration (list them with --list-configs)");
    if (!o.pass.empty() && o.config.rfind(o.pass, 0) != 0)
      throw UsageError("--config " + o.config + " is not a configuration of --pass " + o.pass);
  }
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
  // --config NAME: time that kernel configuration (cases of its pass only) instead of the
  // heuristic's choice; for tuning A/B runs in one device call.
  const std::string& config = o.config;
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
  for (const SuiteShape& s : kGemmSuite) {
    if (!filter.empty() && std::string(s.name).find(filter) == std::string::npos) continue;
    const int64_t G = s.G, M = s.M, N = s.N, K = s.K;
    for (const char* pass_name : {"fwd", "dgrad", "wgrad"}) {
      if (!pass_filter.empty() && pass_filter != pass_name) continue;
      if (!config.empty() && config.rfind(pass_name, 0) != 0) continue;
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
      // wgrad writes bf16 here, like torch._grouped_mm (fp32 main_grad accumulation is tested,
      // and writes twice the bytes).
      const DType out_t = DType::bf16;
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
        // validate first
        fill_bytes(out, 0xFF, stream);
        grouped_gemm(ctx, make(0, GemmEngine::cutlass_sm90, out));
        grouped_gemm(ctx, make(0, GemmEngine::cublas_loop, ref));
        ctx.check();
        const double err = rel_err_device(view_out(out), view_out(ref));
        const bool ok = err <= 1e-2;
        failures += ok ? 0 : 1;
        const size_t ws_need =
            grouped_gemm_workspace_size(ctx, make(0, GemmEngine::cutlass_sm90, out));
        ctx.reserve_workspace(ws_need);
        const double t_ours = median_ms(stream, 3, iters, [&](int i) {
          grouped_gemm(ctx, make(i % R, GemmEngine::cutlass_sm90, out), ctx.workspace(ws_need),
                       ctx.workspace_size());
        });
        const double t_loop = median_ms(stream, 1, std::max(3, iters / 2), [&](int i) {
          grouped_gemm(ctx, make(i % R, GemmEngine::cublas_loop, ref));
        });
        // dense GEMM of the same total size (one cuBLAS call; the roofline peer)
        const float one = 1, zero = 0;
        const int iM = int(M), iN = int(N), iK = int(K);
        const double t_dense = median_ms(stream, 2, iters, [&](int i) {
          const void* A = view_a(i % R).data;
          const void* B = view_b(i % R).data;
          if (pass == GemmPass::forward)
            GROUPMM_CHECK_CUBLAS(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, iN, iM, iK, &one, B,
                                              CUDA_R_16BF, iK, A, CUDA_R_16BF, iK, &zero,
                                              ref.data(), CUDA_R_16BF, iN, CUBLAS_COMPUTE_32F,
                                              CUBLAS_GEMM_DEFAULT));
          else if (pass == GemmPass::dgrad)
            GROUPMM_CHECK_CUBLAS(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, iK, iM, iN, &one, B,
                                              CUDA_R_16BF, iK, A, CUDA_R_16BF, iN, &zero,
                                              ref.data(), CUDA_R_16BF, iK, CUBLAS_COMPUTE_32F,
                                              CUBLAS_GEMM_DEFAULT));
          else
            GROUPMM_CHECK_CUBLAS(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_T, iK, iN, iM, &one, B,
                                              CUDA_R_16BF, iK, A, CUDA_R_16BF, iN, &zero,
                                              ref.data(), CUDA_R_16BF, iK, CUBLAS_COMPUTE_32F,
                                              CUBLAS_GEMM_DEFAULT));
        });
        int64_t active = 0;
        for (auto v : splits) active += v > 0;
        const double flops = 2.0 * double(M) * double(N) * double(K);
        double bytes = double(a_el) * 2 + double(out_el) * (out_t == DType::fp32 ? 4 : 2);
        bytes += pass == GemmPass::wgrad ? double(b_el) * 2 : double(active) * double(N * K) * 2;
        const double us = t_ours * 1e3;
        const std::string config_name =
            gemm_config_name(ctx, make(0, GemmEngine::cutlass_sm90, out));
        std::printf(
            "%-22s %-6s %-8s %5lld %6lld %6lld %6lld %9.1f %7.1f %7.0f %8.3f %8.3f %7.1e %s%s\n",
            s.name, pass_name, pattern.c_str(), (long long)G, (long long)M, (long long)N,
            (long long)K, us, flops / (t_ours * 1e-3) / 1e12, bytes / (t_ours * 1e-3) / 1e9,
            t_dense / t_ours, t_loop / t_ours, err, config_name.c_str(), ok ? "" : "  FAILED");
        std::fflush(stdout);
        if (json.is_open()) {
          json << (first ? "" : ",\n") << "{\"case\": \"" << s.name << "\", \"pass\": \""
               << pass_name << "\", \"pattern\": \"" << pattern << "\", \"G\": " << G
               << ", \"M\": " << M << ", \"N\": " << N << ", \"K\": " << K << ", \"us\": " << us
               << ", \"dense_us\": " << t_dense * 1e3 << ", \"loop_us\": " << t_loop * 1e3
               << ", \"flops\": " << flops << ", \"bytes\": " << bytes << ", \"rel_err\": " << err
               << ", \"config\": \""
               << gemm_config_name(ctx, make(0, GemmEngine::cutlass_sm90, out))
               << "\", \"splits\": [";
          for (size_t i = 0; i < splits.size(); ++i) json << (i ? "," : "") << splits[i];
          json << "]}";
          first = false;
        }
      }
    }
  }
  // Host time of one grouped GEMM call (no sync; the device queue absorbs the launches).
  {
    const int64_t G = 128, M = 1024, N = 1536, K = 2048;
    Tensor x = Tensor::empty({M, K}, DType::bf16, Device::CUDA, stream);
    Tensor w = Tensor::empty({G, N, K}, DType::bf16, Device::CUDA, stream);
    Tensor y = Tensor::empty({M, N}, DType::bf16, Device::CUDA, stream);
    Tensor sp = Tensor::empty({G}, DType::int32, Device::CUDA, stream);
    fill_uniform(ctx, x, -1, 1, 99);
    fill_uniform(ctx, w, -1, 1, 98);
    std::vector<int32_t> hs(size_t(G), int32_t(M / G));
    copy(sp, TensorView(hs.data(), DType::int32, Device::CPU, {G}), stream);
    GroupedGemmArgs x_args;
    x_args.a = x;
    x_args.b = w;
    x_args.out = y;
    x_args.splits = sp;
    const size_t ws = grouped_gemm_workspace_size(ctx, x_args);
    void* wsp = ctx.workspace(ws);
    for (int i = 0; i < 20; ++i) grouped_gemm(ctx, x_args, wsp, ws);
    ctx.synchronize();
    const int n = 200;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) grouped_gemm(ctx, x_args, wsp, ws);
    const auto t1 = std::chrono::steady_clock::now();
    ctx.synchronize();
    const double host_us = std::chrono::duration<double, std::micro>(t1 - t0).count() / n;
    std::printf("host time per grouped_gemm call (decode shape, no sync): %.2f us\n", host_us);
    std::fflush(stdout);
    if (json.is_open()) {
      json << "\n], \"host_us_per_call\": " << host_us << "}\n";
      close_json(json, json_path);
    }
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
                 "time this kernel configuration instead of the heuristic's choice "
                 "(cases of its pass only; names from --list-configs)")
      ->type_name("NAME");
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

Register reg(command<GemmOptions>(
    "bench", "gemm",
    "grouped GEMM suite (forward, dgrad, wgrad on MoE shapes) vs the cuBLAS per-expert "
    "loop and one dense cuBLAS GEMM (GPU)",
    add_gemm_options, run_bench_gemm));

}  // namespace
}  // namespace groupmm::tool
