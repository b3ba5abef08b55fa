// Permute plan and the four row movers on the CPU backend: hand-checked maps (dropless, padded,
// capacity), the round trip, the adjoint identities that make the backwards right, the device-fault
// path of a bad expert id and the validation messages.
#include <cmath>

#include "common/test_util.hpp"
#include "base/cpu_util.hpp"
#include "groupmm/moe.hpp"

namespace groupmm::test {
namespace {

// A map with its own host storage.
struct HostMap {
  std::vector<int32_t> dest, meta;  // meta = row_start | kept | splits
  PermuteMap m;
  HostMap(int64_t T, int64_t k, int64_t E, int64_t align = 1, int64_t capacity = 0)
      : dest(size_t(T * k), -9), meta(size_t(3 * E), -9) {
    m.tokens = T;
    m.topk = k;
    m.experts = E;
    m.align = align;
    m.capacity = capacity;
    m.rows = moe_permuted_rows(T, k, E, align, capacity);
    m.dest_row = host_view(dest, DType::int32, {T, k});
    m.row_start = TensorView(meta.data(), DType::int32, Device::CPU, {E});
    m.kept = TensorView(meta.data() + E, DType::int32, Device::CPU, {E});
    m.splits = TensorView(meta.data() + 2 * E, DType::int32, Device::CPU, {E});
  }
  std::vector<int32_t> part(int i) const {
    const size_t E = size_t(m.experts);
    return std::vector<int32_t>(meta.begin() + long(i * E), meta.begin() + long((i + 1) * E));
  }
};

std::vector<int32_t> kIds = {0, 2, 1, 0, 2, 1, 0, 1};  // T = 4, k = 2, E = 3

HostMap plan(std::vector<int32_t> ids, int64_t T, int64_t k, int64_t E, int64_t align = 1,
             int64_t cap = 0) {
  Context ctx(Device::CPU);
  HostMap h(T, k, E, align, cap);
  moe_permute_plan(ctx, host_view(ids, DType::int32, {T, k}), h.m);
  ctx.check();
  return h;
}

TEST(PermutePlanCpu, DroplessStableExpertOrder) {
  const HostMap h = plan(kIds, 4, 2, 3);
  // expert 0: (t0,j0) (t1,j1) (t3,j0); expert 1: (t1,j0) (t2,j1) (t3,j1); expert 2: (t0,j1) (t2,j0)
  EXPECT_EQ(h.m.rows, 8);
  EXPECT_EQ(h.dest, (std::vector<int32_t>{0, 6, 3, 1, 7, 4, 2, 5}));
  EXPECT_EQ(h.part(0), (std::vector<int32_t>{0, 3, 6}));
  EXPECT_EQ(h.part(1), (std::vector<int32_t>{3, 3, 2}));
  EXPECT_EQ(h.part(2), (std::vector<int32_t>{3, 3, 2}));
}

TEST(PermutePlanCpu, PaddedExpertsAndTheTailInTheLastSplit) {
  const HostMap h = plan(kIds, 4, 2, 3, 4);
  EXPECT_EQ(h.m.rows, 20);  // roundup(8 + 3 * 3, 4)
  EXPECT_EQ(h.dest, (std::vector<int32_t>{0, 8, 4, 1, 9, 5, 2, 6}));
  EXPECT_EQ(h.part(0), (std::vector<int32_t>{0, 4, 8}));
  EXPECT_EQ(h.part(2), (std::vector<int32_t>{4, 4, 12}));  // 4 + 8 tail rows
}

TEST(PermutePlanCpu, CapacityDropsTheLaterTokens) {
  const HostMap h = plan(kIds, 4, 2, 3, 1, 2);
  EXPECT_EQ(h.m.rows, 6);
  EXPECT_EQ(h.dest, (std::vector<int32_t>{0, 4, 2, 1, 5, 3, -1, -1}));
  EXPECT_EQ(h.part(1), (std::vector<int32_t>{2, 2, 2}));
  EXPECT_EQ(moe_capacity(4, 2, 3, 0.75), 2);
  EXPECT_EQ(moe_capacity(4, 2, 3, 0.0), 0);
}

TEST(PermutePlanCpu, AllOnOneExpertAndEmptyExperts) {
  const HostMap h = plan({2, 2, 2}, 3, 1, 4);
  EXPECT_EQ(h.dest, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(h.part(2), (std::vector<int32_t>{0, 0, 3, 0}));
}

TEST(PermutePlanCpu, BadExpertIdIsSkippedAndReported) {
  Context ctx(Device::CPU);
  HostMap h(2, 2, 3);
  std::vector<int32_t> ids = {0, 7, 1, 2};
  moe_permute_plan(ctx, host_view(ids, DType::int32, {2, 2}), h.m);
  EXPECT_EQ(h.dest, (std::vector<int32_t>{0, -1, 1, 2}));
  EXPECT_EQ(h.part(2), (std::vector<int32_t>{1, 1, 2}));  // the unused row joins the tail
  EXPECT_THROW_MSG(ctx.check(),
                   "device fault in moe_permute (status 0x8): index out of range "
                   "(entry skipped); first at group 0, value 7");
}

// permute -> unpermute returns each kept token times its kept choices; padding rows are zero.
TEST(PermuteCpu, RoundTripAndZeroPadding) {
  Context ctx(Device::CPU);
  const int64_t T = 4, k = 2, H = 3;
  const HostMap h = plan(kIds, T, k, 3, 4, 2);  // padded and capacity-limited
  std::vector<float> x = randn(size_t(T * H)), w = randn(size_t(T * k));
  std::vector<float> xp(size_t(h.m.rows * H), NAN), probs(size_t(h.m.rows), NAN);
  moe_permute(ctx, host_view(x, DType::fp32, {T, H}), h.m,
              host_view(xp, DType::fp32, {h.m.rows, H}), host_view(w, DType::fp32, {T, k}),
              host_view(probs, DType::fp32, {h.m.rows}));
  for (int64_t r = 0; r < h.m.rows; ++r) {
    int64_t src = -1;
    for (int64_t i = 0; i < T * k; ++i)
      if (h.dest[size_t(i)] == r) src = i;
    for (int64_t c = 0; c < H; ++c)
      EXPECT_EQ(xp[size_t(r * H + c)], src < 0 ? 0.0f : x[size_t(src / k * H + c)]) << r;
    EXPECT_EQ(probs[size_t(r)], src < 0 ? 0.0f : w[size_t(src)]) << r;
  }
  std::vector<float> y(size_t(T * H), NAN), add(size_t(T * H), 0.5f);
  moe_unpermute(ctx, host_view(xp, DType::fp32, {h.m.rows, H}), h.m,
                host_view(y, DType::fp32, {T, H}), host_view(add, DType::fp32, {T, H}));
  for (int64_t t = 0; t < T; ++t) {
    const int kept = (h.dest[size_t(t * k)] >= 0) + (h.dest[size_t(t * k + 1)] >= 0);
    for (int64_t c = 0; c < H; ++c)
      EXPECT_FLOAT_EQ(y[size_t(t * H + c)], kept * x[size_t(t * H + c)] + 0.5f);
  }
}

// <permute(x), g> = <x, permute_backward(g)> and <unpermute(y), d> = <y, unpermute_backward(d)>;
// the d_weights gather is the adjoint of the probs scatter.
TEST(PermuteCpu, BackwardsAreTheAdjoints) {
  Context ctx(Device::CPU);
  const int64_t T = 9, k = 3, E = 5, H = 7;
  std::vector<int32_t> ids(size_t(T * k));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) ids[size_t(t * k + j)] = int32_t((t * 2 + j * 3) % E);
  const HostMap h = plan(ids, T, k, E, 2, 4);
  const int64_t R = h.m.rows;
  std::vector<float> x = randn(size_t(T * H)), g = randn(size_t(R * H)), w = randn(size_t(T * k));
  std::vector<float> gp = randn(static_cast<size_t>(R)), xp(size_t(R * H)),
                     probs(static_cast<size_t>(R)), dx(size_t(T * H)), dw(size_t(T * k)),
                     gy(size_t(T * H)), dyp(size_t(R * H));
  moe_permute(ctx, host_view(x, DType::fp32, {T, H}), h.m, host_view(xp, DType::fp32, {R, H}),
              host_view(w, DType::fp32, {T, k}), host_view(probs, DType::fp32, {R}));
  moe_permute_backward(ctx, host_view(g, DType::fp32, {R, H}), h.m,
                       host_view(dx, DType::fp32, {T, H}), host_view(gp, DType::fp32, {R}),
                       host_view(dw, DType::fp32, {T, k}));
  auto dot = [](const std::vector<float>& a, const std::vector<float>& b) {
    double s = 0;
    for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
    return s;
  };
  EXPECT_NEAR(dot(xp, g), dot(x, dx), 1e-4);
  EXPECT_NEAR(dot(probs, gp), dot(w, dw), 1e-5);
  moe_unpermute(ctx, host_view(g, DType::fp32, {R, H}), h.m, host_view(gy, DType::fp32, {T, H}));
  moe_unpermute_backward(ctx, host_view(x, DType::fp32, {T, H}), h.m,
                         host_view(dyp, DType::fp32, {R, H}));
  EXPECT_NEAR(dot(gy, x), dot(g, dyp), 1e-4);
}

// The routed bias: y[t] = sum of the kept rows, then w_tj bias[e_tj] fused in j order for each kept
// (t, j) only, then the addend; a kept pair with a bad id adds nothing and reports.
TEST(PermuteCpu, UnpermuteAddsTheRoutedBiasOfTheKeptPairs) {
  Context ctx(Device::CPU);
  const int64_t T = 4, k = 2, E = 3, H = 5;
  const HostMap h = plan(kIds, T, k, E, 4, 2);  // capacity 2 drops some pairs
  const int64_t R = h.m.rows;
  std::vector<float> yp = randn(size_t(R * H)), bias = randn(size_t(E * H)),
                     w = randn(size_t(T * k)), add = randn(size_t(T * H)), y(size_t(T * H), NAN);
  std::vector<int32_t> ids = kIds;
  RoutedBias rb{host_view(bias, DType::fp32, {E, H}), host_view(ids, DType::int32, {T, k}),
                host_view(w, DType::fp32, {T, k})};
  moe_unpermute(ctx, host_view(yp, DType::fp32, {R, H}), h.m, host_view(y, DType::fp32, {T, H}),
                host_view(add, DType::fp32, {T, H}), rb);
  ctx.check();
  int dropped = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < H; ++c) {
      float want = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        const int32_t d = h.dest[size_t(t * k + j)];
        if (d >= 0) want += yp[size_t(d * H + c)];
      }
      for (int64_t j = 0; j < k; ++j) {
        const size_t i = size_t(t * k + j);
        if (h.dest[i] >= 0)
          want = std::fma(w[i], bias[size_t(ids[i] * H + c)], want);
        else if (c == 0)
          ++dropped;
      }
      want += add[size_t(t * H + c)];
      EXPECT_EQ(y[size_t(t * H + c)], want) << t << "," << c;
    }
  EXPECT_GT(dropped, 0);  // the dropped pairs' bias must not be added
  ids[1] = 7;             // kept (token 0's second pair), out of range: skipped and reported
  ASSERT_GE(h.dest[1], 0);
  std::vector<float> y2(size_t(T * H), NAN);
  moe_unpermute(ctx, host_view(yp, DType::fp32, {R, H}), h.m, host_view(y2, DType::fp32, {T, H}),
                host_view(add, DType::fp32, {T, H}), rb);
  EXPECT_THROW_MSG(ctx.check(), "device fault in moe_unpermute (status 0x8): index out of range");
  for (int64_t c = 0; c < H; ++c) {
    const float want = std::fma(w[0], bias[size_t(ids[0] * H + c)],
                                yp[size_t(h.dest[0] * H + c)] + yp[size_t(h.dest[1] * H + c)]) +
                       add[size_t(c)];
    EXPECT_EQ(y2[size_t(c)], want) << c;
  }
}

TEST(PermuteCpu, ClearErrors) {
  Context ctx(Device::CPU);
  HostMap h(4, 2, 3);
  std::vector<float> x(12), xp(24), w(8);
  const TensorView X = host_view(x, DType::fp32, {4, 3});
  EXPECT_THROW_MSG(moe_permute(ctx, X, h.m, host_view(xp, DType::fp32, {7, 3})),
                   "moe_permute: x_perm.shape[0]=7 must equal 8");
  EXPECT_THROW_MSG(moe_permute(ctx, X, h.m, host_view(xp, DType::fp32, {8, 3}),
                               host_view(w, DType::fp32, {4, 2})),
                   "moe_permute: weights and probs must be given together");
  PermuteMap bad = h.m;
  bad.rows = 9;
  EXPECT_THROW_MSG(moe_permute(ctx, X, bad, host_view(xp, DType::fp32, {8, 3})),
                   "moe_permute: map.rows=9 must equal moe_permuted_rows(...)=8");
  EXPECT_THROW_MSG(moe_unpermute(ctx, host_view(xp, DType::fp32, {8, 3}), h.m,
                                 host_view(xp, DType::fp32, {4, 3})),
                   "moe_unpermute: y may not alias an input");
  std::vector<int32_t> ids(6);
  EXPECT_THROW_MSG(moe_permute_plan(ctx, host_view(ids, DType::int32, {3, 2}), h.m),
                   "moe_permute_plan: expert_ids.shape[0]=3 must equal 4");
  std::vector<float> y(12), bias(9);
  std::vector<int32_t> rid(8);
  const TensorView YP = host_view(xp, DType::fp32, {8, 3}), Y = host_view(y, DType::fp32, {4, 3});
  const TensorView B = host_view(bias, DType::fp32, {3, 3}),
                   I = host_view(rid, DType::int32, {4, 2});
  const TensorView W = host_view(w, DType::fp32, {4, 2});
  EXPECT_THROW_MSG(moe_unpermute(ctx, YP, h.m, Y, TensorView(), RoutedBias{B, I, TensorView()}),
                   "moe_unpermute: routed.bias, routed.expert_ids and routed.weights go together "
                   "(got bias, ids, no weights)");
  EXPECT_THROW_MSG(moe_unpermute(ctx, YP, h.m, Y, TensorView(),
                                 RoutedBias{host_view(bias, DType::fp32, {1, 9}), I, W}),
                   "moe_unpermute: routed.bias.shape[0]=1 must equal 3");
  EXPECT_THROW_MSG(moe_unpermute(ctx, YP, h.m, Y, TensorView(),
                                 RoutedBias{B, host_view(w, DType::fp32, {4, 2}), W}),
                   "moe_unpermute: routed.expert_ids");
  EXPECT_THROW_MSG(moe_unpermute(ctx, YP, h.m, Y, TensorView(),
                                 RoutedBias{B, I, host_view(w, DType::fp32, {2, 4})}),
                   "moe_unpermute: routed.weights.shape[0]=2 must equal 4");
}

}  // namespace
}  // namespace groupmm::test
