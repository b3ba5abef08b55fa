// The kernels' fast twins in qnum (src/numerics/quantize.hpp, quantize_layout.hpp) against
// the rules the CPU reference runs, on the host: randomized and edge inputs. (Their device
// instructions are compared on the GPU by tests/cuda/test_qnum_gpu.cu and
// test_block_scale_gpu.cu.) Also: one summation order for the grouped bias gradient.
#include <cmath>
#include <limits>

#include "common/quant_test_util.hpp"
#include "quantize/backends.hpp"
#include "groupmm/dbias.hpp"

namespace groupmm::test {
namespace {

bool same_float(float a, float b) {
  return float_bits(a) == float_bits(b) || (std::isnan(a) && std::isnan(b));
}

// Canonical amax bits: edges of every range the block scales branch on, then random ones.
std::vector<uint32_t> amax_bits_cases(size_t n_random) {
  std::vector<uint32_t> v = {0u,          1u,          0x007FFFFFu, 0x00800000u, 0x00800001u,
                             0x05000000u, 0x1F7FFFFFu, 0x1F800000u, 0x3F800000u, 0x43E00000u,
                             0x43E00001u, 0x47600000u, 0x5F7FFFFFu, 0x5F800000u, 0x5F800001u,
                             0x7F7FFFFFu, 0x7F800000u, 0x7FC00000u};
  for (uint32_t e = 0; e < 255; ++e)  // every binade: its first, middle and last value
    for (uint32_t m : {0u, 0x400000u, 0x7FFFFFu}) v.push_back((e << 23) | m);
  std::uniform_int_distribution<uint32_t> d(0u, 0x7F800000u);
  for (size_t i = 0; i < n_random; ++i) v.push_back(d(rng()));
  return v;
}

std::vector<float> expert_amax_cases() {
  std::vector<float> v = {0.0f,
                          1.0f,
                          2688.0f,
                          448.0f,
                          1e-30f,
                          1e-38f,
                          1e-40f,
                          1e-45f,
                          3.4e38f,
                          2688.0f / 0x1p64f,
                          2688.0f / 0x1p-64f,
                          std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN()};
  for (float x : rand_wide(200)) v.push_back(std::fabs(x));
  return v;
}

template <QuantRecipe kRecipe>
void check_block_quant_fast(bool e5m2, bool pow2) {
  // fp8_current reads only the expert amax, fp8_block and mxfp8 only the block amax.
  std::vector<float> experts = expert_amax_cases();
  std::vector<uint32_t> blocks = amax_bits_cases(2000);
  if (kRecipe == QuantRecipe::fp8_current) blocks.resize(1);
  if (kRecipe == QuantRecipe::fp8_block || kRecipe == QuantRecipe::mxfp8) experts.resize(1);
  for (float expert_amax : experts) {
    qnum::ExpertQuant e;
    qnum::set_expert_quant<kRecipe>(e, expert_amax, e5m2, pow2);
    for (uint32_t am : blocks) {
      const qnum::BlockQuant got = qnum::block_quant_fast<kRecipe>(am, e, e5m2, pow2);
      const qnum::BlockQuant want = qnum::make_block_quant(kRecipe, e5m2, pow2, am, expert_amax);
      auto where = [&] {
        return ::testing::Message()
               << recipe_name(kRecipe) << " e5m2=" << e5m2 << " pow2=" << pow2 << " amax bits 0x"
               << std::hex << am << " expert amax " << std::hexfloat << expert_amax;
      };
      ASSERT_TRUE(same_float(got.mul, want.mul))
          << where() << ": " << got.mul << " vs " << want.mul;
      if (kRecipe == QuantRecipe::fp8_block) {
        ASSERT_TRUE(same_float(got.scale_inv, want.scale_inv)) << where();
      }
      if (kRecipe == QuantRecipe::mxfp8 || kRecipe == QuantRecipe::nvfp4) {
        ASSERT_EQ(got.code, want.code) << where();
      }
    }
  }
}

TEST(QuantNumericsFastTwins, BlockQuantEqualsTheRulesForEveryRecipe) {
  for (const bool e5m2 : {false, true}) {
    for (const bool pow2 : {false, true}) {
      check_block_quant_fast<QuantRecipe::fp8_current>(e5m2, pow2);
      check_block_quant_fast<QuantRecipe::fp8_block>(e5m2, pow2);
    }
    check_block_quant_fast<QuantRecipe::mxfp8>(e5m2, false);
  }
  check_block_quant_fast<QuantRecipe::nvfp4>(false, false);
}

// Blocks as the kernels see them: |x| <= the block amax, the block scale and multiplier from it.
TEST(QuantNumericsFastTwins, Nvfp4EncodeEightEqualsTheElementRule) {
  std::uniform_int_distribution<int> pick(0, 7);
  for (float expert_amax : expert_amax_cases()) {
    qnum::ExpertQuant e;
    qnum::set_expert_quant<QuantRecipe::nvfp4>(e, expert_amax, false, false);
    for (int trial = 0; trial < 200; ++trial) {
      float x[8];
      const std::vector<float> r = rand_wide(8);
      for (int j = 0; j < 8; ++j) x[j] = r[static_cast<size_t>(j)];
      if (trial % 7 == 0) x[pick(rng())] = -0.0f;
      if (trial % 11 == 0) x[pick(rng())] = std::numeric_limits<float>::infinity();
      if (trial % 13 == 0) x[pick(rng())] = std::numeric_limits<float>::quiet_NaN();
      uint32_t am = 0;
      for (float v : x) am = qnum::amax_merge(am, qnum::abs_bits(v));
      const qnum::BlockQuant q = qnum::block_quant_fast<QuantRecipe::nvfp4>(am, e, false, false);
      uint32_t want = 0, sign = 0;
      for (int j = 0; j < 8; ++j) {
        want |= uint32_t(qnum::nvfp4_code(x[j], q.code, q.mul)) << (4 * j);
        sign |= (float_bits(x[j]) >> 31) << (4 * j + 3);
      }
      ASSERT_EQ(qnum::nvfp4_encode8(x, q.mul, q.code), want) << "trial " << trial;
      // With the signs taken from the inputs (the 16-bit kernels) the codes are the same unless
      // the block is NaN (all 7s, positive, either way).
      ASSERT_EQ(qnum::nvfp4_encode8_signed(x, q.mul, q.code, q.mul != q.mul ? 0u : sign), want)
          << "trial " << trial;
    }
  }
}

TEST(QuantNumericsFastTwins, Fp8EncodeFourEqualsTheElementRule) {
  std::vector<float> xs = rand_wide(4000);
  for (float v : {0.0f, -0.0f, 448.0f, 464.0f, 57344.0f, 61440.0f, 1e-10f,
                  std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()})
    xs.push_back(v);
  for (size_t i = 0; i + 4 <= xs.size(); i += 4) {
    for (const float mul : {1.0f, 0.37f, 1024.0f, std::numeric_limits<float>::quiet_NaN()}) {
      const uint32_t got4 = qnum::fp8x4_encode<false>(xs[i], xs[i + 1], xs[i + 2], xs[i + 3], mul);
      const uint32_t got5 = qnum::fp8x4_encode<true>(xs[i], xs[i + 1], xs[i + 2], xs[i + 3], mul);
      for (int j = 0; j < 4; ++j) {
        const float p = qnum::canon_nan(xs[i + static_cast<size_t>(j)] * mul);
        ASSERT_EQ((got4 >> (8 * j)) & 0xFFu, qnum::fp8_encode(p, false)) << xs[i + j] << " " << mul;
        ASSERT_EQ((got5 >> (8 * j)) & 0xFFu, qnum::fp8_encode(p, true)) << xs[i + j] << " " << mul;
      }
    }
  }
}

TEST(QuantNumericsFastTwins, KeepNanMinimumAndInRangeDivision) {
  EXPECT_TRUE(std::isnan(qnum::min_keep_nan(std::nanf(""), 1.0f)));
  EXPECT_EQ(qnum::min_keep_nan(3e38f, 1.0f), 1.0f);
  EXPECT_EQ(qnum::min_keep_nan(-2.0f, 1.0f), -2.0f);
  EXPECT_EQ(qnum::div_rn_inrange(448.0f, 3.0f), 448.0f / 3.0f);
  for (int c = 0; c < 256; ++c)
    EXPECT_TRUE(same_float(qnum::e4m3_decode(static_cast<uint8_t>(c)),
                           e4m3_to_float(static_cast<uint8_t>(c))))
        << c;
}

// The per-thread scale index form against the plain one, over the layouts that use it.
TEST(QuantLayoutFastTwins, InTileRowScaleIndexEqualsThePlainOne) {
  std::uniform_int_distribution<int64_t> big(0, 1 << 20);
  for (const QuantRecipe r :
       {QuantRecipe::fp8_block, QuantRecipe::mxfp8, QuantRecipe::nvfp4, QuantRecipe::mxfp4}) {
    for (const ScaleLayout sl :
         {ScaleLayout::plain, ScaleLayout::swizzled, ScaleLayout::mn_major}) {
      if (sl == ScaleLayout::swizzled && r == QuantRecipe::fp8_block) continue;
      if (sl == ScaleLayout::mn_major && r != QuantRecipe::fp8_block) continue;
      for (const bool block_2d : {false, true}) {
        if (block_2d && (r == QuantRecipe::mxfp8 || r == QuantRecipe::mxfp4)) continue;
        QuantizeConfig c = qcfg(r, QuantDirection::both, sl, DType::fp8e4m3, false, block_2d);
        for (const int64_t K : {128, 256, 640, 7168}) {
          const qnum::Layout L = make_layout(c, 100000, K, 64);
          for (int trial = 0; trial < 300; ++trial) {
            qnum::Geom g;
            g.start = big(rng());
            g.rows = big(rng()) % 5000 + 1;
            g.tile_start = big(rng()) % 4096;
            const int64_t lt = big(rng()) % qnum::ceil_div(g.rows, 128);
            const int r0 = static_cast<int>(big(rng()) % 128);
            const int sc = static_cast<int>(big(rng()) % L.row_ncols);
            ASSERT_EQ(qnum::row_scale_index_in_tile(L, g, lt, r0, sc),
                      qnum::row_scale_index(L, g, lt * 128 + r0, sc))
                << recipe_name(r) << " " << scale_layout_name(sl) << " K=" << K;
          }
        }
      }
    }
  }
}

TEST(QuantLayoutFastTwins, SwizzledIndexIsThePublicFormula) {
  QuantizeConfig c = qcfg(QuantRecipe::mxfp8, QuantDirection::both, ScaleLayout::swizzled);
  const qnum::Layout L = make_layout(c, 4096, 640, 4);
  qnum::Geom g;
  g.tile_start = 3;
  g.cs4_start = 8;
  g.rows = 300;
  const int64_t nb = qnum::col_blocks(L, g.rows);
  EXPECT_EQ(nb, qnum::ceil_div(300, 32));
  for (int64_t r = 0; r < 384; ++r)
    for (int64_t s = 0; s < L.row_kp; ++s)
      ASSERT_EQ(qnum::row_scale_index_swizzled(L, g, r, s),
                swizzle_128x4_index(3 * 128 + r, s, L.row_kp));
  for (int64_t k = 0; k < L.col_k128; ++k)
    for (int64_t j = 0; j < qnum::round_up(nb, 4); ++j)
      ASSERT_EQ(qnum::col_scale_index_swizzled(L, g, nb, k, j),
                L.col_k128 * 8 + swizzle_128x4_index(k, j, qnum::round_up(nb, 4)));
}

// group_dbias and the bias gradient of bgrad_group_quantize: one order, so bit-equal sums.
TEST(DbiasOrder, GroupDbiasEqualsTheBgradQuantizeSums) {
  Context ctx(Device::CPU);
  for (const Pattern pat : {Pattern::balanced, Pattern::zipf, Pattern::random_odd}) {
    const int64_t G = 6, M = 1000, K = 96;
    std::vector<int64_t> s = make_splits(pat, G, M);
    std::vector<float> values = rand_wide(static_cast<size_t>(M * K));
    Tensor x = make_input(values, DType::bf16, {M, K}, Device::CPU);
    std::vector<float> db_q(static_cast<size_t>(G * K)), db_d(static_cast<size_t>(G * K));
    run_quantize(ctx, x, host_view(s, DType::int64, {G}), qcfg(QuantRecipe::mxfp8),
                 host_view(db_q, DType::fp32, {G, K}));
    group_dbias(ctx, x, host_view(s, DType::int64, {G}), host_view(db_d, DType::fp32, {G, K}));
    for (size_t i = 0; i < db_q.size(); ++i)
      ASSERT_EQ(float_bits(db_q[i]), float_bits(db_d[i])) << pattern_name(pat) << " at " << i;
  }
}

}  // namespace
}  // namespace groupmm::test
