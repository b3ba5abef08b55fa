// The fused gate_up projection (moe_gate_up_swiglu: gathered x, weighted-SwiGLU epilogue, on the
// kernel layer's own sm_90a grouped GEMM) and moe_permute_sources on the GPU:
//  - against the CPU reference on fresh random inputs, outputs poisoned first (rel error of the
//    bf16/fp16 GEMM tolerance; moe_permute_sources bit for bit);
//  - against the unfused CUDA composition (moe_permute, grouped GEMM, weighted_swiglu_forward):
//    bit for bit, pre-activation and activation;
//  - two runs bit-identical; a CUDA graph replayed with new routing equals eager;
//  - zero-row experts, all tokens on one expert, padded experts (src_row -1), T = 1, k = 1, E = 1,
//    E = 256, H not a multiple of 64; bad src_row and splits reported, nothing written outside.
#include <algorithm>
#include <cmath>

#include "common/gathered_cases.hpp"
#include "common/moe_pair.hpp"
#include "common/test_util.hpp"
#include "groupmm/gemm.hpp"
#include "groupmm/moe.hpp"

namespace groupmm::test {
namespace {

class GateUpGpu : public ::testing::TestWithParam<GatheredCase> {};

TEST_P(GateUpGpu, EqualsTheReferenceAndTheUnfusedComposition) {
  GROUPMM_REQUIRE_GPU();
  const GatheredCase c = GetParam();
  const int64_t T = c.T, k = c.k, E = c.E, H = c.H, F = c.F;
  Context cpu(Device::CPU), gpu(Device::CUDA);
  ASSERT_TRUE(moe_gate_up_swiglu_supported(gpu, c.dtype, H, F, E));
  Pair ids(DType::int32, {T, k});
  const auto idv = routing(c, rng());
  std::copy(idv.begin(), idv.end(), ids.h<int32_t>());
  ids.upload();
  MapPair m(T, k, E, c.align);
  moe_permute_plan(cpu, ids.host, m.host);
  moe_permute_plan(gpu, ids.dev, m.dev);
  const int64_t R = m.host.rows;
  Pair wt(DType::fp32, {T, k}), src(DType::int32, {R}), probs(DType::fp32, {R});
  wt.fill_floats(randn(size_t(T * k)));
  moe_permute_sources(cpu, m.host, src.host, wt.host, probs.host);
  moe_permute_sources(gpu, m.dev, src.dev, wt.dev, probs.dev);
  src.expect_same("src_row");
  probs.expect_same("probs");

  Pair x(c.dtype, {T, H}), w(c.dtype, {E, 2 * F, H}), out(c.dtype, {R, F}), gu(c.dtype, {R, 2 * F});
  x.fill_floats(randn(size_t(T * H)));
  w.fill_floats(randn(size_t(E * 2 * F * H), 1.0f / std::sqrt(float(H))));
  auto args = [&](bool dev, const TensorView& o, const TensorView& g) {
    auto v = [&](Pair& p) -> TensorView { return dev ? p.dev.view() : p.host; };
    return MoeGateUpArgs{.x = v(x),
                         .src_row = v(src),
                         .splits = dev ? m.dev.splits : m.host.splits,
                         .w = v(w),
                         .prob = v(probs),
                         .out = o,
                         .gate_up = g};
  };
  moe_gate_up_swiglu(cpu, args(false, out.host, gu.host));
  moe_gate_up_swiglu(gpu, args(true, out.dev, gu.dev));
  ASSERT_NO_THROW(gpu.check());
  EXPECT_LE(rel_error(as_floats(gu), cpu::to_floats(gu.host)), 1e-2) << "gate_up";
  EXPECT_LE(rel_error(as_floats(out), cpu::to_floats(out.host)), 1e-2) << "out";
  for (const Pair* p : {&out, &gu}) {  // fully written: no poison left
    const auto f = as_floats(*p);
    EXPECT_TRUE(std::all_of(f.begin(), f.end(), [](float v) { return std::isfinite(v); }));
  }

  // The unfused composition on the GPU: the same bits.
  Tensor xp = Tensor::empty({R, H}, c.dtype, Device::CUDA);
  Tensor pr = Tensor::empty({R}, DType::fp32, Device::CUDA);
  Tensor gu2 = Tensor::empty({R, 2 * F}, c.dtype, Device::CUDA);
  Tensor out2 = Tensor::empty({R, F}, c.dtype, Device::CUDA);
  moe_permute(gpu, x.dev, m.dev, xp, wt.dev, pr);
  gemm_forward(gpu, xp, w.dev, m.dev.splits, gu2);
  weighted_swiglu_forward(gpu, gu2, pr, out2);
  EXPECT_EQ(to_host<uint8_t>(gu2.view()), gu.dev_bytes()) << "pre-activation vs unfused";
  EXPECT_EQ(to_host<uint8_t>(out2.view()), out.dev_bytes()) << "activation vs unfused";

  // The other schedules where they apply: the same bits.
  for (const char* cfg : {"pingpong_128x128", "coop_128x256", "coop_128x256_c2"}) {
    if (F % 128 != 0 && std::string(cfg) != "pingpong_128x128") continue;
    Tensor o = Tensor::empty({R, F}, c.dtype, Device::CUDA);
    fill_bytes(o, 0xFF);
    MoeGateUpArgs alt = args(true, o, TensorView());
    alt.config = cfg;
    moe_gate_up_swiglu(gpu, alt);
    EXPECT_EQ(to_host<uint8_t>(o.view()), out.dev_bytes()) << cfg;
  }
  // Without the pre-activation output, and run again: the same activation bits.
  Tensor out3 = Tensor::empty({R, F}, c.dtype, Device::CUDA);
  fill_bytes(out3, 0xFF);
  moe_gate_up_swiglu(gpu, args(true, out3, TensorView()));
  EXPECT_EQ(to_host<uint8_t>(out3.view()), out.dev_bytes()) << "second run";
  ASSERT_NO_THROW(gpu.check());
}

INSTANTIATE_TEST_SUITE_P(Cases, GateUpGpu,
                         ::testing::ValuesIn(gathered_cases_with(
                             {// more column tiles than a raster band, the last band narrower
                              GatheredCase{"wide_f_bands", 600, 2, 4, 256, 1152, 1, 3,
                                           DType::bf16}})),
                         [](const auto& info) { return std::string(info.param.name); });

// Graph safe: captured plan + sources + fused projection, replayed after the routing changed,
// equals eager execution on the new routing.
TEST(GateUpGpuGraph, ReplayWithNewRoutingEqualsEager) {
  GROUPMM_REQUIRE_GPU();
  const GatheredCase c{"graph", 600, 4, 32, 256, 128, 1, 0, DType::bf16};
  const int64_t T = c.T, k = c.k, E = c.E, H = c.H, F = c.F;
  cudaStream_t stream;
  GROUPMM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    Context ctx(Device::CUDA, stream);
    Pair ids(DType::int32, {T, k}), wt(DType::fp32, {T, k}), x(c.dtype, {T, H}),
        w(c.dtype, {E, 2 * F, H});
    MapPair m(T, k, E);
    const int64_t R = m.dev.rows;
    Pair src(DType::int32, {R}), probs(DType::fp32, {R}), out(c.dtype, {R, F});
    x.fill_floats(randn(size_t(T * H)));
    w.fill_floats(randn(size_t(E * 2 * F * H), 0.06f));
    wt.fill_floats(randn(size_t(T * k)));
    ctx.reserve_workspace(moe_permute_plan_workspace_size(ctx, T, k, E));
    auto run = [&] {
      moe_permute_plan(ctx, ids.dev, m.dev);
      moe_permute_sources(ctx, m.dev, src.dev, wt.dev, probs.dev);
      moe_gate_up_swiglu(ctx, MoeGateUpArgs{.x = x.dev,
                                            .src_row = src.dev,
                                            .splits = m.dev.splits,
                                            .w = w.dev,
                                            .prob = probs.dev,
                                            .out = out.dev,
                                            .gate_up = TensorView()});
    };
    auto set_routing = [&](int pattern) {
      GatheredCase r = c;
      r.pattern = pattern;
      const auto v = routing(r, rng());
      std::copy(v.begin(), v.end(), ids.h<int32_t>());
      ids.upload();
    };
    set_routing(0);
    GROUPMM_CHECK_CUDA(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    GROUPMM_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    run();
    GROUPMM_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    GROUPMM_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int pattern : {3, 2, 1, 0}) {
      set_routing(pattern);
      fill_bytes(out.dev, 0xFF, stream);
      GROUPMM_CHECK_CUDA(cudaGraphLaunch(exec, stream));
      GROUPMM_CHECK_CUDA(cudaStreamSynchronize(stream));
      const auto replayed = out.dev_bytes();
      fill_bytes(out.dev, 0xFF, stream);
      run();
      GROUPMM_CHECK_CUDA(cudaStreamSynchronize(stream));
      EXPECT_EQ(replayed, out.dev_bytes()) << "routing pattern " << pattern;
    }
    EXPECT_NO_THROW(ctx.check());
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(stream);
}

// Bad device data: a src_row out of range reads as a zero row and sets kFaultBadIndex; splits
// summing past R are clamped and reported; nothing is written past the outputs.
class GateUpGpuFaults : public ::testing::TestWithParam<const char*> {};

TEST_P(GateUpGpuFaults, BadRowMapAndSplitsAreReported) {
  GROUPMM_REQUIRE_GPU();
  const int64_t T = 64, E = 4, H = 128, F = 128, R = 384;
  Context gpu(Device::CUDA);
  Pair x(DType::bf16, {T, H}), w(DType::bf16, {E, 2 * F, H}), src(DType::int32, {R}),
      probs(DType::fp32, {R}), splits(DType::int32, {E});
  x.fill_floats(randn(size_t(T * H)));
  w.fill_floats(randn(size_t(E * 2 * F * H), 0.1f));
  probs.fill_floats(randn(size_t(R)));
  for (int64_t r = 0; r < R; ++r) src.h<int32_t>()[r] = int32_t(r % T);
  src.h<int32_t>()[5] = int32_t(T);  // out of range
  src.upload();
  for (int64_t e = 0; e < E; ++e) splits.h<int32_t>()[e] = int32_t(R / E);
  splits.upload();
  // out with a guard band after it: the kernel must not touch it
  const int64_t guard = 4096;
  Tensor buf = Tensor::empty({R * F + guard}, DType::bf16, Device::CUDA);
  fill_bytes(buf, 0x7F);
  TensorView out(buf.data(), DType::bf16, Device::CUDA, {R, F});
  MoeGateUpArgs a{.x = x.dev,
                  .src_row = src.dev,
                  .splits = splits.dev,
                  .w = w.dev,
                  .prob = probs.dev,
                  .out = out,
                  .gate_up = TensorView(),
                  .config = GetParam()};
  moe_gate_up_swiglu(gpu, a);
  StatusBlock s = gpu.take_status();
  EXPECT_EQ(s.bits, kFaultBadIndex);
  EXPECT_EQ(static_cast<OpId>(s.op), OpId::moe_gate_up);
  EXPECT_EQ(s.value, T);

  splits.h<int32_t>()[1] = int32_t(R);  // the sum runs past R
  splits.upload();
  src.h<int32_t>()[5] = 0;
  src.upload();
  moe_gate_up_swiglu(gpu, a);
  s = gpu.take_status();
  EXPECT_TRUE(s.bits & kFaultSplitsOverflow) << s.bits;
  const auto all = to_host<uint16_t>(buf.view());
  EXPECT_TRUE(std::all_of(all.begin() + R * F, all.end(), [](uint16_t v) { return v == 0x7F7F; }))
      << "written past out";
}

INSTANTIATE_TEST_SUITE_P(Configs, GateUpGpuFaults,
                         ::testing::Values("pingpong_128x128", "coop_128x256", "coop_128x256_c2"),
                         [](const auto& info) { return std::string(info.param); });

// Host validation names the op, the argument and the value.
TEST(GateUpGpuErrors, ShapesOutsideTheKernelAreRefused) {
  GROUPMM_REQUIRE_GPU();
  Context gpu(Device::CUDA);
  const int64_t T = 8, E = 2, H = 64, R = 16;
  auto t = [](std::initializer_list<int64_t> d, DType dt) {
    return Tensor::empty(d, dt, Device::CUDA);
  };
  Tensor x = t({T, H}, DType::bf16), src = t({R}, DType::int32), sp = t({E}, DType::int32),
         pr = t({R}, DType::fp32);
  auto args = [&](const TensorView& w, const TensorView& out) {
    return MoeGateUpArgs{.x = x,
                         .src_row = src,
                         .splits = sp,
                         .w = w,
                         .prob = pr,
                         .out = out,
                         .gate_up = TensorView(),
                         .config = {}};
  };
  Tensor w = t({E, 2 * 48, H}, DType::bf16), out = t({R, 48}, DType::bf16);
  EXPECT_THROW_MSG(moe_gate_up_swiglu(gpu, args(w, out)), "moe_gate_up_swiglu: w.shape[1]=96");
  EXPECT_FALSE(moe_gate_up_swiglu_supported(gpu, DType::bf16, H, 48, E));
  EXPECT_FALSE(moe_gate_up_swiglu_supported(gpu, DType::fp32, H, 64, E));
  // The epilogue stores 8 columns at once: an output view 2 elements into its buffer is refused.
  Tensor w64 = t({E, 2 * 64, H}, DType::bf16), big = t({R * 64 + 8}, DType::bf16);
  const TensorView shifted(static_cast<uint16_t*>(big.data()) + 2, DType::bf16, Device::CUDA,
                           {R, 64});
  EXPECT_THROW_MSG(moe_gate_up_swiglu(gpu, args(w64, shifted)),
                   "moe_gate_up_swiglu: out must be 16-byte aligned");
}

}  // namespace
}  // namespace groupmm::test
