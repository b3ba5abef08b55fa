// MoE ops on the GPU against the CPU reference on fresh random inputs, outputs poisoned first:
// permute plan (bit for bit: empty experts, all tokens on one expert, padding, capacity, T = 1,
// k = 1, E = 1, the one-launch plan and the three-launch one), the row movers (bit for bit, odd H,
// the routed bias), and the weighted SwiGLU, plain and with gpt-oss's SwigluForm (within an ulp;
// dprob deterministic; the form graph captured). The router's are in test_moe_router_gpu.cpp.
#include <algorithm>
#include <array>
#include <cmath>

#include "common/moe_pair.hpp"
#include "common/test_util.hpp"
#include "base/cpu_util.hpp"
#include "groupmm/moe.hpp"

namespace groupmm::test {
namespace {

// ---- permute plan and row movers ----------------------------------------------------------------
struct PermuteCase {
  const char* name;
  int64_t T, k, E, align, capacity, H;
  int pattern;  // 0 random distinct, 1 all tokens on expert E-1 (k = 1), 2 only even experts
  DType dtype;
};

std::vector<int32_t> make_ids(const PermuteCase& c) {
  std::vector<int32_t> ids(size_t(c.T * c.k));
  std::vector<int32_t> pool;
  for (int64_t e = 0; e < c.E; ++e)
    if (c.pattern != 2 || e % 2 == 0) pool.push_back(int32_t(e));
  for (int64_t t = 0; t < c.T; ++t) {
    std::shuffle(pool.begin(), pool.end(), rng());
    for (int64_t j = 0; j < c.k; ++j)
      ids[size_t(t * c.k + j)] = c.pattern == 1 ? int32_t(c.E - 1) : pool[size_t(j) % pool.size()];
  }
  return ids;
}

class PermuteGpu : public ::testing::TestWithParam<PermuteCase> {};

TEST_P(PermuteGpu, PlanAndRowMoversEqualTheCpuReference) {
  GROUPMM_REQUIRE_GPU();
  const PermuteCase c = GetParam();
  Context cpu(Device::CPU), gpu(Device::CUDA);
  Pair ids(DType::int32, {c.T, c.k});
  const auto idv = make_ids(c);
  std::copy(idv.begin(), idv.end(), ids.h<int32_t>());
  ids.upload();
  MapPair m(c.T, c.k, c.E, c.align, c.capacity);
  moe_permute_plan(cpu, ids.host, m.host);
  moe_permute_plan(gpu, ids.dev, m.dev);
  EXPECT_NO_THROW(gpu.check());
  m.dest.expect_same("dest_row");
  m.meta.expect_same("row_start | kept | splits");

  const int64_t T = c.T, k = c.k, H = c.H, R = m.host.rows;
  Pair x(c.dtype, {T, H}), w(DType::fp32, {T, k}), xp(c.dtype, {R, H}), probs(DType::fp32, {R});
  x.fill_floats(randn(size_t(T * H)));
  w.fill_floats(randn(size_t(T * k)));
  moe_permute(cpu, x.host, m.host, xp.host, w.host, probs.host);
  moe_permute(gpu, x.dev, m.dev, xp.dev, w.dev, probs.dev);
  xp.expect_same("x_perm");
  probs.expect_same("probs");

  Pair g(c.dtype, {R, H}), gp(DType::fp32, {R}), add(c.dtype, {T, H}), dx(c.dtype, {T, H}),
      dw(DType::fp32, {T, k}), y(c.dtype, {T, H}), dyp(c.dtype, {R, H});
  g.fill_floats(randn(size_t(R * H)));
  gp.fill_floats(randn(static_cast<size_t>(R)));
  add.fill_floats(randn(size_t(T * H)));
  moe_permute_backward(cpu, g.host, m.host, dx.host, gp.host, dw.host, add.host);
  moe_permute_backward(gpu, g.dev, m.dev, dx.dev, gp.dev, dw.dev, add.dev);
  dx.expect_same("dx (permute backward)");
  dw.expect_same("d_weights");
  moe_unpermute(cpu, g.host, m.host, y.host);
  moe_unpermute(gpu, g.dev, m.dev, y.dev);
  y.expect_same("y (unpermute)");
  // The routed bias (dropped pairs add none), then the addend.
  Pair bias(c.dtype, {c.E, H}), yb(c.dtype, {T, H});
  bias.fill_floats(randn(size_t(c.E * H)));
  moe_unpermute(cpu, g.host, m.host, yb.host, add.host, RoutedBias{bias.host, ids.host, w.host});
  moe_unpermute(gpu, g.dev, m.dev, yb.dev, add.dev, RoutedBias{bias.dev, ids.dev, w.dev});
  yb.expect_same("y (unpermute, routed bias and addend)");
  moe_unpermute_backward(cpu, x.host, m.host, dyp.host);
  moe_unpermute_backward(gpu, x.dev, m.dev, dyp.dev);
  dyp.expect_same("dy_perm (unpermute backward)");
  EXPECT_NO_THROW(gpu.check());
}

INSTANTIATE_TEST_SUITE_P(
    Cases, PermuteGpu,
    ::testing::Values(PermuteCase{"qwen3ish", 2048, 8, 128, 1, 0, 256, 0, DType::bf16},
                      PermuteCase{"pad16_fp16", 1000, 4, 32, 16, 0, 64, 0, DType::fp16},
                      PermuteCase{"pad128_empty", 777, 2, 16, 128, 0, 128, 2, DType::bf16},
                      PermuteCase{"capacity", 1500, 2, 8, 1, 300, 96, 0, DType::bf16},
                      PermuteCase{"capacity_pad", 900, 3, 12, 16, 150, 40, 2, DType::fp32},
                      PermuteCase{"all_one_expert", 500, 1, 8, 1, 0, 72, 1, DType::bf16},
                      PermuteCase{"odd_h", 301, 3, 7, 1, 0, 13, 0, DType::bf16},
                      PermuteCase{"t1_k1_e1", 1, 1, 1, 1, 0, 24, 0, DType::bf16},
                      PermuteCase{"dsv3_h", 64, 8, 32, 1, 0, 7168, 0, DType::bf16},
                      // Rows wider than a CTA's threads times the gather's vectors per thread
                      // (4 for k = 2..3, 2 for k = 4..7, 8 for k = 1), ending mid-batch.
                      PermuteCase{"mixtral_h_ragged", 300, 2, 8, 1, 0, 4416, 0, DType::bf16},
                      PermuteCase{"k5_h_ragged", 200, 5, 16, 16, 0, 2056, 2, DType::fp16},
                      PermuteCase{"k1_wide", 90, 1, 4, 1, 0, 8200, 0, DType::bf16},
                      // One 16-byte vector per row: fewer lanes per row (1-2) than choices, so
                      // the gather's lanes write several d_weights each.
                      PermuteCase{"k6_h8", 333, 6, 16, 1, 0, 8, 0, DType::bf16},
                      PermuteCase{"k5_h16_pad", 210, 5, 16, 16, 0, 16, 2, DType::bf16},
                      // Decode batches: one launch plans them, and the gather splits each row
                      // over several CTAs (gpt-oss's rows: 360 vectors).
                      PermuteCase{"gptoss_t1", 1, 4, 128, 1, 0, 2880, 0, DType::bf16},
                      PermuteCase{"gptoss_t8", 8, 4, 128, 1, 0, 2880, 0, DType::bf16},
                      // The three-launch plan: more chunks than the one-CTA plan's warps, and
                      // more counters than its shared memory holds.
                      PermuteCase{"t4097_k2", 4097, 2, 64, 1, 0, 16, 0, DType::bf16},
                      PermuteCase{"e512_t2048", 2048, 4, 512, 1, 0, 8, 0, DType::bf16}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(PermuteGpuFaults, BadExpertIdIsSkippedAndReported) {
  GROUPMM_REQUIRE_GPU();
  Context gpu(Device::CUDA);
  PermuteCase c{"bad", 40, 2, 4, 1, 0, 8, 0, DType::bf16};
  MapPair m(c.T, c.k, c.E, c.align, c.capacity);
  auto idv = make_ids(c);
  idv[13] = 9;
  Pair ids(DType::int32, {c.T, c.k});
  std::copy(idv.begin(), idv.end(), ids.h<int32_t>());
  ids.upload();
  moe_permute_plan(gpu, ids.dev, m.dev);
  EXPECT_THROW_MSG(gpu.check(), "device fault in moe_permute (status 0x8): index out of range");
  EXPECT_EQ(to_host<int32_t>(m.dest.dev)[13], -1);
}

// unpermute's routed bias given an id outside [0, E) for a kept pair: that term skipped (as on the
// CPU), the fault reported.
TEST(PermuteGpuFaults, RoutedBiasBadIdIsSkippedAndReported) {
  GROUPMM_REQUIRE_GPU();
  Context cpu(Device::CPU), gpu(Device::CUDA);
  PermuteCase c{"bad", 40, 2, 4, 1, 0, 8, 0, DType::bf16};
  MapPair m(c.T, c.k, c.E, c.align, c.capacity);
  auto idv = make_ids(c);
  Pair ids(DType::int32, {c.T, c.k});
  std::copy(idv.begin(), idv.end(), ids.h<int32_t>());
  ids.upload();
  moe_permute_plan(cpu, ids.host, m.host);
  moe_permute_plan(gpu, ids.dev, m.dev);
  ids.h<int32_t>()[13] = -3;
  ids.upload();
  const int64_t R = m.host.rows;
  Pair yp(c.dtype, {R, c.H}), bias(c.dtype, {c.E, c.H}), w(DType::fp32, {c.T, c.k}),
      y(c.dtype, {c.T, c.H});
  yp.fill_floats(randn(size_t(R * c.H)));
  bias.fill_floats(randn(size_t(c.E * c.H)));
  w.fill_floats(randn(size_t(c.T * c.k)));
  moe_unpermute(cpu, yp.host, m.host, y.host, TensorView(),
                RoutedBias{bias.host, ids.host, w.host});
  moe_unpermute(gpu, yp.dev, m.dev, y.dev, TensorView(), RoutedBias{bias.dev, ids.dev, w.dev});
  EXPECT_THROW_MSG(gpu.check(), "device fault in moe_unpermute (status 0x8): index out of range");
  EXPECT_THROW_MSG(cpu.check(), "device fault in moe_unpermute (status 0x8): index out of range");
  y.expect_same("y (the bad pair's bias skipped)");
}

// ---- weighted SwiGLU
// ------------------------------------------------------------------------------
class WeightedSwigluGpu : public ::testing::TestWithParam<std::tuple<DType, int64_t>> {};

TEST_P(WeightedSwigluGpu, MatchesCpuWithinAnUlpAndIsDeterministic) {
  GROUPMM_REQUIRE_GPU();
  const auto [t, I] = GetParam();
  const int64_t M = 1037;
  Context cpu(Device::CPU), gpu(Device::CUDA);
  Pair gu(t, {M, 2 * I}), p(DType::fp32, {M}), out(t, {M, I}), dout(t, {M, I}), dgu(t, {M, 2 * I}),
      dp(DType::fp32, {M});
  gu.fill_floats(randn(size_t(M * 2 * I), 2.0f));
  p.fill_floats(randn(static_cast<size_t>(M)));
  dout.fill_floats(randn(size_t(M * I)));
  weighted_swiglu_forward(cpu, gu.host, p.host, out.host);
  weighted_swiglu_forward(gpu, gu.dev, p.dev, out.dev);
  weighted_swiglu_backward(cpu, dout.host, gu.host, p.host, dgu.host, dp.host);
  weighted_swiglu_backward(gpu, dout.dev, gu.dev, p.dev, dgu.dev, dp.dev);
  auto f = [](const Pair& q) {
    auto b = q.dev_bytes();
    return cpu::to_floats(TensorView(b.data(), q.host.dtype, Device::CPU, {q.host.numel()}));
  };
  const double tol = t == DType::bf16 ? 4e-3 : (t == DType::fp16 ? 5e-4 : 1e-6);
  EXPECT_LE(rel_error(f(out), cpu::to_floats(out.host)), tol);
  EXPECT_LE(rel_error(f(dgu), cpu::to_floats(dgu.host)), tol);
  EXPECT_LE(rel_error(f(dp), cpu::to_floats(dp.host)), 1e-5);
  const auto first = dp.dev_bytes();
  weighted_swiglu_backward(gpu, dout.dev, gu.dev, p.dev, dgu.dev, dp.dev);
  EXPECT_EQ(dp.dev_bytes(), first) << "dprob differs between two runs";
}

INSTANTIATE_TEST_SUITE_P(Cases, WeightedSwigluGpu,
                         ::testing::Combine(::testing::Values(DType::bf16, DType::fp16,
                                                              DType::fp32),
                                            ::testing::Values(int64_t(768), int64_t(13))),
                         [](const auto& info) {
                           return detail::cat(dtype_name(std::get<0>(info.param)), "_I",
                                              std::get<1>(info.param));
                         });

// ---- weighted SwiGLU with a SwigluForm (gpt-oss's clamped SwiGLU)
// -------------------------------------------------------------

struct FormCase {
  DType t;
  int64_t I;
  SwigluLayout layout;
  int64_t M = 1037;  // rows (a few: the forward splits each row over several warps)
};

class WeightedSwigluFormGpu : public ::testing::TestWithParam<FormCase> {};

// Inputs of scale 6: a large share beyond the clamp at 7 (both sides of up, above for gate).
TEST_P(WeightedSwigluFormGpu, MatchesCpuEveryOutputWrittenAndDeterministic) {
  GROUPMM_REQUIRE_GPU();
  const FormCase c = GetParam();
  const SwigluForm form{1.702f, 7.0f, 1.0f, c.layout};
  const int64_t M = c.M, I = c.I;
  Context cpu(Device::CPU), gpu(Device::CUDA);
  Pair gu(c.t, {M, 2 * I}), p(DType::fp32, {M}), out(c.t, {M, I}), dout(c.t, {M, I}),
      dgu(c.t, {M, 2 * I}), dp(DType::fp32, {M});
  gu.fill_floats(randn(size_t(M * 2 * I), 6.0f));
  p.fill_floats(randn(static_cast<size_t>(M)));
  dout.fill_floats(randn(size_t(M * I)));
  weighted_swiglu_forward(cpu, gu.host, p.host, out.host, form);
  weighted_swiglu_forward(gpu, gu.dev, p.dev, out.dev, form);
  weighted_swiglu_backward(cpu, dout.host, gu.host, p.host, dgu.host, dp.host, form);
  weighted_swiglu_backward(gpu, dout.dev, gu.dev, p.dev, dgu.dev, dp.dev, form);
  EXPECT_NO_THROW(gpu.check());
  auto f = [](const Pair& q) {
    auto b = q.dev_bytes();
    return cpu::to_floats(TensorView(b.data(), q.host.dtype, Device::CPU, {q.host.numel()}));
  };
  for (const Pair* q : {&out, &dgu, &dp}) {  // poisoned with NaN: every element written
    const auto v = f(*q);
    EXPECT_EQ(std::count_if(v.begin(), v.end(), [](float x) { return !std::isfinite(x); }), 0)
        << form.to_string();
  }
  const double tol = c.t == DType::bf16 ? 4e-3 : (c.t == DType::fp16 ? 5e-4 : 1e-6);
  EXPECT_LE(rel_error(f(out), cpu::to_floats(out.host)), tol) << form.to_string();
  EXPECT_LE(rel_error(f(dgu), cpu::to_floats(dgu.host)), tol) << form.to_string();
  EXPECT_LE(rel_error(f(dp), cpu::to_floats(dp.host)), 1e-5) << form.to_string();
  const auto first = dp.dev_bytes();
  weighted_swiglu_backward(gpu, dout.dev, gu.dev, p.dev, dgu.dev, dp.dev, form);
  EXPECT_EQ(dp.dev_bytes(), first) << "dprob differs between two runs";
}

INSTANTIATE_TEST_SUITE_P(
    Cases, WeightedSwigluFormGpu,
    ::testing::Values(FormCase{DType::bf16, 1440, SwigluLayout::interleaved},  // gpt-oss: 2880/2
                      FormCase{DType::bf16, 13, SwigluLayout::interleaved},    // scalar path
                      FormCase{DType::fp16, 768, SwigluLayout::interleaved},
                      FormCase{DType::fp32, 768, SwigluLayout::interleaved},
                      FormCase{DType::fp32, 13, SwigluLayout::interleaved},
                      FormCase{DType::bf16, 768, SwigluLayout::halves},
                      FormCase{DType::fp32, 13, SwigluLayout::halves},
                      FormCase{DType::bf16, 2880, SwigluLayout::interleaved, 1},  // gpt-oss decode
                      FormCase{DType::bf16, 2880, SwigluLayout::interleaved, 4},
                      FormCase{DType::bf16, 13, SwigluLayout::halves, 3},
                      FormCase{DType::bf16, 768, SwigluLayout::halves, 20000}),  // a warp a row
    [](const auto& info) {
      return detail::cat(dtype_name(info.param.t), "_I", info.param.I, "_",
                         swiglu_layout_name(info.param.layout), "_M", info.param.M);
    });

// Graph safe: captured forward + backward replay to the eager bits.
TEST(WeightedSwigluFormGpuGraph, CapturedEqualsEager) {
  GROUPMM_REQUIRE_GPU();
  const SwigluForm form{1.702f, 7.0f, 1.0f, SwigluLayout::interleaved};
  const int64_t M = 2048, I = 1440;
  cudaStream_t stream;
  GROUPMM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    Context ctx(Device::CUDA, stream);
    Pair gu(DType::bf16, {M, 2 * I}), p(DType::fp32, {M}), dout(DType::bf16, {M, I});
    gu.fill_floats(randn(size_t(M * 2 * I), 6.0f));
    p.fill_floats(randn(static_cast<size_t>(M)));
    dout.fill_floats(randn(size_t(M * I)));
    auto outputs = [&] {
      return std::array<Tensor, 3>{Tensor::empty({M, I}, DType::bf16, Device::CUDA, stream),
                                   Tensor::empty({M, 2 * I}, DType::bf16, Device::CUDA, stream),
                                   Tensor::empty({M}, DType::fp32, Device::CUDA, stream)};
    };
    auto run = [&](std::array<Tensor, 3>& o) {
      weighted_swiglu_forward(ctx, gu.dev, p.dev, o[0], form);
      weighted_swiglu_backward(ctx, dout.dev, gu.dev, p.dev, o[1], o[2], form);
    };
    auto captured = outputs(), eager = outputs();
    GROUPMM_CHECK_CUDA(cudaDeviceSynchronize());
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    GROUPMM_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    run(captured);
    GROUPMM_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    GROUPMM_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    GROUPMM_CHECK_CUDA(cudaGraphLaunch(exec, stream));
    run(eager);
    GROUPMM_CHECK_CUDA(cudaStreamSynchronize(stream));
    for (size_t i = 0; i < 3; ++i)
      EXPECT_EQ(to_host<uint8_t>(captured[i].view()), to_host<uint8_t>(eager[i].view())) << i;
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace groupmm::test
