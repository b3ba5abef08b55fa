// The fused gate_up projection's CPU reference (moe_gate_up_swiglu) and moe_permute_sources:
// against a float64 formula of x[src_row] W^T and the weighted SwiGLU, src_row as the inverse of
// the plan, zero rows for -1, a bad src_row reported, and the validation messages.
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "common/test_util.hpp"
#include "groupmm/moe.hpp"

namespace groupmm::test {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(GateUpCpu, EqualsGatherGemmAndWeightedSwiglu) {
  Context ctx(Device::CPU);
  const int64_t T = 9, k = 2, E = 3, H = 24, F = 5, align = 4;
  std::vector<int32_t> ids(size_t(T * k));
  for (int64_t i = 0; i < T * k; ++i) ids[size_t(i)] = int32_t((i * 7 + i / 3) % E);
  PermuteMap m;
  m.tokens = T, m.topk = k, m.experts = E, m.align = align;
  m.rows = moe_permuted_rows(T, k, E, align);
  std::vector<int32_t> dest(size_t(T * k)), meta(size_t(3 * E));
  m.dest_row = host_view(dest, DType::int32, {T, k});
  m.row_start = TensorView(meta.data(), DType::int32, Device::CPU, {E});
  m.kept = TensorView(meta.data() + E, DType::int32, Device::CPU, {E});
  m.splits = TensorView(meta.data() + 2 * E, DType::int32, Device::CPU, {E});
  moe_permute_plan(ctx, host_view(ids, DType::int32, {T, k}), m);
  const int64_t R = m.rows;
  std::vector<float> wt = randn(size_t(T * k)), probs(size_t(R), -1.0f);
  std::vector<int32_t> src(size_t(R), -7);
  moe_permute_sources(ctx, m, host_view(src, DType::int32, {R}), host_view(wt, DType::fp32, {T, k}),
                      host_view(probs, DType::fp32, {R}));
  // src_row inverts dest_row; every other row is -1 with prob 0
  std::vector<int32_t> want(size_t(R), -1);
  std::vector<float> want_p(size_t(R), 0.0f);
  for (int64_t i = 0; i < T * k; ++i) {
    want[size_t(dest[size_t(i)])] = int32_t(i / k);
    want_p[size_t(dest[size_t(i)])] = wt[size_t(i)];
  }
  EXPECT_EQ(src, want);
  EXPECT_EQ(probs, want_p);
  EXPECT_GT(std::count(src.begin(), src.end(), -1), 0) << "the case should have padding rows";

  std::vector<float> x = randn(size_t(T * H)), w = randn(size_t(E * 2 * F * H), 0.3f),
                     out(size_t(R * F), NAN), gu(size_t(R * 2 * F), NAN);
  moe_gate_up_swiglu(ctx, MoeGateUpArgs{.x = host_view(x, DType::fp32, {T, H}),
                                        .src_row = host_view(src, DType::int32, {R}),
                                        .splits = m.splits,
                                        .w = host_view(w, DType::fp32, {E, 2 * F, H}),
                                        .prob = host_view(probs, DType::fp32, {R}),
                                        .out = host_view(out, DType::fp32, {R, F}),
                                        .gate_up = host_view(gu, DType::fp32, {R, 2 * F})});
  ctx.check();
  int64_t row = 0;
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = row; r < row + meta[size_t(2 * E + e)]; ++r) {
      for (int64_t n = 0; n < F; ++n) {
        double g = 0, u = 0;
        if (src[size_t(r)] >= 0)
          for (int64_t h = 0; h < H; ++h) {
            const double xv = x[size_t(src[size_t(r)] * H + h)];
            g += xv * w[size_t((e * 2 * F + n) * H + h)];
            u += xv * w[size_t((e * 2 * F + F + n) * H + h)];
          }
        EXPECT_NEAR(gu[size_t(r * 2 * F + n)], g, 1e-4) << r << "," << n;
        EXPECT_NEAR(gu[size_t(r * 2 * F + F + n)], u, 1e-4) << r << "," << n;
        const double h = g / (1 + std::exp(-g)) * u * probs[size_t(r)];
        EXPECT_NEAR(out[size_t(r * F + n)], h, 1e-4) << r << "," << n;
      }
    }
    row += meta[size_t(2 * E + e)];
  }
  EXPECT_EQ(row, R);
}

TEST(GateUpCpu, BadRowIsAZeroRowAndAFault) {
  Context ctx(Device::CPU);
  const int64_t T = 2, H = 8, F = 2, R = 3;
  std::vector<float> x = randn(size_t(T * H)), w = randn(size_t(2 * F * H)), p = {1, 1, 1},
                     out(size_t(R * F), NAN);
  std::vector<int32_t> src = {0, 5, 1}, splits = {3};
  moe_gate_up_swiglu(ctx, MoeGateUpArgs{.x = host_view(x, DType::fp32, {T, H}),
                                        .src_row = host_view(src, DType::int32, {R}),
                                        .splits = host_view(splits, DType::int32, {1}),
                                        .w = host_view(w, DType::fp32, {1, 2 * F, H}),
                                        .prob = host_view(p, DType::fp32, {R}),
                                        .out = host_view(out, DType::fp32, {R, F}),
                                        .gate_up = TensorView()});
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_EQ(out[3], 0.0f);
  const std::string e = error_of([&] { ctx.check(); });
  EXPECT_NE(e.find("moe_gate_up_swiglu"), std::string::npos) << e;
}

TEST(GateUpCpu, ValidationNamesTheArgument) {
  Context ctx(Device::CPU);
  std::vector<float> x(64), w(2 * 2 * 3 * 8), p(4), out(12);
  std::vector<int32_t> src(4), splits = {2, 2};
  MoeGateUpArgs a{.x = host_view(x, DType::fp32, {8, 8}),
                  .src_row = host_view(src, DType::int32, {4}),
                  .splits = host_view(splits, DType::int32, {2}),
                  .w = host_view(w, DType::fp32, {2, 6, 8}),
                  .prob = host_view(p, DType::fp32, {4}),
                  .out = host_view(out, DType::fp32, {4, 3}),
                  .gate_up = TensorView()};
  std::vector<int32_t> xi(64);
  a.x = host_view(xi, DType::int32, {8, 8});
  EXPECT_NE(
      error_of([&] { moe_gate_up_swiglu(ctx, a); }).find("x.dtype=int32 must be bf16 or fp16"),
      std::string::npos);
  std::vector<uint16_t> xb(64), wb(2 * 5 * 8), ob(12);
  a.x = host_view(xb, DType::bf16, {8, 8});
  a.w = host_view(wb, DType::bf16, {2, 5, 8});
  a.out = host_view(ob, DType::bf16, {4, 3});
  EXPECT_NE(error_of([&] { moe_gate_up_swiglu(ctx, a); }).find("w.shape[1]=5 must be 2F"),
            std::string::npos);
  std::vector<uint16_t> wb2(2 * 6 * 8);
  a.w = host_view(wb2, DType::bf16, {2, 6, 8});
  a.out = host_view(ob, DType::bf16, {3, 4});
  EXPECT_NE(error_of([&] { moe_gate_up_swiglu(ctx, a); }).find("moe_gate_up_swiglu: out"),
            std::string::npos);
  EXPECT_TRUE(moe_gate_up_swiglu_supported(ctx, DType::bf16, 8, 3, 2));
  EXPECT_TRUE(moe_gate_up_swiglu_supported(ctx, DType::fp32, 8, 3, 2));
  EXPECT_FALSE(moe_gate_up_swiglu_supported(ctx, DType::int32, 8, 3, 2));
}

}  // namespace
}  // namespace groupmm::test
