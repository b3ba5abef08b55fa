// grouped_gemm over quantized operands on the GPU (CUTLASS FP8 kernels, the MXFP8 dequantize path)
// against the CPU reference (fp64 products of the exactly dequantized operands). The operands are
// quantized on each device by group_quantize (bit-exact across backends), so this also checks that
// the GEMMs read the layouts the quantizer writes. Outputs are poisoned first; every split pattern,
// G=1 and G=128, the wgrad alignment rule, CUDA-graph replay with new routings.
#include "common/qgemm_case.hpp"

namespace groupmm::test {
namespace {

// Relative error of a correct implementation against the fp64 reference. Hopper's FP8 tensor
// cores accumulate with about 14 mantissa bits (DeepSeek-V3 report, section 3.3.2) between the
// promotions to fp32 registers every 128 K; measured 0.9-1.3e-4 on fp32 wgrad outputs (H100).
// bf16 outputs add their own rounding (a flip is one bf16 ulp, 2^-8 relative). Fast accumulation
// keeps the reduced precision over the whole K.
double tolerance(const QGemmSpec& s) {
  if (s.fast_accum) return 1e-2;
  if (s.recipe == QuantRecipe::mxfp8) return s.out == DType::fp32 ? 2e-5 : 2e-3;  // bf16 engine
  return s.out == DType::fp32 ? 5e-4 : 2e-3;
}

struct QCase {
  QGemmSpec spec;
  std::string name;
};

void PrintTo(const QCase& c, std::ostream* os) {
  *os << c.name;
}

// Splits of `pattern` rounded down to multiples of 16 (the FP8 wgrad rule), remainder to expert 0.
void check_against_reference(const QGemmSpec& s, const std::vector<float>& gpu,
                             const std::vector<float>& ref) {
  ASSERT_EQ(gpu.size(), ref.size());
  int64_t start = 0;
  const int64_t cols = s.pass == GemmPass::forward ? s.N : s.K;
  const double tol = tolerance(s);
  for (int64_t g = 0; g < s.G; ++g) {
    const int64_t m = s.splits[size_t(g)];
    const int64_t lo = s.pass == GemmPass::wgrad ? g * s.N * s.K : start * cols;
    const int64_t hi = s.pass == GemmPass::wgrad ? (g + 1) * s.N * s.K : (start + m) * cols;
    start += m;
    std::vector<float> x(gpu.begin() + lo, gpu.begin() + hi), y(ref.begin() + lo, ref.begin() + hi);
    if (s.pass == GemmPass::wgrad && m == 0) {
      ASSERT_EQ(x, y) << "empty expert " << g << " must be exactly 0 (or unchanged)";
      continue;
    }
    const double e = rel_error(x, y);
    ASSERT_LE(e, tol) << "expert " << g << " rows " << m << " rel " << e;
    double amax = 0, worst = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      amax = std::max(amax, std::abs(double(y[i])));
      worst = std::max(worst, std::abs(double(x[i]) - y[i]));
    }
    ASSERT_LE(worst, 8 * tol * amax + 1e-30) << "expert " << g << " max abs error " << worst;
  }
  for (size_t i = 0; i < gpu.size(); ++i) ASSERT_FALSE(std::isnan(gpu[i])) << "element " << i;
}

class QuantizedGemmGpu : public ::testing::TestWithParam<QCase> {};

TEST_P(QuantizedGemmGpu, MatchesCpuReference) {
  GROUPMM_REQUIRE_GPU();
  const QGemmSpec& s = GetParam().spec;
  const QGemmInputs in = make_inputs(s);
  Context gctx(Device::CUDA), cctx(Device::CPU);
  QGemmDevice gpu(gctx, s, in), cpu(cctx, s, in);
  grouped_gemm(gctx, gpu.args(s));
  gctx.check();
  grouped_gemm(cctx, cpu.args(s));
  cctx.check();
  check_against_reference(s, gpu.result(s), cpu.result(s));
}

std::vector<QCase> cases() {
  std::vector<QCase> v;
  auto add = [&](QGemmSpec s, const char* tag = "") {
    v.push_back({s, spec_name(s) + (*tag ? std::string("_") + tag : std::string())});
  };
  for (QuantRecipe r : {QuantRecipe::fp8_current, QuantRecipe::fp8_block, QuantRecipe::mxfp8}) {
    const bool blk = r == QuantRecipe::fp8_block;
    for (GemmPass pass : {GemmPass::forward, GemmPass::dgrad, GemmPass::wgrad}) {
      const bool wg = pass == GemmPass::wgrad;
      auto spec = [&](int64_t G, std::vector<int64_t> splits, int64_t N, int64_t K) {
        QGemmSpec s;
        s.pass = pass;
        s.recipe = r;
        s.G = G;
        s.splits = std::move(splits);
        s.N = N;
        s.K = K;
        s.out = wg ? DType::fp32 : DType::bf16;
        return s;
      };
      auto pat = [&](Pattern p, int64_t G, int64_t total) {
        return wg && r != QuantRecipe::mxfp8
                   ? align_splits(make_splits(p, G, total - total % 16), 16)
                   : make_splits(p, G, total);
      };
      // N, K off the 128x256 tile: multiples of the recipe's block (128 / 32 / 16) only.
      const int64_t n_odd = blk ? 384 : r == QuantRecipe::mxfp8 ? 288 : 272;
      const int64_t k_odd = blk ? 640 : r == QuantRecipe::mxfp8 ? 352 : 336;
      add(spec(8, pat(Pattern::zipf, 8, 2000), 512, 1024));
      add(spec(4, pat(Pattern::random_odd, 4, 1000), n_odd, k_odd));
      if (blk && !wg) {
        // The blockwise forward and dgrad run a 128x192 tile over 128x128 weight blocks
        // (sm90_blockwise_wide_mainloop.cuh): one to five K blocks per tile; output widths
        // (N', the forward's N or the dgrad's K) with even and odd tiles (a tile's first 128 or
        // 64 columns in one weight block), tiles that end past N' by 64 and 128 columns, and
        // whole tiles only (1152); and the widths swapped against n_odd x k_odd.
        add(spec(3, pat(Pattern::random_odd, 3, 500), 128, 128));
        add(spec(3, pat(Pattern::random_odd, 3, 500), 256, 256));
        add(spec(4, pat(Pattern::random_odd, 4, 1000), k_odd, n_odd));
        for (auto [n, k] : {std::pair<int64_t, int64_t>{896, 640}, {1152, 256}}) {
          const bool fwd = pass == GemmPass::forward;
          add(spec(5, pat(Pattern::random_odd, 5, 1500), fwd ? n : k, fwd ? k : n), "wide");
        }
      }
      add(spec(1, pat(Pattern::balanced, 1, 777), 256, 512));
      add(spec(128, pat(Pattern::quarter_empty, 128, 4096), 256, 256));
      for (Pattern z : {Pattern::zero_first, Pattern::zero_last})
        add(spec(6, pat(z, 6, 900), 256, 384), pattern_name(z));
      add(spec(5, pat(Pattern::zero_all, 5, 0), 256, 256));
      if (pass == GemmPass::forward) {  // decode: <= 64 rows per expert, swapped operands
        add(spec(128, pat(Pattern::random_odd, 128, 1024), 512, 1024), "decode");
        add(spec(64, pat(Pattern::quarter_empty, 64, 256), n_odd, k_odd), "decode");
        QGemmSpec db = spec(32, pat(Pattern::zipf, 32, 1024), 256, 512);
        db.bias = true;
        add(db, "decode");
      }
      if (pass == GemmPass::forward) {
        QGemmSpec b = spec(8, pat(Pattern::zipf, 8, 2000), 512, 512);
        b.bias = true;
        add(b);
      }
      if (wg) {
        QGemmSpec acc = spec(8, pat(Pattern::zero_middle, 8, 2048), 256, 512);
        acc.beta = 1;
        add(acc);
        QGemmSpec o16 = spec(8, pat(Pattern::zipf, 8, 2048), 256, 512);
        o16.out = DType::bf16;
        add(o16);
        // 16-bit dW with N, K off the tile and off the epilogue subtiles (128x64, 128x96).
        QGemmSpec o16_odd = spec(4, pat(Pattern::random_odd, 4, 1000), n_odd, k_odd);
        o16_odd.out = DType::bf16;
        add(o16_odd, "odd");
      }
      if (r == QuantRecipe::fp8_current && pass != GemmPass::forward) {
        QGemmSpec e5 = spec(8, pat(Pattern::zipf, 8, 2048), 512, 512);
        e5.grad_fp8 = DType::fp8e5m2;
        add(e5);
        if (wg) {
          e5.out = DType::bf16;
          add(e5);
        }
      }
      if (r == QuantRecipe::fp8_current && pass == GemmPass::forward) {
        QGemmSpec f = spec(8, pat(Pattern::zipf, 8, 2048), 512, 2048);
        f.fast_accum = true;
        add(f);
      }
      if (r == QuantRecipe::mxfp8) {
        QGemmSpec sw = spec(8, pat(Pattern::random_odd, 8, 1500), 256, 512);
        sw.mx_layout = ScaleLayout::swizzled;
        add(sw);
      }
    }
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Recipes, QuantizedGemmGpu, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// A captured FP8 GEMM replays with new routings exactly as eager runs compute them.
TEST(QuantizedGemmGpuGraph, ReplayWithNewSplitsMatchesEager) {
  GROUPMM_REQUIRE_GPU();
  for (QuantRecipe r : {QuantRecipe::fp8_current, QuantRecipe::fp8_block}) {
    for (GemmPass pass : {GemmPass::forward, GemmPass::wgrad}) {
      QGemmSpec s;
      s.pass = pass;
      s.recipe = r;
      s.G = 16;
      s.N = 256;
      s.K = 512;
      s.out = pass == GemmPass::wgrad ? DType::fp32 : DType::bf16;
      s.splits = align_splits(make_splits(Pattern::zipf, 16, 2048), 16);
      const QGemmInputs in = make_inputs(s);
      cudaStream_t stream;  // the legacy default stream cannot be captured
      GROUPMM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      {
        Context ctx(Device::CUDA, stream);
        QGemmDevice d(ctx, s, in);
        QuantizedGemmArgs a = d.args(s);
        ctx.reserve_workspace(grouped_gemm_workspace_size(ctx, a));
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        GROUPMM_CHECK_CUDA(cudaStreamBeginCapture(ctx.stream(), cudaStreamCaptureModeThreadLocal));
        grouped_gemm(ctx, a);
        GROUPMM_CHECK_CUDA(cudaStreamEndCapture(ctx.stream(), &graph));
        GROUPMM_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
        for (int rep = 0; rep < 4; ++rep) {
          // New routing of the same total (the quantized operands keep their bytes: only the expert
          // boundaries move, which is what the GEMM's setup kernel must follow).
          std::vector<int64_t> sp = align_splits(
              make_splits(rep % 2 ? Pattern::quarter_empty : Pattern::random_odd, 16, 2048), 16);
          copy(d.splits, TensorView(sp.data(), DType::int64, Device::CPU, {16}), ctx.stream());
          fill_bytes(d.out, 0xFF, ctx.stream());
          GROUPMM_CHECK_CUDA(cudaGraphLaunch(exec, ctx.stream()));
          ctx.check();
          const std::vector<uint8_t> replay = quant_bytes(d.out);
          fill_bytes(d.out, 0xFF, ctx.stream());
          grouped_gemm(ctx, a);
          ctx.check();
          EXPECT_EQ(replay, quant_bytes(d.out))
              << recipe_name(r) << " " << gemm_pass_name(pass) << " replay " << rep;
        }
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
      }
      cudaStreamDestroy(stream);
    }
  }
}

// FP8 wgrad experts whose split is not a multiple of 16 are reported and left unwritten; the
// others are right. Both backends follow the same rule.
TEST(QuantizedGemmGpuFaults, WgradMisalignedSplits) {
  GROUPMM_REQUIRE_GPU();
  for (QuantRecipe r : {QuantRecipe::fp8_current, QuantRecipe::fp8_block}) {
    QGemmSpec s;
    s.pass = GemmPass::wgrad;
    s.recipe = r;
    s.G = 4;
    s.N = 256;
    s.K = 256;
    s.out = DType::fp32;
    s.splits = {160, 17, 15, 0};
    const QGemmInputs in = make_inputs(s);
    Context gctx(Device::CUDA), cctx(Device::CPU);
    QGemmDevice gpu(gctx, s, in), cpu(cctx, s, in);
    grouped_gemm(gctx, gpu.args(s));
    EXPECT_THROW_MSG(gctx.check(), "alignment rule");
    grouped_gemm(cctx, cpu.args(s));
    EXPECT_THROW_MSG(cctx.check(), "alignment rule");
    const auto g = gpu.result(s), c = cpu.result(s);
    const int64_t slab = s.N * s.K;
    EXPECT_LE(rel_error({g.begin(), g.begin() + slab}, {c.begin(), c.begin() + slab}), 5e-4);
    for (int64_t i = slab; i < 3 * slab; ++i) ASSERT_TRUE(std::isnan(g[size_t(i)]));
    for (int64_t i = 3 * slab; i < 4 * slab; ++i) ASSERT_EQ(g[size_t(i)], 0.0f);
  }
}

TEST(QuantizedGemmGpuErrors, AlignmentAndKernelChoice) {
  GROUPMM_REQUIRE_GPU();
  QGemmSpec s;
  s.pass = GemmPass::forward;
  s.recipe = QuantRecipe::fp8_block;
  s.G = 2;
  s.N = 256;
  s.K = 256;
  s.splits = {96, 64};  // 80 rows per expert: not the decode case
  Context ctx(Device::CUDA);
  QGemmDevice d(ctx, s, make_inputs(s));
  QuantizedGemmArgs a = d.args(s);
  a.config = "fwd_e4m3_bf16_128x192_coop_c21";
  EXPECT_THROW_MSG(grouped_gemm(ctx, a),
                   "computes forward fp8e4m3->bf16 (fp8_current), not forward fp8e4m3->bf16 "
                   "(fp8_block)");
  a.config = "";
  EXPECT_EQ(gemm_config_name(ctx, a), "fwd_e4m3_bf16_block_128x192_coop_c21");
  // expected_rows (at_most): the decode rule reads the rows the splits are expected to reach
  a.splits_total = SplitsTotal::at_most;
  a.expected_rows = 128;
  EXPECT_EQ(gemm_config_name(ctx, a), "fwdswap_e4m3_bf16_block_128x32_pp_c11");
  s.splits = {64, 64};  // <= 64 rows per expert: the weights fill the tile (swapped operands)
  QGemmDevice dec(ctx, s, make_inputs(s));
  EXPECT_EQ(gemm_config_name(ctx, dec.args(s)), "fwdswap_e4m3_bf16_block_128x32_pp_c11");
}

}  // namespace
}  // namespace groupmm::test
