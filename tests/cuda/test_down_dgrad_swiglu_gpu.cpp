// The fused down-projection backward (moe_down_dgrad_swiglu: gathered dy, the down weight read
// N-major, the weighted SwiGLU's backward in the epilogue, row-owning CTAs) on the GPU:
//  - against the CPU reference on fresh random inputs, outputs poisoned first;
//  - against the unfused CUDA chain (moe_unpermute_backward, gemm_dgrad, weighted_swiglu_backward):
//    dgate_up bit for bit, dprob within fp32 rounding (its sum runs in another fixed order);
//  - two runs bit-identical, dprob included; the epilogue-warps schedule: dgate_up the same bits,
//    its dprob (another order) deterministic; a CUDA graph replayed with new routing equals eager;
//  - zero-row experts, all tokens on one expert, padded experts (src_row -1), T = 1, k = 1, E = 1,
//    E = 256, H not a multiple of 64, F not a multiple of the 256-column tile (and below 64), fp16;
//    bad src_row and splits reported, nothing written outside.
#include <algorithm>
#include <cmath>

#include "common/gathered_cases.hpp"
#include "common/moe_pair.hpp"
#include "common/test_util.hpp"
#include "groupmm/gemm.hpp"
#include "groupmm/moe.hpp"

namespace groupmm::test {
namespace {

class DownDgradGpu : public ::testing::TestWithParam<GatheredCase> {};

TEST_P(DownDgradGpu, EqualsTheReferenceAndTheUnfusedChain) {
  GROUPMM_REQUIRE_GPU();
  const GatheredCase c = GetParam();
  const int64_t T = c.T, k = c.k, E = c.E, H = c.H, F = c.F;
  Context cpu(Device::CPU), gpu(Device::CUDA);
  ASSERT_TRUE(moe_down_dgrad_swiglu_supported(gpu, c.dtype, H, F, E));
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

  Pair dy(c.dtype, {T, H}), w(c.dtype, {E, H, F}), gu(c.dtype, {R, 2 * F}),
      dgu(c.dtype, {R, 2 * F}), dp(DType::fp32, {R});
  dy.fill_floats(randn(size_t(T * H)));
  w.fill_floats(randn(size_t(E * H * F), 1.0f / std::sqrt(float(H))));
  gu.fill_floats(randn(size_t(R * 2 * F), 2.0f));
  auto args = [&](bool dev, const TensorView& dg, const TensorView& dpr) {
    auto v = [&](Pair& p) -> TensorView { return dev ? p.dev.view() : p.host; };
    return MoeDownDgradArgs{.dy = v(dy),
                            .src_row = v(src),
                            .splits = dev ? m.dev.splits : m.host.splits,
                            .w = v(w),
                            .gate_up = v(gu),
                            .prob = v(probs),
                            .dgate_up = dg,
                            .dprob = dpr};
  };
  fill_bytes(dgu.dev, 0xFF);
  fill_bytes(dp.dev, 0xFF);
  moe_down_dgrad_swiglu(cpu, args(false, dgu.host, dp.host));
  moe_down_dgrad_swiglu(gpu, args(true, dgu.dev, dp.dev));
  ASSERT_NO_THROW(gpu.check());
  EXPECT_LE(rel_error(as_floats(dgu), cpu::to_floats(dgu.host)), 1e-2) << "dgate_up";
  EXPECT_LE(rel_error(as_floats(dp), cpu::to_floats(dp.host)), 1e-2) << "dprob";
  for (const Pair* p : {&dgu, &dp}) {  // fully written: no poison left
    const auto f = as_floats(*p);
    EXPECT_TRUE(std::all_of(f.begin(), f.end(), [](float v) { return std::isfinite(v); }));
  }

  // The unfused chain on the GPU: the same dgate_up bits; dprob within its summation order.
  Tensor dyp = Tensor::empty({R, H}, c.dtype, Device::CUDA);
  Tensor da = Tensor::empty({R, F}, c.dtype, Device::CUDA);
  Tensor dgu2 = Tensor::empty({R, 2 * F}, c.dtype, Device::CUDA);
  Tensor dp2 = Tensor::empty({R}, DType::fp32, Device::CUDA);
  moe_unpermute_backward(gpu, dy.dev, m.dev, dyp);
  gemm_dgrad(gpu, dyp, w.dev, m.dev.splits, da);
  weighted_swiglu_backward(gpu, da, gu.dev, probs.dev, dgu2, dp2);
  EXPECT_EQ(to_host<uint8_t>(dgu2.view()), dgu.dev_bytes()) << "dgate_up vs unfused";
  const auto dpf = as_floats(dp), dp2f = to_host<float>(dp2.view());
  EXPECT_LE(rel_error(dpf, dp2f), 1e-5) << "dprob vs unfused";

  // Run again into fresh poison: the same bits, dprob included.
  Tensor dgu3 = Tensor::empty({R, 2 * F}, c.dtype, Device::CUDA);
  Tensor dp3 = Tensor::empty({R}, DType::fp32, Device::CUDA);
  fill_bytes(dgu3, 0xFF);
  fill_bytes(dp3, 0xFF);
  moe_down_dgrad_swiglu(gpu, args(true, dgu3, dp3));
  EXPECT_EQ(to_host<uint8_t>(dgu3.view()), dgu.dev_bytes()) << "second run";
  EXPECT_EQ(to_host<uint8_t>(dp3.view()), dp.dev_bytes()) << "second run, dprob";

  // The epilogue-warps schedule: the same dgate_up bits; its own dprob order, deterministic.
  MoeDownDgradArgs ew = args(true, dgu3, dp3);
  ew.config = "epi_warps";
  Tensor dp4 = Tensor::empty({R}, DType::fp32, Device::CUDA);
  for (int run = 0; run < 2; ++run) {
    fill_bytes(dgu3, 0xFF);
    fill_bytes(dp3, 0xFF);
    moe_down_dgrad_swiglu(gpu, ew);
    EXPECT_EQ(to_host<uint8_t>(dgu3.view()), dgu.dev_bytes()) << "epi_warps, run " << run;
    EXPECT_LE(rel_error(to_host<float>(dp3.view()), dp2f), 1e-5) << "epi_warps dprob vs unfused";
    if (run == 0)
      GROUPMM_CHECK_CUDA(cudaMemcpy(dp4.data(), dp3.data(), size_t(R) * 4, cudaMemcpyDefault));
    else
      EXPECT_EQ(to_host<uint8_t>(dp3.view()), to_host<uint8_t>(dp4.view())) << "epi_warps dprob";
  }
  ASSERT_NO_THROW(gpu.check());
}

INSTANTIATE_TEST_SUITE_P(
    Cases, DownDgradGpu,
    ::testing::ValuesIn(
        gathered_cases_with({GatheredCase{"f_not_mult_256", 300, 2, 8, 256, 328, 1, 3, DType::bf16},
                             GatheredCase{"f_24", 150, 2, 4, 128, 24, 1, 0, DType::bf16},
                             GatheredCase{"wide_f", 600, 2, 4, 256, 1152, 1, 3, DType::bf16}})),
    [](const auto& info) { return std::string(info.param.name); });

// Graph safe: captured plan + sources + fused backward, replayed after the routing changed,
// equals eager execution on the new routing (each configuration).
class DownDgradGpuGraph : public ::testing::TestWithParam<const char*> {};

TEST_P(DownDgradGpuGraph, ReplayWithNewRoutingEqualsEager) {
  GROUPMM_REQUIRE_GPU();
  const GatheredCase c{"graph", 600, 4, 32, 256, 320, 1, 0, DType::bf16};
  const int64_t T = c.T, k = c.k, E = c.E, H = c.H, F = c.F;
  cudaStream_t stream;
  GROUPMM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    Context ctx(Device::CUDA, stream);
    Pair ids(DType::int32, {T, k}), wt(DType::fp32, {T, k}), dy(c.dtype, {T, H}),
        w(c.dtype, {E, H, F});
    MapPair m(T, k, E);
    const int64_t R = m.dev.rows;
    Pair src(DType::int32, {R}), probs(DType::fp32, {R}), gu(c.dtype, {R, 2 * F}),
        dgu(c.dtype, {R, 2 * F}), dp(DType::fp32, {R});
    dy.fill_floats(randn(size_t(T * H)));
    w.fill_floats(randn(size_t(E * H * F), 0.06f));
    wt.fill_floats(randn(size_t(T * k)));
    gu.fill_floats(randn(size_t(R * 2 * F)));
    ctx.reserve_workspace(moe_permute_plan_workspace_size(ctx, T, k, E));
    auto run = [&] {
      moe_permute_plan(ctx, ids.dev, m.dev);
      moe_permute_sources(ctx, m.dev, src.dev, wt.dev, probs.dev);
      moe_down_dgrad_swiglu(ctx, MoeDownDgradArgs{.dy = dy.dev,
                                                  .src_row = src.dev,
                                                  .splits = m.dev.splits,
                                                  .w = w.dev,
                                                  .gate_up = gu.dev,
                                                  .prob = probs.dev,
                                                  .dgate_up = dgu.dev,
                                                  .dprob = dp.dev,
                                                  .config = GetParam()});
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
      fill_bytes(dgu.dev, 0xFF, stream);
      fill_bytes(dp.dev, 0xFF, stream);
      GROUPMM_CHECK_CUDA(cudaGraphLaunch(exec, stream));
      GROUPMM_CHECK_CUDA(cudaStreamSynchronize(stream));
      const auto replayed = dgu.dev_bytes(), replayed_dp = dp.dev_bytes();
      fill_bytes(dgu.dev, 0xFF, stream);
      fill_bytes(dp.dev, 0xFF, stream);
      run();
      GROUPMM_CHECK_CUDA(cudaStreamSynchronize(stream));
      EXPECT_EQ(replayed, dgu.dev_bytes()) << "routing pattern " << pattern;
      EXPECT_EQ(replayed_dp, dp.dev_bytes()) << "routing pattern " << pattern;
    }
    EXPECT_NO_THROW(ctx.check());
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(Configs, DownDgradGpuGraph, ::testing::Values("coop_128x256", "epi_warps"),
                         [](const auto& info) { return std::string(info.param); });

// Bad device data: a src_row out of range reads as a zero row and sets kFaultBadIndex; splits
// summing past R are clamped and reported; nothing is written past the outputs.
class DownDgradGpuFaults : public ::testing::TestWithParam<const char*> {};

TEST_P(DownDgradGpuFaults, BadRowMapAndSplitsAreReported) {
  GROUPMM_REQUIRE_GPU();
  const int64_t T = 64, E = 4, H = 128, F = 136, R = 384;
  Context gpu(Device::CUDA);
  Pair dy(DType::bf16, {T, H}), w(DType::bf16, {E, H, F}), src(DType::int32, {R}),
      probs(DType::fp32, {R}), splits(DType::int32, {E}), gu(DType::bf16, {R, 2 * F});
  dy.fill_floats(randn(size_t(T * H)));
  w.fill_floats(randn(size_t(E * H * F), 0.1f));
  probs.fill_floats(randn(size_t(R)));
  gu.fill_floats(randn(size_t(R * 2 * F)));
  for (int64_t r = 0; r < R; ++r) src.h<int32_t>()[r] = int32_t(r % T);
  src.h<int32_t>()[5] = int32_t(T);  // out of range
  src.upload();
  for (int64_t e = 0; e < E; ++e) splits.h<int32_t>()[e] = int32_t(R / E);
  splits.upload();
  // outputs with a guard band after each: the kernel must not touch them
  const int64_t guard = 4096;
  Tensor buf = Tensor::empty({R * 2 * F + guard}, DType::bf16, Device::CUDA);
  Tensor pbuf = Tensor::empty({R + guard}, DType::fp32, Device::CUDA);
  fill_bytes(buf, 0x7F);
  fill_bytes(pbuf, 0x7F);
  MoeDownDgradArgs a{.dy = dy.dev,
                     .src_row = src.dev,
                     .splits = splits.dev,
                     .w = w.dev,
                     .gate_up = gu.dev,
                     .prob = probs.dev,
                     .dgate_up = TensorView(buf.data(), DType::bf16, Device::CUDA, {R, 2 * F}),
                     .dprob = TensorView(pbuf.data(), DType::fp32, Device::CUDA, {R}),
                     .config = GetParam()};
  moe_down_dgrad_swiglu(gpu, a);
  StatusBlock s = gpu.take_status();
  EXPECT_EQ(s.bits, kFaultBadIndex);
  EXPECT_EQ(static_cast<OpId>(s.op), OpId::moe_down_dgrad);
  EXPECT_EQ(s.value, T);
  // the bad row is a zero row: zero gradients
  const auto dg = to_host<uint16_t>(buf.view());
  EXPECT_TRUE(std::all_of(dg.begin() + 5 * 2 * F, dg.begin() + 6 * 2 * F,
                          [](uint16_t v) { return (v & 0x7FFF) == 0; }));

  splits.h<int32_t>()[1] = int32_t(R);  // the sum runs past R
  splits.upload();
  src.h<int32_t>()[5] = 0;
  src.upload();
  moe_down_dgrad_swiglu(gpu, a);
  s = gpu.take_status();
  EXPECT_TRUE(s.bits & kFaultSplitsOverflow) << s.bits;
  const auto all = to_host<uint16_t>(buf.view());
  EXPECT_TRUE(std::all_of(all.begin() + R * 2 * F, all.end(), [](uint16_t v) {
    return v == 0x7F7F;
  })) << "written past dgate_up";
  const auto pall = to_host<uint32_t>(pbuf.view());
  EXPECT_TRUE(std::all_of(pall.begin() + R, pall.end(), [](uint32_t v) {
    return v == 0x7F7F7F7Fu;
  })) << "written past dprob";
}

INSTANTIATE_TEST_SUITE_P(Configs, DownDgradGpuFaults,
                         ::testing::Values("coop_128x256", "epi_warps"),
                         [](const auto& info) { return std::string(info.param); });

// Host validation names the op, the argument and the value.
TEST(DownDgradGpuErrors, ShapesOutsideTheKernelAreRefused) {
  GROUPMM_REQUIRE_GPU();
  Context gpu(Device::CUDA);
  const int64_t T = 8, E = 2, H = 64, R = 16, F = 20;
  auto t = [](std::initializer_list<int64_t> d, DType dt) {
    return Tensor::empty(d, dt, Device::CUDA);
  };
  Tensor dy = t({T, H}, DType::bf16), src = t({R}, DType::int32), sp = t({E}, DType::int32),
         pr = t({R}, DType::fp32), dp = t({R}, DType::fp32), w = t({E, H, F}, DType::bf16),
         gu = t({R, 2 * F}, DType::bf16), dgu = t({R, 2 * F}, DType::bf16);
  MoeDownDgradArgs a{.dy = dy,
                     .src_row = src,
                     .splits = sp,
                     .w = w,
                     .gate_up = gu,
                     .prob = pr,
                     .dgate_up = dgu,
                     .dprob = dp};
  EXPECT_THROW_MSG(moe_down_dgrad_swiglu(gpu, a), "moe_down_dgrad_swiglu: w.shape[2]=20 (F)");
  EXPECT_FALSE(moe_down_dgrad_swiglu_supported(gpu, DType::bf16, H, F, E));
  EXPECT_FALSE(moe_down_dgrad_swiglu_supported(gpu, DType::fp32, H, 64, E));
  // The epilogue stores 8 columns at once: an output view 2 elements into its buffer is refused.
  Tensor w64 = t({E, H, 64}, DType::bf16), gu64 = t({R, 128}, DType::bf16),
         big = t({R * 128 + 8}, DType::bf16);
  a.w = w64;
  a.gate_up = gu64;
  a.dgate_up =
      TensorView(static_cast<uint16_t*>(big.data()) + 2, DType::bf16, Device::CUDA, {R, 128});
  EXPECT_THROW_MSG(moe_down_dgrad_swiglu(gpu, a),
                   "moe_down_dgrad_swiglu: dgate_up must be 16-byte aligned");
  a.dgate_up = t({R, 128}, DType::bf16);
  a.config = "pingpong";
  EXPECT_THROW_MSG(moe_down_dgrad_swiglu(gpu, a),
                   "moe_down_dgrad_swiglu: config=\"pingpong\" must be empty, coop_128x256 or "
                   "epi_warps");
}

}  // namespace
}  // namespace groupmm::test
