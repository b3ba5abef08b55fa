// 4-bit weight formats pinned by hand-computed vectors (DESIGN section 5): MXFP4's E8M0 scales,
// E2M1 codes and nibble order, NVFP4's two-level scale; round trips within half a step; MXFP4
// checkpoint import / export; the GEMM form of the weights (numerics/w4.hpp) on the host.
#include <cmath>
#include <limits>

#include "common/quant_test_util.hpp"
#include "quantize/backends.hpp"
#include "numerics/w4.hpp"

namespace groupmm::test {
namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

// One expert, one row of fp32 values, rowwise plain.
Quantized one_row(Context& ctx, const std::vector<float>& row, QuantRecipe r, Tensor& x,
                  std::vector<int32_t>& splits) {
  x = make_input(row, DType::fp32, {1, int64_t(row.size())}, Device::CPU);
  splits = {1};
  return run_quantize(ctx, x, host_view(splits, DType::int32, {1}),
                      qcfg(r, QuantDirection::rowwise));
}

TEST(W4Formats, Mxfp4EveryCodeAndNibbleOrder) {
  // amax 6: v = 6 * fp32(1/6) rounds to exactly 1.0, e = 127 (no round up), so q = e2m1(x).
  // Element 2j is the low nibble.
  Context ctx(Device::CPU);
  std::vector<float> row = {0, .5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -.5f, -1, -1.5f, -2, -3, -4, -6};
  row.resize(32, 0.0f);
  Tensor x;
  std::vector<int32_t> s;
  Quantized q = one_row(ctx, row, QuantRecipe::mxfp4, x, s);
  EXPECT_EQ(quant_bytes(q.buf.data), (std::vector<uint8_t>{0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC,
                                                           0xFE, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(quant_bytes(q.buf.scale_inv), (std::vector<uint8_t>{127}));
  EXPECT_FALSE(q.buf.global_scale.view().present()) << "mxfp4 has no per-expert scalars";
  EXPECT_FALSE(q.buf.amax.view().present());
}

struct Mx4Case {
  float amax;
  uint8_t e;        // expected E8M0 exponent
  uint8_t q_amax;   // expected code of the element holding amax
  float other;      // a second element
  uint8_t q_other;  // its code
};

TEST(W4Formats, Mxfp4E8m0Scales) {
  // e = exponent of amax * fp32(1/6), rounded up when its mantissa is non-zero; q = e2m1(x *
  // 2^(127 - e)).
  //  6.5: v = 1.083 -> 2^1, e = 128: 6.5/2 = 3.25 -> 3 (0x5); 1 -> .5 (0x1)
  //  12:  v = 2.0000000596 rounds to 2.0 in fp32, e = 128: 12/2 = 6 (0x7); 3 -> 1.5 (0x3)
  //  3:   v = 0.5, e = 126: 3*2 = 6 (0x7); 1 -> 2 (0x4)
  //  0:   e = 0, every code 0
  //  Inf: v = Inf -> e = 254, Inf -> 6 (0x7); 1 * 2^-127 -> 0
  //  NaN: e = 255, every element encodes as 6 (0x7)
  const Mx4Case cases[] = {{6.5f, 128, 0x5, 1.0f, 0x1}, {12.0f, 128, 0x7, 3.0f, 0x3},
                           {3.0f, 126, 0x7, 1.0f, 0x4}, {0.0f, 0, 0x0, 0.0f, 0x0},
                           {kInf, 254, 0x7, 1.0f, 0x0}, {kNaN, 255, 0x7, 1.0f, 0x7}};
  for (const Mx4Case& c : cases) {
    Context ctx(Device::CPU);
    std::vector<float> row(32, 0.0f);
    row[4] = c.amax;
    row[5] = c.other;
    Tensor x;
    std::vector<int32_t> s;
    Quantized q = one_row(ctx, row, QuantRecipe::mxfp4, x, s);
    const auto d = quant_bytes(q.buf.data);
    EXPECT_EQ(quant_bytes(q.buf.scale_inv)[0], c.e) << "amax " << c.amax;
    EXPECT_EQ(d[2], c.q_amax | (c.q_other << 4)) << "amax " << c.amax;
    EXPECT_EQ(d[0], std::isnan(c.amax) ? 0x77 : 0x00) << "amax " << c.amax;
    EXPECT_EQ(qnum::mxfp4_e8m0(c.amax), c.e);
  }
}

TEST(W4Formats, Mxfp4Dequantizes) {
  // Dequant q * 2^(e - 127): codes of a block with e = 129 (x4), NaN for e = 255.
  std::vector<uint8_t> data = {0x71, 0xF9};  // elements: .5, 6, -.5, -6
  std::vector<uint8_t> scales = {129};
  QuantizeConfig c = qcfg(QuantRecipe::mxfp4, QuantDirection::rowwise);
  const qnum::Layout L = make_layout(c, 1, 32, 1);
  const qnum::Geom g{0, 1, 0, 0, 0};
  const float want[] = {2.0f, 24.0f, -2.0f, -24.0f};
  for (int k = 0; k < 4; ++k)
    EXPECT_EQ(qnum::dequant_value(L, g, 0, 0, k, false, data.data(), scales.data(), nullptr),
              want[k]);
  scales[0] = 255;
  EXPECT_TRUE(
      std::isnan(qnum::dequant_value(L, g, 0, 0, 0, false, data.data(), scales.data(), nullptr)));
}

TEST(W4Formats, Nvfp4TwoLevelScale) {
  // Block 0 amax 1, block 1 amax 2: amax_g = 2, S_enc = 2688 / 2 = 1344. s_b0 = e4m3(1 * 1344/6 =
  // 224) = 0x76, multiplier 1344 / 224 = 6: 1 -> 6 (0x7), .5 -> 3 (0x5). s_b1 = e4m3(448) = 0x7E,
  // multiplier 3: 2 -> 6 (0x7), 1 -> 3 (0x5). Dequant q * s_b / S_enc: 6 * 224 / 1344 = 1.
  Context ctx(Device::CPU);
  std::vector<float> row(32, 0.0f);
  row[0] = 1.0f;
  row[1] = 0.5f;
  row[16] = 2.0f;
  row[17] = 1.0f;
  Tensor x;
  std::vector<int32_t> s;
  Quantized q = one_row(ctx, row, QuantRecipe::nvfp4, x, s);
  const auto d = quant_bytes(q.buf.data);
  EXPECT_EQ(q.buf.global_scale.ptr<float>()[0], 1344.0f);
  EXPECT_EQ(quant_bytes(q.buf.scale_inv), (std::vector<uint8_t>{0x76, 0x7E}));
  EXPECT_EQ(d[0], 0x57);
  EXPECT_EQ(d[8], 0x57);
  Tensor out = Tensor::empty({1, 32}, DType::fp32, Device::CPU);
  GroupDequantizeArgs da;
  da.in = q.gt;
  da.config = quantize_config_of(q.gt);
  da.out = out;
  group_dequantize(ctx, da);
  EXPECT_EQ(out.ptr<float>()[0], 1.0f);
  EXPECT_EQ(out.ptr<float>()[1], 0.5f);
  EXPECT_EQ(out.ptr<float>()[16], 2.0f);
  EXPECT_EQ(out.ptr<float>()[17], 1.0f);
}

// Half the E2M1 step at |x| / s (s: the block's dequant scale): 0.25 below 2, 0.5 below 4, 1.
double half_step(double ax, double s) {
  const double a = ax / s;
  return (a <= 2 ? 0.25 : a <= 4 ? 0.5 : 1.0) * s;
}

TEST(W4Formats, Mxfp4RoundTripWithinHalfAStep) {
  for (ScaleLayout layout : {ScaleLayout::plain, ScaleLayout::swizzled}) {
    Context ctx(Device::CPU);
    const int64_t G = 3, N = 40, K = 96;
    const std::vector<float> v = rand_wide(size_t(G * N * K));
    Tensor w = make_input(v, DType::fp32, {G, N, K}, Device::CPU);
    Quantized q = run_quantize(ctx, w, TensorView(),
                               qcfg(QuantRecipe::mxfp4, QuantDirection::rowwise, layout));
    Tensor out = Tensor::empty({G, N, K}, DType::fp32, Device::CPU);
    GroupDequantizeArgs da;
    da.in = q.gt;
    da.config = quantize_config_of(q.gt);
    da.out = out;
    group_dequantize(ctx, da);
    const QuantizeConfig c = qcfg(QuantRecipe::mxfp4, QuantDirection::rowwise, layout);
    const qnum::Layout L = make_layout(c, G * N, K, G);
    for (int64_t r = 0; r < G * N; ++r) {
      const qnum::Geom geo{r / N * N, N, r / N * qnum::ceil_div(N, 128), 0, 0};
      for (int64_t k = 0; k < K; ++k) {
        const uint8_t e =
            q.buf.scale_inv.ptr<uint8_t>()[qnum::row_scale_index(L, geo, r % N, k / 32)];
        const double s = std::ldexp(1.0, int(e) - 127), x = v[size_t(r * K + k)];
        const double d = out.ptr<float>()[r * K + k];
        ASSERT_LE(std::abs(d - x), half_step(std::abs(x), s))
            << "row " << r << " k " << k << " x " << x << " dequant " << d;
      }
    }
  }
}

// Checkpoint tensors of values whose blocks each hold one +-6 * 2^(e - 127): quantizing the values
// must give exactly these codes and exponents.
struct Checkpoint {
  int64_t G, N, K;
  std::vector<uint8_t> blocks, scales;
  std::vector<float> values;
};

Checkpoint make_checkpoint(int64_t G, int64_t N, int64_t K) {
  Checkpoint c{G,
               N,
               K,
               std::vector<uint8_t>(size_t(G * N * K / 2)),
               std::vector<uint8_t>(size_t(G * N * K / 32)),
               std::vector<float>(size_t(G * N * K))};
  std::uniform_int_distribution<int> code(0, 15), ex(100, 140), pos(0, 31);
  for (int64_t b = 0; b < G * N * K / 32; ++b) {
    const uint8_t e = uint8_t(ex(rng()));
    c.scales[size_t(b)] = e;
    const int big = pos(rng());
    for (int i = 0; i < 32; ++i) {
      uint8_t q = uint8_t(code(rng()));
      if (i == big) q = (q & 8) | 7;  // the block's amax: 6 * 2^(e - 127)
      const int64_t k = b * 32 + i;
      c.values[size_t(k)] = e2m1_to_float(q) * std::ldexp(1.0f, int(e) - 127);
      uint8_t& byte = c.blocks[size_t(k / 2)];
      byte = (k & 1) ? uint8_t((byte & 0x0F) | (q << 4)) : uint8_t((byte & 0xF0) | q);
    }
  }
  return c;
}

TEST(W4Formats, Mxfp4CheckpointImportEqualsQuantizeAndExportInverts) {
  const Checkpoint ck = make_checkpoint(3, 136, 96);
  const int64_t G = ck.G, N = ck.N, K = ck.K;
  for (ScaleLayout layout : {ScaleLayout::plain, ScaleLayout::swizzled}) {
    Context ctx(Device::CPU);
    Tensor w = make_input(ck.values, DType::fp32, {G, N, K}, Device::CPU);
    const QuantizeConfig cfg = qcfg(QuantRecipe::mxfp4, QuantDirection::rowwise, layout);
    Quantized q = run_quantize(ctx, w, TensorView(), cfg);
    ASSERT_EQ(quant_bytes(q.buf.data), ck.blocks) << "the values quantize to the checkpoint codes";

    QuantizedBuffers ours =
        allocate_quantized(group_quantize_shapes(G * N, K, G, cfg), Device::CPU);
    fill_bytes(ours.data, 0xAB);
    fill_bytes(ours.scale_inv, 0xAB);
    std::vector<uint8_t> blocks = ck.blocks, scales = ck.scales;
    Mxfp4CheckpointArgs a;
    a.G = G;
    a.N = N;
    a.K = K;
    a.blocks = TensorView(blocks.data(), DType::e8m0, Device::CPU, {G * N, K / 2});
    a.scales = TensorView(scales.data(), DType::e8m0, Device::CPU, {G, N, K / 32});
    a.weights = ours.view(G, TensorView(), cfg);
    const GroupedTensor imported = import_mxfp4_weights(ctx, a);
    EXPECT_EQ(imported.recipe, QuantRecipe::mxfp4);
    EXPECT_EQ(imported.num_groups, G);
    EXPECT_EQ(quant_bytes(ours.data), quant_bytes(q.buf.data)) << scale_layout_name(layout);
    // Scales: every byte equals quantizing the same values, the experts' (padded) blocks and the
    // slack of the host-known bound past the last expert (swizzled: (M + 127 G) rows), written 0.
    const std::vector<uint8_t> got = quant_bytes(ours.scale_inv),
                               want = quant_bytes(q.buf.scale_inv);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(got, want) << scale_layout_name(layout)
                         << ": import equals quantizing the same values";
    const size_t used = layout == ScaleLayout::swizzled
                            ? size_t(G * qnum::round_up(N, 128) * qnum::round_up(K / 32, 4))
                            : got.size();
    if (layout == ScaleLayout::swizzled) ASSERT_LT(used, got.size()) << "the case has slack";
    for (size_t i = used; i < got.size(); ++i) ASSERT_EQ(got[i], 0) << "slack byte " << i;

    std::vector<uint8_t> b2(blocks.size(), 0xCD), s2(scales.size(), 0xCD);
    a.blocks = TensorView(b2.data(), DType::fp4e2m1x2, Device::CPU, {G, N, K});
    a.scales = TensorView(s2.data(), DType::e8m0, Device::CPU, {G * N, K / 32});
    a.weights = imported;
    export_mxfp4_weights(ctx, a);
    EXPECT_EQ(b2, ck.blocks);
    EXPECT_EQ(s2, ck.scales) << scale_layout_name(layout) << ": export inverts import";
  }
}

TEST(W4Formats, Mxfp4CheckpointErrors) {
  Context ctx(Device::CPU);
  std::vector<uint8_t> blocks(2 * 64 * 64 / 2), scales(2 * 64 * 2);
  const QuantizeConfig cfg = qcfg(QuantRecipe::mxfp4, QuantDirection::rowwise);
  QuantizedBuffers ours = allocate_quantized(group_quantize_shapes(128, 64, 2, cfg), Device::CPU);
  Mxfp4CheckpointArgs a;
  a.G = 2;
  a.N = 64;
  a.K = 64;
  a.blocks = TensorView(blocks.data(), DType::e8m0, Device::CPU, {int64_t(blocks.size())});
  a.scales = TensorView(scales.data(), DType::e8m0, Device::CPU, {int64_t(scales.size())});
  a.weights = ours.view(2, TensorView(), cfg);
  Mxfp4CheckpointArgs bad = a;
  bad.K = 48;
  EXPECT_THROW_MSG(import_mxfp4_weights(ctx, bad),
                   "import_mxfp4_weights: K=48 must be a multiple of 32");
  bad = a;
  bad.scales.shape[0] = 100;
  EXPECT_THROW_MSG(import_mxfp4_weights(ctx, bad), "import_mxfp4_weights: scales has 100 bytes");
  bad = a;
  bad.blocks.dtype = DType::bf16;
  EXPECT_THROW_MSG(import_mxfp4_weights(ctx, bad), "blocks.dtype=bf16 must be e8m0");
  bad = a;
  bad.weights.recipe = QuantRecipe::nvfp4;
  EXPECT_THROW_MSG(export_mxfp4_weights(ctx, bad), "export_mxfp4_weights: weights.recipe=nvfp4");
}

// ---- the GEMM form of the weights (numerics/w4.hpp), host side ---------------------------

// The value of every (code, scale) pair through the kernels' form equals the rule.
TEST(W4Numerics, GemmWeightsEqualTheRuleForEveryCodeAndScale) {
  for (QuantRecipe r : {QuantRecipe::nvfp4, QuantRecipe::mxfp4}) {
    for (int sc = 0; sc < 256; ++sc) {
      const uint8_t s = uint8_t(sc);
      for (uint32_t base = 0; base < 16; base += 8) {  // codes base..base+7, one per nibble
        uint32_t q = 0;
        for (uint32_t i = 0; i < 8; ++i) q |= ((base + i) & 0xF) << (4 * i);
        uint32_t w[4];
        if (r == QuantRecipe::nvfp4) {
          qnum::w4_weights8(q, qnum::w4_nvfp4_multiplier(s), w);
        } else if (qnum::w4_mxfp4_needs_two(s)) {
          qnum::w4_weights8(q, qnum::w4_mxfp4_multiplier1(s), qnum::w4_mxfp4_multiplier2(s), w);
        } else {
          qnum::w4_weights8(q, qnum::w4_mxfp4_multiplier1(s), w);
          uint32_t w2[4];  // the two-factor form agrees where one factor suffices
          qnum::w4_weights8(q, qnum::w4_mxfp4_multiplier1(s), qnum::w4_mxfp4_multiplier2(s), w2);
          for (int i = 0; i < 4; ++i) ASSERT_EQ(w[i], w2[i]);
        }
        for (int i = 0; i < 4; ++i)
          for (int h = 0; h < 2; ++h) {
            const uint8_t c = uint8_t((base + (h ? 7 : 3) - i) & 0xF);
            const uint16_t got = uint16_t(h ? w[i] >> 16 : w[i] & 0xFFFF);
            const uint16_t want = float_to_bf16_bits(qnum::w4_weight_value(r, c, s));
            ASSERT_EQ(got, want) << recipe_name(r) << " code " << int(c) << " scale " << sc;
          }
      }
    }
  }
}

// The conversion's bit placement (masks and one multiply a pair of codes) equals the direct
// placement e2m1_raw_pair(q << 4i) for every code at every nibble, whatever the other nibbles hold
// (a carry between the multiply's two copies would show here), and for random words.
TEST(W4Numerics, RawPairsEqualTheDirectPlacement) {
  auto check = [](uint32_t q) {
    uint32_t r[4];
    qnum::e2m1x8_raw(q, r);
    for (int i = 0; i < 4; ++i) ASSERT_EQ(r[i], qnum::e2m1_raw_pair(q << (4 * i))) << std::hex << q;
  };
  uint64_t state = 0x9E3779B97F4A7C15ull;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(state >> 32);
  };
  for (int nibble = 0; nibble < 8; ++nibble)
    for (uint32_t c = 0; c < 16; ++c)
      for (uint32_t background : {0u, 0xFFFFFFFFu, 0x77777777u, 0x88888888u, next(), next()}) {
        const uint32_t mask = 0xFu << (4 * nibble);
        check((background & ~mask) | (c << (4 * nibble)));
      }
  for (int k = 0; k < 200000; ++k) check(next());
}

// The RS GEMM's form: every byte (two codes, the low nibble the even K element) times every block
// multiplier gives the rule's values in natural order.
TEST(W4Numerics, BytePairsEqualTheRuleForEveryByteAndScale) {
  for (QuantRecipe r : {QuantRecipe::nvfp4, QuantRecipe::mxfp4})
    for (int sc = 0; sc < 256; ++sc) {
      const uint8_t s = uint8_t(sc);
      for (uint32_t b = 0; b < 256; ++b) {
        uint32_t w = qnum::e2m1_byte_raw_pair(b);
        if (r == QuantRecipe::nvfp4) {
          w = qnum::bf16x2_mul(w, qnum::w4_nvfp4_multiplier(s));
        } else {
          w = qnum::bf16x2_mul(w, qnum::w4_mxfp4_multiplier1(s));
          w = qnum::bf16x2_mul(w, qnum::w4_mxfp4_multiplier2(s));
        }
        for (int h = 0; h < 2; ++h) {
          const uint8_t c = uint8_t(h ? b >> 4 : b & 0xF);
          const uint16_t got = uint16_t(h ? w >> 16 : w & 0xFFFF);
          const uint16_t want = float_to_bf16_bits(qnum::w4_weight_value(r, c, s));
          ASSERT_EQ(got, want) << recipe_name(r) << " byte " << b << " scale " << sc;
        }
      }
    }
}

TEST(W4Numerics, ActivationPairsFollowTheWeightOrder) {
  // x pairs (0,1) (2,3) (4,5) (6,7) -> (3,7) (2,6) (1,5) (0,4); natural_pairs inverts the order.
  const uint32_t x0 = 0x00010000, x1 = 0x00030002, x2 = 0x00050004, x3 = 0x00070006;
  uint32_t p[4], n[4];
  qnum::w4_x_pairs(x0, x1, x2, x3, p);
  EXPECT_EQ(p[0], 0x00070003u);
  EXPECT_EQ(p[1], 0x00060002u);
  EXPECT_EQ(p[2], 0x00050001u);
  EXPECT_EQ(p[3], 0x00040000u);
  qnum::w4_natural_pairs(p, n);
  EXPECT_EQ(n[0], x0);
  EXPECT_EQ(n[1], x1);
  EXPECT_EQ(n[2], x2);
  EXPECT_EQ(n[3], x3);
}

TEST(W4Numerics, ScaleColumnOffsetSplitsTheIndex) {
  for (ScaleLayout layout : {ScaleLayout::plain, ScaleLayout::swizzled}) {
    const QuantizeConfig c = qcfg(QuantRecipe::nvfp4, QuantDirection::rowwise, layout);
    const int64_t G = 3, N = 200, K = 352;
    const qnum::Layout L = make_layout(c, G * N, K, G);
    for (int64_t g = 0; g < G; ++g) {
      const qnum::Geom geo{g * N, N, g * qnum::ceil_div(N, 128), 0, 0};
      for (int64_t n = 0; n < N; ++n)
        for (int64_t sc = 0; sc < K / 16; ++sc)
          ASSERT_EQ(qnum::row_scale_index(L, geo, n, sc),
                    qnum::row_scale_index(L, geo, n, 0) + qnum::row_scale_col_offset(L, sc));
    }
  }
}

}  // namespace
}  // namespace groupmm::test
