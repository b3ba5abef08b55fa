// The 4-bit weight GEMM on the GPU, both formats and both paths (forced), against the CPU
// reference (bf16 x exactly dequantized weights, fp64 sums): split patterns (balanced, Zipf, top-1,
// zero-row experts, all but one empty, all empty), G = 1 to 256, N and K off 128, K = 32, bias and
// alpha, swizzled scales, weights over many binades (MXFP4 exponents past 128), split-K. Outputs
// are poisoned first and checked fully written. Also: graph replay with new routings equals eager
// bit for bit, device faults, GPU-only argument checks, the layer recipes.
#include <algorithm>

#include "common/w4_case.hpp"

namespace groupmm::test {
namespace {

// bf16 weights and activations multiplied on tensor cores with fp32 accumulation against fp64
// sums: the bf16 output's rounding (2^-9 relative) dominates.
constexpr double kTol = 2e-3;

struct W4Case {
  W4Spec spec;
  std::string name;
};
void PrintTo(const W4Case& c, std::ostream* os) {
  *os << c.name;
}

void check_against_reference(const W4Spec& s, const std::vector<float>& gpu,
                             const std::vector<float>& ref) {
  ASSERT_EQ(gpu.size(), ref.size());
  int64_t start = 0;
  for (int64_t g = 0; g < s.G; ++g) {
    const int64_t m = s.splits[size_t(g)];
    const auto lo = size_t(start * s.N), hi = size_t((start + m) * s.N);
    start += m;
    if (m == 0) continue;
    const std::vector<float> x(gpu.begin() + lo, gpu.begin() + hi),
        y(ref.begin() + lo, ref.begin() + hi);
    const double e = rel_error(x, y);
    ASSERT_LE(e, kTol) << "expert " << g << " rows " << m << " rel " << e;
    double amax = 0, worst = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      amax = std::max(amax, std::abs(double(y[i])));
      worst = std::max(worst, std::abs(double(x[i]) - y[i]));
    }
    ASSERT_LE(worst, 8 * kTol * amax + 1e-30) << "expert " << g << " max abs error " << worst;
  }
  for (size_t i = 0; i < gpu.size(); ++i) ASSERT_FALSE(std::isnan(gpu[i])) << "element " << i;
}

class W4GemmGpu : public ::testing::TestWithParam<W4Case> {};

TEST_P(W4GemmGpu, MatchesCpuReference) {
  GROUPMM_REQUIRE_GPU();
  const W4Spec& s = GetParam().spec;
  const W4Inputs in = make_w4_inputs(s);
  Context gctx(Device::CUDA), cctx(Device::CPU);
  W4Device gpu(gctx, s, in), cpu(cctx, s, in);
  EXPECT_EQ(quant_bytes(gpu.w.buf.data), quant_bytes(cpu.w.buf.data)) << "weights bit-exact";
  const W4GemmArgs a = gpu.args(s);
  EXPECT_EQ(w4_gemm_path(gctx, a), s.path);
  grouped_gemm(gctx, a);
  gctx.check();
  grouped_gemm(cctx, cpu.args(s));
  cctx.check();
  check_against_reference(s, gpu.result(), cpu.result());
}

// Top-1 routing of M tokens over G experts with a skewed (Zipf) choice: many experts empty.
std::vector<int64_t> top1(int64_t G, int64_t M) {
  std::vector<int64_t> s(size_t(G), 0);
  std::vector<double> w(static_cast<size_t>(G));
  for (int64_t i = 0; i < G; ++i) w[size_t(i)] = 1.0 / std::pow(double(i + 1), 1.2);
  std::shuffle(w.begin(), w.end(), rng());
  std::discrete_distribution<int64_t> d(w.begin(), w.end());
  for (int64_t t = 0; t < M; ++t) ++s[size_t(d(rng()))];
  return s;
}

std::vector<W4Case> cases() {
  std::vector<W4Case> v;
  for (QuantRecipe r : {QuantRecipe::nvfp4, QuantRecipe::mxfp4})
    for (W4Path path : {W4Path::decode, W4Path::prefill, W4Path::fused}) {
      auto add = [&](int64_t G, std::vector<int64_t> splits, int64_t N, int64_t K,
                     const char* tag = "") {
        W4Spec s;
        s.recipe = r;
        s.path = path;
        s.G = G;
        s.N = N;
        s.K = K;
        s.splits = std::move(splits);
        v.push_back({s, w4_name(s) + (*tag ? std::string("_") + tag : std::string())});
        return &v.back().spec;
      };
      add(8, make_splits(Pattern::balanced, 8, 32), 256, 512, "balanced4");   // 8 tokens/pass
      add(8, make_splits(Pattern::balanced, 8, 64), 256, 512, "balanced");    // 8 (16 above 8)
      add(8, make_splits(Pattern::balanced, 8, 96), 256, 512, "balanced12");  // 16 (32 above 16)
      // Both kinds of pass in use: experts of 0 rows, at a narrow pass, just above it, above two
      // wide ones; then the same with K split (few items).
      add(8, {3, 12, 0, 8, 9, 17, 1, 6}, 256, 512, "two_passes");        // 8 and 16
      add(8, {20, 5, 16, 33, 0, 17, 12, 1}, 256, 512, "two_passes_16");  // 16 and 32
      add(2, {2, 30}, 256, 2048, "two_passes_splitk");                   // 16 and 32, split-K
      add(16, make_splits(Pattern::zipf, 16, 300), 384, 1024, "zipf");   // passes of 32 tokens
      add(64, top1(64, 64), 256, 256, "top1");
      for (Pattern z : {Pattern::zero_first, Pattern::zero_last})
        add(6, make_splits(z, 6, 40), 128, 256, pattern_name(z));
      std::vector<int64_t> one(32, 0);
      one[13] = 40;
      add(32, one, 256, 512, "all_but_one_empty");
      add(5, make_splits(Pattern::zero_all, 5, 0), 128, 128, "zero_all");
      add(1, {77}, 200, 352, "odd_shape");  // N % 16 != 0, K % 128 != 0
      // K below one copy box (the decode kernel's boxes cover 128 codes and 256 activations of
      // a row: the rest is the copies' zero fill), N below one 128-row box.
      add(3, make_splits(Pattern::random_odd, 3, 21), 72, 32, "k32");
      add(256, make_splits(Pattern::quarter_empty, 256, 512), 64, 128, "G256");
      add(1, {5}, 256, 2048, "splitk");  // few items: K is split
      // Many experts, no split-K: the plan and the item search over 1100 experts (past the fused
      // kernel's limit: G1000 there, its tile tables nearly full).
      if (path == W4Path::fused)
        add(1000, make_splits(Pattern::quarter_empty, 1000, 1500), 64, 128, "G1000");
      else
        add(1100, make_splits(Pattern::quarter_empty, 1100, 1500), 64, 128, "G1100");
      // The fused kernel's tiles: many row tiles an expert, N not a multiple of its 256 columns
      // (gpt-oss's 2880), K not a multiple of its 64-code stages.
      if (path == W4Path::fused) {
        add(4, make_splits(Pattern::zipf, 4, 1500), 2880, 352, "tiles");
        W4Spec* fb = add(3, make_splits(Pattern::random_odd, 3, 700), 520, 96, "tiles_bias");
        fb->bias = true;
        fb->alpha = 2.0f;
        // Last token tiles of every width: 40, 100, 64, 128 and 129 rows past a full tile, and
        // experts of 200, 60, 1 and 256 rows (the RS kernel's wgmma N follows a tile's rows).
        add(10, {296, 356, 200, 60, 0, 129, 320, 384, 1, 256}, 192, 160, "tile_widths");
      }
      W4Spec* b = add(8, make_splits(Pattern::random_odd, 8, 50), 256, 256, "bias_alpha");
      b->bias = true;
      b->alpha = 0.5f;
      // Split K with a bias over both kinds of pass (3 and 9 rows): the CTA with a tile's last
      // ticket adds the K ranges, the factor and the bias; the wide launch has its own tickets.
      W4Spec* kb = add(2, {3, 9}, 384, 2048, "splitk_bias");
      kb->bias = true;
      kb->alpha = 0.5f;
      W4Spec* sw = add(8, make_splits(Pattern::zipf, 8, 60), 256, 512, "swizzled");
      sw->layout = ScaleLayout::swizzled;
      W4Spec* wide = add(4, make_splits(Pattern::balanced, 4, 24), 128, 256, "wide");
      wide->wide = true;  // mxfp4 exponents past 128: the two-factor multiplier
    }
  return v;
}

// Every fused case again on the RS kernel without its scale warps (config rs_256x128) and on the
// kernel layer's variant (config coop_128x256: the producer warps dequantize into a bf16
// shared-memory operand); the fused path's default is the RS kernel with its scale warps. Every
// decode case again with passes of 8 tokens (an expert's rows in many passes) and of 32.
std::vector<W4Case> all_cases() {
  std::vector<W4Case> v = cases();
  const size_t n = v.size();
  struct Variant {
    W4Path path;
    const char* config;
    const char* suffix;
  };
  for (const Variant& var :
       {Variant{W4Path::fused, "rs_256x128", "_rs"},
        Variant{W4Path::fused, "coop_128x256", "_coop"}, Variant{W4Path::decode, "pass8", "_pass8"},
        Variant{W4Path::decode, "pass32", "_pass32"}})
    for (size_t i = 0; i < n; ++i)
      if (v[i].spec.path == var.path) {
        W4Case c = v[i];
        c.spec.config = var.config;
        c.name += var.suffix;
        v.push_back(c);
      }
  return v;
}

// The fused path's kernels after decode and prefill: v 0 decode, 1 prefill, 2 fused (the RS
// kernel with its scale warps), 3 the RS kernel without them, 4 the kernel layer's variant.
constexpr int kW4Variants = 5;
void set_variant(W4Spec& s, int v) {
  s.path = v == 0 ? W4Path::decode : v == 1 ? W4Path::prefill : W4Path::fused;
  s.config = v == 3 ? "rs_256x128" : v == 4 ? "coop_128x256" : "";
}

INSTANTIATE_TEST_SUITE_P(Formats, W4GemmGpu, ::testing::ValuesIn(all_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(W4GemmGpu, AutomaticPathFollowsTheAverageRows) {
  GROUPMM_REQUIRE_GPU();
  struct Want {
    int64_t G, M;
    W4Path path;
    const char* name;
  };
  const Want wants[] = {
      {16, 64, W4Path::decode, "w4_decode(nvfp4"},
      {16, 16 * kW4DecodeMaxAvgRows, W4Path::decode, "w4_decode(nvfp4"},
      {16, 16 * kW4DecodeMaxAvgRows + 1, W4Path::fused, "w4_fused(nvfp4, rs_sw_256x128)"},
      {16, 16 * kW4FusedMaxAvgRows, W4Path::fused, "w4_fused(nvfp4, rs_sw_256x128)"},
      {16, 16 * kW4FusedMaxAvgRows + 1, W4Path::prefill, "w4_prefill(nvfp4)+fwd_bf16_alpha"},
      // past the fused kernel's expert limit the middle range runs prefill
      {kW4FusedMaxGroups + 1, 100 * (kW4FusedMaxGroups + 1), W4Path::prefill, "w4_prefill(nvfp4)"},
  };
  for (const Want& w : wants) {
    W4Spec s;
    s.G = w.G;
    s.N = 128;
    s.K = 128;
    s.splits = make_splits(Pattern::balanced, w.G, w.M);
    Context ctx(Device::CUDA);
    W4Device d(ctx, s, make_w4_inputs(s));
    EXPECT_EQ(w4_gemm_path(ctx, d.args(s)), w.path) << "G=" << w.G << " M=" << w.M;
    const std::string name = gemm_config_name(ctx, d.args(s));
    EXPECT_NE(name.find(w.name), std::string::npos) << name;
  }
}

// At-most splits (rows past the sum neither read nor written) on each path: decode (one pass,
// wide passes, split K), fused and prefill, against exact splits over the experts' rows.
TEST(W4GemmGpu, AtMostSplitsComputeTheExpertsRowsOnly) {
  GROUPMM_REQUIRE_GPU();
  struct Case {
    W4Path path;
    std::vector<int64_t> splits;
    int64_t tail;
  };
  const Case cases[] = {
      {W4Path::decode, {3, 0, 5, 1, 8, 2, 0, 7}, 37},  // 8-token passes
      {W4Path::decode, {30, 0, 9, 2}, 64},             // wider passes above a pass
      {W4Path::decode, {2, 1}, 5},                     // few items: split K
      {W4Path::fused, {100, 0, 37, 200}, 300},
      {W4Path::prefill, {64, 0, 129, 7}, 90},
  };
  for (QuantRecipe r : {QuantRecipe::nvfp4, QuantRecipe::mxfp4})
    for (const Case& c : cases) {
      W4Spec s;
      s.recipe = r;
      s.path = c.path;
      s.G = int64_t(c.splits.size());
      s.N = 256;
      s.K = 512;
      s.splits = c.splits;
      s.bias = true;
      check_w4_at_most(Device::CUDA, s, c.tail, 0.0);
    }
}

// A captured GEMM (each path) replays with new routings exactly as eager runs compute them.
TEST(W4GemmGpuGraph, ReplayWithNewSplitsMatchesEager) {
  GROUPMM_REQUIRE_GPU();
  for (QuantRecipe r : {QuantRecipe::nvfp4, QuantRecipe::mxfp4})
    for (int v = 0; v < kW4Variants; ++v) {
      W4Spec s;
      s.recipe = r;
      set_variant(s, v);
      const W4Path path = s.path;
      s.G = 16;
      s.N = 256;
      s.K = 512;
      s.splits = make_splits(Pattern::zipf, 16, 128);
      const W4Inputs in = make_w4_inputs(s);
      cudaStream_t stream;  // the legacy default stream cannot be captured
      GROUPMM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      {
        Context ctx(Device::CUDA, stream);
        W4Device d(ctx, s, in);
        const W4GemmArgs a = d.args(s);
        ctx.reserve_workspace(grouped_gemm_workspace_size(ctx, a));
        grouped_gemm(ctx, a);  // first use: kernel attributes outside the capture
        ctx.check();
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        GROUPMM_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        grouped_gemm(ctx, a);
        GROUPMM_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
        GROUPMM_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
        const Pattern pats[] = {Pattern::random_odd, Pattern::quarter_empty, Pattern::zero_first,
                                Pattern::balanced};
        for (int rep = 0; rep < 4; ++rep) {
          std::vector<int64_t> sp = make_splits(pats[rep], 16, 128);
          if (rep == 3) {  // one expert holds every row
            std::fill(sp.begin(), sp.end(), 0);
            sp[7] = 128;
          }
          copy(d.splits, TensorView(sp.data(), DType::int64, Device::CPU, {16}), stream);
          fill_bytes(d.out, 0xFF, stream);
          GROUPMM_CHECK_CUDA(cudaGraphLaunch(exec, stream));
          ctx.check();
          const std::vector<uint8_t> replay = quant_bytes(d.out);
          fill_bytes(d.out, 0xFF, stream);
          grouped_gemm(ctx, a);
          ctx.check();
          EXPECT_EQ(replay, quant_bytes(d.out))
              << recipe_name(r) << " " << w4_path_name(path) << " replay " << rep;
          for (size_t i = 0; i + 1 < replay.size(); i += 2)
            ASSERT_FALSE(replay[i] == 0xFF && replay[i + 1] == 0xFF) << "unwritten byte " << i;
        }
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
      }
      cudaStreamDestroy(stream);
    }
}

// Bad splits: the kernels clamp, never write past the buffers, and report.
TEST(W4GemmGpuFaults, BadSplitsAreClampedAndReported) {
  GROUPMM_REQUIRE_GPU();
  for (int v = 0; v < kW4Variants; ++v) {
    W4Spec s;
    s.recipe = QuantRecipe::mxfp4;
    set_variant(s, v);
    s.G = 4;
    s.N = 128;
    s.K = 128;
    s.splits = {8, 8, 8, 8};
    Context ctx(Device::CUDA);
    W4Device d(ctx, s, make_w4_inputs(s));
    for (const std::vector<int64_t>& bad :
         {std::vector<int64_t>{8, -3, 8, 8}, std::vector<int64_t>{8, 8, 30, 8}}) {
      std::vector<int64_t> sp = bad;
      copy(d.splits, TensorView(sp.data(), DType::int64, Device::CPU, {4}), ctx.stream());
      grouped_gemm(ctx, d.args(s));
      EXPECT_THROW_MSG(ctx.check(), "grouped_gemm");
    }
  }
}

TEST(W4GemmGpuErrors, AlignmentAndPaths) {
  GROUPMM_REQUIRE_GPU();
  W4Spec s;
  s.G = 2;
  s.N = 64;
  s.K = 64;
  s.splits = {3, 5};
  Context ctx(Device::CUDA);
  W4Device d(ctx, s, make_w4_inputs(s));
  W4GemmArgs a = d.args(s);
  Tensor big = Tensor::empty({9 * 64}, DType::bf16, Device::CUDA);
  a.x = TensorView(static_cast<uint16_t*>(big.data()) + 1, DType::bf16, Device::CUDA, {8, 64});
  EXPECT_THROW_MSG(grouped_gemm(ctx, a), "grouped_gemm: x.data=");
  a = d.args(s);
  a.engine = GemmEngine::reference;
  EXPECT_THROW_MSG(grouped_gemm(ctx, a), "grouped_gemm: engine reference does not run");
  // The fused kernel's tile tables hold kW4FusedMaxGroups experts.
  W4Spec many = s;
  many.G = kW4FusedMaxGroups + 1;
  many.splits = make_splits(Pattern::balanced, many.G, many.G);
  W4Device dm(ctx, many, make_w4_inputs(many));
  a = dm.args(many);
  a.path = W4Path::fused;
  EXPECT_THROW_MSG(grouped_gemm(ctx, a), "grouped_gemm: path fused runs at most 1024 experts");
}

TEST(W4GroupedLinearGpu, ForwardMatchesCpuAndBackwardRefuses) {
  GROUPMM_REQUIRE_GPU();
  for (QuantRecipe r : {QuantRecipe::nvfp4, QuantRecipe::mxfp4}) {
    const nn::GroupedLinearConfig c = w4_layer_config(r, 8, 256, 128, 1024, true);
    Context gctx(Device::CUDA), cctx(Device::CPU);
    nn::GroupedLinear gl(gctx, c), cl(cctx, c);
    for (int64_t M : {int64_t(40), int64_t(1024)}) {  // decode, prefill
      std::vector<int64_t> sp = make_splits(Pattern::zipf, 8, M);
      Tensor gs = clone_to(TensorView(sp.data(), DType::int64, Device::CPU, {8}), Device::CUDA);
      Tensor cs = clone_to(TensorView(sp.data(), DType::int64, Device::CPU, {8}), Device::CPU);
      const std::vector<float> xv = randn(size_t(M * 256));
      Tensor gx = make_input(xv, DType::bf16, {M, 256}, Device::CUDA);
      Tensor cx = make_input(xv, DType::bf16, {M, 256}, Device::CPU);
      const std::vector<float> g = cpu_floats(gl.forward(gctx, gx, gs));
      gctx.check();
      const std::vector<float> ref = cpu_floats(cl.forward(cctx, cx, cs));
      EXPECT_LE(rel_error(g, ref), kTol) << c.recipe->name() << " M=" << M;
    }
    Tensor dy = Tensor::empty({1024, 128}, DType::bf16, Device::CUDA);
    fill_bytes(dy, 0, gctx.stream());
    EXPECT_THROW_MSG(gl.backward(gctx, dy), c.recipe->name() + ": backward is not supported");
  }
}

}  // namespace
}  // namespace groupmm::test
