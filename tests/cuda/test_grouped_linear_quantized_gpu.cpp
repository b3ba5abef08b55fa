// GroupedLinear with the quantized recipes on the GPU: the same layer on the CPU backend (same
// seeded weights; the quantized operands are bit-exact across backends, so only the GEMMs'
// accumulation differs), accuracy against the bf16 layer, and the whole step (with the weight
// quantization) captured in one CUDA graph, replayed with three routings equal to eager.
#include "common/quant_test_util.hpp"
#include "base/cpu_util.hpp"
#include "groupmm/nn/grouped_linear.hpp"

namespace groupmm::test {
namespace {

using nn::GroupedLinear;
using nn::GroupedLinearConfig;

// hp_wgrad: QuantizedRecipeOptions::high_precision_wgrad.
GroupedLinearConfig cfg(QuantRecipe r, int64_t G, int64_t K, int64_t N, int64_t max_tokens,
                        bool main_grad, bool hp_wgrad = false) {
  GroupedLinearConfig c;
  c.experts = G;
  c.in_features = K;
  c.out_features = N;
  c.bias = true;
  c.max_tokens = max_tokens;
  c.seed = 11;
  c.accumulate_into_main_grad = main_grad;
  c.delay_wgrad = true;
  nn::QuantizedRecipeOptions o;
  o.high_precision_wgrad = hp_wgrad;
  if (r != QuantRecipe::none) c.recipe = nn::quantized_recipe(r, o);
  return c;
}

Tensor bf16_input(int64_t rows, int64_t cols, float scale, Device d) {
  Tensor h = Tensor::empty({rows, cols}, DType::bf16, Device::CPU);
  const auto r = randn(static_cast<size_t>(rows * cols), scale);
  for (size_t i = 0; i < r.size(); ++i) h.ptr<uint16_t>()[i] = float_to_bf16_bits(r[i]);
  return d == Device::CPU ? std::move(h) : clone_to(h, d);
}

struct Outs {
  std::vector<float> y, dx, dw, db;
};

Outs step(Context& ctx, GroupedLinear& l, const TensorView& x, const TensorView& splits,
          const TensorView& dy) {
  Outs o;
  o.y = floats_of(l.forward(ctx, x, splits));
  o.dx = floats_of(l.backward(ctx, dy));
  l.backward_dw(ctx);
  ctx.check();
  o.dw = floats_of(l.weight_grad());
  o.db = floats_of(l.bias_grad());
  return o;
}

class QuantizedLayerGpu : public ::testing::TestWithParam<QuantRecipe> {};

TEST_P(QuantizedLayerGpu, MatchesCpuLayerAndBf16) {
  GROUPMM_REQUIRE_GPU();
  const QuantRecipe r = GetParam();
  const int64_t G = 8, K = 512, N = 768, M = 2048;
  Context gctx(Device::CUDA), cctx(Device::CPU);
  GroupedLinear gq(gctx, cfg(r, G, K, N, M, true)), cq(cctx, cfg(r, G, K, N, M, true));
  GroupedLinear gh(gctx, cfg(QuantRecipe::none, G, K, N, M, true));
  std::vector<int64_t> s = align_splits(make_splits(Pattern::zipf, G, M), 16);
  Tensor hx = bf16_input(M, K, 1.0f, Device::CPU), hdy = bf16_input(M, N, 0.1f, Device::CPU);
  Tensor x = clone_to(hx, Device::CUDA), dy = clone_to(hdy, Device::CUDA);
  Tensor ds = clone_to(host_view(s, DType::int64, {G}), Device::CUDA);
  const Outs g = step(gctx, gq, x, ds, dy);
  const Outs c = step(cctx, cq, hx, host_view(s, DType::int64, {G}), hdy);
  const Outs h = step(gctx, gh, x, ds, dy);
  EXPECT_LE(rel_error(g.y, c.y), 2e-3);
  EXPECT_LE(rel_error(g.dx, c.dx), 2e-3);
  EXPECT_LE(rel_error(g.dw, c.dw), r == QuantRecipe::mxfp8 ? 2e-5 : 5e-4);  // FP8 accumulation
  EXPECT_LE(rel_error(g.db, c.db), 1e-5);
  for (const auto& [q, b, what] :
       {std::tuple{&g.y, &h.y, "y"}, {&g.dx, &h.dx, "dx"}, {&g.dw, &h.dw, "dW"}}) {
    const double d = calc_diff(*q, *b);
    EXPECT_LT(d, 1e-3) << what;
    std::printf("[ accuracy ] %s %s vs bf16 layer: diff %.3g\n", recipe_name(r), what, d);
  }
}

// high_precision_wgrad on the GPU: y and dx are the FP8 layer's and dW the bf16 layer's, bit for
// bit (the same kernels on the same operands), into the fp32 main grad, delayed wgrad.
TEST_P(QuantizedLayerGpu, HighPrecisionWgradIsTheBf16Wgrad) {
  GROUPMM_REQUIRE_GPU();
  const QuantRecipe r = GetParam();
  const int64_t G = 12, K = 256, N = 640, M = 1536;
  Context ctx(Device::CUDA);
  GroupedLinear hp(ctx, cfg(r, G, K, N, M, true, true)), q(ctx, cfg(r, G, K, N, M, true));
  GroupedLinear h(ctx, cfg(QuantRecipe::none, G, K, N, M, true));
  std::vector<int64_t> s = align_splits(make_splits(Pattern::quarter_empty, G, M), 16);
  Tensor x = bf16_input(M, K, 1.0f, Device::CUDA), dy = bf16_input(M, N, 0.1f, Device::CUDA);
  Tensor ds = clone_to(host_view(s, DType::int64, {G}), Device::CUDA);
  const Outs a = step(ctx, hp, x, ds, dy), fp8 = step(ctx, q, x, ds, dy);
  const Outs bf16 = step(ctx, h, x, ds, dy);
  EXPECT_EQ(a.y, fp8.y);
  EXPECT_EQ(a.dx, fp8.dx);
  EXPECT_EQ(a.dw, bf16.dw);
  EXPECT_NE(a.dw, fp8.dw) << "the FP8 wgrad ran";
  EXPECT_EQ(a.db, bf16.db);
}

// forward_gathered and backward_gathered (x and dy quantized through a row map with -1 rows and
// repeated sources) equal forward and backward on the gathered copies bit for bit on the GPU: y,
// dx, dW, db (fused into dy's quantization); and into a main grad without bias.
TEST_P(QuantizedLayerGpu, GatheredPassesEqualTheGatheredCopies) {
  GROUPMM_REQUIRE_GPU();
  const QuantRecipe r = GetParam();
  const int64_t G = 12, K = 256, N = 640, M = 1536, T = 700;
  Context ctx(Device::CUDA);
  std::vector<int64_t> s = align_splits(make_splits(Pattern::quarter_empty, G, M), 16);
  std::vector<int32_t> map = random_row_map(M, T, 4);
  Tensor xs = bf16_input(T, K, 1.0f, Device::CPU), dys = bf16_input(T, N, 0.1f, Device::CPU);
  Tensor x = clone_to(gather_rows_host(xs, map), Device::CUDA);
  Tensor dy = clone_to(gather_rows_host(dys, map), Device::CUDA);
  Tensor dxs = clone_to(xs, Device::CUDA), ddys = clone_to(dys, Device::CUDA);
  Tensor dmap = clone_to(host_view(map, DType::int32, {M}), Device::CUDA);
  Tensor ds = clone_to(host_view(s, DType::int64, {G}), Device::CUDA);
  for (bool main_grad : {false, true}) {
    GroupedLinearConfig c = cfg(r, G, K, N, M, main_grad);
    c.bias = !main_grad;
    GroupedLinear ref(ctx, c), l(ctx, c);
    if (r == QuantRecipe::mxfp8) {
      EXPECT_FALSE(l.gathers());
      continue;
    }
    ASSERT_TRUE(l.gathers());
    const Outs want = step(ctx, ref, x, ds, dy);
    Outs got;
    got.y = floats_of(l.forward_gathered(ctx, dxs, dmap, ds));
    got.dx = floats_of(l.backward_gathered(ctx, ddys, dmap));
    l.backward_dw(ctx);
    ctx.check();
    got.dw = floats_of(l.weight_grad());
    got.db = floats_of(l.bias_grad());
    EXPECT_EQ(got.y, want.y) << "main_grad " << main_grad;
    EXPECT_EQ(got.dx, want.dx) << "main_grad " << main_grad;
    EXPECT_EQ(got.dw, want.dw) << "main_grad " << main_grad;
    EXPECT_EQ(got.db, want.db) << "main_grad " << main_grad;
  }
}

// forward + backward + backward_dw, W's quantization included, in one graph; three routings;
// the recipe as it is and with high_precision_wgrad.
TEST_P(QuantizedLayerGpu, WholeStepInOneGraphEqualsEager) {
  GROUPMM_REQUIRE_GPU();
  const QuantRecipe r = GetParam();
  const int64_t G = 16, K = 256, N = 384, M = 3072;
  cudaStream_t stream;
  GROUPMM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (const bool hp_wgrad : {false, true}) {
    SCOPED_TRACE(hp_wgrad ? "high_precision_wgrad" : "FP8 wgrad");
    Context ctx(Device::CUDA, stream);
    GroupedLinear l(ctx, cfg(r, G, K, N, M, true, hp_wgrad));
    Tensor x = bf16_input(M, K, 1.0f, Device::CUDA), dy = bf16_input(M, N, 0.1f, Device::CUDA);
    Tensor ds = Tensor::empty({G}, DType::int64, Device::CUDA, stream);
    std::vector<int64_t> first = align_splits(make_splits(Pattern::balanced, G, M), 16);
    copy(ds, host_view(first, DType::int64, {G}), stream);
    auto run = [&]() {
      l.zero_grad(ctx);
      l.forward(ctx, x, ds);
      const TensorView dx = l.backward(ctx, dy);
      l.backward_dw(ctx);
      return dx;
    };
    run();  // eager warm-up (kernel attributes), then capture with W's quantization inside
    GROUPMM_CHECK_CUDA(cudaStreamSynchronize(stream));
    l.weights_changed();
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    GROUPMM_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const TensorView dx = run();
    GROUPMM_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    GROUPMM_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    auto snapshot = [&]() {
      GROUPMM_CHECK_CUDA(cudaStreamSynchronize(stream));
      return std::vector<std::vector<uint8_t>>{bytes_of(dx), bytes_of(l.weight_grad()),
                                               bytes_of(l.bias_grad())};
    };
    for (Pattern p : {Pattern::zipf, Pattern::quarter_empty, Pattern::zero_last}) {
      std::vector<int64_t> s = align_splits(make_splits(p, G, M), 16);
      copy(ds, host_view(s, DType::int64, {G}), stream);
      fill_bytes(dx, 0xFF, stream);
      GROUPMM_CHECK_CUDA(cudaGraphLaunch(exec, stream));
      const auto replayed = snapshot();
      l.weights_changed();
      run();
      const auto eager = snapshot();
      EXPECT_EQ(replayed[0], eager[0]) << "dx, routing " << pattern_name(p);
      EXPECT_EQ(replayed[1], eager[1]) << "dW, routing " << pattern_name(p);
      EXPECT_EQ(replayed[2], eager[2]) << "db, routing " << pattern_name(p);
      EXPECT_NO_THROW(ctx.check());
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(Recipes, QuantizedLayerGpu,
                         ::testing::Values(QuantRecipe::fp8_current, QuantRecipe::fp8_block,
                                           QuantRecipe::mxfp8),
                         [](const auto& info) { return std::string(recipe_name(info.param)); });

}  // namespace
}  // namespace groupmm::test
