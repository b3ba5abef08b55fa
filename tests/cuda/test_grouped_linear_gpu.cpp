// GroupedLinear on the GPU: equals the same layer on the CPU backend (weights moved through
// export/import), and a routed expert MLP (gate_up layer -> SwiGLU -> down layer) whose whole
// forward + backward + backward_dw is captured in one CUDA graph replays with three routings to
// the same bits as eager execution.
#include "common/tolerance.hpp"
#include "base/cpu_util.hpp"
#include "groupmm/moe.hpp"
#include "groupmm/nn/grouped_linear.hpp"

namespace groupmm::test {
namespace {

using nn::GroupedLinear;
using nn::GroupedLinearConfig;

struct HostT {  // host tensor with random N(0, scale) values in dtype
  std::vector<uint8_t> b;
  TensorView v;
  HostT(DType t, std::initializer_list<int64_t> dims, float scale = 1.0f) {
    v = TensorView(nullptr, t, Device::CPU, dims);
    b.resize(static_cast<size_t>(v.nbytes()));
    v.data = b.data();
    const auto r = randn(static_cast<size_t>(v.numel()), scale);
    for (int64_t i = 0; i < v.numel(); ++i) cpu::store_f(v, i, r[static_cast<size_t>(i)]);
  }
};

// Copies `from`'s weights (and bias) into `to` through per-expert export/import.
void copy_weights(Context& fctx, const GroupedLinear& from, Context& tctx, GroupedLinear& to) {
  const auto& c = from.config();
  std::vector<std::vector<uint16_t>> w(static_cast<size_t>(c.experts)), b(w.size());
  std::vector<TensorView> wv, bv;
  for (size_t g = 0; g < w.size(); ++g) {
    w[g].resize(static_cast<size_t>(c.out_features * c.in_features));
    wv.push_back(TensorView(w[g].data(), c.dtype, Device::CPU, {c.out_features, c.in_features}));
    if (c.bias) {
      b[g].resize(static_cast<size_t>(c.out_features));
      bv.push_back(TensorView(b[g].data(), c.dtype, Device::CPU, {c.out_features}));
    }
  }
  from.export_weights(fctx, wv, bv);
  to.import_weights(tctx, wv, bv);
}

struct Case {
  Pattern pattern;
  int64_t G, K, N, M;
  bool bias, delay, main_grad;
  DType dtype;
};

std::string case_name(const Case& c) {
  return detail::cat(pattern_name(c.pattern), "_G", c.G, "_", dtype_name(c.dtype),
                     c.bias ? "_bias" : "", c.delay ? "_delayed" : "",
                     c.main_grad ? "_maingrad" : "");
}
void PrintTo(const Case& c, std::ostream* os) {
  *os << case_name(c);
}

class GroupedLinearGpu : public ::testing::TestWithParam<Case> {};

TEST_P(GroupedLinearGpu, MatchesCpuLayer) {
  GROUPMM_REQUIRE_GPU();
  const Case c = GetParam();
  Context cctx(Device::CPU), gctx(Device::CUDA);
  GroupedLinearConfig cfg;
  cfg.experts = c.G;
  cfg.in_features = c.K;
  cfg.out_features = c.N;
  cfg.bias = c.bias;
  cfg.dtype = c.dtype;
  cfg.delay_wgrad = c.delay;
  cfg.accumulate_into_main_grad = c.main_grad;
  cfg.max_tokens = c.M + 100;
  cfg.seed = 42;
  GroupedLinear gl(gctx, cfg), cl(cctx, cfg);
  copy_weights(gctx, gl, cctx, cl);
  EXPECT_EQ(floats_of(gl.weight()), cpu::to_floats(cl.weight()));

  std::vector<int32_t> s = to_i32(make_splits(c.pattern, c.G, c.M));
  const TensorView hs = host_view(s, DType::int32, {c.G});
  Tensor ds = clone_to(hs, Device::CUDA);
  for (int mb = 0; mb < (c.main_grad ? 2 : 1); ++mb) {  // main grads: two accumulated micro-batches
    HostT x(c.dtype, {c.M, c.K}), dy(c.dtype, {c.M, c.N});
    Tensor gx = clone_to(x.v, Device::CUDA), gdy = clone_to(dy.v, Device::CUDA);
    if (!c.main_grad) {
      fill_bytes(gl.weight_grad(), 0xFF);
      if (c.bias) fill_bytes(gl.bias_grad(), 0xFF);
    }
    const TensorView gy = gl.forward(gctx, gx, ds), cy = cl.forward(cctx, x.v, hs);
    const TensorView gdx = gl.backward(gctx, gdy), cdx = cl.backward(cctx, dy.v);
    gl.backward_dw(gctx);
    cl.backward_dw(cctx);
    EXPECT_NO_THROW(gctx.check());
    const Tolerance tol = gpu_gemm_tolerance(c.dtype, c.dtype, c.K);
    EXPECT_TRUE(close_to(floats_of(gy), cpu::to_floats(cy), tol, "y"));
    EXPECT_TRUE(close_to(floats_of(gdx), cpu::to_floats(cdx), tol, "dx"));
  }
  const auto gdw = floats_of(gl.weight_grad()), cdw = cpu::to_floats(cl.weight_grad());
  const int64_t NK = c.N * c.K;
  for (int64_t g = 0; g < c.G; ++g) {
    std::vector<float> a(gdw.begin() + g * NK, gdw.begin() + (g + 1) * NK);
    std::vector<float> b(cdw.begin() + g * NK, cdw.begin() + (g + 1) * NK);
    if (s[static_cast<size_t>(g)] == 0) {
      EXPECT_EQ(a, b) << "zero-row expert " << g;  // 0, or the untouched main grad (0 here)
    } else {
      const int64_t terms = (c.main_grad ? 2 : 1) * s[static_cast<size_t>(g)];  // micro-batches
      EXPECT_TRUE(close_to(a, b, gpu_gemm_tolerance(c.dtype, gl.weight_grad().dtype, terms),
                           detail::cat("dW expert ", g)));
    }
  }
  if (c.bias) {
    const int64_t rows = (c.main_grad ? 2 : 1) * *std::max_element(s.begin(), s.end());
    EXPECT_TRUE(close_to(
        floats_of(gl.bias_grad()), cpu::to_floats(cl.bias_grad()),
        tolerance(TolOp::dbias, c.dtype, gl.bias_grad().dtype, rows).between_implementations(),
        "db"));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, GroupedLinearGpu,
    ::testing::Values(Case{Pattern::zipf, 16, 256, 384, 2048, true, false, false, DType::bf16},
                      Case{Pattern::quarter_empty, 12, 128, 256, 1000, true, true, true,
                           DType::bf16},
                      Case{Pattern::zero_middle, 8, 192, 128, 777, false, true, false, DType::fp16},
                      Case{Pattern::balanced, 32, 128, 64, 4096, true, false, true, DType::fp16},
                      Case{Pattern::zero_first, 4, 64, 64, 100, false, false, false, DType::bf16}),
    [](const auto& info) { return case_name(info.param); });

// ---- one CUDA graph for the whole routed expert MLP
// -------------------------------------------------
struct Mlp {
  GroupedLinear up, down;
  Tensor h;   // swiglu output [max, I]
  Tensor dh;  // d(gate_up) [max, 2I]
  Mlp(Context& ctx, int64_t G, int64_t H, int64_t I, int64_t max_tokens, bool main_grad)
      : up(ctx, cfg(G, H, 2 * I, max_tokens, main_grad, 1)),
        down(ctx, cfg(G, I, H, max_tokens, main_grad, 2)) {
    h = Tensor::empty({max_tokens, I}, DType::bf16, Device::CUDA, ctx.stream());
    dh = Tensor::empty({max_tokens, 2 * I}, DType::bf16, Device::CUDA, ctx.stream());
  }
  static GroupedLinearConfig cfg(int64_t G, int64_t K, int64_t N, int64_t max_tokens,
                                 bool main_grad, uint64_t seed) {
    GroupedLinearConfig c;
    c.experts = G;
    c.in_features = K;
    c.out_features = N;
    c.bias = true;
    c.delay_wgrad = true;
    c.accumulate_into_main_grad = main_grad;
    c.max_tokens = max_tokens;
    c.seed = seed;
    return c;
  }
  // The whole step: (zero main grads), forward, backward, backward_dw. Returns dx.
  TensorView step(Context& ctx, const TensorView& x, const TensorView& splits,
                  const TensorView& dy) {
    const int64_t M = x.dim(0), I = h.view().dim(1);
    if (up.config().accumulate_into_main_grad) {
      up.zero_grad(ctx);
      down.zero_grad(ctx);
    }
    const TensorView gu = up.forward(ctx, x, splits);
    const TensorView hv(h.data(), DType::bf16, Device::CUDA, {M, I});
    swiglu_forward(ctx, gu, hv);
    down.forward(ctx, hv, splits);
    const TensorView dhv(dh.data(), DType::bf16, Device::CUDA, {M, 2 * I});
    swiglu_backward(ctx, down.backward(ctx, dy), gu, dhv);
    const TensorView dx = up.backward(ctx, dhv);
    down.backward_dw(ctx);
    up.backward_dw(ctx);
    return dx;
  }
};

class GroupedLinearGpuGraph : public ::testing::TestWithParam<bool> {};

TEST_P(GroupedLinearGpuGraph, WholeStepInOneGraphEqualsEagerForThreeRoutings) {
  GROUPMM_REQUIRE_GPU();
  const bool main_grad = GetParam();
  const int64_t G = 16, H = 256, I = 192, M = 3000;
  cudaStream_t stream;
  GROUPMM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    Context ctx(Device::CUDA, stream);
    Mlp mlp(ctx, G, H, I, M, main_grad);
    HostT hx(DType::bf16, {M, H}), hdy(DType::bf16, {M, H});
    Tensor x = clone_to(hx.v, Device::CUDA, stream), dy = clone_to(hdy.v, Device::CUDA, stream);
    Tensor ds = Tensor::empty({G}, DType::int64, Device::CUDA, stream);
    std::vector<int64_t> first = make_splits(Pattern::balanced, G, M);
    copy(ds, host_view(first, DType::int64, {G}), stream);
    GROUPMM_CHECK_CUDA(cudaStreamSynchronize(stream));

    cudaGraph_t graph;
    cudaGraphExec_t exec;
    GROUPMM_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const TensorView dx = mlp.step(ctx, x, ds, dy);
    GROUPMM_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    GROUPMM_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));

    auto snapshot = [&]() {
      return std::vector<std::vector<uint8_t>>{
          bytes_of(dx),
          bytes_of(TensorView(mlp.h.data(), DType::bf16, Device::CUDA, {M, I})),
          bytes_of(mlp.up.weight_grad()),
          bytes_of(mlp.up.bias_grad()),
          bytes_of(mlp.down.weight_grad()),
          bytes_of(mlp.down.bias_grad())};
    };
    const char* names[] = {"dx", "swiglu out", "up dW", "up db", "down dW", "down db"};
    for (Pattern p : {Pattern::zipf, Pattern::quarter_empty, Pattern::zero_last}) {
      std::vector<int64_t> s = make_splits(p, G, M);
      copy(ds, host_view(s, DType::int64, {G}), stream);
      for (const TensorView* t : {&mlp.up.weight_grad(), &mlp.down.weight_grad()})
        fill_bytes(*t, 0xFF, stream);
      fill_bytes(dx, 0xFF, stream);
      GROUPMM_CHECK_CUDA(cudaGraphLaunch(exec, stream));
      GROUPMM_CHECK_CUDA(cudaStreamSynchronize(stream));
      const auto replayed = snapshot();
      const TensorView edx = mlp.step(ctx, x, ds, dy);
      EXPECT_EQ(edx.data, dx.data);
      GROUPMM_CHECK_CUDA(cudaStreamSynchronize(stream));  // snapshot() copies on the legacy stream
      const auto eager = snapshot();
      for (size_t i = 0; i < eager.size(); ++i)
        EXPECT_EQ(replayed[i], eager[i]) << names[i] << " differs, routing " << pattern_name(p);
      EXPECT_NO_THROW(ctx.check());
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(MainGrad, GroupedLinearGpuGraph, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "main_grad" : "dtype_grads"; });

TEST(GroupedLinearGpuErrors, ClearMessages) {
  GROUPMM_REQUIRE_GPU();
  Context ctx(Device::CUDA);
  GroupedLinearConfig c = Mlp::cfg(4, 64, 60, 128, false, 0);  // N = 60: not a multiple of 8
  EXPECT_THROW_MSG(GroupedLinear l(ctx, c), "N=60 must be a multiple of 8");
  c.out_features = 64;
  GroupedLinear layer(ctx, c);
  HostT hx(DType::bf16, {16, 64});
  std::vector<int32_t> s = {4, 4, 4, 4};
  Tensor ds = clone_to(host_view(s, DType::int32, {4}), Device::CUDA);
  EXPECT_THROW_MSG(layer.forward(ctx, hx.v, ds),
                   "GroupedLinear.forward: x is on cpu but the context is cuda");
  Context cpu(Device::CPU);
  EXPECT_THROW_MSG(layer.forward(cpu, hx.v, ds),
                   "GroupedLinear.forward: the context is cpu but the layer lives on cuda");
}

}  // namespace
}  // namespace groupmm::test
