// `groupmm bench gemm --recipe fp8_current|fp8_block|mxfp8`: the public suite on quantized
// operands. Each case quantizes bf16 inputs with group_quantize (not timed), checks the quantized
// GEMM against our bf16 GEMM of the same inputs (DeepGEMM's diff < 1e-3), then times the quantized
// GEMM and, as the ceiling, one dense cuBLASLt FP8 GEMM (e4m3, bf16 out, fp32 accumulation) of the
// same total size, on the quantized operands' own bytes. --json writes records for
// bench/peers_torch.py (torch._scaled_grouped_mm).
#include <cublasLt.h>

#include <cstdio>

#include "bench/suites.hpp"
#include "groupmm/gemm.hpp"
#include "groupmm/quantize.hpp"
#include "groupmm/random.hpp"

namespace groupmm::tool {
namespace {

// One dense cuBLASLt FP8 GEMM: row-major D[M, N] = A[M, K] B[N, K]^T, e4m3 in, bf16 out.
class DenseFp8 {
 public:
  DenseFp8(int64_t M, int64_t N, int64_t K, cudaStream_t s) : s_(s) {
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
  cudaStream_t s_;
  cublasLtHandle_t lt_ = nullptr;
  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, d_ = nullptr;
  cublasLtMatmulPreference_t pref_ = nullptr;
  cublasLtMatmulHeuristicResult_t heur_{};
  void* ws_ = nullptr;
  size_t ws_bytes_ = 0;
};

QuantRecipe gemm_recipe_of(const std::string& r) {
  return r == "fp8_current" ? QuantRecipe::fp8_current
         : r == "fp8_block" ? QuantRecipe::fp8_block
                            : QuantRecipe::mxfp8;
}

// One case x pass: the bf16 inputs, the buffers of their quantized copies (in the directions the
// pass reads), the output and the bf16 GEMM's reference output.
struct QuantGemmCase {
  GemmPass pass;
  bool fwd, wg;
  int64_t G, M, N, K, a_cols, out_el;
  DType out_t;
  Tensor a, b, out, ref, dsplits;
  QuantizeConfig qa, qb;
  QuantizedBuffers ba, bb;

  QuantGemmCase(Context& ctx, const SuiteShape& s, GemmPass p, QuantRecipe recipe, bool out_fp32,
                uint64_t& seed)
      : pass(p),
        fwd(p == GemmPass::forward),
        wg(p == GemmPass::wgrad),
        G(s.G),
        M(s.M),
        N(s.N),
        K(s.K),
        a_cols(fwd ? K : N),
        out_el(wg ? G * N * K : M * (fwd ? N : K)),
        out_t(out_fp32 ? DType::fp32 : DType::bf16) {
    cudaStream_t st = ctx.stream();
    a = Tensor::empty({M, a_cols}, DType::bf16, Device::CUDA, st);
    b = wg ? Tensor::empty({M, K}, DType::bf16, Device::CUDA, st)
           : Tensor::empty({G, N, K}, DType::bf16, Device::CUDA, st);
    fill_uniform(ctx, a, -1.0f, 1.0f, seed++);
    fill_uniform(ctx, b, -0.05f, 0.05f, seed++);
    out = Tensor::empty({out_el}, out_t, Device::CUDA, st);
    ref = Tensor::empty({out_el}, out_t, Device::CUDA, st);
    dsplits = Tensor::empty({G}, DType::int64, Device::CUDA, st);
    qa.recipe = qb.recipe = recipe;
    qa.direction = wg ? QuantDirection::columnwise : QuantDirection::rowwise;
    qb.direction = fwd ? QuantDirection::rowwise : QuantDirection::columnwise;
    qb.block_2d = !wg && recipe == QuantRecipe::fp8_block;
    ba = allocate_quantized(group_quantize_shapes(M, a_cols, G, qa), Device::CUDA, st);
    bb = allocate_quantized(group_quantize_shapes(wg ? M : G * N, K, G, qb), Device::CUDA, st);
  }
  TensorView out_view(const Tensor& t) const {
    return wg ? TensorView(t.data(), out_t, Device::CUDA, {G, N, K})
              : TensorView(t.data(), out_t, Device::CUDA, {M, out_el / M});
  }
  // Quantizes a and b (splits in dsplits) into ba, bb.
  std::pair<GroupedTensor, GroupedTensor> quantize(Context& ctx) const {
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
    return {ta, group_quantize(ctx, q)};
  }
};

// The dense FP8 ceiling of the same total size (forward shape: M x N x K): median ms. It reads the
// quantized operands' own bytes (their first dM x dK and dN x dK elements), not constant ones:
// tensor-core power depends on the data, and these GEMMs run at the GPU's power cap, where power
// sets the clock (docs/decisions.md, "Benchmarking: the dense FP8 peer runs on the operands'
// bytes").
double time_dense_fp8(Context& ctx, const QuantGemmCase& c, const GroupedTensor& ta,
                      const GroupedTensor& tb, int iters) {
  const int64_t dM = c.wg ? c.N : c.M, dN = c.wg ? c.K : (c.fwd ? c.N : c.K),
                dK = c.wg ? c.M : (c.fwd ? c.K : c.N);
  const TensorView qa8 = ta.data.present() ? ta.data : ta.columnwise_data;
  const TensorView qb8 = tb.data.present() ? tb.data : tb.columnwise_data;
  GROUPMM_CHECK(qa8.dtype == DType::fp8e4m3 && qb8.dtype == DType::fp8e4m3 &&
                    qa8.numel() >= dM * dK && qb8.numel() >= dN * dK,
                "bench gemm: the dense FP8 peer needs e4m3 operands of ", dM, "x", dK, " and ", dN,
                "x", dK, " (got ", qa8.numel(), " and ", qb8.numel(), ")");
  Tensor dd = Tensor::empty({dM * dN}, DType::bf16, Device::CUDA, ctx.stream());
  DenseFp8 dense(dM, dN, dK, ctx.stream());
  return median_ms(ctx.stream(), 2, iters, [&](int) { dense.run(qa8.data, qb8.data, dd.data()); });
}

const Table kQuantGemmTable({text_col("case", 22), text_col("pass", 6), text_col("pattern", 8),
                             int_col("G", 5), int_col("M", 6), int_col("N", 6), int_col("K", 6),
                             num_col("us", 9, 1), num_col("TFLOP/s", 8, 1),
                             num_col("xdense8", 8, 3), num_col("xbf16", 8, 3),
                             num_col("diff", 9, 2, 'e'), text_col("config", 0)});

// One case x pass x pattern: validated against the bf16 GEMM, then timed with its peers.
void run_quant_gemm_case(Context& ctx, const BenchGemmOptions& o, const QuantGemmCase& c,
                         const SuiteShape& s, const char* pass_name, const char* pattern,
                         Failures& failures, JsonFile& json) {
  std::vector<int64_t> splits = bench_splits(pattern, c.G, c.M);
  if (c.wg && c.qa.recipe != QuantRecipe::mxfp8) splits = align_splits16(splits);
  copy(c.dsplits, TensorView(splits.data(), DType::int64, Device::CPU, {c.G}), ctx.stream());
  const auto [ta, tb] = c.quantize(ctx);
  QuantizedGemmArgs x;
  x.pass = c.pass;
  x.a = ta;
  x.b = tb;
  x.out = c.out_view(c.out);
  x.splits = c.dsplits;
  x.fast_accum = o.fast_accum;
  x.config = gemm_config_arg(o.config);  // "auto": the heuristic's kernel, "auto@along_n" its order
  GroupedGemmArgs h;                     // the bf16 GEMM of the same inputs
  h.pass = c.pass;
  h.a = c.a;
  h.b = c.b;
  h.out = c.out_view(c.ref);
  h.splits = c.dsplits;
  fill_bytes(c.out, 0xFF, ctx.stream());
  grouped_gemm(ctx, x);
  grouped_gemm(ctx, h);
  ctx.check();
  const double diff = calc_diff(c.out_view(c.out), c.out_view(c.ref));
  const bool ok = failures.check(diff < 1e-3);
  const size_t ws = grouped_gemm_workspace_size(ctx, x);
  ctx.reserve_workspace(std::max(ws, grouped_gemm_workspace_size(ctx, h)));
  const double t_q = median_ms(ctx.stream(), 3, o.iters, [&](int) {
    grouped_gemm(ctx, x, ctx.workspace(ws), ctx.workspace_size());
  });
  const double t_h = median_ms(ctx.stream(), 2, o.iters, [&](int) { grouped_gemm(ctx, h); });
  const double t_dense = time_dense_fp8(ctx, c, ta, tb, o.iters);
  const double flops = 2.0 * double(c.M) * double(c.N) * double(c.K);
  const std::string cfg = gemm_config_name(ctx, x);
  kQuantGemmTable.print_row({s.name, pass_name, pattern, c.G, c.M, c.N, c.K, t_q * 1e3,
                             flops / (t_q * 1e-3) / 1e12, t_dense / t_q, t_h / t_q, diff, cfg},
                            ok ? "" : "  FAILED");
  json.add(JsonRecord()
               .add("case", s.name)
               .add("pass", pass_name)
               .add("pattern", pattern)
               .add("G", c.G)
               .add("M", c.M)
               .add("N", c.N)
               .add("K", c.K)
               .add("us", t_q * 1e3)
               .add("bf16_us", t_h * 1e3)
               .add("dense_fp8_us", t_dense * 1e3)
               .add("flops", flops)
               .add("diff", diff)
               .add("config", cfg)
               .add("splits", splits));
}

}  // namespace

int run_gemm_quantized(const BenchGemmOptions& o, cudaStream_t stream) {
  const QuantRecipe recipe = gemm_recipe_of(o.recipe);
  JsonFile json(o.json_path);
  Context ctx(Device::CUDA, stream);
  const GpuInfo gpu = gpu_info(ctx);
  std::printf("groupmm bench gemm --recipe %s%s on %s (%d SMs)\n", recipe_name(recipe),
              o.fast_accum ? " --fast-accum" : "", gpu.name.c_str(), gpu.sms);
  kQuantGemmTable.print_header();
  Failures failures;
  uint64_t seed = 1;
  for (const SuiteShape& s : gemm_suite_shapes(o.suite)) {
    if (!case_matches(o.case_filter, s.name)) continue;
    const bool decode = std::string(s.name).find("decode") != std::string::npos;
    for (const char* pass_name : {"fwd", "dgrad", "wgrad"}) {
      const GemmPass pass = pass_name[0] == 'f'   ? GemmPass::forward
                            : pass_name[0] == 'd' ? GemmPass::dgrad
                                                  : GemmPass::wgrad;
      if ((!o.pass.empty() && o.pass != pass_name) || (pass != GemmPass::forward && decode) ||
          (o.fast_accum && pass != GemmPass::forward) ||
          (o.out == "fp32" && pass != GemmPass::wgrad))  // the FP8 GEMMs into fp32: the wgrads
        continue;
      const QuantGemmCase c(ctx, s, pass, recipe, o.out == "fp32", seed);
      for (const char* pattern : {"balanced", "zipf", "empty25"})
        if (o.pattern.empty() || o.pattern == pattern)
          run_quant_gemm_case(ctx, o, c, s, pass_name, pattern, failures, json);
    }
  }
  json.write(JsonRecord()
                 .add("device", gpu.name)
                 .add("recipe", recipe_name(recipe))
                 .add("fast_accum", o.fast_accum));
  return failures.summary();
}

}  // namespace groupmm::tool
