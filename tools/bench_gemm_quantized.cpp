// `groupmm bench gemm --recipe fp8_current|fp8_block|mxfp8`: the public suite on quantized
// operands. Each case quantizes bf16 inputs with group_quantize (not timed), checks the quantized
// GEMM against our bf16 GEMM of the same inputs (DeepGEMM's diff < 1e-3), then times the quantized
// GEMM and, as the ceiling, one dense cuBLASLt FP8 GEMM (e4m3, bf16 out, fp32 accumulation) of the
// same total size, on the quantized operands' own bytes. --json writes records for
// bench/peers_torch.py (torch._scaled_grouped_mm).
#include <cublasLt.h>

#include <cstdio>
#include <fstream>

#include "bench_common.hpp"
#include "bench_gemm_quantized.hpp"
#include "groupmm/quantize.hpp"
#include "groupmm/random.hpp"

namespace groupmm::tool {
namespace {

// One dense cuBLASLt FP8 GEMM: row-major D[M, N] = A[M, K] B[N, K]^T, e4m3 in, bf16 out.
class DenseFp8 {
 public:
  DenseFp8(int64_t M, int64_t N, int64_t K, cudaStream_t s) : M_(M), N_(N), K_(K), s_(s) {
    GROUPMM_CHECK_CUBLAS(cublasLtCreate(&lt_));
    GROUPMM_CHECK_CUBLAS(cublasLtMatmulDescCreate(&op_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
    GROUPMM_CHECK_CUBLAS(
        cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
    GROUPMM_CHECK_CUBLAS(
        cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof(n)));
    // column-major view: D^T[N, M] = B[N, K] (as [K, N] transposed) x A^T ([K, M])
    GROUPMM_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&a_, CUDA_R_8F_E4M3, K, N, K));
    GROUPMM_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&b_, CUDA_R_8F_E4M3, K, M, K));
    GROUPMM_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&d_, CUDA_R_16BF, N, M, N));
    GROUPMM_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref_));
    ws_bytes_ = size_t(64) << 20;
    GROUPMM_CHECK_CUDA(cudaMalloc(&ws_, ws_bytes_));
    GROUPMM_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref_, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes_, sizeof(ws_bytes_)));
    int found = 0;
    GROUPMM_CHECK_CUBLAS(
        cublasLtMatmulAlgoGetHeuristic(lt_, op_, a_, b_, d_, d_, pref_, 1, &heur_, &found));
    GROUPMM_CHECK(found > 0, "bench gemm: cuBLASLt has no FP8 algorithm for ", M, "x", N, "x", K);
  }
  ~DenseFp8() {
    cudaFree(ws_);
    cublasLtMatmulPreferenceDestroy(pref_);
    cublasLtMatrixLayoutDestroy(a_);
    cublasLtMatrixLayoutDestroy(b_);
    cublasLtMatrixLayoutDestroy(d_);
    cublasLtMatmulDescDestroy(op_);
    cublasLtDestroy(lt_);
  }
  void run(const void* A, const void* B, void* D) {
    const float one = 1, zero = 0;
    GROUPMM_CHECK_CUBLAS(cublasLtMatmul(lt_, op_, &one, B, a_, A, b_, &zero, D, d_, D, d_,
                                        &heur_.algo, ws_, ws_bytes_, s_));
  }

 private:
  int64_t M_, N_, K_;
  cudaStream_t s_;
  cublasLtHandle_t lt_ = nullptr;
  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, d_ = nullptr;
  cublasLtMatmulPreference_t pref_ = nullptr;
  cublasLtMatmulHeuristicResult_t heur_{};
  void* ws_ = nullptr;
  size_t ws_bytes_ = 0;
};

}  // namespace

double calc_diff_device(const TensorView& x, const TensorView& y) {
  const auto host_floats = [](const TensorView& v) {
    std::vector<float> f(size_t(v.numel()));
    if (v.dtype == DType::fp32) {
      copy(TensorView(f.data(), DType::fp32, Device::CPU, {v.numel()}), v);
      return f;
    }
    GROUPMM_CHECK(v.dtype == DType::bf16, "calc_diff_device: bf16 or fp32 views, got ",
                  dtype_name(v.dtype));
    std::vector<uint16_t> h(f.size());
    copy(TensorView(h.data(), DType::bf16, Device::CPU, {v.numel()}), v);
    for (size_t i = 0; i < h.size(); ++i) f[i] = bf16_bits_to_float(h[i]);
    return f;
  };
  const std::vector<float> hx = host_floats(x), hy = host_floats(y);
  double xy = 0, xx = 0, yy = 0;
#pragma omp parallel for reduction(+ : xy, xx, yy)
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double a = hx[size_t(i)], b = hy[size_t(i)];
    xy += a * b;
    xx += a * a;
    yy += b * b;
  }
  return xx + yy == 0 ? 0 : 1 - 2 * xy / (xx + yy);
}

namespace {

// The FP8 wgrad rule: every split a multiple of 16 (remainders moved to the first non-empty one).
std::vector<int64_t> align16(std::vector<int64_t> s) {
  int64_t rest = 0;
  for (auto& v : s) rest += v % 16, v -= v % 16;
  for (auto& v : s)
    if (v > 0 || rest == 0) {
      v += rest;
      break;
    }
  return s;
}

}  // namespace

int bench_gemm_quantized(const QuantBenchOptions& o, cudaStream_t stream) {
  Context ctx(Device::CUDA, stream);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, ctx.device_index());
  std::printf("groupmm bench gemm --recipe %s%s on %s (%d SMs)\n", recipe_name(o.recipe),
              o.fast_accum ? " --fast-accum" : "", prop.name, prop.multiProcessorCount);
  std::printf("%-22s %-6s %-8s %5s %6s %6s %6s %9s %8s %8s %8s %9s %s\n", "case", "pass", "pattern",
              "G", "M", "N", "K", "us", "TFLOP/s", "xdense8", "xbf16", "diff", "config");
  std::ofstream json;
  if (!o.json_path.empty()) {
    json.open(o.json_path);
    GROUPMM_CHECK(json.is_open(), "bench gemm: cannot write --json file '", o.json_path, "'");
    json << "{\"device\": \"" << prop.name << "\", \"recipe\": \"" << recipe_name(o.recipe)
         << "\", \"fast_accum\": " << (o.fast_accum ? "true" : "false") << ", \"cases\": [\n";
  }
  bool first = true;
  int failures = 0;
  uint64_t seed = 1;
  for (const BenchShape& s : o.shapes) {
    const int64_t G = s.G, M = s.M, N = s.N, K = s.K;
    for (GemmPass pass : {GemmPass::forward, GemmPass::dgrad, GemmPass::wgrad}) {
      const char* pass_name = pass == GemmPass::forward ? "fwd"
                              : pass == GemmPass::dgrad ? "dgrad"
                                                        : "wgrad";
      if (!o.pass.empty() && o.pass != pass_name) continue;
      if (pass != GemmPass::forward && s.decode) continue;
      if (o.fast_accum && pass != GemmPass::forward) continue;
      const bool wg = pass == GemmPass::wgrad, fwd = pass == GemmPass::forward;
      if (o.out_fp32 && !wg) continue;  // the FP8 GEMMs into fp32 are the wgrads
      const int64_t a_cols = fwd ? K : N;
      Tensor a = Tensor::empty({M, a_cols}, DType::bf16, Device::CUDA, stream);
      Tensor b = wg ? Tensor::empty({M, K}, DType::bf16, Device::CUDA, stream)
                    : Tensor::empty({G, N, K}, DType::bf16, Device::CUDA, stream);
      fill_uniform(ctx, a, -1.0f, 1.0f, seed++);
      fill_uniform(ctx, b, -0.05f, 0.05f, seed++);
      const DType out_t = o.out_fp32 ? DType::fp32 : DType::bf16;
      const int64_t out_el = wg ? G * N * K : M * (fwd ? N : K);
      Tensor out = Tensor::empty({out_el}, out_t, Device::CUDA, stream);
      Tensor ref = Tensor::empty({out_el}, out_t, Device::CUDA, stream);
      Tensor dsplits = Tensor::empty({G}, DType::int64, Device::CUDA, stream);
      auto out_view = [&](const Tensor& t) {
        return wg ? TensorView(t.data(), out_t, Device::CUDA, {G, N, K})
                  : TensorView(t.data(), out_t, Device::CUDA, {M, out_el / M});
      };
      // Quantized operands in the copies the pass reads.
      QuantizeConfig qa, qb;
      qa.recipe = qb.recipe = o.recipe;
      qa.direction = wg ? QuantDirection::columnwise : QuantDirection::rowwise;
      qb.direction = fwd ? QuantDirection::rowwise : QuantDirection::columnwise;
      qb.block_2d = !wg && o.recipe == QuantRecipe::fp8_block;
      const QuantizedBuffers ba =
          allocate_quantized(group_quantize_shapes(M, a_cols, G, qa), Device::CUDA, stream);
      const QuantizedBuffers bb =
          allocate_quantized(group_quantize_shapes(wg ? M : G * N, K, G, qb), Device::CUDA, stream);
      for (const char* pattern : {"balanced", "zipf", "empty25"}) {
        if (!o.pattern.empty() && o.pattern != pattern) continue;
        std::vector<int64_t> splits = bench_splits(pattern, G, M);
        if (wg && o.recipe != QuantRecipe::mxfp8) splits = align16(splits);
        copy(dsplits, TensorView(splits.data(), DType::int64, Device::CPU, {G}), stream);
        GroupQuantizeArgs q;
        q.input = a;
        q.splits = dsplits;
        q.config = qa;
        q.out = ba.view(G, dsplits, qa);
        const GroupedTensor ta = group_quantize(ctx, q);
        q.input = b;
        q.splits = wg ? dsplits.view() : TensorView();
        q.config = qb;
        q.out = bb.view(G, q.splits, qb);
        const GroupedTensor tb = group_quantize(ctx, q);
        QuantizedGemmArgs x;
        x.pass = pass;
        x.a = ta;
        x.b = tb;
        x.out = out_view(out);
        x.splits = dsplits;
        x.fast_accum = o.fast_accum;
        x.config = o.config;
        GroupedGemmArgs h;  // the bf16 GEMM of the same inputs
        h.pass = pass;
        h.a = a;
        h.b = b;
        h.out = out_view(ref);
        h.splits = dsplits;
        fill_bytes(out, 0xFF, stream);
        grouped_gemm(ctx, x);
        grouped_gemm(ctx, h);
        ctx.check();
        const double diff = calc_diff_device(out_view(out), out_view(ref));
        const bool ok = diff < 1e-3;
        failures += ok ? 0 : 1;
        const size_t ws = grouped_gemm_workspace_size(ctx, x);
        ctx.reserve_workspace(std::max(ws, grouped_gemm_workspace_size(ctx, h)));
        const double t_q = median_ms(stream, 3, o.iters, [&](int) {
          grouped_gemm(ctx, x, ctx.workspace(ws), ctx.workspace_size());
        });
        const double t_h = median_ms(stream, 2, o.iters, [&](int) { grouped_gemm(ctx, h); });
        // dense FP8 ceiling of the same total size (forward shape: M x N x K)
        const int64_t dM = wg ? N : M, dN = wg ? K : (fwd ? N : K), dK = wg ? M : (fwd ? K : N);
        // It reads the quantized operands' own bytes (their first dM x dK and dN x dK elements),
        // not constant ones: tensor-core power depends on the data, and these GEMMs run at the
        // GPU's power cap, where power sets the clock (bench/RESULTS.md, "the power cap").
        const TensorView qa8 = ta.data.present() ? ta.data : ta.columnwise_data;
        const TensorView qb8 = tb.data.present() ? tb.data : tb.columnwise_data;
        GROUPMM_CHECK(qa8.dtype == DType::fp8e4m3 && qb8.dtype == DType::fp8e4m3 &&
                          qa8.numel() >= dM * dK && qb8.numel() >= dN * dK,
                      "bench gemm: the dense FP8 peer needs e4m3 operands of ", dM, "x", dK,
                      " and ", dN, "x", dK, " (got ", qa8.numel(), " and ", qb8.numel(), ")");
        Tensor dd = Tensor::empty({dM * dN}, DType::bf16, Device::CUDA, stream);
        DenseFp8 dense(dM, dN, dK, stream);
        const double t_dense =
            median_ms(stream, 2, o.iters, [&](int) { dense.run(qa8.data, qb8.data, dd.data()); });
        const double flops = 2.0 * double(M) * double(N) * double(K);
        const std::string cfg = gemm_config_name(ctx, x);
        std::printf("%-22s %-6s %-8s %5lld %6lld %6lld %6lld %9.1f %8.1f %8.3f %8.3f %9.2e %s%s\n",
                    s.name, pass_name, pattern, (long long)G, (long long)M, (long long)N,
                    (long long)K, t_q * 1e3, flops / (t_q * 1e-3) / 1e12, t_dense / t_q, t_h / t_q,
                    diff, cfg.c_str(), ok ? "" : "  FAILED");
        std::fflush(stdout);
        if (json.is_open()) {
          json << (first ? "" : ",\n") << "{\"case\": \"" << s.name << "\", \"pass\": \""
               << pass_name << "\", \"pattern\": \"" << pattern << "\", \"G\": " << G
               << ", \"M\": " << M << ", \"N\": " << N << ", \"K\": " << K
               << ", \"us\": " << t_q * 1e3 << ", \"bf16_us\": " << t_h * 1e3
               << ", \"dense_fp8_us\": " << t_dense * 1e3 << ", \"flops\": " << flops
               << ", \"diff\": " << diff << ", \"config\": \"" << cfg << "\", \"splits\": [";
          for (size_t i = 0; i < splits.size(); ++i) json << (i ? "," : "") << splits[i];
          json << "]}";
          first = false;
        }
      }
    }
  }
  if (json.is_open()) json << "\n]}\n";
  std::printf("%s: %d case(s) failed validation\n", failures ? "FAIL" : "ok", failures);
  return failures ? 1 : 0;
}

}  // namespace groupmm::tool
