// GroupedLinear on the CPU backend: against a per-expert loop of dense float64 GEMMs and against
// the grouped ops it is built from; delayed wgrad, main_grad accumulation, zero-row experts, bias
// grads, init, import/export, and the error messages of bad input.
#include <cmath>

#include "common/tolerance.hpp"
#include "base/cpu_util.hpp"
#include "groupmm/dbias.hpp"
#include "groupmm/gemm.hpp"
#include "groupmm/nn/grouped_linear.hpp"

namespace groupmm::test {
namespace {

using nn::GroupedLinear;
using nn::GroupedLinearConfig;

// A host tensor of a float dtype, filled from fp32 values (rounded once).
struct HT {
  std::vector<uint8_t> bytes;
  TensorView v;
  HT(DType t, std::initializer_list<int64_t> dims) {
    v = TensorView(nullptr, t, Device::CPU, dims);
    bytes.assign(static_cast<size_t>(v.nbytes()) + 16, 0xFF);
    v.data = bytes.data();
  }
  HT& random(float scale = 1.0f) {
    const auto r = randn(static_cast<size_t>(v.numel()), scale);
    for (int64_t i = 0; i < v.numel(); ++i) cpu::store_f(v, i, r[static_cast<size_t>(i)]);
    return *this;
  }
  std::vector<float> f() const { return cpu::to_floats(v); }
};

GroupedLinearConfig cfg_of(int64_t G, int64_t K, int64_t N, bool bias, DType t, int64_t max_tokens,
                           uint64_t seed = 7) {
  GroupedLinearConfig c;
  c.experts = G;
  c.in_features = K;
  c.out_features = N;
  c.bias = bias;
  c.dtype = t;
  c.max_tokens = max_tokens;
  c.seed = seed;
  return c;
}

std::vector<float> floats(const TensorView& v) {
  return cpu::to_floats(v);
}

// Per-expert dense float64 loops over the layer's own (rounded) parameters and inputs.
struct Ref {
  std::vector<double> y, dx, dw, db;
};
Ref dense_loop(const GroupedLinearConfig& c, const std::vector<float>& W,
               const std::vector<float>& B, const std::vector<float>& x,
               const std::vector<float>& dy, const std::vector<int64_t>& splits) {
  const int64_t K = c.in_features, N = c.out_features, M = static_cast<int64_t>(x.size()) / K;
  Ref r;
  r.y.assign(static_cast<size_t>(M * N), 0);
  r.dx.assign(static_cast<size_t>(M * K), 0);
  r.dw.assign(static_cast<size_t>(c.experts * N * K), 0);
  r.db.assign(static_cast<size_t>(c.experts * N), 0);
  int64_t row0 = 0;
  for (int64_t g = 0; g < c.experts; ++g) {
    const int64_t rows = splits[static_cast<size_t>(g)];
    const float* Wg = &W[static_cast<size_t>(g * N * K)];
    for (int64_t m = row0; m < row0 + rows; ++m) {
      for (int64_t n = 0; n < N; ++n) {
        double s = B.empty() ? 0.0 : B[static_cast<size_t>(g * N + n)];
        for (int64_t k = 0; k < K; ++k)
          s += double(x[static_cast<size_t>(m * K + k)]) * Wg[n * K + k];
        r.y[static_cast<size_t>(m * N + n)] = s;
      }
      for (int64_t k = 0; k < K; ++k) {
        double s = 0;
        for (int64_t n = 0; n < N; ++n)
          s += double(dy[static_cast<size_t>(m * N + n)]) * Wg[n * K + k];
        r.dx[static_cast<size_t>(m * K + k)] = s;
      }
    }
    for (int64_t n = 0; n < N; ++n) {
      double sb = 0;
      for (int64_t m = row0; m < row0 + rows; ++m) sb += dy[static_cast<size_t>(m * N + n)];
      r.db[static_cast<size_t>(g * N + n)] = sb;
      for (int64_t k = 0; k < K; ++k) {
        double s = 0;
        for (int64_t m = row0; m < row0 + rows; ++m)
          s += double(dy[static_cast<size_t>(m * N + n)]) * x[static_cast<size_t>(m * K + k)];
        r.dw[static_cast<size_t>((g * N + n) * K + k)] = s;
      }
    }
    row0 += rows;
  }
  return r;
}

struct LayerCase {
  Pattern pattern;
  int64_t G, K, N, M;
  bool bias;
  DType dtype;
  bool delay;
};

std::string case_name(const LayerCase& c) {
  return detail::cat(pattern_name(c.pattern), "_G", c.G, "_", dtype_name(c.dtype),
                     c.bias ? "_bias" : "", c.delay ? "_delayed" : "");
}
void PrintTo(const LayerCase& c, std::ostream* os) {
  *os << case_name(c);
}

class GroupedLinearCpu : public ::testing::TestWithParam<LayerCase> {};

TEST_P(GroupedLinearCpu, MatchesPerExpertDenseLoop) {
  const LayerCase c = GetParam();
  Context ctx(Device::CPU);
  auto cfg = cfg_of(c.G, c.K, c.N, c.bias, c.dtype, c.M + 37);
  cfg.delay_wgrad = c.delay;
  GroupedLinear layer(ctx, cfg);
  const auto s = make_splits(c.pattern, c.G, c.M);
  std::vector<int64_t> splits = s;
  HT x(c.dtype, {c.M, c.K}), dy(c.dtype, {c.M, c.N});
  x.random();
  dy.random();
  fill_bytes(layer.weight_grad(), 0xFF);  // poison: every grad element must be written
  if (c.bias) fill_bytes(layer.bias_grad(), 0xFF);

  const TensorView y = layer.forward(ctx, x.v, host_view(splits, DType::int64, {c.G}));
  const TensorView dx = layer.backward(ctx, dy.v);
  EXPECT_EQ(layer.wgrad_pending(), c.delay);
  layer.backward_dw(ctx);
  EXPECT_FALSE(layer.wgrad_pending());
  EXPECT_NO_THROW(ctx.check());
  EXPECT_EQ(y.shape_string(), detail::cat("[", c.M, ", ", c.N, "]"));
  EXPECT_EQ(dx.shape_string(), detail::cat("[", c.M, ", ", c.K, "]"));

  const Ref r = dense_loop(cfg, floats(layer.weight()),
                           c.bias ? floats(layer.bias()) : std::vector<float>{}, x.f(), dy.f(), s);
  const Tolerance tol = tolerance(TolOp::gemm, c.dtype, c.dtype);
  EXPECT_TRUE(close_to(floats(y), r.y, tol, "y"));
  EXPECT_TRUE(close_to(floats(dx), r.dx, tol, "dx"));
  const auto dw = floats(layer.weight_grad());
  const int64_t NK = c.N * c.K;
  for (int64_t g = 0; g < c.G; ++g) {  // per expert
    std::vector<float> a(dw.begin() + g * NK, dw.begin() + (g + 1) * NK);
    std::vector<double> b(r.dw.begin() + g * NK, r.dw.begin() + (g + 1) * NK);
    if (s[static_cast<size_t>(g)] == 0) {
      for (float v : a) ASSERT_EQ(v, 0.0f) << "zero-row expert " << g << " must get dW = 0";
    } else {
      EXPECT_TRUE(close_to(a, b, tol, detail::cat("dW of expert ", g)));
    }
  }
  if (c.bias)
    EXPECT_TRUE(
        close_to(floats(layer.bias_grad()), r.db, tolerance(TolOp::dbias, c.dtype, c.dtype), "db"));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, GroupedLinearCpu,
    ::testing::Values(LayerCase{Pattern::balanced, 4, 64, 32, 256, false, DType::bf16, false},
                      LayerCase{Pattern::zipf, 8, 48, 40, 300, true, DType::bf16, true},
                      LayerCase{Pattern::zero_middle, 5, 32, 56, 133, true, DType::fp16, false},
                      LayerCase{Pattern::quarter_empty, 12, 40, 24, 211, true, DType::bf16, false},
                      LayerCase{Pattern::zero_first, 3, 24, 16, 50, false, DType::fp16, true},
                      LayerCase{Pattern::balanced, 1, 32, 32, 64, true, DType::bf16, false}),
    [](const auto& info) { return case_name(info.param); });

// The layer is exactly the grouped ops it is built from.
TEST(GroupedLinearCpuOps, EqualsGroupedOpsBitForBit) {
  Context ctx(Device::CPU);
  const int64_t G = 6, K = 48, N = 32, M = 190;
  auto cfg = cfg_of(G, K, N, true, DType::bf16, 256);
  GroupedLinear layer(ctx, cfg);
  std::vector<int32_t> splits = to_i32(make_splits(Pattern::zipf, G, M));
  const TensorView sv = host_view(splits, DType::int32, {G});
  HT x(DType::bf16, {M, K}), dy(DType::bf16, {M, N});
  x.random();
  dy.random();
  const auto y = floats(layer.forward(ctx, x.v, sv));
  const auto dx = floats(layer.backward(ctx, dy.v));

  HT ry(DType::bf16, {M, N}), rdx(DType::bf16, {M, K}), rdw(DType::bf16, {G, N, K}),
      rdb(DType::bf16, {G, N});
  gemm_forward(ctx, x.v, layer.weight(), sv, ry.v, layer.bias());
  gemm_dgrad(ctx, dy.v, layer.weight(), sv, rdx.v);
  gemm_wgrad(ctx, dy.v, x.v, sv, rdw.v, false);
  group_dbias(ctx, dy.v, sv, rdb.v);
  EXPECT_EQ(y, ry.f());
  EXPECT_EQ(dx, rdx.f());
  EXPECT_EQ(floats(layer.weight_grad()), rdw.f());
  EXPECT_EQ(floats(layer.bias_grad()), rdb.f());
}

TEST(GroupedLinearCpuOps, DelayedWgradEqualsImmediate) {
  Context ctx(Device::CPU);
  const int64_t G = 8, K = 32, N = 40, M = 160;
  auto cfg = cfg_of(G, K, N, true, DType::bf16, M);
  GroupedLinear now(ctx, cfg);
  cfg.delay_wgrad = true;
  GroupedLinear later(ctx, cfg);
  std::vector<int64_t> splits = make_splits(Pattern::quarter_empty, G, M);
  const TensorView sv = host_view(splits, DType::int64, {G});
  HT x(DType::bf16, {M, K}), dy(DType::bf16, {M, N});
  x.random();
  dy.random();
  now.forward(ctx, x.v, sv);
  const auto dx_now = floats(now.backward(ctx, dy.v));
  later.forward(ctx, x.v, sv);
  const auto dx_later = floats(later.backward(ctx, dy.v));
  EXPECT_TRUE(later.wgrad_pending());
  later.backward_dw(ctx);
  EXPECT_EQ(dx_now, dx_later);
  EXPECT_EQ(floats(now.weight_grad()), floats(later.weight_grad()));
  EXPECT_EQ(floats(now.bias_grad()), floats(later.bias_grad()));
}

// Two micro-batches into main_grad equal the fp32 sum of each one's grads; an expert with zero rows
// in the second micro-batch keeps the first one's grads.
TEST(GroupedLinearCpuOps, MainGradAccumulatesMicroBatches) {
  Context ctx(Device::CPU);
  const int64_t G = 6, K = 40, N = 24, M = 150;
  for (bool delay : {false, true}) {
    auto cfg = cfg_of(G, K, N, true, DType::bf16, M);
    cfg.accumulate_into_main_grad = true;
    cfg.delay_wgrad = delay;
    GroupedLinear layer(ctx, cfg);
    EXPECT_EQ(layer.weight_grad().dtype, DType::fp32);
    EXPECT_EQ(layer.bias_grad().dtype, DType::fp32);
    EXPECT_EQ(floats(layer.weight_grad()),
              std::vector<float>(static_cast<size_t>(G * N * K), 0.0f));
    std::vector<int64_t> s1 = make_splits(Pattern::random_odd, G, M);
    std::vector<int64_t> s2 = make_splits(Pattern::zero_middle, G, M);  // expert 3 empty
    HT x1(DType::bf16, {M, K}), x2(DType::bf16, {M, K}), dy1(DType::bf16, {M, N}),
        dy2(DType::bf16, {M, N});
    x1.random();
    x2.random();
    dy1.random();
    dy2.random();
    layer.forward(ctx, x1.v, host_view(s1, DType::int64, {G}));
    layer.backward(ctx, dy1.v);
    layer.backward_dw(ctx);
    layer.forward(ctx, x2.v, host_view(s2, DType::int64, {G}));
    layer.backward(ctx, dy2.v);
    layer.backward_dw(ctx);

    HT w1(DType::fp32, {G, N, K}), w2(DType::fp32, {G, N, K}), b1(DType::fp32, {G, N}),
        b2(DType::fp32, {G, N});
    gemm_wgrad(ctx, dy1.v, x1.v, host_view(s1, DType::int64, {G}), w1.v, false);
    gemm_wgrad(ctx, dy2.v, x2.v, host_view(s2, DType::int64, {G}), w2.v, false);
    group_dbias(ctx, dy1.v, host_view(s1, DType::int64, {G}), b1.v);
    group_dbias(ctx, dy2.v, host_view(s2, DType::int64, {G}), b2.v);
    auto sum = [](std::vector<float> a, const std::vector<float>& b) {
      for (size_t i = 0; i < a.size(); ++i) a[i] = b[i] + a[i];
      return a;
    };
    const auto dw = floats(layer.weight_grad()), db = floats(layer.bias_grad());
    EXPECT_EQ(dw, sum(w1.f(), w2.f())) << "delay=" << delay;
    EXPECT_EQ(db, sum(b1.f(), b2.f())) << "delay=" << delay;
    const auto w1f = w1.f();
    for (int64_t i = 3 * N * K; i < 4 * N * K; ++i)
      ASSERT_EQ(dw[static_cast<size_t>(i)], w1f[static_cast<size_t>(i)])
          << "zero-row expert changed";

    layer.zero_grad(ctx);
    EXPECT_EQ(floats(layer.weight_grad()),
              std::vector<float>(static_cast<size_t>(G * N * K), 0.0f));
    // External main grads (a distributed optimizer's buffer).
    HT ext_w(DType::fp32, {G, N, K}), ext_b(DType::fp32, {G, N});
    fill_bytes(ext_w.v, 0);
    fill_bytes(ext_b.v, 0);
    layer.set_main_grad(ext_w.v, ext_b.v);
    layer.forward(ctx, x1.v, host_view(s1, DType::int64, {G}));
    layer.backward(ctx, dy1.v);
    layer.backward_dw(ctx);
    EXPECT_EQ(ext_w.f(), sum(w1.f(), std::vector<float>(static_cast<size_t>(G * N * K), 0.0f)));
    EXPECT_EQ(ext_b.f(), b1.f());
  }
}

TEST(GroupedLinearCpuOps, ZeroRowExpertsGetZeroGradsAndAllEmptyWorks) {
  Context ctx(Device::CPU);
  const int64_t G = 4, K = 16, N = 24;
  GroupedLinear layer(ctx, cfg_of(G, K, N, true, DType::bf16, 64));
  for (Pattern p : {Pattern::zero_last, Pattern::zero_all}) {
    const int64_t M = p == Pattern::zero_all ? 0 : 40;
    std::vector<int32_t> splits = to_i32(make_splits(p, G, M));
    HT x(DType::bf16, {M, K}), dy(DType::bf16, {M, N});
    x.random();
    dy.random();
    fill_bytes(layer.weight_grad(), 0xFF);
    fill_bytes(layer.bias_grad(), 0xFF);
    layer.forward(ctx, x.v, host_view(splits, DType::int32, {G}));
    layer.backward(ctx, dy.v);
    EXPECT_NO_THROW(ctx.check());
    const auto dw = floats(layer.weight_grad()), db = floats(layer.bias_grad());
    for (int64_t g = 0; g < G; ++g) {
      if (splits[static_cast<size_t>(g)] != 0) continue;
      for (int64_t i = g * N * K; i < (g + 1) * N * K; ++i)
        ASSERT_EQ(dw[static_cast<size_t>(i)], 0.0f);
      for (int64_t i = g * N; i < (g + 1) * N; ++i) ASSERT_EQ(db[static_cast<size_t>(i)], 0.0f);
    }
  }
}

TEST(GroupedLinearCpuOps, InitIsSeededUniformAndDeviceIndependent) {
  Context ctx(Device::CPU);
  const int64_t G = 3, K = 64, N = 48;
  GroupedLinear a(ctx, cfg_of(G, K, N, true, DType::bf16, 16, 1234));
  GroupedLinear b(ctx, cfg_of(G, K, N, true, DType::bf16, 999, 1234));  // max_tokens irrelevant
  GroupedLinear c(ctx, cfg_of(G, K, N, true, DType::bf16, 16, 1235));
  const auto wa = floats(a.weight()), ba = floats(a.bias());
  EXPECT_EQ(wa, floats(b.weight()));
  EXPECT_EQ(ba, floats(b.bias()));
  EXPECT_NE(wa, floats(c.weight()));
  EXPECT_NE(std::vector<float>(wa.begin(), wa.begin() + N), ba);  // bias is its own stream
  const double bound = 1.0 / std::sqrt(double(K));
  double sum = 0, sq = 0;
  for (float v : wa) {
    ASSERT_LE(std::fabs(v), bound * (1 + 1.0 / 128)) << "outside U(-1/sqrt(K), 1/sqrt(K))";
    sum += v;
    sq += double(v) * v;
  }
  const double n = double(wa.size()), mean = sum / n, var = sq / n - mean * mean;
  EXPECT_NEAR(mean, 0.0, 4 * bound / std::sqrt(3 * n));
  EXPECT_NEAR(var, bound * bound / 3, 0.05 * bound * bound / 3);
}

TEST(GroupedLinearCpuOps, ImportExportRoundTrip) {
  Context ctx(Device::CPU);
  const int64_t G = 5, K = 24, N = 16;
  GroupedLinear src(ctx, cfg_of(G, K, N, true, DType::fp16, 8, 1));
  GroupedLinear dst(ctx, cfg_of(G, K, N, true, DType::fp16, 8, 2));
  std::vector<HT> ws, bs;
  std::vector<TensorView> wv, bv;
  for (int64_t g = 0; g < G; ++g) {
    ws.emplace_back(DType::fp16, std::initializer_list<int64_t>{N, K});
    bs.emplace_back(DType::fp16, std::initializer_list<int64_t>{N});
  }
  for (int64_t g = 0; g < G; ++g) {
    wv.push_back(ws[static_cast<size_t>(g)].v);
    bv.push_back(bs[static_cast<size_t>(g)].v);
  }
  src.export_weights(ctx, wv, bv);
  // expert g's [N, K] is slice g of the grouped weight
  const auto w = floats(src.weight());
  EXPECT_EQ(ws[2].f(), std::vector<float>(w.begin() + 2 * N * K, w.begin() + 3 * N * K));
  EXPECT_NE(floats(dst.weight()), w);
  dst.import_weights(ctx, wv, bv);
  EXPECT_EQ(floats(dst.weight()), w);
  EXPECT_EQ(floats(dst.bias()), floats(src.bias()));
  // modified per-expert tensors survive the round trip
  ws[4].random();
  dst.import_weights(ctx, wv);
  HT back(DType::fp16, {N, K});
  std::vector<TensorView> out(static_cast<size_t>(G), back.v);
  for (int64_t g = 0; g < 4; ++g) out[static_cast<size_t>(g)] = ws[static_cast<size_t>(g)].v;
  dst.export_weights(ctx, out);
  EXPECT_EQ(back.f(), ws[4].f());

  wv.pop_back();
  EXPECT_THROW_MSG(dst.import_weights(ctx, wv),
                   "GroupedLinear.import_weights: 4 weights given, expected experts=5");
  HT wrong(DType::fp16, {K, N});
  wv.push_back(wrong.v);
  EXPECT_THROW_MSG(dst.import_weights(ctx, wv),
                   "GroupedLinear.import_weights: weight[4]=fp16[24, 16]@cpu must be fp16[16, 24]");
}

TEST(GroupedLinearCpuOps, BadInputGivesClearErrors) {
  Context ctx(Device::CPU);
  const int64_t G = 4, K = 16, N = 8, M = 32;
  auto cfg = cfg_of(G, K, N, false, DType::bf16, M);
  cfg.delay_wgrad = true;
  GroupedLinear layer(ctx, cfg);
  std::vector<int32_t> splits = {8, 8, 8, 8}, short_splits = {16, 16, 0};
  const TensorView sv = host_view(splits, DType::int32, {G});
  HT x(DType::bf16, {M, K}), xk(DType::bf16, {M, K + 1}), xbig(DType::bf16, {M + 1, K}),
      xf(DType::fp16, {M, K});
  HT dy(DType::bf16, {M, N}), dyshort(DType::bf16, {M - 1, N});
  x.random();
  dy.random();

  EXPECT_THROW_MSG(layer.backward(ctx, dy.v), "GroupedLinear.backward: no saved forward");
  EXPECT_THROW_MSG(layer.backward_dw(ctx), "GroupedLinear.backward_dw: no wgrad is pending");
  EXPECT_THROW_MSG(layer.forward(ctx, xk.v, sv),
                   "GroupedLinear.forward: x.shape[1]=17 must equal 16");
  EXPECT_THROW_MSG(layer.forward(ctx, xbig.v, sv),
                   "GroupedLinear.forward: x.shape[0]=33 exceeds max_tokens=32");
  EXPECT_THROW_MSG(layer.forward(ctx, xf.v, sv),
                   "GroupedLinear.forward: x.dtype=fp16 must be bf16");
  EXPECT_THROW_MSG(layer.forward(ctx, x.v, host_view(short_splits, DType::int32, {3})),
                   "GroupedLinear.forward: splits.shape[0]=3 must equal the number of groups 4");
  layer.forward(ctx, x.v, sv);
  EXPECT_THROW_MSG(layer.backward(ctx, dyshort.v),
                   "GroupedLinear.backward: dy.shape[0]=31 must equal forward's x.shape[0]=32");
  layer.backward(ctx, dy.v);
  EXPECT_THROW_MSG(layer.forward(ctx, x.v, sv),
                   "GroupedLinear.forward: a delayed wgrad is pending; call backward_dw()");
  layer.backward_dw(ctx);
  EXPECT_THROW_MSG(layer.set_main_grad(layer.weight_grad()), "accumulate_into_main_grad=false");

  EXPECT_THROW_MSG(GroupedLinear l(ctx, cfg_of(G, 0, N, false, DType::bf16, M)),
                   "GroupedLinear: in_features=0 must be >= 1");
  EXPECT_THROW_MSG(GroupedLinear l(ctx, cfg_of(G, K, N, false, DType::fp8e4m3, M)),
                   "GroupedLinear: dtype=fp8e4m3 must be bf16 or fp16");
  EXPECT_THROW_MSG(GroupedLinear l(ctx, cfg_of(G, K, N, false, DType::bf16, 0)),
                   "GroupedLinear: max_tokens=0 must be >= 1");
  auto c1 = cfg_of(G, K, N, false, DType::bf16, M);
  c1.expected_rows = 8;  // the GEMMs' kernel choice for at_most splits only
  EXPECT_THROW_MSG(GroupedLinear l(ctx, c1),
                   "GroupedLinear: expected_rows=8 must be 0, or > 0 with splits_total=at_most");
  c1.splits_total = SplitsTotal::at_most;
  c1.expected_rows = -2;
  EXPECT_THROW_MSG(GroupedLinear l(ctx, c1), "GroupedLinear: expected_rows=-2 must be 0");
  c1.expected_rows = 8;
  EXPECT_NE(GroupedLinear(ctx, c1).config().to_string().find("expected_rows=8"), std::string::npos);
  auto c2 = cfg_of(G, K, N, false, DType::bf16, M);
  c2.recipe = nn::high_precision_recipe(GemmEngine::cublas_loop);
  EXPECT_THROW_MSG(GroupedLinear l(ctx, c2),
                   "high_precision(cublas_loop): engine cannot run on a cpu context");
  EXPECT_NE(layer.to_string().find(
                "GroupedLinearConfig(G=4, K=16, N=8, bias=false, dtype=bf16, delay_wgrad=true"),
            std::string::npos)
      << layer.to_string();
  EXPECT_EQ(layer.recipe().name(), "high_precision(automatic)");
  EXPECT_EQ(layer.recipe().quantization(), QuantRecipe::none);
}

}  // namespace
}  // namespace groupmm::test
