// grouped_gemm on the GPU (cutlass_sm90 engine) against the CPU reference: every pass, both
// dtypes, 16-bit and fp32 outputs, split patterns with empty experts, odd shapes, bias, beta;
// CUDA-graph replay with new routings; device faults; alignment errors; the cuBLAS-loop baseline.
#include "common/gemm_case.hpp"
#include "common/tolerance.hpp"

namespace groupmm::test {
namespace {

struct DeviceProblem {
  Tensor a, b, out, splits, bias;
  DeviceProblem(const GemmProblem& p) {
    a = clone_to(TensorView((void*)p.a.data(), p.dtype, Device::CPU, {int64_t(p.a.size())}),
                 Device::CUDA);
    b = clone_to(TensorView((void*)p.b.data(), p.dtype, Device::CPU, {int64_t(p.b.size())}),
                 Device::CUDA);
    out = Tensor::empty({int64_t(p.out_bytes())}, DType::e8m0, Device::CUDA);
    splits = clone_to(TensorView((void*)p.splits.data(), DType::int64, Device::CPU, {p.G}),
                      Device::CUDA);
    if (p.bias)
      bias = clone_to(
          TensorView((void*)p.biasv.data(), DType::e8m0, Device::CPU, {int64_t(p.biasv.size())}),
          Device::CUDA);
    reset_out(p);
  }
  void reset_out(const GemmProblem& p) {
    copy(out,
         TensorView((void*)p.out_init.data(), DType::e8m0, Device::CPU, {int64_t(p.out_bytes())}));
  }
  GroupedGemmArgs args(const GemmProblem& p) const {
    return p.args(a.data(), b.data(), out.data(), splits.data(), bias.data(), Device::CUDA);
  }
  std::vector<uint8_t> out_bytes() const {
    std::vector<uint8_t> h(static_cast<size_t>(out.nbytes()));
    copy(TensorView(h.data(), DType::e8m0, Device::CPU, {out.nbytes()}), out);
    return h;
  }
};

void expect_matches_reference(GemmProblem& p, const std::vector<uint8_t>& gpu_bytes) {
  const auto ref_bytes = p.run_cpu();
  const auto gpu = decode(gpu_bytes, p.out_dtype), ref = decode(ref_bytes, p.out_dtype);
  const auto ranges = p.expert_ranges();
  for (int64_t g = 0; g < p.G; ++g) {
    const auto [lo, hi] = ranges[size_t(g)];
    std::vector<float> x(gpu.begin() + lo, gpu.begin() + hi), y(ref.begin() + lo, ref.begin() + hi);
    if (p.pass == GemmPass::wgrad && p.splits[size_t(g)] == 0) {
      // empty expert: exactly 0, or main_grad unchanged when accumulating
      ASSERT_EQ(std::memcmp(&gpu_bytes[size_t(lo) * 4 / (p.out_dtype == DType::fp32 ? 1 : 2)],
                            &ref_bytes[size_t(lo) * 4 / (p.out_dtype == DType::fp32 ? 1 : 2)],
                            size_t(hi - lo) * (p.out_dtype == DType::fp32 ? 4 : 2)),
                0)
          << "empty expert " << g << " not exact";
      continue;
    }
    // Both sides are within the table's bound of the exact product.
    const int64_t terms = p.pass == GemmPass::forward ? p.K
                          : p.pass == GemmPass::dgrad ? p.N
                                                      : p.splits[size_t(g)] + (p.beta != 0);
    const Tolerance tol = gpu_gemm_tolerance(p.dtype, p.out_dtype, terms);
    ASSERT_TRUE(close_to(x, y, tol, detail::cat("expert ", g, " rows ", p.splits[size_t(g)])));
  }
  // nothing left unwritten anywhere (poison was NaN)
  for (size_t i = 0; i < gpu.size(); ++i)
    ASSERT_FALSE(std::isnan(gpu[i])) << "element " << i << " unwritten";
}

struct Case {
  GemmPass pass;
  DType dtype;
  int64_t G, total, N, K;
  Pattern pattern;
  bool bias;
  float beta;
  DType out;  // output dtype: the operand dtype or fp32 (any pass)
};

std::string case_name(const Case& c) {
  std::string s = std::string(gemm_pass_name(c.pass)) + "_" + dtype_name(c.dtype) + "_G" +
                  std::to_string(c.G) + "_M" + std::to_string(c.total) + "_N" +
                  std::to_string(c.N) + "_K" + std::to_string(c.K) + "_" + pattern_name(c.pattern);
  if (c.bias) s += "_bias";
  if (c.beta != 0) s += "_accum";
  if (c.out != c.dtype) s += std::string("_out") + dtype_name(c.out);
  return s;
}

void PrintTo(const Case& c, std::ostream* os) {
  *os << case_name(c);
}

class GemmGpu : public ::testing::TestWithParam<Case> {};

TEST_P(GemmGpu, MatchesCpuReference) {
  GROUPMM_REQUIRE_GPU();
  const Case c = GetParam();
  GemmProblem p = GemmProblem::make(c.pass, c.dtype, c.G, make_splits(c.pattern, c.G, c.total), c.N,
                                    c.K, c.bias, c.beta, c.out);
  DeviceProblem d(p);
  Context ctx(Device::CUDA);
  grouped_gemm(ctx, d.args(p));
  ctx.check();
  expect_matches_reference(p, d.out_bytes());
}

std::vector<Case> gemm_cases() {
  std::vector<Case> v;
  const DType bf = DType::bf16, hf = DType::fp16;
  for (GemmPass pass : {GemmPass::forward, GemmPass::dgrad, GemmPass::wgrad}) {
    for (DType t : {bf, hf}) {
      // wgrad into fp32 here; forward/dgrad keep a's dtype (their fp32-out cases are below)
      const DType o32 = pass == GemmPass::wgrad ? DType::fp32 : t;
      v.push_back({pass, t, 4, 1000, 512, 256, Pattern::random_odd, false, 0, t});
      v.push_back({pass, t, 32, 3001, 768, 2880, Pattern::zipf, false, 0, o32});
      v.push_back({pass, t, 1, 777, 1536, 768, Pattern::balanced, false, 0, o32});
      v.push_back({pass, t, 128, 2048, 264, 136, Pattern::quarter_empty, false, 0, o32});
      v.push_back({pass, t, 256, 4093, 128, 200, Pattern::zipf, false, 0, t});
      for (Pattern z : {Pattern::zero_first, Pattern::zero_middle, Pattern::zero_last})
        v.push_back({pass, t, 8, 901, 256, 384, z, false, 0, o32});
      v.push_back({pass, t, 6, 0, 256, 128, Pattern::zero_all, false, 0, o32});
    }
  }
  // forward with bias; decode-sized (operands swapped); wgrad accumulating into fp32 main_grad
  for (DType t : {bf, hf}) {
    v.push_back({GemmPass::forward, t, 16, 2500, 1024, 512, Pattern::zero_middle, true, 0, t});
    v.push_back({GemmPass::forward, t, 16, 128, 1536, 2048, Pattern::balanced, false, 0, t});
    v.push_back({GemmPass::forward, t, 32, 100, 2880, 768, Pattern::random_odd, true, 0, t});
    v.push_back(
        {GemmPass::wgrad, t, 16, 1500, 512, 768, Pattern::quarter_empty, false, 1, DType::fp32});
    v.push_back({GemmPass::wgrad, t, 5, 0, 64, 64, Pattern::zero_all, false, 1, DType::fp32});
  }
  // forward and dgrad into fp32 (kernels *_f32_*): an odd MoE shape, zero-row experts, a
  // decode-sized forward (which runs the cooperative kernel: the swapped one writes 16-bit only)
  // and fp32 bias
  const DType f32 = DType::fp32;
  for (DType t : {bf, hf}) {
    for (GemmPass pass : {GemmPass::forward, GemmPass::dgrad}) {
      v.push_back({pass, t, 32, 3001, 768, 2880, Pattern::zipf, false, 0, f32});
      v.push_back({pass, t, 8, 901, 256, 384, Pattern::zero_middle, false, 0, f32});
      v.push_back({pass, t, 128, 2048, 264, 136, Pattern::quarter_empty, false, 0, f32});
      v.push_back({pass, t, 6, 0, 256, 128, Pattern::zero_all, false, 0, f32});
    }
    v.push_back({GemmPass::forward, t, 16, 128, 1536, 2048, Pattern::balanced, false, 0, f32});
    v.push_back({GemmPass::forward, t, 16, 2500, 1024, 512, Pattern::zero_middle, true, 0, f32});
    v.push_back({GemmPass::forward, t, 32, 100, 2880, 768, Pattern::random_odd, true, 0, f32});
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, GemmGpu, ::testing::ValuesIn(gemm_cases()),
                         [](const auto& info) { return case_name(info.param); });

// ---- cuBLAS loop baseline agrees with the reference too --------------------------------------
TEST(GemmGpuCublasLoop, MatchesCpuReference) {
  GROUPMM_REQUIRE_GPU();
  for (GemmPass pass : {GemmPass::forward, GemmPass::dgrad, GemmPass::wgrad}) {
    for (DType out : {DType::bf16, DType::fp32}) {
      if (pass == GemmPass::wgrad && out == DType::bf16) continue;
      GemmProblem p = GemmProblem::make(
          pass, DType::bf16, 8, make_splits(Pattern::zero_middle, 8, 999), 384, 256, false, 0, out);
      DeviceProblem d(p);
      Context ctx(Device::CUDA);
      GroupedGemmArgs a = d.args(p);
      a.engine = GemmEngine::cublas_loop;
      grouped_gemm(ctx, a);
      expect_matches_reference(p, d.out_bytes());
    }
  }
}

// ---- explicit kernel configuration (tuning override) -----------------------------------------
TEST(GemmGpuConfig, ExplicitConfigRunsAndBadOnesAreRefused) {
  GROUPMM_REQUIRE_GPU();
  // the decode kernel (operands swapped) on a problem the heuristic would not give it
  GemmProblem p =
      GemmProblem::make(GemmPass::forward, DType::bf16, 6,
                        make_splits(Pattern::zero_middle, 6, 1500), 256, 320, true, 0, DType::bf16);
  DeviceProblem d(p);
  Context ctx(Device::CUDA);
  GroupedGemmArgs a = d.args(p);
  a.config = "fwdswap_bf16_128x32_pp_c11";
  EXPECT_EQ(gemm_config_name(ctx, a), "fwdswap_bf16_128x32_pp_c11");
  grouped_gemm(ctx, a);
  ctx.check();
  expect_matches_reference(p, d.out_bytes());
  a.config = "fwd_bf16_1x1";
  EXPECT_THROW_MSG(grouped_gemm(ctx, a), "config 'fwd_bf16_1x1' is not an instantiated kernel");
  a.config = "wgrad_bf16_f32_128x256_coop_c21";
  EXPECT_THROW_MSG(grouped_gemm(ctx, a), "computes wgrad bf16->fp32, not forward bf16->bf16");
  EXPECT_FALSE(gemm_config_names().empty());
}

// fp32 out runs the *_f32_* kernels, a decode-sized forward included (the swapped decode kernel
// writes 16-bit only, so it is neither chosen nor accepted as an override).
TEST(GemmGpuConfig, Fp32OutPicksTheFp32Kernels) {
  GROUPMM_REQUIRE_GPU();
  Context ctx(Device::CUDA);
  for (DType t : {DType::bf16, DType::fp16}) {
    const std::string n = dtype_name(t);
    for (GemmPass pass : {GemmPass::forward, GemmPass::dgrad}) {
      const int64_t M = pass == GemmPass::forward ? 128 : 2000;  // forward: decode-sized
      GemmProblem p = GemmProblem::make(pass, t, 16, make_splits(Pattern::balanced, 16, M), 256,
                                        128, false, 0, DType::fp32);
      DeviceProblem d(p);
      GroupedGemmArgs a = d.args(p);
      EXPECT_EQ(gemm_config_name(ctx, a), pass == GemmPass::forward
                                              ? "fwd_" + n + "_f32_128x256_coop_c12"
                                              : "dgrad_" + n + "_f32_128x256_coop_c11");
      if (pass == GemmPass::forward) {
        a.config = "fwdswap_" + n + "_128x32_pp_c11";
        EXPECT_THROW_MSG(grouped_gemm(ctx, a),
                         "computes forward " + n + "->" + n + ", not forward " + n + "->fp32");
      }
    }
  }
}

// The heuristic's shape rules for short reductions and ragged widths (host-known shapes only): a
// short-reduction bf16 forward runs the ping-pong tile, a 16-bit-out bf16 wgrad whose width 192
// divides and 256 does not runs 128x192, and the alternatives stay where they measured better
// (see docs/decisions.md, "GEMM heuristic: short-reduction forward on a ping-pong tile" and "GEMM
// heuristic: 128x192 wgrad for widths 192 divides and 256 does not"). Each picked kernel is run
// against the CPU reference (a bias in the forward, so the ping-pong epilogue adds it).
TEST(GemmGpuConfig, ShortReductionAndRaggedWidthPicks) {
  GROUPMM_REQUIRE_GPU();
  Context ctx(Device::CUDA);
  struct Pick {
    GemmPass pass;
    DType t, out;
    int64_t rows, N, K;
    const char* want;
  };
  const Pick picks[] = {
      {GemmPass::forward, DType::bf16, DType::bf16, 64, 256, 768, "fwd_bf16_128x128_pp_c12"},
      {GemmPass::forward, DType::bf16, DType::bf16, 64, 256, 1536, "fwd_bf16_128x128_pp_c12"},
      // K 2048 is no short reduction: the cooperative tile, paired along M (2x1) because one
      // 256-wide N tile is an odd count
      {GemmPass::forward, DType::bf16, DType::bf16, 64, 256, 2048, "fwd_bf16_128x256_coop_c21"},
      {GemmPass::forward, DType::fp16, DType::fp16, 64, 256, 768, "fwd_fp16_128x256_coop_c12"},
      {GemmPass::forward, DType::bf16, DType::bf16, 16, 256, 768, "fwdswap_bf16_128x32_pp_c11"},
      {GemmPass::wgrad, DType::bf16, DType::bf16, 256, 256, 1920,
       "wgrad_bf16_bf16_128x192_coop_c21"},
      {GemmPass::wgrad, DType::bf16, DType::fp32, 256, 256, 1920, "wgrad_bf16_f32_128x128_pp_c21"},
      {GemmPass::wgrad, DType::bf16, DType::bf16, 256, 256, 1408, "wgrad_bf16_bf16_128x128_pp_c21"},
  };
  for (const Pick& k : picks) {
    SCOPED_TRACE(std::string(k.want) + " K=" + std::to_string(k.K));
    const int64_t G = 4;
    GemmProblem p =
        GemmProblem::make(k.pass, k.t, G, make_splits(Pattern::zero_middle, G, G * k.rows), k.N,
                          k.K, k.pass == GemmPass::forward, 0, k.out);
    DeviceProblem d(p);
    const GroupedGemmArgs a = d.args(p);
    EXPECT_EQ(gemm_config_name(ctx, a), k.want);
    grouped_gemm(ctx, a);
    ctx.check();
    expect_matches_reference(p, d.out_bytes());
  }
}

// The tile order changes which CTA computes a tile and when, never the tile's arithmetic: each
// pass run in both orders gives the same bytes, equal to the CPU reference (a split wgrad, a
// wgrad into an fp32 main_grad with beta = 1, a wgrad with a wide dW grid, a forward with bias, a
// dgrad; zero-row experts). The heuristic's order shows in the name (across N only for the tall
// wgrad grids); an unknown order suffix is an error naming it.
TEST(GemmGpuConfig, TileOrderIsBitIdentical) {
  GROUPMM_REQUIRE_GPU();
  Context ctx(Device::CUDA);
  struct Order {
    GemmPass pass;
    DType out;
    int64_t rows, N, K;
    float beta;
    bool along_n;  // the heuristic's order: wgrad grids at least 1.5x taller than wide
  };
  const Order cases[] = {
      {GemmPass::wgrad, DType::bf16, 300, 896, 256, 0.0f, true},  // split (129-1024 rows)
      {GemmPass::wgrad, DType::fp32, 1100, 640, 512, 1.0f, true},
      {GemmPass::wgrad, DType::bf16, 1100, 256, 1024, 0.0f, false},  // wide grid
      {GemmPass::forward, DType::bf16, 300, 384, 512, 0.0f, false},
      {GemmPass::dgrad, DType::bf16, 300, 384, 512, 0.0f, false},
  };
  for (const Order& c : cases) {
    SCOPED_TRACE(std::string(gemm_pass_name(c.pass)) + " N=" + std::to_string(c.N));
    const int64_t G = 6;
    GemmProblem p =
        GemmProblem::make(c.pass, DType::bf16, G, make_splits(Pattern::zero_middle, G, G * c.rows),
                          c.N, c.K, c.pass == GemmPass::forward, c.beta, c.out);
    DeviceProblem d(p);
    GroupedGemmArgs a = d.args(p);
    const std::string auto_name = gemm_config_name(ctx, a);
    const std::string base = auto_name.substr(0, auto_name.find('@'));
    EXPECT_EQ(auto_name, c.along_n ? base + "@along_n" : base);
    std::vector<std::vector<uint8_t>> got;
    for (const char* order : {"@along_m", "@along_n"}) {
      d.reset_out(p);
      a.config = base + order;
      grouped_gemm(ctx, a);
      ctx.check();
      got.push_back(d.out_bytes());
    }
    EXPECT_TRUE(got[0] == got[1]) << base;
    expect_matches_reference(p, got[0]);
    a.config = base + "@along_k";
    EXPECT_THROW_MSG(grouped_gemm(ctx, a), "ends in '@along_k', not @along_m or @along_n");
  }
}

// A GEMM SM limit (Context::set_gemm_sm_limit, what a chunked expert-parallel step sets) sizes the
// persistent grid only: the same bytes on every SM count, the caller's limit kept.
TEST(GemmGpuConfig, SmLimitChangesNoBit) {
  GROUPMM_REQUIRE_GPU();
  Context ctx(Device::CUDA);
  for (GemmPass pass : {GemmPass::forward, GemmPass::dgrad, GemmPass::wgrad}) {
    SCOPED_TRACE(gemm_pass_name(pass));
    const int64_t G = 5;
    GemmProblem p =
        GemmProblem::make(pass, DType::bf16, G, make_splits(Pattern::zero_middle, G, G * 700), 384,
                          512, pass == GemmPass::forward, 0.0f, DType::bf16);
    DeviceProblem d(p);
    const GroupedGemmArgs a = d.args(p);
    std::vector<std::vector<uint8_t>> got;
    for (int limit : {0, ctx.sm_count() - 20, 7, 1}) {
      ctx.set_gemm_sm_limit(limit);
      EXPECT_EQ(ctx.gemm_sm_count(), limit == 0 ? ctx.sm_count() : limit);
      d.reset_out(p);
      grouped_gemm(ctx, a);
      ctx.check();
      got.push_back(d.out_bytes());
    }
    ctx.set_gemm_sm_limit(0);
    for (size_t i = 1; i < got.size(); ++i) EXPECT_TRUE(got[i] == got[0]) << "limit #" << i;
    expect_matches_reference(p, got[0]);
  }
}

// ---- launch parameters kept between calls -------------------------------------------------------
// The engine keeps each configuration's last CUTLASS parameters per thread and rebuilds them when
// the workspace, the shape, alpha, beta, the bias or the tile order change; operands and splits
// reach the kernel through device arrays. Calls that alternate all of these (but the order, whose
// results are the same bytes either way) must each match the reference.
TEST(GemmGpuConfig, KeptLaunchParametersFollowEveryCall) {
  GROUPMM_REQUIRE_GPU();
  Context ctx(Device::CUDA);
  const std::vector<int64_t> bounds = {0, 1, 64, 128, 129, 500, 0, 1024, 1025, 300, 7, 0};
  Tensor ws[2];
  for (const char* config :
       {"fwd_bf16_128x256_coop_c12", "wgrad_bf16_f32_split_pp128x128_coop128x256"}) {
    const bool fwd = config[0] == 'f';
    const GemmPass pass = fwd ? GemmPass::forward : GemmPass::wgrad;
    const DType out_t = fwd ? DType::bf16 : DType::fp32;
    for (int step = 0; step < 6; ++step) {
      SCOPED_TRACE(std::string(config) + " step " + std::to_string(step));
      // Steps: new data on the same shape (kept parameters), another workspace, another shape,
      // bias or beta on, alpha 0.5, and back to the first workspace.
      const bool other_shape = step == 2;
      const std::vector<int64_t> splits =
          other_shape ? make_splits(Pattern::random_odd, 5, 2200) : bounds;
      const bool bias = fwd && step == 3;
      const float beta = !fwd && step == 3 ? 1.0f : 0.0f;
      GemmProblem p = GemmProblem::make(pass, DType::bf16, int64_t(splits.size()), splits, 256,
                                        other_shape ? 512 : 384, bias, beta, out_t);
      DeviceProblem d(p);
      GroupedGemmArgs a = d.args(p);
      a.config = config;
      const float alpha = step == 4 ? 0.5f : 1.0f;  // a power of two: exact against alpha 1
      a.alpha = alpha;
      const size_t need = grouped_gemm_workspace_size(ctx, a);
      Tensor& w = ws[step == 1 ? 1 : 0];
      if (w.nbytes() < int64_t(need)) w = Tensor::empty({int64_t(need)}, DType::e8m0, Device::CUDA);
      grouped_gemm(ctx, a, w.data(), size_t(w.nbytes()));
      ctx.check();
      std::vector<uint8_t> got = d.out_bytes();
      if (alpha != 1.0f) {  // undo the exact scaling: out = 0.5 * acc (no bias, beta 0)
        std::vector<float> v = decode(got, out_t);
        for (float& x : v) x /= alpha;
        if (fwd) {
          const std::vector<uint16_t> h = encode16(v, out_t);
          std::memcpy(got.data(), h.data(), got.size());
        } else {
          std::memcpy(got.data(), v.data(), got.size());
        }
      }
      expect_matches_reference(p, got);
    }
  }
}

// ---- CUDA graph: forward + dgrad + wgrad captured once, replayed with new routings ------------
TEST(GemmGpuGraph, ReplayWithNewRoutingsEqualsEager) {
  GROUPMM_REQUIRE_GPU();
  const int64_t G = 16, M = 2000, N = 512, K = 384;
  cudaStream_t s;
  GROUPMM_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  {
    Context ctx(Device::CUDA, s);
    auto rand16 = [&](int64_t n, float sc) {
      auto h = encode16(randn(size_t(n), sc), DType::bf16);
      return clone_to(TensorView(h.data(), DType::bf16, Device::CPU, {n}), Device::CUDA, s);
    };
    Tensor x = rand16(M * K, 1), w = rand16(G * N * K, 0.05f), dy = rand16(M * N, 1);
    Tensor splits = Tensor::empty({G}, DType::int32, Device::CUDA, s);
    auto outs = [&] {
      std::vector<Tensor> o;
      o.push_back(Tensor::empty({M, N}, DType::bf16, Device::CUDA, s));
      o.push_back(Tensor::empty({M, K}, DType::bf16, Device::CUDA, s));
      o.push_back(Tensor::empty({G, N, K}, DType::fp32, Device::CUDA, s));
      for (auto& t : o) fill_bytes(t, 0xFF, s);
      return o;
    };
    auto run = [&](std::vector<Tensor>& o) {
      TensorView xv(x.data(), DType::bf16, Device::CUDA, {M, K});
      TensorView wv(w.data(), DType::bf16, Device::CUDA, {G, N, K});
      TensorView dyv(dy.data(), DType::bf16, Device::CUDA, {M, N});
      gemm_forward(ctx, xv, wv, splits, o[0]);
      gemm_dgrad(ctx, dyv, wv, splits, o[1]);
      gemm_wgrad(ctx, dyv, xv, splits, o[2], /*accumulate=*/false);
    };
    std::vector<Tensor> g_out = outs();
    // size the workspace for all three passes before capture
    std::vector<int32_t> s0 = to_i32(make_splits(Pattern::balanced, G, M));
    copy(splits, host_view(s0, DType::int32, {G}), s);
    run(g_out);
    ctx.synchronize();
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    GROUPMM_CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    run(g_out);
    GROUPMM_CHECK_CUDA(cudaStreamEndCapture(s, &graph));
    GROUPMM_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (Pattern pat : {Pattern::zipf, Pattern::quarter_empty, Pattern::random_odd}) {
      std::vector<int32_t> sp = to_i32(make_splits(pat, G, M));
      copy(splits, host_view(sp, DType::int32, {G}), s);
      for (auto& t : g_out) fill_bytes(t, 0xFF, s);
      GROUPMM_CHECK_CUDA(cudaGraphLaunch(exec, s));
      std::vector<Tensor> e_out = outs();
      run(e_out);
      ctx.check();
      for (int i = 0; i < 3; ++i) {
        std::vector<uint8_t> a(size_t(g_out[i].nbytes())), b(a.size());
        copy(TensorView(a.data(), DType::e8m0, Device::CPU, {int64_t(a.size())}), g_out[i], s);
        copy(TensorView(b.data(), DType::e8m0, Device::CPU, {int64_t(b.size())}), e_out[i], s);
        ASSERT_EQ(a, b) << "pass " << i << " pattern " << pattern_name(pat);
      }
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(s);
}

// ---- device faults: never out of bounds, status bit set ---------------------------------------
TEST(GemmGpuFaults, BadSplitsSetStatusAndStayInBounds) {
  GROUPMM_REQUIRE_GPU();
  GemmProblem p = GemmProblem::make(GemmPass::forward, DType::bf16, 4, {100, 100, 100, 100}, 256,
                                    128, false, 0, DType::bf16);
  DeviceProblem d(p);
  Context ctx(Device::CUDA);
  std::vector<int64_t> bad = {100, -5, 250, 200};  // negative, then past M=400
  copy(d.splits, host_view(bad, DType::int64, {4}));
  grouped_gemm(ctx, d.args(p));
  const StatusBlock st = ctx.take_status();
  EXPECT_TRUE(st.bits & kFaultNegativeSplit);
  EXPECT_TRUE(st.bits & kFaultSplitsOverflow);
  EXPECT_EQ(st.op, uint32_t(OpId::grouped_gemm));
  std::vector<int64_t> wrong_total = {10, 10, 10, 10};
  copy(d.splits, host_view(wrong_total, DType::int64, {4}));
  grouped_gemm(ctx, d.args(p));
  EXPECT_THROW_MSG(ctx.check(),
                   "device fault in grouped_gemm (status 0x2): sum of splits != expected rows");
}

// ---- SplitsTotal::at_most: buffers longer than sum(splits) ------------------------------------
// Device copies of a TailProblem's operands.
struct DeviceTail {
  Tensor a, b, out, splits, bias;
  explicit DeviceTail(const TailProblem& t) {
    auto up = [](const void* p, size_t bytes) {
      return clone_to(TensorView(const_cast<void*>(p), DType::e8m0, Device::CPU, {int64_t(bytes)}),
                      Device::CUDA);
    };
    a = up(t.a.data(), t.a.size() * 2);
    b = up(t.b.data(), t.b.size() * 2);
    out = Tensor::empty({int64_t(t.out_bytes())}, DType::e8m0, Device::CUDA);
    fill_bytes(out, 0xFF);
    splits = up(t.p.splits.data(), t.p.splits.size() * 8);
    if (t.p.bias) bias = up(t.p.biasv.data(), t.p.biasv.size());
  }
  GroupedGemmArgs args(const TailProblem& t, bool zero_tail) const {
    return t.args(a.data(), b.data(), out.data(), splits.data(), bias.data(), Device::CUDA,
                  zero_tail);
  }
  std::vector<uint8_t> out_bytes() const {
    std::vector<uint8_t> h(size_t(out.nbytes()));
    copy(TensorView(h.data(), DType::e8m0, Device::CPU, {out.nbytes()}), out);
    return h;
  }
};

// Every pass: the experts' rows match the CPU reference (and hold no NaN: no tail row of a or b
// was read), the output rows past the sum are untouched (at_most) or zero (zero_tail), no fault.
TEST(GemmGpuTail, RowsPastTheSumAreNeitherReadNorWritten) {
  GROUPMM_REQUIRE_GPU();
  const std::vector<std::vector<int64_t>> patterns = {
      {130, 0, 257, 3, 0, 64}, {0, 0, 0, 0, 0, 200}, {0, 0, 0, 0, 0, 0}};
  for (GemmPass pass : {GemmPass::forward, GemmPass::dgrad, GemmPass::wgrad})
    for (const auto& splits : patterns)
      for (bool zero_tail : {false, true}) {
        if (zero_tail && pass == GemmPass::wgrad) continue;
        const DType out_t = pass == GemmPass::wgrad ? DType::fp32 : DType::bf16;
        GemmProblem exact = GemmProblem::make(pass, DType::bf16, 6, splits, 256, 136,
                                              pass == GemmPass::forward, 0, out_t);
        TailProblem t = TailProblem::make(exact, 300);
        DeviceTail d(t);
        Context ctx(Device::CUDA);
        grouped_gemm(ctx, d.args(t, zero_tail));
        const std::string what =
            detail::cat(gemm_pass_name(pass), " sum ", exact.M, zero_tail ? " zero_tail" : "");
        ASSERT_NO_THROW(ctx.check()) << what;
        const std::vector<uint8_t> got = d.out_bytes();
        ASSERT_TRUE(t.tail_is(got, zero_tail ? 0x00 : 0xFF)) << what;
        if (exact.M > 0) {
          expect_matches_reference(
              exact, std::vector<uint8_t>(got.begin(), got.begin() + exact.out_bytes()));
        } else if (pass == GemmPass::wgrad) {  // no rows: dW = 0
          for (uint8_t byte : got) ASSERT_EQ(byte, 0) << what;
        }
      }
}

// expected_rows: the heuristic sizes its choice by the rows the splits are expected to reach, not
// by the buffer. A wgrad of 6 experts x 300 rows in a buffer of 4x those rows: by the buffer (1200
// rows an expert) the cooperative 128x256 tile; by the 1800 expected rows the split (129-1024
// rows an expert), as the same wgrad over an exact 1800-row buffer. Both agree with the CPU
// reference and read no tail row (NaN there).
TEST(GemmGpuTail, ExpectedRowsChoosesTheKernel) {
  GROUPMM_REQUIRE_GPU();
  GemmProblem exact =
      GemmProblem::make(GemmPass::wgrad, DType::bf16, 6, make_splits(Pattern::zero_middle, 6, 1800),
                        256, 512, false, 0, DType::bf16);
  TailProblem t = TailProblem::make(exact, 3 * 1800);
  DeviceTail d(t);
  Context ctx(Device::CUDA);
  GroupedGemmArgs a = d.args(t, false);
  const std::string by_buffer = gemm_config_name(ctx, a);
  a.expected_rows = 1800;
  const std::string by_expected = gemm_config_name(ctx, a);
  DeviceProblem dp(exact);
  EXPECT_EQ(by_expected, gemm_config_name(ctx, dp.args(exact)));
  EXPECT_EQ(by_buffer.substr(0, by_buffer.find('@')), "wgrad_bf16_bf16_128x256_coop_c21");
  EXPECT_EQ(by_expected.substr(0, by_expected.find('@')),
            "wgrad_bf16_bf16_split_pp128x128_coop128x256");
  for (int64_t expected : {int64_t(0), int64_t(1800)}) {
    SCOPED_TRACE("expected_rows " + std::to_string(expected));
    a.expected_rows = expected;
    fill_bytes(d.out, 0xFF);
    grouped_gemm(ctx, a);
    ASSERT_NO_THROW(ctx.check());
    expect_matches_reference(exact, d.out_bytes());
  }
}

// A sum past the buffer is still reported (overflow and total bits), never written past it.
TEST(GemmGpuTail, SumPastTheRowsIsAFault) {
  GROUPMM_REQUIRE_GPU();
  GemmProblem exact = GemmProblem::make(GemmPass::forward, DType::bf16, 3, {100, 50, 50}, 128, 64,
                                        false, 0, DType::bf16);
  TailProblem t = TailProblem::make(exact, 56);  // 256 rows
  DeviceTail d(t);
  std::vector<int64_t> bad = {100, 100, 100};
  copy(d.splits, host_view(bad, DType::int64, {3}));
  Context ctx(Device::CUDA);
  grouped_gemm(ctx, d.args(t, true));
  const StatusBlock st = ctx.take_status();
  EXPECT_TRUE(st.bits & kFaultSplitsOverflow);
  EXPECT_TRUE(st.bits & kFaultSplitsTotalMismatch);
  EXPECT_EQ(st.op, uint32_t(OpId::grouped_gemm));
}

// forward (zero_tail) + dgrad (zero_tail) + wgrad over 2600-row buffers captured once, replayed
// with routings whose sums differ (full, short, empty): bit for bit the eager results, tails zero.
TEST(GemmGpuTail, GraphReplayWithShortSumsEqualsEager) {
  GROUPMM_REQUIRE_GPU();
  const int64_t G = 16, M = 2600, N = 512, K = 384;
  cudaStream_t s;
  GROUPMM_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  {
    Context ctx(Device::CUDA, s);
    auto rand16 = [&](int64_t n, float sc) {
      auto h = encode16(randn(size_t(n), sc), DType::bf16);
      return clone_to(TensorView(h.data(), DType::bf16, Device::CPU, {n}), Device::CUDA, s);
    };
    Tensor x = rand16(M * K, 1), w = rand16(G * N * K, 0.05f), dy = rand16(M * N, 1);
    Tensor splits = Tensor::empty({G}, DType::int32, Device::CUDA, s);
    auto outs = [&] {
      std::vector<Tensor> o;
      o.push_back(Tensor::empty({M, N}, DType::bf16, Device::CUDA, s));
      o.push_back(Tensor::empty({M, K}, DType::bf16, Device::CUDA, s));
      o.push_back(Tensor::empty({G, N, K}, DType::fp32, Device::CUDA, s));
      for (auto& t : o) fill_bytes(t, 0xFF, s);
      return o;
    };
    auto run = [&](std::vector<Tensor>& o) {
      GroupedGemmArgs a;
      a.splits = splits;
      a.splits_total = SplitsTotal::at_most;
      a.zero_tail = true;
      a.pass = GemmPass::forward;
      a.a = TensorView(x.data(), DType::bf16, Device::CUDA, {M, K});
      a.b = TensorView(w.data(), DType::bf16, Device::CUDA, {G, N, K});
      a.out = o[0];
      grouped_gemm(ctx, a);
      a.pass = GemmPass::dgrad;
      a.a = TensorView(dy.data(), DType::bf16, Device::CUDA, {M, N});
      a.out = o[1];
      grouped_gemm(ctx, a);
      a.pass = GemmPass::wgrad;
      a.zero_tail = false;
      a.b = TensorView(x.data(), DType::bf16, Device::CUDA, {M, K});
      a.out = o[2];
      grouped_gemm(ctx, a);
    };
    std::vector<Tensor> g_out = outs();
    std::vector<int32_t> s0 = to_i32(make_splits(Pattern::balanced, G, M));
    copy(splits, host_view(s0, DType::int32, {G}), s);
    run(g_out);  // sizes the workspace before capture
    ctx.synchronize();
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    GROUPMM_CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    run(g_out);
    GROUPMM_CHECK_CUDA(cudaStreamEndCapture(s, &graph));
    GROUPMM_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int64_t total : {M, int64_t(2000), int64_t(37), int64_t(0)}) {
      std::vector<int32_t> sp = to_i32(make_splits(Pattern::quarter_empty, G, total));
      copy(splits, host_view(sp, DType::int32, {G}), s);
      for (auto& t : g_out) fill_bytes(t, 0xFF, s);
      GROUPMM_CHECK_CUDA(cudaGraphLaunch(exec, s));
      std::vector<Tensor> e_out = outs();
      run(e_out);
      ctx.check();
      for (int i = 0; i < 3; ++i) {
        std::vector<uint8_t> a(size_t(g_out[i].nbytes())), b(a.size());
        copy(TensorView(a.data(), DType::e8m0, Device::CPU, {int64_t(a.size())}), g_out[i], s);
        copy(TensorView(b.data(), DType::e8m0, Device::CPU, {int64_t(b.size())}), e_out[i], s);
        ASSERT_EQ(a, b) << "pass " << i << " total " << total;
        if (i < 2) {  // rows past the sum are zero
          const size_t row = a.size() / size_t(M);
          for (size_t j = size_t(total) * row; j < a.size(); ++j)
            ASSERT_EQ(a[j], 0) << "pass " << i << " total " << total << " byte " << j;
        }
      }
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(s);
}

TEST(GemmGpuErrors, AlignmentAndShapes) {
  GROUPMM_REQUIRE_GPU();
  Context ctx(Device::CUDA);
  Tensor x = Tensor::empty({64, 100}, DType::bf16, Device::CUDA);
  Tensor w = Tensor::empty({2, 64, 100}, DType::bf16, Device::CUDA);
  Tensor y = Tensor::empty({64, 64}, DType::bf16, Device::CUDA);
  Tensor s = Tensor::empty({2}, DType::int32, Device::CUDA);
  EXPECT_THROW_MSG(gemm_forward(ctx, x, w, s, y), "grouped_gemm: K=100 must be a multiple of 8");
  TensorView xo(static_cast<char*>(x.data()) + 2, DType::bf16, Device::CUDA, {8, 64});
  TensorView wv(w.data(), DType::bf16, Device::CUDA, {2, 64, 64});
  TensorView yv(y.data(), DType::bf16, Device::CUDA, {8, 64});
  EXPECT_THROW_MSG(gemm_forward(ctx, xo, wv, s, yv), "must be 16-byte aligned");
}

// ---- every instantiated 16-bit configuration, by name ------------------------------------------
// The heuristic picks among these by shape; each one must be right on its own, on the shapes the
// issue-22 heuristic sends to it: ragged widths (not multiples of the tile), thousands of experts
// with 0-64 rows, and row counts on both sides of the split configurations' class bounds (129,
// 768 into bf16, 1024 into fp32), accumulating and not. Two runs are bit-identical (no run-to-run
// reduction order).
struct ConfigCase {
  std::string config;
  std::string shape;  // ragged | many_small | class_bounds | class_bounds_accum
};

struct ConfigInfo {
  GemmPass pass;
  DType dtype, out;
};

ConfigInfo config_info(const std::string& name) {
  const auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  ConfigInfo c;
  c.pass = name.rfind("fwd", 0) == 0     ? GemmPass::forward
           : name.rfind("dgrad", 0) == 0 ? GemmPass::dgrad
                                         : GemmPass::wgrad;
  c.dtype = has("fp16") ? DType::fp16 : DType::bf16;
  c.out = has("_f32") ? DType::fp32 : c.dtype;
  return c;
}

std::vector<ConfigCase> config_cases() {
  std::vector<ConfigCase> v;
  for (const std::string& n : gemm_config_names()) {
    // 16-bit operands only (the FP8 and 4-bit configurations have their own suites)
    if (n.find("e4m3") != std::string::npos || n.find("e5m2") != std::string::npos ||
        n.find("alpha") != std::string::npos)
      continue;
    v.push_back({n, "ragged"});
    v.push_back({n, "many_small"});
    const ConfigInfo info = config_info(n);
    if (info.pass == GemmPass::wgrad) {
      v.push_back({n, "class_bounds"});
      if (info.out == DType::fp32) v.push_back({n, "class_bounds_accum"});  // main_grad += dW
    }
  }
  return v;
}

class GemmGpuConfigs : public ::testing::TestWithParam<ConfigCase> {};

TEST_P(GemmGpuConfigs, MatchesCpuReferenceAndRepeatsBitExact) {
  GROUPMM_REQUIRE_GPU();
  const ConfigCase c = GetParam();
  const ConfigInfo info = config_info(c.config);
  std::vector<int64_t> splits;
  int64_t N = 0, K = 0;
  if (c.shape == "ragged") {  // N' 1408 = 5.5 256-wide tiles; K 704: dgrad/wgrad N' 2.75 tiles
    splits = make_splits(Pattern::random_odd, 6, 1500);
    N = 1408, K = 704;
  } else if (c.shape == "many_small") {  // 4096 experts of 0-64 rows
    std::uniform_int_distribution<int64_t> rows(0, 64);
    for (int g = 0; g < 4096; ++g) splits.push_back(rows(rng()));
    N = 64, K = 128;
  } else {  // both sides of 129, 768 and 1024, empty experts first, middle and last
    splits = {0, 1, 64, 128, 129, 500, 0, 768, 769, 1024, 1025, 2000, 300, 7, 0};
    N = 256, K = 384;
  }
  const float beta = c.shape == "class_bounds_accum" ? 1.0f : 0.0f;
  GemmProblem p = GemmProblem::make(info.pass, info.dtype, int64_t(splits.size()), splits, N, K,
                                    false, beta, info.out);
  DeviceProblem d(p);
  Context ctx(Device::CUDA);
  GroupedGemmArgs args = d.args(p);
  args.config = c.config;
  grouped_gemm(ctx, args);
  ctx.check();
  const std::vector<uint8_t> first = d.out_bytes();
  expect_matches_reference(p, first);
  d.reset_out(p);
  grouped_gemm(ctx, args);
  ctx.check();
  ASSERT_TRUE(first == d.out_bytes()) << c.config << ": a second run differs";
}

INSTANTIATE_TEST_SUITE_P(All, GemmGpuConfigs, ::testing::ValuesIn(config_cases()),
                         [](const ::testing::TestParamInfo<ConfigCase>& i) {
                           return i.param.config + "_" + i.param.shape;
                         });

}  // namespace
}  // namespace groupmm::test
