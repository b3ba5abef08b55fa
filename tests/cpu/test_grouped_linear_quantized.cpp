// GroupedLinear with the quantized recipes on the CPU backend: close to the bf16 layer on the same
// weights and inputs (y, dx, dW, db), delayed wgrad equal to immediate, the weight cache and its
// invalidation, main_grad accumulation, and the recipes' configuration errors.
#include "common/quant_test_util.hpp"
#include "base/cpu_util.hpp"
#include "groupmm/nn/grouped_linear.hpp"
#include "groupmm/quantize.hpp"

namespace groupmm::test {
namespace {

using nn::GroupedLinear;
using nn::GroupedLinearConfig;

std::vector<uint16_t> bf16_randn(size_t n, float scale = 1.0f) {
  std::vector<uint16_t> v(n);
  const auto r = randn(n, scale);
  for (size_t i = 0; i < n; ++i) v[i] = float_to_bf16_bits(r[i]);
  return v;
}

GroupedLinearConfig layer_cfg(std::shared_ptr<const nn::LinearRecipe> recipe, bool main_grad,
                              bool delay = false) {
  GroupedLinearConfig c;
  c.experts = 4;
  c.in_features = 256;
  c.out_features = 384;
  c.bias = true;
  c.max_tokens = 512;
  c.seed = 7;
  c.accumulate_into_main_grad = main_grad;
  c.delay_wgrad = delay;
  c.recipe = std::move(recipe);
  return c;
}

struct Step {
  std::vector<float> y, dx, dw, db;
};

Step run_step(GroupedLinear& l, Context& ctx, std::vector<uint16_t>& x, std::vector<uint16_t>& dy,
              std::vector<int64_t>& splits) {
  const auto& c = l.config();
  const int64_t M = int64_t(x.size()) / c.in_features;
  TensorView xv(x.data(), DType::bf16, Device::CPU, {M, c.in_features});
  TensorView dyv(dy.data(), DType::bf16, Device::CPU, {M, c.out_features});
  TensorView sv(splits.data(), DType::int64, Device::CPU, {c.experts});
  Step s;
  s.y = cpu::to_floats(l.forward(ctx, xv, sv));
  s.dx = cpu::to_floats(l.backward(ctx, dyv));
  l.backward_dw(ctx);
  ctx.check();
  s.dw = cpu::to_floats(l.weight_grad());
  s.db = cpu::to_floats(l.bias_grad());
  return s;
}

class QuantizedLayerCpu : public ::testing::TestWithParam<QuantRecipe> {};

TEST_P(QuantizedLayerCpu, CloseToTheBf16Layer) {
  const QuantRecipe r = GetParam();
  Context ctx(Device::CPU);
  for (bool main_grad : {false, true}) {
    GroupedLinear q(ctx, layer_cfg(nn::quantized_recipe(r), main_grad));
    GroupedLinear h(ctx, layer_cfg(nullptr, main_grad));  // same seed: same weights
    std::vector<int64_t> splits = {160, 0, 48, 96};       // multiples of 16 (FP8 wgrad)
    auto x = bf16_randn(304 * 256), dy = bf16_randn(304 * 384, 0.1f);
    const Step a = run_step(q, ctx, x, dy, splits), b = run_step(h, ctx, x, dy, splits);
    for (const auto& [got, want, what] : {std::tuple{&a.y, &b.y, "y"},
                                          {&a.dx, &b.dx, "dx"},
                                          {&a.dw, &b.dw, "dW"},
                                          {&a.db, &b.db, "db"}}) {
      const double d = calc_diff(*got, *want);
      EXPECT_LT(d, 1e-3) << recipe_name(r) << " " << what << (main_grad ? " main_grad" : "");
      if (std::string(what) != "db") {
        EXPECT_GT(d, 1e-8) << what << " was not quantized";
      }
    }
    // db comes from dy in full precision on every recipe (fused or not): the same fp32 sums.
    EXPECT_LT(calc_diff(a.db, b.db), 1e-12);
  }
}

TEST_P(QuantizedLayerCpu, DelayedWgradEqualsImmediate) {
  const QuantRecipe r = GetParam();
  Context ctx(Device::CPU);
  GroupedLinear now(ctx, layer_cfg(nn::quantized_recipe(r), true));
  GroupedLinear later(ctx, layer_cfg(nn::quantized_recipe(r), true, true));
  std::vector<int64_t> splits = {64, 16, 0, 128};
  auto x = bf16_randn(208 * 256), dy = bf16_randn(208 * 384);
  const Step a = run_step(now, ctx, x, dy, splits), b = run_step(later, ctx, x, dy, splits);
  EXPECT_EQ(a.dw, b.dw);
  EXPECT_EQ(a.db, b.db);
  EXPECT_EQ(a.dx, b.dx);
}

TEST_P(QuantizedLayerCpu, WeightsAreCachedUntilChanged) {
  const QuantRecipe r = GetParam();
  Context ctx(Device::CPU);
  GroupedLinear q(ctx, layer_cfg(nn::quantized_recipe(r), false));
  std::vector<int64_t> splits = {64, 64, 64, 64};
  auto x = bf16_randn(256 * 256), dy = bf16_randn(256 * 384);
  const Step a = run_step(q, ctx, x, dy, splits);
  // Scale every weight by 2 in place: the cached quantized W still answers until
  // weights_changed(), then the output doubles (power-of-two scaling is exact in every format).
  const TensorView w = q.weight();
  for (int64_t i = 0; i < w.numel(); ++i) cpu::store_f(w, i, 2 * cpu::load_f(w, i));
  const Step b = run_step(q, ctx, x, dy, splits);
  EXPECT_EQ(a.y, b.y) << "a changed weight was used without weights_changed()";
  q.weights_changed();
  const Step c = run_step(q, ctx, x, dy, splits);
  const TensorView bias = q.bias();  // [G, N]; rows of expert g are [64 g, 64 g + 64)
  for (size_t i = 0; i < c.y.size(); ++i) {
    const int64_t row = int64_t(i) / 384, n = int64_t(i) % 384;
    const float bi = cpu::load_f(bias, (row / 64) * 384 + n);
    // y is bf16: half an ulp is at most 2^-8 |y| (8 significant bits), doubled on the a side.
    const double tol = std::ldexp(2 * std::abs(a.y[i]) + std::abs(c.y[i]), -8) + 1e-6;
    ASSERT_NEAR(c.y[i] - bi, 2 * (a.y[i] - bi), tol) << i;
  }
}

// high_precision_wgrad: forward and dgrad are the FP8 recipe's, bit for bit; dW is the bf16
// layer's (the same 16-bit GEMM of the same dy and x), bit for bit; db as on every recipe.
TEST_P(QuantizedLayerCpu, HighPrecisionWgradIsTheBf16Wgrad) {
  const QuantRecipe r = GetParam();
  Context ctx(Device::CPU);
  nn::QuantizedRecipeOptions o;
  o.high_precision_wgrad = true;
  for (bool main_grad : {false, true}) {
    for (bool delay : {false, true}) {
      GroupedLinear hp(ctx, layer_cfg(nn::quantized_recipe(r, o), main_grad, delay));
      GroupedLinear q(ctx, layer_cfg(nn::quantized_recipe(r), main_grad));
      GroupedLinear h(ctx, layer_cfg(nullptr, main_grad));  // same seed: same weights
      std::vector<int64_t> splits = {160, 0, 48, 96};
      auto x = bf16_randn(304 * 256), dy = bf16_randn(304 * 384, 0.1f);
      const Step a = run_step(hp, ctx, x, dy, splits);
      const Step fp8 = run_step(q, ctx, x, dy, splits), bf16 = run_step(h, ctx, x, dy, splits);
      const std::string what =
          std::string(recipe_name(r)) + (main_grad ? " main_grad" : "") + (delay ? " delay" : "");
      EXPECT_EQ(a.y, fp8.y) << what;
      EXPECT_EQ(a.dx, fp8.dx) << what;
      EXPECT_EQ(a.dw, bf16.dw) << what;
      EXPECT_NE(a.dw, fp8.dw) << what << ": the FP8 wgrad ran";
      EXPECT_EQ(a.db, bf16.db) << what;
    }
  }
  EXPECT_NE(nn::quantized_recipe(r, o)->name().find("bf16 wgrad"), std::string::npos);
}

// Rows of a [T, n] bf16 matrix gathered by map (-1: a zero row).
std::vector<uint16_t> gather16(const std::vector<uint16_t>& v, int64_t n,
                               const std::vector<int32_t>& map) {
  std::vector<uint16_t> out(map.size() * size_t(n), 0);
  for (size_t r = 0; r < map.size(); ++r)
    if (map[r] >= 0) std::copy_n(v.begin() + map[r] * n, n, out.begin() + int64_t(r) * n);
  return out;
}

// forward_gathered / backward_gathered (each, or both) equal forward / backward on the gathered
// copies bit for bit: y, dx, dW, db; immediate and delayed wgrad, into a main grad (without bias:
// a bias gradient into a main grad reads the bf16 dy, so that layer does not gather).
TEST_P(QuantizedLayerCpu, GatheredPassesEqualTheGatheredCopies) {
  const QuantRecipe r = GetParam();
  Context ctx(Device::CPU);
  const int64_t T = 150, M = 304;
  std::vector<int64_t> splits = {160, 0, 48, 96};
  std::vector<int32_t> map = random_row_map(M, T, 5);
  auto x_src = bf16_randn(size_t(T * 256)), dy_src = bf16_randn(size_t(T * 384), 0.1f);
  auto x = gather16(x_src, 256, map), dy = gather16(dy_src, 384, map);
  TensorView xs(x_src.data(), DType::bf16, Device::CPU, {T, 256});
  TensorView dys(dy_src.data(), DType::bf16, Device::CPU, {T, 384});
  TensorView xv(x.data(), DType::bf16, Device::CPU, {M, 256});
  TensorView dyv(dy.data(), DType::bf16, Device::CPU, {M, 384});
  TensorView mv(map.data(), DType::int32, Device::CPU, {M});
  TensorView sv(splits.data(), DType::int64, Device::CPU, {4});
  for (bool main_grad : {false, true}) {
    for (bool delay : {false, true}) {
      GroupedLinearConfig c = layer_cfg(nn::quantized_recipe(r), main_grad, delay);
      c.bias = !main_grad;
      GroupedLinear ref(ctx, c);
      const Step want = run_step(ref, ctx, x, dy, splits);
      for (int mode : {0, 1, 2}) {  // both passes gathered, forward only, backward only
        GroupedLinear l(ctx, c);    // same seed: same weights
        const std::string what = std::string(recipe_name(r)) + (main_grad ? " main_grad" : "") +
                                 (delay ? " delay" : "") + " mode " + std::to_string(mode);
        if (r == QuantRecipe::mxfp8) {
          EXPECT_FALSE(l.gathers());
          EXPECT_THROW_MSG(l.forward_gathered(ctx, xs, mv, sv),
                           "GroupedLinear.forward_gathered: recipe mxfp8 does not gather its "
                           "input (gathers() is false)");
          continue;
        }
        ASSERT_TRUE(l.gathers()) << what;
        Step got;
        got.y = cpu::to_floats(mode == 2 ? l.forward(ctx, xv, sv)
                                         : l.forward_gathered(ctx, xs, mv, sv));
        got.dx =
            cpu::to_floats(mode == 1 ? l.backward(ctx, dyv) : l.backward_gathered(ctx, dys, mv));
        l.backward_dw(ctx);
        ctx.check();
        got.dw = cpu::to_floats(l.weight_grad());
        if (c.bias) got.db = cpu::to_floats(l.bias_grad());
        EXPECT_EQ(got.y, want.y) << what;
        EXPECT_EQ(got.dx, want.dx) << what;
        EXPECT_EQ(got.dw, want.dw) << what;
        EXPECT_EQ(got.db, want.db) << what;
      }
    }
  }
}

TEST(QuantizedLayerCpuErrors, GatheredPassesRefused) {
  Context ctx(Device::CPU);
  nn::QuantizedRecipeOptions o;
  o.high_precision_wgrad = true;
  std::vector<int32_t> map = random_row_map(64, 40, 1);
  std::vector<int64_t> splits = {64, 0, 0, 0};
  auto x_src = bf16_randn(40 * 256);
  TensorView xs(x_src.data(), DType::bf16, Device::CPU, {40, 256});
  TensorView mv(map.data(), DType::int32, Device::CPU, {64});
  TensorView sv(splits.data(), DType::int64, Device::CPU, {4});
  // a 16-bit wgrad, and a bias gradient into a main grad, read the bf16 operands
  GroupedLinear hp(ctx, layer_cfg(nn::quantized_recipe(QuantRecipe::fp8_block, o), false));
  EXPECT_FALSE(hp.gathers());
  GroupedLinear mg(ctx, layer_cfg(nn::quantized_recipe(QuantRecipe::fp8_block), true));
  EXPECT_FALSE(mg.gathers());
  GroupedLinear bf(ctx, layer_cfg(nullptr, false));
  EXPECT_FALSE(bf.gathers());
  EXPECT_THROW_MSG(bf.forward_gathered(ctx, xs, mv, sv), "does not gather its input");
  GroupedLinear l(ctx, layer_cfg(nn::quantized_recipe(QuantRecipe::fp8_current), false));
  ASSERT_TRUE(l.gathers());
  TensorView m64(map.data(), DType::int64, Device::CPU, {32});
  EXPECT_THROW_MSG(l.forward_gathered(ctx, xs, m64, sv), "GroupedLinear.forward_gathered: row_map");
  std::vector<int32_t> big(600, -1);
  EXPECT_THROW_MSG(
      l.forward_gathered(ctx, xs, TensorView(big.data(), DType::int32, Device::CPU, {600}), sv),
      "GroupedLinear.forward_gathered: row_map.shape[0]=600 exceeds max_tokens=512");
  l.forward_gathered(ctx, xs, mv, sv);
  std::vector<uint16_t> dy_src(40 * 384, 0);
  TensorView dys(dy_src.data(), DType::bf16, Device::CPU, {40, 384});
  EXPECT_THROW_MSG(
      l.backward_gathered(ctx, dys, TensorView(map.data(), DType::int32, Device::CPU, {48})),
      "GroupedLinear.backward_gathered: row_map.shape[0]=48 must equal forward's rows 64");
}

INSTANTIATE_TEST_SUITE_P(Recipes, QuantizedLayerCpu,
                         ::testing::Values(QuantRecipe::fp8_current, QuantRecipe::fp8_block,
                                           QuantRecipe::mxfp8),
                         [](const auto& info) { return std::string(recipe_name(info.param)); });

TEST(QuantizedLayerCpuErrors, ClearMessages) {
  Context ctx(Device::CPU);
  EXPECT_THROW_MSG(nn::quantized_recipe(QuantRecipe::nvfp4),
                   "recipe=nvfp4 must be fp8_current, fp8_block or mxfp8 (4-bit weights for "
                   "inference: nvfp4_weight_recipe()");
  EXPECT_THROW_MSG(nn::quantized_recipe(QuantRecipe::fp8_block, {DType::fp8e5m2, false}),
                   "fp8_block gradients are fp8e4m3");
  GroupedLinearConfig c = layer_cfg(nn::quantized_recipe(QuantRecipe::fp8_block), false);
  c.in_features = 320;
  EXPECT_THROW_MSG(GroupedLinear(ctx, c), "must be multiples of 128");
  c = layer_cfg(nn::quantized_recipe(QuantRecipe::fp8_current), false);
  c.dtype = DType::fp16;
  EXPECT_THROW_MSG(GroupedLinear(ctx, c), "dtype=fp16 must be bf16");
}

// recipe_traits is the one statement of each recipe's rules: its table, the quantize config's
// blocks and scale dtype, and the layers' feature rule (accepted at the multiple, refused at half
// of it, with the multiple in the message).
TEST(RecipeTraits, TableAndTheRulesThatReadIt) {
  struct Row {
    QuantRecipe r;
    int row, col;
    DType scale;
    int gemm_k, gemm_n, split, in, out;
    bool e5m2;
  };
  const Row rows[] = {
      {QuantRecipe::fp8_current, 16, 128, DType::fp32, 16, 16, 16, 16, 16, true},
      {QuantRecipe::fp8_block, 128, 128, DType::fp32, 128, 128, 16, 128, 128, false},
      {QuantRecipe::mxfp8, 32, 32, DType::e8m0, 16, 16, 1, 32, 32, true},
      {QuantRecipe::nvfp4, 16, 16, DType::fp8e4m3, 32, 8, 1, 32, 8, false},
      {QuantRecipe::mxfp4, 32, 32, DType::e8m0, 32, 8, 1, 32, 8, false}};
  Context ctx(Device::CPU);
  for (const Row& w : rows) {
    SCOPED_TRACE(recipe_name(w.r));
    const RecipeTraits t = recipe_traits(w.r);
    EXPECT_EQ(t.row_block, w.row);
    EXPECT_EQ(t.col_block, w.col);
    EXPECT_EQ(t.scale_dtype, w.scale);
    EXPECT_EQ(t.fp4, w.r == QuantRecipe::nvfp4 || w.r == QuantRecipe::mxfp4);
    EXPECT_EQ(t.gemm_k_multiple, w.gemm_k);
    EXPECT_EQ(t.gemm_n_multiple, w.gemm_n);
    EXPECT_EQ(t.split_multiple, w.split);
    EXPECT_EQ(t.in_features_multiple, w.in);
    EXPECT_EQ(t.out_features_multiple, w.out);
    EXPECT_EQ(t.e5m2_gradients, w.e5m2);
    QuantizeConfig q;
    q.recipe = w.r;
    EXPECT_EQ(q.row_block(), t.row_block);
    EXPECT_EQ(q.col_block(), t.col_block);
    EXPECT_EQ(q.scale_dtype(), t.scale_dtype);
    const auto recipe =
        t.fp4 ? (w.r == QuantRecipe::nvfp4 ? nn::nvfp4_weight_recipe() : nn::mxfp4_weight_recipe())
              : nn::quantized_recipe(w.r);
    GroupedLinearConfig c = layer_cfg(recipe, false);
    c.in_features = 2 * w.in;
    c.out_features = w.out;
    c.max_tokens = 32;
    EXPECT_NO_THROW(GroupedLinear(ctx, c));
    c.in_features = w.in / 2;
    EXPECT_THROW_MSG(GroupedLinear(ctx, c),
                     detail::cat("multiple", t.fp4 ? " of " : "s of ", w.in));
  }
}

}  // namespace
}  // namespace groupmm::test
