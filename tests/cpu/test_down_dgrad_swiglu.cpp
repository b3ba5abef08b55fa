// The fused down-projection backward's CPU reference (moe_down_dgrad_swiglu): against a float64
// formula of dy[src_row] W and the weighted SwiGLU's backward, bit for bit the block's unfused
// chain (moe_unpermute_backward, gemm_dgrad, weighted_swiglu_backward) in bf16, zero rows for -1,
// a bad src_row reported, and the validation messages.
#include <cmath>
#include <string>

#include "common/test_util.hpp"
#include "groupmm/gemm.hpp"
#include "groupmm/moe.hpp"

namespace groupmm::test {
namespace {

// A routed case: the plan of T tokens to k of E experts (padded to `align` rows), its row map.
struct Routed {
  int64_t T, k, E, R;
  std::vector<int32_t> dest, meta, src;
  std::vector<float> wt, probs;
  PermuteMap m;
  Routed(Context& ctx, int64_t T_, int64_t k_, int64_t E_, int64_t align)
      : T(T_), k(k_), E(E_), dest(size_t(T_ * k_)), meta(size_t(3 * E_)) {
    std::vector<int32_t> ids(size_t(T * k));
    for (int64_t i = 0; i < T * k; ++i) ids[size_t(i)] = int32_t((i * 7 + i / 3) % E);
    m.tokens = T, m.topk = k, m.experts = E, m.align = align;
    m.rows = moe_permuted_rows(T, k, E, align);
    m.dest_row = host_view(dest, DType::int32, {T, k});
    m.row_start = TensorView(meta.data(), DType::int32, Device::CPU, {E});
    m.kept = TensorView(meta.data() + E, DType::int32, Device::CPU, {E});
    m.splits = TensorView(meta.data() + 2 * E, DType::int32, Device::CPU, {E});
    moe_permute_plan(ctx, host_view(ids, DType::int32, {T, k}), m);
    R = m.rows;
    wt = randn(size_t(T * k));
    src.assign(size_t(R), -7);
    probs.assign(size_t(R), -1.0f);
    moe_permute_sources(ctx, m, host_view(src, DType::int32, {R}),
                        host_view(wt, DType::fp32, {T, k}), host_view(probs, DType::fp32, {R}));
  }
};

TEST(DownDgradCpu, EqualsGatherDgradAndSwigluBackward) {
  Context ctx(Device::CPU);
  const int64_t H = 24, F = 5;
  Routed c(ctx, 9, 2, 3, 4);
  const int64_t T = c.T, E = c.E, R = c.R;
  ASSERT_GT(std::count(c.src.begin(), c.src.end(), -1), 0) << "the case should have padding rows";
  std::vector<float> dy = randn(size_t(T * H)), w = randn(size_t(E * H * F), 0.3f),
                     gu = randn(size_t(R * 2 * F)), dgu(size_t(R * 2 * F), NAN), dp(size_t(R), NAN);
  moe_down_dgrad_swiglu(ctx, MoeDownDgradArgs{.dy = host_view(dy, DType::fp32, {T, H}),
                                              .src_row = host_view(c.src, DType::int32, {R}),
                                              .splits = c.m.splits,
                                              .w = host_view(w, DType::fp32, {E, H, F}),
                                              .gate_up = host_view(gu, DType::fp32, {R, 2 * F}),
                                              .prob = host_view(c.probs, DType::fp32, {R}),
                                              .dgate_up = host_view(dgu, DType::fp32, {R, 2 * F}),
                                              .dprob = host_view(dp, DType::fp32, {R})});
  ctx.check();
  int64_t row = 0;
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = row; r < row + c.meta[size_t(2 * E + e)]; ++r) {
      double want_dp = 0;
      for (int64_t i = 0; i < F; ++i) {
        double da = 0;
        if (c.src[size_t(r)] >= 0)
          for (int64_t h = 0; h < H; ++h)
            da += double(dy[size_t(c.src[size_t(r)] * H + h)]) * w[size_t((e * H + h) * F + i)];
        const double g = gu[size_t(r * 2 * F + i)], u = gu[size_t(r * 2 * F + F + i)];
        const double s = 1 / (1 + std::exp(-g)), p = c.probs[size_t(r)];
        EXPECT_NEAR(dgu[size_t(r * 2 * F + i)], da * p * u * s * (1 + g * (1 - s)), 1e-4)
            << r << "," << i;
        EXPECT_NEAR(dgu[size_t(r * 2 * F + F + i)], da * p * g * s, 1e-4) << r << "," << i;
        want_dp += da * g * s * u;
      }
      EXPECT_NEAR(dp[size_t(r)], want_dp, 1e-4) << r;
    }
    row += c.meta[size_t(2 * E + e)];
  }
  EXPECT_EQ(row, R);
}

// In bf16, bit for bit what the block's backward runs without the fusion: the unpermute's
// backward (dy gathered into the permuted rows), the down projection's dgrad, the weighted SwiGLU
// backward.
TEST(DownDgradCpu, EqualsTheUnfusedChainBitForBit) {
  Context ctx(Device::CPU);
  const int64_t H = 40, F = 12;
  Routed c(ctx, 13, 3, 4, 8);
  const int64_t T = c.T, E = c.E, R = c.R;
  auto bf16 = [](const std::vector<float>& v) {
    std::vector<uint16_t> b(v.size());
    const TensorView bv(b.data(), DType::bf16, Device::CPU, {int64_t(v.size())});
    for (size_t i = 0; i < v.size(); ++i) cpu::store_f(bv, int64_t(i), v[i]);
    return b;
  };
  std::vector<uint16_t> dy = bf16(randn(size_t(T * H))), w = bf16(randn(size_t(E * H * F), 0.2f)),
                        gu = bf16(randn(size_t(R * 2 * F))), dgu(size_t(R * 2 * F), 0xFFFF),
                        dyp(size_t(R * H)), da(size_t(R * F)), dgu2(size_t(R * 2 * F), 0xFFFF);
  std::vector<float> dp(size_t(R), NAN), dp2(size_t(R), NAN);
  moe_down_dgrad_swiglu(ctx, MoeDownDgradArgs{.dy = host_view(dy, DType::bf16, {T, H}),
                                              .src_row = host_view(c.src, DType::int32, {R}),
                                              .splits = c.m.splits,
                                              .w = host_view(w, DType::bf16, {E, H, F}),
                                              .gate_up = host_view(gu, DType::bf16, {R, 2 * F}),
                                              .prob = host_view(c.probs, DType::fp32, {R}),
                                              .dgate_up = host_view(dgu, DType::bf16, {R, 2 * F}),
                                              .dprob = host_view(dp, DType::fp32, {R})});
  moe_unpermute_backward(ctx, host_view(dy, DType::bf16, {T, H}), c.m,
                         host_view(dyp, DType::bf16, {R, H}));
  gemm_dgrad(ctx, host_view(dyp, DType::bf16, {R, H}), host_view(w, DType::bf16, {E, H, F}),
             c.m.splits, host_view(da, DType::bf16, {R, F}));
  weighted_swiglu_backward(
      ctx, host_view(da, DType::bf16, {R, F}), host_view(gu, DType::bf16, {R, 2 * F}),
      host_view(c.probs, DType::fp32, {R}), host_view(dgu2, DType::bf16, {R, 2 * F}),
      host_view(dp2, DType::fp32, {R}));
  ctx.check();
  EXPECT_EQ(dgu, dgu2);
  for (int64_t r = 0; r < R; ++r) EXPECT_EQ(dp[size_t(r)], dp2[size_t(r)]) << r;
}

TEST(DownDgradCpu, BadRowIsAZeroRowAndAFault) {
  Context ctx(Device::CPU);
  const int64_t T = 2, H = 8, F = 2, R = 3;
  std::vector<float> dy = randn(size_t(T * H)), w = randn(size_t(H * F)), p = {1, 1, 1},
                     gu = randn(size_t(R * 2 * F)), dgu(size_t(R * 2 * F), NAN), dp(size_t(R), NAN);
  std::vector<int32_t> src = {0, 5, 1}, splits = {3};
  moe_down_dgrad_swiglu(ctx, MoeDownDgradArgs{.dy = host_view(dy, DType::fp32, {T, H}),
                                              .src_row = host_view(src, DType::int32, {R}),
                                              .splits = host_view(splits, DType::int32, {1}),
                                              .w = host_view(w, DType::fp32, {1, H, F}),
                                              .gate_up = host_view(gu, DType::fp32, {R, 2 * F}),
                                              .prob = host_view(p, DType::fp32, {R}),
                                              .dgate_up = host_view(dgu, DType::fp32, {R, 2 * F}),
                                              .dprob = host_view(dp, DType::fp32, {R})});
  for (int64_t i = 0; i < 2 * F; ++i) EXPECT_EQ(dgu[size_t(2 * F + i)], 0.0f) << i;
  EXPECT_EQ(dp[1], 0.0f);
  EXPECT_NE(dgu[0], 0.0f);
  EXPECT_THROW_MSG(ctx.check(), "moe_down_dgrad_swiglu");
}

TEST(DownDgradCpu, ValidationNamesTheArgument) {
  Context ctx(Device::CPU);
  const int64_t T = 8, H = 8, F = 3, R = 4, E = 2;
  std::vector<uint16_t> dy(size_t(T * H)), w(size_t(E * H * F)), gu(size_t(R * 2 * F)),
      dgu(size_t(R * 2 * F));
  std::vector<float> p(static_cast<size_t>(R)), dp(static_cast<size_t>(R));
  std::vector<int32_t> src(static_cast<size_t>(R)), splits = {2, 2};
  MoeDownDgradArgs a{.dy = host_view(dy, DType::bf16, {T, H}),
                     .src_row = host_view(src, DType::int32, {R}),
                     .splits = host_view(splits, DType::int32, {E}),
                     .w = host_view(w, DType::bf16, {E, H, F}),
                     .gate_up = host_view(gu, DType::bf16, {R, 2 * F}),
                     .prob = host_view(p, DType::fp32, {R}),
                     .dgate_up = host_view(dgu, DType::bf16, {R, 2 * F}),
                     .dprob = host_view(dp, DType::fp32, {R})};
  EXPECT_NO_THROW(moe_down_dgrad_swiglu(ctx, a));
  std::vector<int32_t> dyi(size_t(T * H));
  MoeDownDgradArgs b = a;
  b.dy = host_view(dyi, DType::int32, {T, H});
  EXPECT_THROW_MSG(moe_down_dgrad_swiglu(ctx, b),
                   "moe_down_dgrad_swiglu: dy.dtype=int32 must be bf16 or fp16");
  b = a;
  b.w = host_view(w, DType::bf16, {E, F, H});
  EXPECT_THROW_MSG(moe_down_dgrad_swiglu(ctx, b), "moe_down_dgrad_swiglu: w");
  b = a;
  b.gate_up = host_view(gu, DType::bf16, {R, F});
  EXPECT_THROW_MSG(moe_down_dgrad_swiglu(ctx, b), "moe_down_dgrad_swiglu: gate_up");
  b = a;
  b.dprob = host_view(dp, DType::fp32, {R - 1});
  EXPECT_THROW_MSG(moe_down_dgrad_swiglu(ctx, b), "moe_down_dgrad_swiglu: dprob");
  b = a;
  b.dgate_up = a.gate_up;
  EXPECT_THROW_MSG(moe_down_dgrad_swiglu(ctx, b), "may not alias");
  EXPECT_TRUE(moe_down_dgrad_swiglu_supported(ctx, DType::bf16, 8, 3, 2));
  EXPECT_FALSE(moe_down_dgrad_swiglu_supported(ctx, DType::int32, 8, 3, 2));
}

}  // namespace
}  // namespace groupmm::test
