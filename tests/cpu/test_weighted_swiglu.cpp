// Router-weighted SwiGLU on the CPU backend: against a float64 formula, its backward against
// finite differences (d gate_up and d prob), and the validation messages.
#include <cmath>

#include "common/test_util.hpp"
#include "groupmm/moe.hpp"

namespace groupmm::test {
namespace {

double silu(double g) {
  return g / (1.0 + std::exp(-g));
}

TEST(WeightedSwigluCpu, ForwardIsSwigluTimesTheRowWeight) {
  Context ctx(Device::CPU);
  const int64_t M = 5, I = 6;
  std::vector<float> gu = randn(size_t(M * 2 * I), 1.5f), p = randn(static_cast<size_t>(M)),
                     out(size_t(M * I));
  weighted_swiglu_forward(ctx, host_view(gu, DType::fp32, {M, 2 * I}),
                          host_view(p, DType::fp32, {M}), host_view(out, DType::fp32, {M, I}));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t i = 0; i < I; ++i) {
      const double ref =
          silu(gu[size_t(m * 2 * I + i)]) * gu[size_t(m * 2 * I + I + i)] * p[size_t(m)];
      EXPECT_NEAR(out[size_t(m * I + i)], ref, 1e-5 * (1 + std::fabs(ref)));
    }
}

// L = sum(r * out): d gate_up and d prob by central differences.
TEST(WeightedSwigluCpu, BackwardMatchesFiniteDifferences) {
  Context ctx(Device::CPU);
  const int64_t M = 3, I = 4;
  std::vector<float> gu = randn(size_t(M * 2 * I)), p = randn(static_cast<size_t>(M)),
                     r = randn(size_t(M * I));
  auto loss = [&](const std::vector<float>& g, const std::vector<float>& pr) {
    std::vector<float> out(size_t(M * I));
    weighted_swiglu_forward(
        ctx, TensorView(const_cast<float*>(g.data()), DType::fp32, Device::CPU, {M, 2 * I}),
        TensorView(const_cast<float*>(pr.data()), DType::fp32, Device::CPU, {M}),
        host_view(out, DType::fp32, {M, I}));
    double s = 0;
    for (size_t i = 0; i < out.size(); ++i) s += double(r[i]) * out[i];
    return s;
  };
  std::vector<float> dgu(size_t(M * 2 * I)), dp(static_cast<size_t>(M));
  weighted_swiglu_backward(ctx, host_view(r, DType::fp32, {M, I}),
                           host_view(gu, DType::fp32, {M, 2 * I}), host_view(p, DType::fp32, {M}),
                           host_view(dgu, DType::fp32, {M, 2 * I}),
                           host_view(dp, DType::fp32, {M}));
  const float h = 1e-2f;
  for (size_t i = 0; i < gu.size(); ++i) {
    std::vector<float> a = gu, b = gu;
    a[i] += h;
    b[i] -= h;
    const double fd = (loss(a, p) - loss(b, p)) / (2 * h);
    EXPECT_NEAR(dgu[i], fd, 1e-3 + 1e-3 * std::fabs(fd)) << "gate_up " << i;
  }
  for (size_t i = 0; i < p.size(); ++i) {
    std::vector<float> a = p, b = p;
    a[i] += h;
    b[i] -= h;
    const double fd = (loss(gu, a) - loss(gu, b)) / (2 * h);
    EXPECT_NEAR(dp[i], fd, 1e-3 + 1e-3 * std::fabs(fd)) << "prob " << i;
  }
}

TEST(WeightedSwigluCpu, ClearErrors) {
  Context ctx(Device::CPU);
  std::vector<float> gu(24), p(3), out(12), dgu(24), dp(3);
  const TensorView GU = host_view(gu, DType::fp32, {3, 8}),
                   OUT = host_view(out, DType::fp32, {3, 4});
  EXPECT_THROW_MSG(weighted_swiglu_forward(ctx, GU, host_view(p, DType::fp32, {2}), OUT),
                   "weighted_swiglu_forward: prob.shape[0]=2 must equal 3");
  EXPECT_THROW_MSG(weighted_swiglu_forward(ctx, GU, host_view(p, DType::fp32, {3}),
                                           host_view(gu, DType::fp32, {3, 4})),
                   "weighted_swiglu_forward: out may not alias gate_up or prob");
  EXPECT_THROW_MSG(weighted_swiglu_backward(ctx, OUT, GU, host_view(p, DType::fp32, {3}),
                                            host_view(dgu, DType::fp32, {3, 8}),
                                            host_view(dp, DType::int32, {3})),
                   "weighted_swiglu_backward: dprob.dtype=int32 must be fp32");
}

}  // namespace
}  // namespace groupmm::test
