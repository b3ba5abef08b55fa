// Router-weighted SwiGLU on the CPU backend: against a float64 formula, its backward against
// finite differences (d gate_up and d prob), and the validation messages.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "common/test_util.hpp"
#include "groupmm/moe.hpp"

namespace groupmm::test {
namespace {

double silu(double g) {
  return g / (1.0 + std::exp(-g));
}

// Central differences of loss over each element of v (step h) against grad.
template <class Loss>
void expect_matches_finite_differences(std::vector<float>& v, const std::vector<float>& grad,
                                       Loss loss, const std::string& what) {
  const float h = 1e-2f;
  for (size_t i = 0; i < v.size(); ++i) {
    const float keep = v[i];
    v[i] = keep + h;
    const double up = loss();
    v[i] = keep - h;
    const double down = loss();
    v[i] = keep;
    const double fd = (up - down) / (2 * h);
    EXPECT_NEAR(grad[i], fd, 1e-3 + 1e-3 * std::fabs(fd)) << what << " " << i;
  }
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

// ---- SwigluForm (gpt-oss's clamped SwiGLU) ----------------------------------------------------

const SwigluForm kGptOss{1.702f, 7.0f, 1.0f, SwigluLayout::interleaved};

// gpt-oss's formula in float64 (transformers' GptOssExperts._apply_gate): gate = gate_up[..., ::2]
// clamped above at limit, up = gate_up[..., 1::2] clamped to [-limit, limit],
// out = (up + 1) * gate * sigmoid(gate * alpha).
double gpt_oss_ref(double g, double u, const SwigluForm& f) {
  g = std::min(g, double(f.limit));
  u = std::max(std::min(u, double(f.limit)), -double(f.limit));
  return (u + f.up_offset) * g / (1.0 + std::exp(-g * f.alpha));
}

TEST(WeightedSwigluCpu, FormIsGptOssClampedSwiglu) {
  Context ctx(Device::CPU);
  const int64_t M = 6, I = 5;
  // Scale 8: about a third of the values lie beyond the clamp at 7.
  std::vector<float> gu = randn(size_t(M * 2 * I), 8.0f), p = randn(static_cast<size_t>(M)),
                     out(size_t(M * I));
  for (SwigluLayout layout : {SwigluLayout::interleaved, SwigluLayout::halves}) {
    SwigluForm f = kGptOss;
    f.layout = layout;
    weighted_swiglu_forward(ctx, host_view(gu, DType::fp32, {M, 2 * I}),
                            host_view(p, DType::fp32, {M}), host_view(out, DType::fp32, {M, I}), f);
    const bool il = layout == SwigluLayout::interleaved;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t i = 0; i < I; ++i) {
        const double g = gu[size_t(m * 2 * I + (il ? 2 * i : i))];
        const double u = gu[size_t(m * 2 * I + (il ? 2 * i + 1 : I + i))];
        const double ref = gpt_oss_ref(g, u, f) * p[size_t(m)];
        EXPECT_NEAR(out[size_t(m * I + i)], ref, 1e-5 * (1 + std::fabs(ref)))
            << swiglu_layout_name(layout) << " m=" << m << " i=" << i;
      }
  }
}

// Hand-computed values: a clamped gate passes no gradient, neither does a clamped up.
TEST(WeightedSwigluCpu, FormClampsAndTheirGradients) {
  Context ctx(Device::CPU);
  // One row, I = 3, interleaved (g, u): (10, 0.5) gate clamped; (1, -9) up clamped; (-2, 3) free.
  std::vector<float> gu{10.f, .5f, 1.f, -9.f, -2.f, 3.f}, p{2.f}, out(3), d{1.f, 1.f, 1.f}, dgu(6),
      dp(1);
  weighted_swiglu_forward(ctx, host_view(gu, DType::fp32, {1, 6}), host_view(p, DType::fp32, {1}),
                          host_view(out, DType::fp32, {1, 3}), kGptOss);
  auto sig = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  EXPECT_NEAR(out[0], 2 * 7 * sig(7 * 1.702) * 1.5, 1e-5);
  EXPECT_NEAR(out[1], 2 * 1 * sig(1.702) * (-7 + 1), 1e-5);
  EXPECT_NEAR(out[2], 2 * -2 * sig(-2 * 1.702) * 4, 1e-5);
  weighted_swiglu_backward(ctx, host_view(d, DType::fp32, {1, 3}),
                           host_view(gu, DType::fp32, {1, 6}), host_view(p, DType::fp32, {1}),
                           host_view(dgu, DType::fp32, {1, 6}), host_view(dp, DType::fp32, {1}),
                           kGptOss);
  EXPECT_EQ(dgu[0], 0.0f);                            // gate 10 > 7: clamped
  EXPECT_NEAR(dgu[1], 2 * 7 * sig(7 * 1.702), 1e-5);  // up free: 2 * g' s
  EXPECT_EQ(dgu[3], 0.0f);                            // up -9 < -7: clamped
  const double s = sig(-2 * 1.702);
  EXPECT_NEAR(dgu[4], 2 * 4 * s * (1 + 1.702 * -2 * (1 - s)), 1e-5);
  EXPECT_NEAR(dp[0], (out[0] + out[1] + out[2]) / 2, 1e-5);
}

// L = sum(r * out) for the plain op (the default form) and random forms in both layouts, away
// from the clamp's kinks: d gate_up and d prob by central differences.
TEST(WeightedSwigluCpu, BackwardMatchesFiniteDifferences) {
  Context ctx(Device::CPU);
  const int64_t M = 3, I = 4;
  for (const SwigluForm& f :
       {SwigluForm{}, SwigluForm{0.7f, 2.5f, -0.5f, SwigluLayout::interleaved},
        SwigluForm{0.7f, 2.5f, -0.5f, SwigluLayout::halves}}) {
    std::vector<float> gu = randn(size_t(M * 2 * I), 2.0f), p = randn(static_cast<size_t>(M)),
                       r = randn(size_t(M * I));
    for (float& v : gu)  // keep every value 0.1 away from +-limit (finite differences at a kink)
      if (std::fabs(std::fabs(v) - f.limit) < 0.1f) v += 0.3f;
    auto loss = [&]() {
      std::vector<float> out(size_t(M * I));
      weighted_swiglu_forward(ctx, host_view(gu, DType::fp32, {M, 2 * I}),
                              host_view(p, DType::fp32, {M}), host_view(out, DType::fp32, {M, I}),
                              f);
      double s = 0;
      for (size_t i = 0; i < out.size(); ++i) s += double(r[i]) * out[i];
      return s;
    };
    std::vector<float> dgu(size_t(M * 2 * I)), dp(static_cast<size_t>(M));
    weighted_swiglu_backward(ctx, host_view(r, DType::fp32, {M, I}),
                             host_view(gu, DType::fp32, {M, 2 * I}), host_view(p, DType::fp32, {M}),
                             host_view(dgu, DType::fp32, {M, 2 * I}),
                             host_view(dp, DType::fp32, {M}), f);
    expect_matches_finite_differences(gu, dgu, loss, f.to_string() + " gate_up");
    expect_matches_finite_differences(p, dp, loss, f.to_string() + " prob");
  }
}

// The default form is the plain op, bit for bit.
TEST(WeightedSwigluCpu, DefaultFormIsThePlainOp) {
  Context ctx(Device::CPU);
  const int64_t M = 4, I = 8;
  std::vector<float> gu = randn(size_t(M * 2 * I), 3.0f), p = randn(static_cast<size_t>(M)),
                     a(size_t(M * I)), b(size_t(M * I));
  weighted_swiglu_forward(ctx, host_view(gu, DType::fp32, {M, 2 * I}),
                          host_view(p, DType::fp32, {M}), host_view(a, DType::fp32, {M, I}));
  weighted_swiglu_forward(ctx, host_view(gu, DType::fp32, {M, 2 * I}),
                          host_view(p, DType::fp32, {M}), host_view(b, DType::fp32, {M, I}),
                          SwigluForm{});
  EXPECT_EQ(a, b);
  EXPECT_TRUE(SwigluForm{}.plain());
  EXPECT_FALSE(kGptOss.plain());
}

TEST(WeightedSwigluCpu, FormClearErrors) {
  Context ctx(Device::CPU);
  std::vector<float> gu(24), p(3), out(12), dgu(24), dp(3);
  const TensorView GU = host_view(gu, DType::fp32, {3, 8}), P = host_view(p, DType::fp32, {3}),
                   OUT = host_view(out, DType::fp32, {3, 4});
  SwigluForm f = kGptOss;
  f.limit = 0.0f;
  EXPECT_THROW_MSG(weighted_swiglu_forward(ctx, GU, P, OUT, f),
                   "weighted_swiglu_forward: form.limit=0 must be > 0 (infinity: no clamp)");
  f.limit = std::nanf("");
  EXPECT_THROW_MSG(weighted_swiglu_forward(ctx, GU, P, OUT, f),
                   "weighted_swiglu_forward: form.limit=nan must be > 0");
  f = kGptOss;
  f.alpha = std::numeric_limits<float>::infinity();
  EXPECT_THROW_MSG(weighted_swiglu_backward(ctx, OUT, GU, P, host_view(dgu, DType::fp32, {3, 8}),
                                            host_view(dp, DType::fp32, {3}), f),
                   "weighted_swiglu_backward: form.alpha=inf must be finite");
  f = kGptOss;
  f.up_offset = std::nanf("");
  EXPECT_THROW_MSG(weighted_swiglu_forward(ctx, GU, P, OUT, f),
                   "weighted_swiglu_forward: form.up_offset=nan must be finite");
  EXPECT_THROW_MSG(
      weighted_swiglu_forward(ctx, GU, P, host_view(out, DType::fp32, {3, 3}), kGptOss),
      "weighted_swiglu_forward: out.shape[1]=3 must equal 4");
}

}  // namespace
}  // namespace groupmm::test
