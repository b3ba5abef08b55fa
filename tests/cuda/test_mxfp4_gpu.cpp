// MXFP4 group_quantize / dequantize and the checkpoint relayout on the GPU: every output byte
// equals the CPU reference (outputs poisoned 0xFF on both sides first), for 16- and 32-bit inputs,
// both directions, plain and swizzled scales, split patterns with zero-row, odd (columnwise fault)
// and partial-block experts, weights; inputs spread over many binades with Inf, NaN, -0 and
// subnormals; CUDA-graph replay with new splits equals eager.
#include <numeric>

#include "common/quant_test_util.hpp"

namespace groupmm::test {
namespace {

std::vector<float> values(int64_t n) {
  std::vector<float> v = rand_wide(static_cast<size_t>(n));
  if (n > 4000) {
    v[17] = INFINITY;
    v[1000] = -INFINITY;
    v[2001] = NAN;
    v[3003] = -0.0f;
    v[3004] = 1e-41f;
    v[3500] = 6.0f * 65536.0f;
  }
  return v;
}

void expect_same(const Quantized& g, const Quantized& c, const std::string& what) {
  for (auto [name, a, b] :
       {std::tuple{"data", &g.buf.data, &c.buf.data},
        std::tuple{"scale_inv", &g.buf.scale_inv, &c.buf.scale_inv},
        std::tuple{"columnwise_data", &g.buf.columnwise_data, &c.buf.columnwise_data},
        std::tuple{"columnwise_scale_inv", &g.buf.columnwise_scale_inv,
                   &c.buf.columnwise_scale_inv}}) {
    if (!b->view().present()) continue;
    const auto x = quant_bytes(*a), y = quant_bytes(*b);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < x.size(); ++i)
      if (x[i] != y[i] && bad++ == 0) first = i;
    EXPECT_EQ(bad, 0u) << what << " " << name << ": first difference at byte " << first;
  }
}

struct Mx4Case {
  std::vector<int64_t> splits;
  int64_t K;
  std::string name;
};
void PrintTo(const Mx4Case& c, std::ostream* os) {
  *os << c.name;
}

class Mxfp4QuantizeGpu : public ::testing::TestWithParam<Mx4Case> {};

TEST_P(Mxfp4QuantizeGpu, BitExactWithCpu) {
  GROUPMM_REQUIRE_GPU();
  const Mx4Case& c = GetParam();
  const int64_t M = std::accumulate(c.splits.begin(), c.splits.end(), int64_t(0));
  const std::vector<float> v = values(M * c.K);
  std::vector<int64_t> s = c.splits;
  const TensorView hs = host_view(s, DType::int64, {int64_t(s.size())});
  Tensor ds = clone_to(hs, Device::CUDA);
  Context cctx(Device::CPU), gctx(Device::CUDA);
  for (DType in : {DType::bf16, DType::fp32}) {
    Tensor hx = make_input(v, in, {M, c.K}, Device::CPU), dx = clone_to(hx, Device::CUDA);
    for (ScaleLayout layout : {ScaleLayout::plain, ScaleLayout::swizzled}) {
      const QuantizeConfig cfg = qcfg(QuantRecipe::mxfp4, QuantDirection::both, layout);
      const Quantized g = run_quantize(gctx, dx, ds, cfg), h = run_quantize(cctx, hx, hs, cfg);
      const StatusBlock gs = gctx.take_status(), hst = cctx.take_status();
      EXPECT_EQ(gs.bits, hst.bits) << "the same faults (odd splits: columnwise skipped)";
      expect_same(g, h, cfg_name(cfg) + "_" + dtype_name(in));
      // dequantize (rowwise) agrees too
      Tensor gout = Tensor::empty({M, c.K}, DType::fp32, Device::CUDA);
      Tensor hout = Tensor::empty({M, c.K}, DType::fp32, Device::CPU);
      fill_bytes(gout, 0xFF);
      fill_bytes(hout, 0xFF);
      GroupDequantizeArgs da;
      da.in = g.gt;
      da.config = quantize_config_of(g.gt);
      da.config.direction = QuantDirection::rowwise;
      da.out = gout;
      group_dequantize(gctx, da);
      da.in = h.gt;
      da.out = hout;
      group_dequantize(cctx, da);
      EXPECT_EQ(quant_bytes(gout), quant_bytes(hout)) << cfg_name(cfg) << " dequantize";
    }
  }
}

std::vector<Mx4Case> mx4_cases() {
  return {{{100, 0, 300, 17, 200}, 256, "odd_and_empty"},
          {{128, 128, 128, 128}, 512, "aligned"},
          {make_splits(Pattern::zipf, 16, 2000), 160, "zipf_K160"},
          {{0, 0, 0}, 64, "all_empty"},
          {{1}, 32, "one_row"}};
}
INSTANTIATE_TEST_SUITE_P(Splits, Mxfp4QuantizeGpu, ::testing::ValuesIn(mx4_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(Mxfp4QuantizeGpuWeights, WeightsAndCheckpointImport) {
  GROUPMM_REQUIRE_GPU();
  const int64_t G = 5, N = 136, K = 224;
  const std::vector<float> v = values(G * N * K);
  Tensor hw = make_input(v, DType::bf16, {G, N, K}, Device::CPU), dw = clone_to(hw, Device::CUDA);
  Context cctx(Device::CPU), gctx(Device::CUDA);
  for (ScaleLayout layout : {ScaleLayout::plain, ScaleLayout::swizzled}) {
    const QuantizeConfig cfg = qcfg(QuantRecipe::mxfp4, QuantDirection::rowwise, layout);
    const Quantized g = run_quantize(gctx, dw, TensorView(), cfg);
    const Quantized h = run_quantize(cctx, hw, TensorView(), cfg);
    expect_same(g, h, cfg_name(cfg) + "_weights");
    // Export the GPU copy to checkpoint tensors, import them into fresh buffers: the same bytes.
    Tensor blocks = Tensor::empty({G * N * K / 2}, DType::e8m0, Device::CUDA);
    Tensor scales = Tensor::empty({G * N * K / 32}, DType::e8m0, Device::CUDA);
    Mxfp4CheckpointArgs a;
    a.G = G;
    a.N = N;
    a.K = K;
    a.blocks = blocks;
    a.scales = scales;
    a.weights = g.gt;
    export_mxfp4_weights(gctx, a);
    Quantized back;
    back.buf = allocate_quantized(group_quantize_shapes(G * N, K, G, cfg), Device::CUDA);
    fill_bytes(back.buf.data, 0xFF);
    fill_bytes(back.buf.scale_inv, 0xFF);
    a.weights = back.buf.view(G, TensorView(), cfg);
    back.gt = import_mxfp4_weights(gctx, a);
    gctx.check();
    expect_same(back, h, cfg_name(cfg) + "_import");
    EXPECT_EQ(quant_bytes(blocks), quant_bytes(h.buf.data)) << "blocks are our data bytes";
  }
}

TEST(Mxfp4QuantizeGpuGraph, ReplayWithNewSplitsMatchesEager) {
  GROUPMM_REQUIRE_GPU();
  const int64_t G = 8, M = 1024, K = 256;
  Tensor dx = make_input(values(M * K), DType::bf16, {M, K}, Device::CUDA);
  std::vector<int64_t> s(G, M / G);  // even: every columnwise copy is written
  Tensor ds = clone_to(host_view(s, DType::int64, {G}), Device::CUDA);
  cudaStream_t stream;
  GROUPMM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    Context ctx(Device::CUDA, stream);
    const QuantizeConfig cfg =
        qcfg(QuantRecipe::mxfp4, QuantDirection::both, ScaleLayout::swizzled);
    Quantized q = run_quantize(ctx, dx, ds, cfg);  // eager first (kernel attributes)
    GroupQuantizeArgs a;
    a.input = dx;
    a.splits = ds;
    a.config = cfg;
    a.out = q.gt;
    ctx.reserve_workspace(group_quantize_workspace_size(ctx, a));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    GROUPMM_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    group_quantize(ctx, a);
    GROUPMM_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    GROUPMM_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (Pattern p : {Pattern::quarter_empty, Pattern::balanced}) {
      std::vector<int64_t> sp = make_splits(p, G, M);
      for (auto& v : sp) v -= v % 2;  // even: every columnwise copy is written
      sp[0] += M - std::accumulate(sp.begin(), sp.end(), int64_t(0));
      copy(ds, host_view(sp, DType::int64, {G}), stream);
      GROUPMM_CHECK_CUDA(cudaGraphLaunch(exec, stream));
      ctx.check();
      const auto d1 = quant_bytes(q.buf.columnwise_data), s1 = quant_bytes(q.buf.scale_inv);
      group_quantize(ctx, a);
      ctx.check();
      EXPECT_EQ(d1, quant_bytes(q.buf.columnwise_data)) << pattern_name(p);
      EXPECT_EQ(s1, quant_bytes(q.buf.scale_inv)) << pattern_name(p);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace groupmm::test
