// The router's ops on the GPU against the CPU reference on fresh random inputs, outputs poisoned
// first: router forward / backward (bit for bit, ties and group-limited routing included; the
// losses within rounding; one chunk of tokens and several), and the router GEMMs (the logits with
// and without the bias, the one-kernel path and cuBLAS's, and their backward).
#include <algorithm>
#include <array>
#include <cmath>

#include "common/moe_pair.hpp"
#include "common/test_util.hpp"
#include "base/cpu_util.hpp"
#include "groupmm/moe.hpp"

namespace groupmm::test {
namespace {

// ---- router
// ---------------------------------------------------------------------------------------
struct RouterCase {
  const char* name;
  int64_t T, E, k;
  RouterScore score;
  int64_t n_group, topk_group;
  bool renorm, bias, aux, z, ties;
  float scale;
};

class RouterGpu : public ::testing::TestWithParam<RouterCase> {};

TEST_P(RouterGpu, ForwardAndBackwardEqualTheCpuReference) {
  GROUPMM_REQUIRE_GPU();
  const RouterCase rc = GetParam();
  const int64_t T = rc.T, E = rc.E, k = rc.k;
  const RouterConfig c{.experts = E,
                       .topk = k,
                       .score = rc.score,
                       .n_group = rc.n_group,
                       .topk_group = rc.topk_group,
                       .renormalize = rc.renorm,
                       .scaling_factor = rc.scale,
                       .aux_loss_coeff = rc.aux ? 0.01f : 0.0f,
                       .z_loss_coeff = rc.z ? 0.001f : 0.0f};
  Context cpu(Device::CPU), gpu(Device::CUDA);
  Pair logits(DType::fp32, {T, E}), bias(DType::fp32, {E}), ids(DType::int32, {T, k}),
      w(DType::fp32, {T, k}), counts(DType::int32, {E}), aux(DType::fp32, {1}), z(DType::fp32, {1});
  std::vector<float> l = randn(size_t(T * E), 2.0f);
  if (rc.ties)  // few distinct values: many exact ties in every row
    for (auto& v : l) v = std::round(v * 2) / 2;
  logits.fill_floats(l);
  bias.fill_floats(randn(size_t(E), 0.1f));
  auto args = [&](bool dev) {
    auto v = [&](Pair& p) -> TensorView { return dev ? p.dev.view() : p.host; };
    return RouterArgs{.logits = v(logits),
                      .expert_bias = rc.bias ? v(bias) : TensorView(),
                      .expert_ids = v(ids),
                      .weights = v(w),
                      .counts = v(counts),
                      .aux_loss = v(aux),
                      .z_loss = v(z)};
  };
  moe_router_forward(cpu, c, args(false));
  moe_router_forward(gpu, c, args(true));
  EXPECT_NO_THROW(gpu.check());
  ids.expect_same("expert ids");
  w.expect_same("weights");
  counts.expect_same("counts");
  if (rc.aux)
    EXPECT_NEAR(to_host<float>(aux.dev)[0], aux.h<float>()[0],
                1e-5 * std::fabs(aux.h<float>()[0]) + 1e-12);
  else  // given with the loss off: written 0 (both poisoned with 0xFF before)
    EXPECT_TRUE(to_host<float>(aux.dev)[0] == 0.0f && aux.h<float>()[0] == 0.0f);
  if (rc.z)
    EXPECT_NEAR(to_host<float>(z.dev)[0], z.h<float>()[0],
                1e-5 * std::fabs(z.h<float>()[0]) + 1e-12);
  else
    EXPECT_TRUE(to_host<float>(z.dev)[0] == 0.0f && z.h<float>()[0] == 0.0f);

  Pair dw(DType::fp32, {T, k}), dl(DType::fp32, {T, E});
  dw.fill_floats(randn(size_t(T * k)));
  auto bargs = [&](bool dev) {
    auto v = [&](Pair& p) -> TensorView { return dev ? p.dev.view() : p.host; };
    return RouterBackwardArgs{.logits = v(logits),
                              .expert_ids = v(ids),
                              .counts = v(counts),
                              .d_weights = v(dw),
                              .d_logits = v(dl)};
  };
  moe_router_backward(cpu, c, bargs(false));
  moe_router_backward(gpu, c, bargs(true));
  EXPECT_NO_THROW(gpu.check());
  if (!rc.z) {
    dl.expect_same("d_logits");
  } else {  // logsumexp: device logf vs host log
    const auto g = cpu::to_floats(
        TensorView(to_host<float>(dl.dev).data(), DType::fp32, Device::CPU, {T * E}));
    EXPECT_LE(rel_error(g, cpu::to_floats(dl.host)), 1e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, RouterGpu,
    ::testing::Values(RouterCase{"qwen3", 1000, 128, 8, RouterScore::softmax, 1, 1, true, false,
                                 true, true, false, 1.0f},
                      RouterCase{"dsv3", 513, 256, 8, RouterScore::sigmoid, 8, 4, true, true, true,
                                 false, false, 2.5f},
                      RouterCase{"mixtral_ties", 4097, 8, 2, RouterScore::softmax, 1, 1, true,
                                 false, true, true, true, 1.0f},
                      RouterCase{"ties_e64", 300, 64, 6, RouterScore::sigmoid, 1, 1, false, false,
                                 false, false, true, 1.0f},
                      RouterCase{"groups_ties", 200, 64, 6, RouterScore::softmax, 4, 2, false, true,
                                 true, false, true, 1.0f},
                      RouterCase{"e40_sigmoid_aux", 77, 40, 3, RouterScore::sigmoid, 1, 1, false,
                                 true, true, true, false, 1.0f},
                      RouterCase{"e1024_k32", 50, 1024, 32, RouterScore::softmax, 1, 1, true, false,
                                 false, false, false, 1.0f},
                      RouterCase{"e1_t1", 1, 1, 1, RouterScore::softmax, 1, 1, false, false, true,
                                 true, false, 1.0f},
                      // One chunk of tokens (at most kRouterChunkTokens): one launch writes the
                      // counts and losses; nine tokens take the finalize kernel.
                      RouterCase{"gptoss_t5", 5, 128, 4, RouterScore::softmax, 1, 1, true, false,
                                 true, true, false, 1.0f},
                      RouterCase{"t8_sigmoid_bias", 8, 64, 6, RouterScore::sigmoid, 1, 1, false,
                                 true, true, false, false, 1.0f},
                      RouterCase{"t3_losses_off", 3, 32, 2, RouterScore::softmax, 1, 1, true, false,
                                 false, false, false, 1.0f},
                      RouterCase{"t9_two_chunks", 9, 64, 6, RouterScore::softmax, 1, 1, true, false,
                                 true, true, false, 1.0f},
                      RouterCase{"t0", 0, 16, 2, RouterScore::softmax, 1, 1, false, false, true,
                                 true, false, 1.0f}),
    [](const auto& info) { return std::string(info.param.name); });

// The top-k compares 64-bit rank keys on the device and router::better on the host: special
// values must rank the same (NaN after every number and NaNs by index, +-inf, exact ties).
// Softmax with a +inf logit makes a whole row NaN; sigmoid keeps the NaN to its expert.
TEST(RouterGpuSpecialValues, SelectionEqualsTheCpuReference) {
  GROUPMM_REQUIRE_GPU();
  const float nan = std::nanf(""), inf = INFINITY;
  for (RouterScore score : {RouterScore::sigmoid, RouterScore::softmax}) {
    SCOPED_TRACE(score == RouterScore::sigmoid ? "sigmoid" : "softmax");
    const int64_t T = 257, E = 64, k = 6;
    const RouterConfig c{.experts = E, .topk = k, .score = score, .renormalize = true};
    Context cpu(Device::CPU), gpu(Device::CUDA);
    Pair logits(DType::fp32, {T, E}), bias(DType::fp32, {E}), ids(DType::int32, {T, k}),
        w(DType::fp32, {T, k}), counts(DType::int32, {E});
    std::vector<float> l = randn(size_t(T * E), 2.0f);
    for (int64_t t = 0; t < T; ++t) {
      float* row = l.data() + t * E;
      const int64_t a = t % E;
      // Row kinds by t % 5: two NaNs; tied +inf; -inf and a NaN; all tied; signed zeros.
      const int kind = int(t % 5);
      if (kind == 0) row[a] = nan, row[(a + 7) % E] = nan;
      if (kind == 1) row[a] = inf, row[(a + 3) % E] = inf;
      if (kind == 2) row[a] = -inf, row[(a + 1) % E] = nan;
      if (kind == 3) std::fill(row, row + E, 0.5f);
      if (kind == 4) row[a] = -0.0f, row[(a + 9) % E] = 0.0f;
    }
    logits.fill_floats(l);
    auto args = [&](bool dev) {
      auto v = [&](Pair& p) -> TensorView { return dev ? p.dev.view() : p.host; };
      return RouterArgs{
          .logits = v(logits), .expert_ids = v(ids), .weights = v(w), .counts = v(counts)};
    };
    moe_router_forward(cpu, c, args(false));
    moe_router_forward(gpu, c, args(true));
    EXPECT_NO_THROW(gpu.check());
    ids.expect_same("expert ids");
    counts.expect_same("counts");
    const std::vector<float> gw = to_host<float>(w.dev);
    for (int64_t i = 0; i < T * k; ++i) {  // NaN payloads may differ between the backends
      const float a = gw[size_t(i)], b = w.h<float>()[i];
      EXPECT_TRUE((std::isnan(a) && std::isnan(b)) || float_bits(a) == float_bits(b))
          << "weight " << i << ": gpu " << a << ", cpu " << b;
    }
  }
}

struct LogitsCase {
  int64_t T, H, E;
  bool bias;
};

class RouterGemmGpu : public ::testing::TestWithParam<LogitsCase> {};

TEST_P(RouterGemmGpu, LogitsAndBackwardMatchCpu) {
  GROUPMM_REQUIRE_GPU();
  const LogitsCase c = GetParam();
  const int64_t T = c.T, H = c.H, E = c.E;
  Context cpu(Device::CPU), gpu(Device::CUDA);
  Pair x(DType::bf16, {T, H}), w(DType::bf16, {E, H}), l(DType::fp32, {T, E}),
      dl(DType::fp32, {T, E}), dx(DType::bf16, {T, H}), dw(DType::fp32, {E, H}),
      b(DType::bf16, {E});
  x.fill_floats(randn(size_t(T * H)));
  w.fill_floats(randn(size_t(E * H), 0.05f));
  b.fill_floats(randn(size_t(E)));
  dl.fill_floats(randn(size_t(T * E)));
  dx.fill_floats(randn(size_t(T * H)));  // accumulated into
  dw.fill_floats(randn(size_t(E * H)));
  moe_router_logits(cpu, x.host, w.host, l.host, c.bias ? b.host : TensorView());
  moe_router_logits(gpu, x.dev, w.dev, l.dev, c.bias ? b.dev.view() : TensorView());
  auto f = [](const Pair& p) {
    auto b = p.dev_bytes();
    return cpu::to_floats(TensorView(b.data(), p.host.dtype, Device::CPU, {p.host.numel()}));
  };
  EXPECT_LE(rel_error(f(l), cpu::to_floats(l.host)), 1e-5);
  const auto first = l.dev_bytes();  // a fixed order: the same bits again
  moe_router_logits(gpu, x.dev, w.dev, l.dev, c.bias ? b.dev.view() : TensorView());
  EXPECT_EQ(l.dev_bytes(), first);
  moe_router_logits_backward(cpu, dl.host, x.host, w.host, dx.host, dw.host, true, true);
  moe_router_logits_backward(gpu, dl.dev, x.dev, w.dev, dx.dev, dw.dev, true, true);
  EXPECT_LE(rel_error(f(dx), cpu::to_floats(dx.host)), 1e-2);
  EXPECT_LE(rel_error(f(dw), cpu::to_floats(dw.host)), 1e-5);
  EXPECT_NO_THROW(gpu.check());
}

// cuBLAS (+ the bias's kernel) above 16 tokens, the one-kernel path up to 16 (16-byte vectors, or
// single elements when H % 8 != 0).
INSTANTIATE_TEST_SUITE_P(
    Cases, RouterGemmGpu,
    ::testing::Values(LogitsCase{333, 256, 24, false}, LogitsCase{333, 256, 24, true},
                      LogitsCase{17, 264, 24, true}, LogitsCase{1, 2880, 128, true},
                      LogitsCase{16, 2880, 128, false}, LogitsCase{5, 13, 7, true}),
    [](const auto& info) {
      const LogitsCase& c = info.param;
      return detail::cat("T", c.T, "_H", c.H, "_E", c.E, c.bias ? "_bias" : "");
    });

}  // namespace
}  // namespace groupmm::test
