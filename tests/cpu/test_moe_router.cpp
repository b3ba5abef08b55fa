// Router on the CPU backend: the shared numerics (exp, ranking), hand-checked routings (softmax,
// sigmoid, ties, NaN, bias, group-limited top-k, renormalization and scaling), the aux loss and
// z-loss against their formulas, the backward against finite differences, the router GEMMs, and
// the validation messages.
#include <cmath>

#include "common/test_util.hpp"
#include "numerics/router.hpp"
#include "groupmm/moe.hpp"

namespace groupmm::test {
namespace {

// One routing call on host buffers.
struct Routed {
  std::vector<int32_t> ids, counts;
  std::vector<float> w;
  float aux = NAN, z = NAN;  // poisoned: every call must write both
};

Routed route(const RouterConfig& c, std::vector<float> logits, std::vector<float> bias = {}) {
  Context ctx(Device::CPU);
  const int64_t E = c.experts, k = c.topk, T = int64_t(logits.size()) / E;
  Routed r;
  r.ids.assign(size_t(T * k), -7);
  r.w.assign(size_t(T * k), -7.0f);
  r.counts.assign(size_t(E), -7);
  RouterArgs a;
  a.logits = host_view(logits, DType::fp32, {T, E});
  if (!bias.empty()) a.expert_bias = host_view(bias, DType::fp32, {E});
  a.expert_ids = host_view(r.ids, DType::int32, {T, k});
  a.weights = host_view(r.w, DType::fp32, {T, k});
  a.counts = host_view(r.counts, DType::int32, {E});
  a.aux_loss = TensorView(&r.aux, DType::fp32, Device::CPU, {1});
  a.z_loss = TensorView(&r.z, DType::fp32, Device::CPU, {1});
  moe_router_forward(ctx, c, a);
  ctx.check();
  return r;
}

RouterConfig cfg(int64_t E, int64_t k, RouterScore s = RouterScore::softmax) {
  RouterConfig c;
  c.experts = E;
  c.topk = k;
  c.score = s;
  return c;
}

TEST(RouterNumerics, ExpIsWithinTwoUlpAndHandlesTheEdges) {
  for (float x = -103.0f; x < 88.7f; x += 0.01371f) {
    const double ref = std::exp(double(x));
    const float got = router::exp(x);
    const double ulp = std::ldexp(1.0, std::ilogb(float(ref)) - 23);
    ASSERT_LE(std::fabs(double(got) - ref), 2 * std::max(ulp, 1.5e-45)) << "x=" << x;
  }
  EXPECT_EQ(router::exp(0.0f), 1.0f);
  EXPECT_EQ(router::exp(-INFINITY), 0.0f);
  EXPECT_EQ(router::exp(-200.0f), 0.0f);
  EXPECT_TRUE(std::isinf(router::exp(100.0f)));
  EXPECT_TRUE(std::isnan(router::exp(NAN)));
  EXPECT_FALSE(router::better(NAN, 0, -INFINITY, 1));  // NaN ranks after every number
  EXPECT_TRUE(router::better(-INFINITY, 1, NAN, 0));
  EXPECT_TRUE(router::better(NAN, 0, NAN, 1));  // then by index
  EXPECT_TRUE(router::better(1.0f, 5, 1.0f, 6));
  EXPECT_TRUE(router::better(2.0f, 6, 1.0f, 5));
}

TEST(RouterNumerics, LaneOrderSumIsTheWarpButterfly) {
  std::vector<float> v = randn(77);
  // lane l adds l, l + 32, l + 64 in turn; then pairs at distance 16, 8, 4, 2, 1 (any lane's view)
  float lane[32];
  for (int l = 0; l < 32; ++l) {
    float s = 0;
    for (int e = l; e < 77; e += 32) s += v[size_t(e)];
    lane[l] = s;
  }
  for (int d = 16; d >= 1; d /= 2)
    for (int l = 0; l < d; ++l) lane[l] = lane[l] + lane[l + d];
  EXPECT_EQ(router::lane_order_sum(77, [&](int e) { return v[size_t(e)]; }), lane[0]);
}

TEST(RouterCpu, SoftmaxTopTwoByHand) {
  RouterConfig c = cfg(4, 2);
  const Routed r = route(c, {1.0f, 3.0f, 2.0f, 0.0f});
  const double z = std::exp(1.0) + std::exp(3.0) + std::exp(2.0) + 1.0;
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 2}));
  EXPECT_NEAR(r.w[0], std::exp(3.0) / z, 1e-6);
  EXPECT_NEAR(r.w[1], std::exp(2.0) / z, 1e-6);
  EXPECT_EQ(r.counts, (std::vector<int32_t>{0, 1, 1, 0}));
  c.renormalize = true;
  c.scaling_factor = 2.5f;
  const Routed n = route(c, {1.0f, 3.0f, 2.0f, 0.0f});
  EXPECT_NEAR(n.w[0], 2.5 * std::exp(3.0) / (std::exp(3.0) + std::exp(2.0)), 1e-6);
  EXPECT_NEAR(n.w[1], 2.5 * std::exp(2.0) / (std::exp(3.0) + std::exp(2.0)), 1e-6);
}

TEST(RouterCpu, TiesGoToTheLowerExpertAndNaNRanksLast) {
  EXPECT_EQ(route(cfg(5, 3), {0.5f, 0.5f, 0.5f, 0.5f, 0.5f}).ids, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(route(cfg(4, 2), {2.0f, 5.0f, 5.0f, 1.0f}).ids, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(route(cfg(3, 2, RouterScore::sigmoid), {NAN, -1.0f, 2.0f}).ids,
            (std::vector<int32_t>{2, 1}));
  EXPECT_EQ(route(cfg(3, 3, RouterScore::sigmoid), {NAN, -INFINITY, 2.0f}).ids,
            (std::vector<int32_t>{2, 1, 0}));  // sigmoid(-inf) = 0 still ranks above NaN
}

TEST(RouterCpu, SigmoidWithSelectionOnlyBias) {
  RouterConfig c = cfg(4, 2, RouterScore::sigmoid);
  const std::vector<float> l = {0.0f, 1.0f, 2.0f, -1.0f};
  const Routed r = route(c, l, {10.0f, 0.0f, 0.0f, 0.0f});  // expert 0 promoted by its bias only
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 2}));
  EXPECT_FLOAT_EQ(r.w[0], 0.5f);  // the weight is the unbiased score sigmoid(0)
  EXPECT_NEAR(r.w[1], 1.0 / (1.0 + std::exp(-2.0)), 1e-6);
}

TEST(RouterCpu, GroupLimitedTopK) {
  // 8 experts in 4 groups of 2; a group's score is the sum of its top (k / topk_group) scores.
  RouterConfig c = cfg(8, 2, RouterScore::sigmoid);
  c.n_group = 4;
  c.topk_group = 1;  // m = 2: sums g0 s(3)+s(-5), g1 2 s(2), g2 s(1)+s(-5), g3 2 s(0) -> group 1
  EXPECT_EQ(route(c, {3.0f, -5.0f, 2.0f, 2.0f, 1.0f, -5.0f, 0.0f, 0.0f}).ids,
            (std::vector<int32_t>{2, 3}));  // plain top-2 would be {0, 2}
  c.topk = 4;
  c.topk_group = 2;  // m = 2: sums g0 1.90, g1 1.03, g2 0.89, g3 1.35 -> groups 0 and 3
  EXPECT_EQ(route(c, {3.0f, 2.9f, 0.0f, 0.1f, 2.0f, -5.0f, 1.0f, 0.5f}).ids,
            (std::vector<int32_t>{0, 1, 6, 7}));  // plain top-4 would be {0, 1, 4, 6}
}

TEST(RouterCpu, AuxLossAndZLossMatchTheirFormulas) {
  const int64_t T = 37, E = 6, k = 2;
  std::vector<float> l = randn(size_t(T * E), 1.5f);
  for (RouterScore s : {RouterScore::softmax, RouterScore::sigmoid}) {
    RouterConfig c = cfg(E, k, s);
    c.aux_loss_coeff = 0.01f;
    c.z_loss_coeff = 0.001f;
    const Routed r = route(c, l);
    std::vector<double> psum(size_t(E), 0.0);
    double zs = 0;
    for (int64_t t = 0; t < T; ++t) {
      double m = -INFINITY, ssum = 0, sig = 0;
      for (int64_t e = 0; e < E; ++e) m = std::max(m, double(l[size_t(t * E + e)]));
      for (int64_t e = 0; e < E; ++e) ssum += std::exp(l[size_t(t * E + e)] - m);
      for (int64_t e = 0; e < E; ++e) sig += 1 / (1 + std::exp(-l[size_t(t * E + e)]));
      for (int64_t e = 0; e < E; ++e) {
        const double x = l[size_t(t * E + e)];
        psum[size_t(e)] +=
            s == RouterScore::softmax ? std::exp(x - m) / ssum : 1 / (1 + std::exp(-x)) / sig;
      }
      zs += std::pow(m + std::log(ssum), 2);
    }
    double aux = 0;
    for (int64_t e = 0; e < E; ++e) aux += psum[size_t(e)] * r.counts[size_t(e)];
    aux *= 0.01 * E / (double(k) * T * T);
    EXPECT_NEAR(r.aux, aux, 1e-6 * std::fabs(aux)) << router_score_name(s);
    EXPECT_NEAR(r.z, 0.001 * zs / T, 1e-6 * 0.001 * zs / T) << router_score_name(s);
    int sum = 0;
    for (int x : r.counts) sum += x;
    EXPECT_EQ(sum, T * k);
  }
}

// A loss given with its coefficient 0 reads 0 (the binding relies on it: no fill of its own).
TEST(RouterCpu, DisabledLossesGivenAnywayReadZero) {
  const Routed r = route(cfg(6, 2), randn(size_t(5 * 6)));
  EXPECT_EQ(r.aux, 0.0f);
  EXPECT_EQ(r.z, 0.0f);
}

// d/d logits of  L = sum_tj r_tj w_tj + aux + z  against central differences (routing unchanged).
TEST(RouterCpu, BackwardMatchesFiniteDifferences) {
  const int64_t T = 5, E = 8, k = 3;
  for (int variant = 0; variant < 4; ++variant) {
    RouterConfig c = cfg(E, k, variant % 2 ? RouterScore::sigmoid : RouterScore::softmax);
    c.renormalize = variant >= 2;
    c.scaling_factor = 1.5f;
    c.aux_loss_coeff = 0.3f;
    c.z_loss_coeff = 0.05f;
    std::mt19937_64 g(100 + variant);
    std::vector<float> l(size_t(T * E));  // well-separated logits: a small step keeps the routing
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < E; ++e) l[size_t(t * E + e)] = 0.4f * float((e * 5 + t * 3) % E) - 1;
    const std::vector<float> rw = randn(size_t(T * k), 1.0f, g);
    auto loss = [&](const std::vector<float>& x) {
      const Routed r = route(c, x);
      double s = r.aux + r.z;
      for (size_t i = 0; i < rw.size(); ++i) s += double(rw[i]) * r.w[i];
      return s;
    };
    const Routed r0 = route(c, l);
    Context ctx(Device::CPU);
    std::vector<float> dl(size_t(T * E)), drw = rw;
    RouterBackwardArgs b;
    b.logits = host_view(l, DType::fp32, {T, E});
    b.expert_ids =
        TensorView(const_cast<int32_t*>(r0.ids.data()), DType::int32, Device::CPU, {T, k});
    b.counts = TensorView(const_cast<int32_t*>(r0.counts.data()), DType::int32, Device::CPU, {E});
    b.d_weights = host_view(drw, DType::fp32, {T, k});
    b.d_logits = host_view(dl, DType::fp32, {T, E});
    moe_router_backward(ctx, c, b);
    for (size_t i = 0; i < l.size(); ++i) {
      std::vector<float> a = l, m = l;
      const float h = 1e-2f;
      a[i] += h;
      m[i] -= h;
      ASSERT_EQ(route(c, a).ids, r0.ids);
      const double fd = (loss(a) - loss(m)) / (2 * h);
      EXPECT_NEAR(dl[i], fd, 2e-3 + 2e-3 * std::fabs(fd)) << "variant " << variant << " i " << i;
    }
  }
}

TEST(RouterCpu, LogitsGemmAndItsBackward) {
  Context ctx(Device::CPU);
  const int64_t T = 3, H = 4, E = 2;
  std::vector<float> x = {1, 2, 3, 4, 0, 1, 0, -1, 2, 2, 2, 2}, w = {1, 0, 0, 1, 0.5f, 0.5f, 0, 0};
  std::vector<float> logits(6), dx(12, 1.0f), dw(8, 0.0f), dl = {1, 0, 0, 1, 1, 1};
  moe_router_logits(ctx, host_view(x, DType::fp32, {T, H}), host_view(w, DType::fp32, {E, H}),
                    host_view(logits, DType::fp32, {T, E}));
  EXPECT_EQ(logits, (std::vector<float>{5, 1.5f, -1, 0.5f, 4, 2}));
  moe_router_logits_backward(ctx, host_view(dl, DType::fp32, {T, E}),
                             host_view(x, DType::fp32, {T, H}), host_view(w, DType::fp32, {E, H}),
                             host_view(dx, DType::fp32, {T, H}), host_view(dw, DType::fp32, {E, H}),
                             true, false);
  // dx = 1 + dl W;  dW = dl^T x
  EXPECT_EQ(dx, (std::vector<float>{2, 1, 1, 2, 1.5f, 1.5f, 1, 1, 2.5f, 1.5f, 1, 2}));
  EXPECT_EQ(dw, (std::vector<float>{3, 4, 5, 6, 2, 3, 2, 1}));
}

TEST(RouterCpu, LogitsGemmAddsTheBiasToEachSum) {
  // fp32 sums + the bias promoted from x's dtype: bf16 operands whose products and sums are exact.
  Context ctx(Device::CPU);
  const int64_t T = 2, H = 3, E = 2;
  const std::vector<float> xf = {1, 2, -1, 0.5f, 0, 4}, wf = {1, 1, 1, -2, 0.25f, 3},
                           bf = {0.5f, -1.25f};
  std::vector<uint16_t> x(6), w(6), b(2);
  for (size_t i = 0; i < 6; ++i) x[i] = float_to_bf16_bits(xf[i]), w[i] = float_to_bf16_bits(wf[i]);
  for (size_t i = 0; i < 2; ++i) b[i] = float_to_bf16_bits(bf[i]);
  std::vector<float> logits(4, -7.0f);
  moe_router_logits(ctx, host_view(x, DType::bf16, {T, H}), host_view(w, DType::bf16, {E, H}),
                    host_view(logits, DType::fp32, {T, E}), host_view(b, DType::bf16, {E}));
  // x w^T = [[2, -4.5], [4.5, 11]], then + b
  EXPECT_EQ(logits, (std::vector<float>{2.5f, -5.75f, 5.0f, 9.75f}));
  std::vector<float> b32(2);
  EXPECT_THROW_MSG(
      moe_router_logits(ctx, host_view(x, DType::bf16, {T, H}), host_view(w, DType::bf16, {E, H}),
                        host_view(logits, DType::fp32, {T, E}), host_view(b32, DType::fp32, {E})),
      "moe_router_logits: bias.dtype=fp32 must be bf16");
  EXPECT_THROW_MSG(
      moe_router_logits(ctx, host_view(x, DType::bf16, {T, H}), host_view(w, DType::bf16, {E, H}),
                        host_view(logits, DType::fp32, {T, E}), host_view(b, DType::bf16, {1})),
      "moe_router_logits: bias.shape[0]=1 must equal 2");
}

TEST(RouterCpu, LogitsGemmNamesItsInput) {
  // x in another dtype or size than the router weight: named from x's side, with both values.
  Context ctx(Device::CPU);
  std::vector<float> x(12), logits(6);
  std::vector<uint16_t> w16(8);
  const TensorView w = host_view(w16, DType::bf16, {2, 4});
  EXPECT_THROW_MSG(moe_router_logits(ctx, host_view(x, DType::fp32, {3, 4}), w,
                                     host_view(logits, DType::fp32, {3, 2})),
                   "moe_router_logits: x.dtype=fp32 must equal w.dtype=bf16 (both operands in "
                   "one dtype)");
  std::vector<uint16_t> x16(12);
  EXPECT_THROW_MSG(moe_router_logits(ctx, host_view(x16, DType::bf16, {2, 6}), w,
                                     host_view(logits, DType::fp32, {2, 2})),
                   "moe_router_logits: x.shape[1]=6 must equal w.shape[1]=4 (the hidden size H: w "
                   "is [E, H])");
}

TEST(RouterCpu, ClearErrors) {
  Context ctx(Device::CPU);
  std::vector<float> l(12), w(12);
  std::vector<int32_t> ids(12), counts(4);
  RouterArgs a;
  a.logits = host_view(l, DType::fp32, {3, 4});
  a.expert_ids = host_view(ids, DType::int32, {3, 2});
  a.weights = host_view(w, DType::fp32, {3, 2});
  a.counts = host_view(counts, DType::int32, {4});
  RouterConfig groups = cfg(4, 2), aux = cfg(4, 2);
  groups.n_group = 3;
  aux.aux_loss_coeff = 0.1f;
  const std::pair<RouterConfig, const char*> bad[] = {
      {cfg(4, 5), "moe_router_forward: cfg.topk=5 must be <= cfg.experts=4"},
      {cfg(5, 2), "moe_router_forward: logits.shape[1]=4 must equal 5"},
      {groups, "moe_router_forward: cfg.n_group=3 must be in [1, 32] and divide experts=4"},
      {cfg(4, 3), "moe_router_forward: expert_ids.shape[1]=2 must equal 3"},
      {aux, "moe_router_forward: aux_loss is required"}};
  for (const auto& [c, msg] : bad) EXPECT_THROW_MSG(moe_router_forward(ctx, c, a), msg);
}

}  // namespace
}  // namespace groupmm::test
