// nn::MoE on the GPU: equals the same block on the CPU backend (parameters copied over), forward
// and every grad; the whole forward + backward + backward_dw captured in one CUDA graph replays
// with many different routings (random inputs, every token on one expert, a changed router) to the
// same bits as eager execution; two eager runs are bit-identical.
#include <cmath>

#include "common/moe_fused_case.hpp"
#include "common/test_util.hpp"
#include "base/cpu_util.hpp"
#include "groupmm/nn/moe.hpp"
#include "groupmm/random.hpp"

namespace groupmm::test {
namespace {

using nn::GroupedLinear;
using nn::MoE;
using nn::MoEConfig;

// dst (any device) = src (any device), same shape and dtype
void copy_param(const TensorView& dst, const TensorView& src) {
  copy(TensorView(dst.data, DType::e8m0, dst.device, {dst.nbytes()}),
       TensorView(src.data, DType::e8m0, src.device, {src.nbytes()}));
}

struct Bf16Host {  // random bf16 host tensor
  std::vector<uint16_t> b;
  TensorView v;
  Bf16Host(int64_t rows, int64_t cols, float scale) : b(size_t(rows * cols)) {
    const auto r = randn(b.size(), scale);
    for (size_t i = 0; i < b.size(); ++i) b[i] = float_to_bf16_bits(r[i]);
    v = TensorView(b.data(), DType::bf16, Device::CPU, {rows, cols});
  }
};

struct LayerCase {
  const char* name;
  bool shared, delay, main_grad;
  double capacity;
  int64_t align;
  RouterScore score;
  int64_t T = 517, experts = 16, topk = 4;
};

MoEConfig cfg(const LayerCase& lc) {
  return MoEConfig{.hidden = 256,
                   .ffn_hidden = 128,
                   .experts = lc.experts,
                   .topk = lc.topk,
                   .max_tokens = 600,
                   .score = lc.score,
                   .renormalize = true,
                   .aux_loss_coeff = 0.01f,
                   .z_loss_coeff = 0.001f,
                   .shared_ffn_hidden = lc.shared ? 96 : 0,
                   .capacity_factor = lc.capacity,
                   .pad_align = lc.align,
                   .bias = true,
                   .delay_wgrad = lc.delay,
                   .accumulate_into_main_grad = lc.main_grad,
                   .seed = 11};
}

class MoEGpu : public ::testing::TestWithParam<LayerCase> {};

TEST_P(MoEGpu, MatchesTheCpuBlock) {
  GROUPMM_REQUIRE_GPU();
  const LayerCase lc = GetParam();
  const MoEConfig c = cfg(lc);
  Context cctx(Device::CPU), gctx(Device::CUDA);
  MoE g(gctx, c), h(cctx, c);
  copy_param(h.router_weight(), g.router_weight());
  auto gl = moe_linears(g), hl = moe_linears(h);
  for (size_t i = 0; i < gl.size(); ++i) {
    copy_param(hl[i]->weight(), gl[i]->weight());
    copy_param(hl[i]->bias(), gl[i]->bias());
  }
  const int64_t T = lc.T, H = c.hidden;
  Bf16Host x(T, H, 1.0f), dy(T, H, 0.1f);
  Tensor gx = clone_to(x.v, Device::CUDA), gdy = clone_to(dy.v, Device::CUDA);
  const TensorView gy = g.forward(gctx, gx), hy = h.forward(cctx, x.v);
  EXPECT_EQ(bytes_of(g.expert_ids()), bytes_of(h.expert_ids())) << "routing differs";
  EXPECT_LE(rel_error(floats_of(gy), cpu::to_floats(hy)), 1e-2) << "y";
  EXPECT_NEAR(floats_of(g.aux_loss())[0], cpu::to_floats(h.aux_loss())[0], 1e-6);
  const TensorView gdx = g.backward(gctx, gdy), hdx = h.backward(cctx, dy.v);
  g.backward_dw(gctx);
  h.backward_dw(cctx);
  EXPECT_NO_THROW(gctx.check());
  EXPECT_LE(rel_error(floats_of(gdx), cpu::to_floats(hdx)), 2e-2) << "dx";
  EXPECT_LE(rel_error(floats_of(g.router_weight_grad()), cpu::to_floats(h.router_weight_grad())),
            2e-2)
      << "router dW";
  for (size_t i = 0; i < gl.size(); ++i) {
    EXPECT_LE(rel_error(floats_of(gl[i]->weight_grad()), cpu::to_floats(hl[i]->weight_grad())),
              2e-2)
        << "dW of linear " << i;
    EXPECT_LE(rel_error(floats_of(gl[i]->bias_grad()), cpu::to_floats(hl[i]->bias_grad())), 2e-2)
        << "db of linear " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, MoEGpu,
    ::testing::Values(
        LayerCase{"plain", false, false, false, 0.0, 1, RouterScore::softmax},
        LayerCase{"shared_delayed_maingrad", true, true, true, 0.0, 1, RouterScore::sigmoid},
        LayerCase{"capacity_pad16", true, false, false, 0.8, 16, RouterScore::softmax},
        LayerCase{"t1_e1_k1", true, false, true, 0.0, 1, RouterScore::softmax, 1, 1, 1}),
    [](const auto& info) { return std::string(info.param.name); });

// fused_gate_up on the GPU (the kernel layer's moe_gate_up_swiglu, the backward's gather) changes
// no bit of the block: y, dx, every gradient, over two steps; with a shared expert, capacity and
// padding, delayed wgrad into main grads; a skewed width with more column tiles than a raster band.
TEST(MoEGpuFused, GateUpEqualsTheSeparateOpsBitForBit) {
  GROUPMM_REQUIRE_GPU();
  Context gctx(Device::CUDA);
  LayerCase lc{"fused", true, false, false, 0.0, 1, RouterScore::softmax};
  MoEConfig c = cfg(lc);
  c.bias = false;
  expect_fused_gate_up_bit_exact(gctx, c, lc.T);
  lc = LayerCase{"fused_capacity", true, true, true, 0.8, 16, RouterScore::sigmoid};
  c = cfg(lc);
  c.bias = false;
  expect_fused_gate_up_bit_exact(gctx, c, lc.T);
  c.ffn_hidden = 1152;  // 9 cooperative column tiles
  c.shared_ffn_hidden = 0;
  expect_fused_gate_up_bit_exact(gctx, c, 300);
}

// ---- one CUDA graph for the whole step
// ------------------------------------------------------------
struct Step {
  MoE& m;
  const TensorView &x, &dy;
  TensorView run(Context& ctx) {
    m.zero_grad(ctx);
    m.forward(ctx, x);
    const TensorView dx = m.backward(ctx, dy);
    m.backward_dw(ctx);
    return dx;
  }
  std::vector<std::vector<uint8_t>> snapshot(const TensorView& dx) {
    std::vector<std::vector<uint8_t>> s = {bytes_of(dx), bytes_of(m.aux_loss()),
                                           bytes_of(m.z_loss()), bytes_of(m.router_weight_grad()),
                                           bytes_of(m.counts())};
    for (GroupedLinear* l : moe_linears(m)) {
      s.push_back(bytes_of(l->weight_grad()));
      s.push_back(bytes_of(l->bias_grad()));
    }
    return s;
  }
};

// One captured step (forward, backward, delayed wgrad) replays new routings (one with every token
// on the same experts, one with a new router) as eager runs compute them, and eager runs repeat.
void expect_graph_replays_routings(const MoEConfig& c) {
  cudaStream_t stream;
  GROUPMM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    Context ctx(Device::CUDA, stream);
    MoE m(ctx, c);
    const int64_t T = 512, H = c.hidden;
    Tensor x = Tensor::empty({T, H}, DType::bf16, Device::CUDA, stream);
    Tensor dy = Tensor::empty({T, H}, DType::bf16, Device::CUDA, stream);
    Step step{m, x.view(), dy.view()};
    auto load = [&](bool one_expert) {
      Bf16Host hx(T, H, 1.0f), hdy(T, H, 0.1f);
      if (one_expert)  // every token the same: all T tokens on the same k experts
        for (int64_t t = 1; t < T; ++t)
          std::copy(hx.b.begin(), hx.b.begin() + H, hx.b.begin() + t * H);
      copy(x, hx.v, stream);
      copy(dy, hdy.v, stream);
    };
    load(false);
    GROUPMM_CHECK_CUDA(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    GROUPMM_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const TensorView dx = step.run(ctx);
    GROUPMM_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    GROUPMM_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int round = 0; round < 6; ++round) {
      load(round == 2);
      if (round == 4) fill_uniform(ctx, m.router_weight(), -0.5f, 0.5f, 77);  // a new router
      fill_bytes(dx, 0xFF, stream);
      GROUPMM_CHECK_CUDA(cudaGraphLaunch(exec, stream));
      GROUPMM_CHECK_CUDA(cudaStreamSynchronize(stream));
      const auto replayed = step.snapshot(dx);
      const TensorView edx = step.run(ctx);
      EXPECT_EQ(edx.data, dx.data);
      GROUPMM_CHECK_CUDA(cudaStreamSynchronize(stream));
      const auto eager = step.snapshot(edx);
      for (size_t i = 0; i < eager.size(); ++i)
        EXPECT_EQ(replayed[i], eager[i]) << "output " << i << " differs, round " << round;
      step.run(ctx);  // a second eager run: the same bits again
      GROUPMM_CHECK_CUDA(cudaStreamSynchronize(stream));
      EXPECT_EQ(step.snapshot(edx), eager) << "two eager runs differ, round " << round;
      EXPECT_NO_THROW(ctx.check());
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(stream);
}

TEST(MoEGpuGraph, OneGraphReplaysManyRoutingsBitForBit) {
  GROUPMM_REQUIRE_GPU();
  expect_graph_replays_routings(
      cfg(LayerCase{"graph", true, true, true, 0.0, 16, RouterScore::softmax}));
}

// The FP8 blocks with gathered_quantize (gate_up quantizing x, down dy, through the row map):
// bit for bit the permuted copies (y, dx, every gradient, two steps; capacity, padding, a shared
// expert, bias, delayed wgrad; a main grad without bias), and one CUDA graph replaying routings.
TEST(MoEGpuFp8, GatheredQuantizeEqualsThePermutedCopiesAndReplays) {
  GROUPMM_REQUIRE_GPU();
  Context gctx(Device::CUDA);
  for (QuantRecipe r : {QuantRecipe::fp8_current, QuantRecipe::fp8_block}) {
    SCOPED_TRACE(recipe_name(r));
    // the recipe's layers: the shared expert 128 wide (fp8_block's 128-feature multiple)
    auto fp8 = [&](const LayerCase& lc) {
      MoEConfig c = cfg(lc);
      c.recipe = nn::quantized_recipe(r);
      c.shared_ffn_hidden = 128;
      return c;
    };
    MoEConfig c = fp8(LayerCase{"gathered", true, false, false, 0.0, 16, RouterScore::softmax});
    expect_gathered_quantize_bit_exact(gctx, c, 512);
    c = fp8(LayerCase{"gathered_capacity", true, true, false, 0.8, 16, RouterScore::sigmoid});
    expect_gathered_quantize_bit_exact(gctx, c, 496);
    c = fp8(LayerCase{"gathered_graph", true, true, true, 0.0, 16, RouterScore::softmax});
    c.bias = false;  // a bias gradient into a main grad reads the bf16 dy: no gather
    {
      MoE probe(gctx, c);
      ASSERT_TRUE(probe.gathered());
    }
    expect_gathered_quantize_bit_exact(gctx, c, 512);
    expect_graph_replays_routings(c);
  }
}

}  // namespace
}  // namespace groupmm::test
