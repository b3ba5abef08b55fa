// Hand-computed vectors pinning the format rules of docs/numerics.md, independent of our code:
// E8M0 exponents at the edges, E2M1 codes and nibble order, FP8 current/blockwise scaling (E4M3
// and E5M2), NaN and Inf in every recipe, 2D weight blocks, an NVFP4 expert with amax 0, partial
// blocks, off-grid values whose rounding is not their truncation, the swizzle index formula.
#include <algorithm>
#include <cmath>
#include <limits>

#include "common/quant_test_util.hpp"
#include "numerics/quantize_layout.hpp"
#include "numerics/quantize.hpp"

namespace groupmm::test {
namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

// n zeros with the given (index, value) entries.
std::vector<float> zeros_with(size_t n, std::initializer_list<std::pair<size_t, float>> at) {
  std::vector<float> v(n, 0.0f);
  for (const auto& [i, x] : at) v[i] = x;
  return v;
}

struct Mark {
  int64_t row, col;
  float value;
};
// A [rows, K] tensor of ones with marked elements (as one weight expert [1, rows, K] when
// `weight`), in bf16 (every value here is exact in bf16).
Tensor ones_with(int64_t rows, int64_t K, std::initializer_list<Mark> marks, bool weight) {
  std::vector<float> v(static_cast<size_t>(rows * K), 1.0f);
  for (const Mark& m : marks) v[static_cast<size_t>(m.row * K + m.col)] = m.value;
  return weight ? make_input(v, DType::bf16, {1, rows, K}, Device::CPU)
                : make_input(v, DType::bf16, {rows, K}, Device::CPU);
}

// One expert, one row of K fp32 values, rowwise plain; returns (data bytes, scale bytes).
// x [rows, K] quantized as one expert (its splits kept in splits_storage).
Quantized one_expert(Context& ctx, const Tensor& x, const QuantizeConfig& cfg,
                     std::vector<int32_t>& splits_storage) {
  splits_storage = {static_cast<int32_t>(x.view().dim(0))};
  return run_quantize(ctx, x, host_view(splits_storage, DType::int32, {1}), cfg);
}

Quantized one_row(Context& ctx, std::vector<float> row, const QuantizeConfig& cfg,
                  std::vector<int32_t>& splits_storage, Tensor& x) {
  const int64_t K = static_cast<int64_t>(row.size());
  x = make_input(row, DType::fp32, {1, K}, Device::CPU);
  return one_expert(ctx, x, cfg, splits_storage);
}

struct MxCase {
  float amax;
  uint8_t e;  // expected E8M0 exponent
  uint8_t q;  // expected e4m3 code of the element holding amax
};

TEST(QuantFormats, Mxfp8E8m0Edges) {
  // v = amax * fp32(1/448). 448 * fp32(1/448) rounds to exactly 1.0 -> e = 127, q(448) = 448.
  // The next fp32 above 448 gives v = 1 + 2^-23 -> rounded up to 2^1 -> e = 128, q = 224 (0x76).
  // amax 0 -> e = 0 (all q = 0). Inf -> e = 254, q(Inf) saturates to 448 (0x7E).
  // NaN -> e = 255 and every element of the block is NaN (0x7F).
  const float above = std::nextafter(448.0f, 1000.0f);
  const MxCase cases[] = {{448.0f, 127, 0x7E},
                          {above, 128, 0x76},
                          {0.0f, 0, 0x00},
                          {kInf, 254, 0x7E},
                          {kNaN, 255, 0x7F}};
  for (const MxCase& c : cases) {
    Context ctx(Device::CPU);
    std::vector<float> row(32, 0.0f);
    row[5] = c.amax;
    row[6] = c.amax == 0.0f ? 0.0f : 1.0f;  // a small companion value
    std::vector<int32_t> s;
    Tensor x;
    Quantized q = one_row(ctx, row, qcfg(QuantRecipe::mxfp8, QuantDirection::rowwise), s, x);
    const auto data = quant_bytes(q.buf.data), sc = quant_bytes(q.buf.scale_inv);
    EXPECT_EQ(sc[0], c.e) << "amax " << c.amax;
    EXPECT_EQ(data[5], c.q) << "amax " << c.amax;
    if (std::isnan(c.amax)) {
      EXPECT_EQ(data[0], 0x7F) << "NaN scale makes every element NaN";
    } else {
      EXPECT_EQ(data[0], 0x00);
    }
  }
}

// E5M2 data, worked out from the format (max 57344, 2 mantissa bits, bias 15), for the three fp8
// recipes; each row also holds an off-grid value whose nearest code is above its truncation.
TEST(QuantFormats, Mxfp8E5m2ExponentAndCodes) {
  // amax 1: v = 1 * fp32(1/57344) = 1.1428 * 2^-16 -> e = 127 - 16 + 1 = 112, multiplier 2^15.
  // 1 -> 32768 = 2^15 (0x78); 0.3 -> 9830.4 between 8192 (0x70) and 10240 (0x71): 0x71.
  // (With the E4M3 maximum the exponent would be 119 and 1 -> 256, 0x5C.)
  // E4M3 for contrast, amax 448: e = 127; 0.3 between 0.28125 (0x29) and 0.3125 (0x2A): 0x2A.
  for (const bool e5 : {true, false}) {
    Context ctx(Device::CPU);
    std::vector<float> row(32, 0.0f);
    row[0] = e5 ? 1.0f : 448.0f;
    row[1] = 0.3f;
    row[2] = -0.3f;
    std::vector<int32_t> s;
    Tensor x;
    Quantized q = one_row(ctx, row,
                          qcfg(QuantRecipe::mxfp8, QuantDirection::rowwise, ScaleLayout::plain,
                               e5 ? DType::fp8e5m2 : DType::fp8e4m3),
                          s, x);
    const auto d = quant_bytes(q.buf.data), sc = quant_bytes(q.buf.scale_inv);
    EXPECT_EQ(sc[0], e5 ? 112 : 127);
    EXPECT_EQ(std::vector<uint8_t>(d.begin(), d.begin() + 4),
              e5 ? (std::vector<uint8_t>{0x78, 0x71, 0xF1, 0x00})
                 : (std::vector<uint8_t>{0x7E, 0x2A, 0xAA, 0x00}));
  }
}

TEST(QuantFormats, Fp8BlockE5m2) {
  // Block 0 amax 114688 = 2 * 57344 -> scale_inv 2, scale 0.5: 114688 -> 57344 (0x7B),
  // 3 -> 1.5 (0x3E), 7 -> 3.5 (0x43), 5.8 -> 2.9 between 2.5 (0x41) and 3 (0x42): 0x42.
  // Block 1 with pow2, amax 100000: 100000 / 57344 = 1.74 rounds up to 2: 100000 -> 50000,
  // between 49152 (0x7A) and 57344 (0x7B): 0x7A; 3 -> 0x3E.
  for (bool pow2 : {false, true}) {
    Context ctx(Device::CPU);
    const auto row =
        zeros_with(256, {{0, 114688}, {1, 3}, {2, 7}, {3, 5.8f}, {128, 100000}, {129, 3}});
    std::vector<int32_t> s;
    Tensor x;
    Quantized q = one_row(ctx, row,
                          qcfg(QuantRecipe::fp8_block, QuantDirection::rowwise, ScaleLayout::plain,
                               DType::fp8e5m2, pow2),
                          s, x);
    const auto d = quant_bytes(q.buf.data);
    EXPECT_EQ(std::vector<uint8_t>(d.begin(), d.begin() + 4),
              (std::vector<uint8_t>{0x7B, 0x3E, 0x43, 0x42}));
    EXPECT_EQ(q.buf.scale_inv.ptr<float>()[0], 2.0f);
    if (pow2) {
      EXPECT_EQ(d[128], 0x7A);
      EXPECT_EQ(d[129], 0x3E);
      EXPECT_EQ(q.buf.scale_inv.ptr<float>()[1], 2.0f);
    } else {
      EXPECT_EQ(d[128], 0x7B);
      EXPECT_EQ(q.buf.scale_inv.ptr<float>()[1], 100000.0f / 57344.0f);
    }
  }
}

// NaN and Inf through every recipe (docs/numerics.md): a NaN amax or a non-finite quotient gives
// the fallback scale; NaN elements encode as NaN (e2m1: +6), Inf saturates.
TEST(QuantFormats, NanAndInfInEveryRecipe) {
  const float n = kNaN, i = kInf;
  {  // fp8_current, three experts of one row: amax NaN, amax Inf (both scale 1), amax 4
    Context ctx(Device::CPU);
    std::vector<float> v(48, 0.0f);
    const float e0[] = {n, 1, i, -i, 2, -0.0f}, e1[] = {i, 1}, e2[] = {4, 1};
    std::copy(std::begin(e0), std::end(e0), v.begin());
    std::copy(std::begin(e1), std::end(e1), v.begin() + 16);
    std::copy(std::begin(e2), std::end(e2), v.begin() + 32);
    Tensor x = make_input(v, DType::fp32, {3, 16}, Device::CPU);
    std::vector<int32_t> s = {1, 1, 1};
    Quantized q = run_quantize(ctx, x, host_view(s, DType::int32, {3}),
                               qcfg(QuantRecipe::fp8_current, QuantDirection::both));
    const auto d = quant_bytes(q.buf.data), c = quant_bytes(q.buf.columnwise_data);
    EXPECT_EQ(std::vector<uint8_t>(d.begin(), d.begin() + 6),
              (std::vector<uint8_t>{0x7F, 0x38, 0x7E, 0xFE, 0x40, 0x80}));
    EXPECT_EQ(d[16], 0x7E);
    EXPECT_EQ(d[17], 0x38);
    EXPECT_EQ(d[32], 0x7E);
    EXPECT_EQ(d[33], 0x6E);  // 1 * 448 / 4 = 112
    EXPECT_EQ(c, d) << "one-row experts: the columnwise copy is the same bytes";
    const float* si = q.buf.scale_inv.ptr<float>();
    EXPECT_EQ(si[0], 1.0f);
    EXPECT_EQ(si[1], 1.0f);
    EXPECT_EQ(si[2], 1.0f / 112);
    EXPECT_TRUE(std::isnan(q.buf.amax.ptr<float>()[0]));
    EXPECT_EQ(q.buf.amax.ptr<float>()[1], i);
  }
  {  // fp8_block: a NaN block and an Inf block fall back to scale 1; the third block is normal
    Context ctx(Device::CPU);
    const auto row =
        zeros_with(384, {{0, n}, {1, 1}, {128, i}, {129, 1}, {130, -i}, {256, 896}, {257, 3}});
    std::vector<int32_t> s;
    Tensor x;
    Quantized q = one_row(ctx, row, qcfg(QuantRecipe::fp8_block, QuantDirection::rowwise), s, x);
    const auto d = quant_bytes(q.buf.data);
    EXPECT_EQ(std::vector<uint8_t>({d[0], d[1], d[128], d[129], d[130], d[256], d[257]}),
              (std::vector<uint8_t>{0x7F, 0x38, 0x7E, 0x38, 0xFE, 0x7E, 0x3C}));
    const float* si = q.buf.scale_inv.ptr<float>();
    EXPECT_EQ(std::vector<float>(si, si + 3), (std::vector<float>{1, 1, 2}));
  }
  {  // mxfp8 columnwise: a NaN column block is all NaN (e = 255), an Inf one has e = 254
    Context ctx(Device::CPU);
    Tensor x = ones_with(32, 64, {{5, 0, n}, {7, 1, i}}, false);
    std::vector<int32_t> s;
    Quantized q = one_expert(ctx, x, qcfg(QuantRecipe::mxfp8, QuantDirection::columnwise), s);
    const auto d = quant_bytes(q.buf.columnwise_data), sc = quant_bytes(q.buf.columnwise_scale_inv);
    EXPECT_EQ(sc[0], 255);
    EXPECT_EQ(sc[1], 254);
    EXPECT_EQ(sc[2], 119);  // amax 1: v = fp32(1/448) = 1.14 * 2^-9
    EXPECT_EQ(d[0], 0x7F);  // column 0 (first row of the [K, 32] block): all NaN
    EXPECT_EQ(d[31], 0x7F);
    EXPECT_EQ(d[32 + 7], 0x7E);  // column 1: Inf * 2^-127 saturates; 1 * 2^-127 -> 0
    EXPECT_EQ(d[32 + 0], 0x00);
    EXPECT_EQ(d[64], 0x78);  // column 2: 1 * 2^8
  }
  {  // nvfp4: expert amax NaN -> S_enc 1. Block 0 NaN: s_b = NaN (0x7F), every code 7.
     // Block 1 Inf: s_b saturates to 448 (0x7E), multiplier 1/448: Inf -> 7, 448 -> 1 (2),
     // 100 -> 0.22 (0), -448 -> -1 (0xA). Block 2 amax 3: s_b = 0.5 (0x30), 3 -> 6 (7), 1 -> 2 (4).
    Context ctx(Device::CPU);
    const auto row = zeros_with(
        48, {{0, n}, {1, 1}, {2, -1}, {16, i}, {17, 448}, {18, 100}, {19, -448}, {32, 3}, {33, 1}});
    std::vector<int32_t> s;
    Tensor x;
    Quantized q = one_row(ctx, row, qcfg(QuantRecipe::nvfp4, QuantDirection::rowwise), s, x);
    const auto d = quant_bytes(q.buf.data);
    EXPECT_EQ(quant_bytes(q.buf.scale_inv), (std::vector<uint8_t>{0x7F, 0x7E, 0x30}));
    EXPECT_EQ(std::vector<uint8_t>(d.begin(), d.begin() + 8), std::vector<uint8_t>(8, 0x77));
    EXPECT_EQ(std::vector<uint8_t>(d.begin() + 8, d.begin() + 11),
              (std::vector<uint8_t>{0x27, 0xA0, 0x00}));
    EXPECT_EQ(d[16], 0x47);
    EXPECT_EQ(d[17], 0x00);
    EXPECT_EQ(q.buf.global_scale.ptr<float>()[0], 1.0f);
    EXPECT_TRUE(std::isnan(q.buf.amax.ptr<float>()[0]));
  }
}

// 2D blocks of weights: every element of a 128x128 (fp8_block) or 16x16 (nvfp4) block shares
// the block's scale, whichever row holds the block's amax.
TEST(QuantFormats, Fp8Block128x128WeightBlocks) {
  // One expert [256, 256] of ones, with 896 at (100, 5), 3 at (200, 0), -1792 at (255, 255).
  // Block (0,0) amax 896: scale_inv 2, 1 -> 0.5 (0x30), 896 -> 448 (0x7E). Block (0,1) amax 1:
  // scale_inv 1/448, 1 -> 448 (0x7E). Block (1,0) amax 3: scale 448/3 = 149.33, 1 -> between 144
  // (0x71) and 160 (0x72): 0x71; 3 -> 0x7E. Block (1,1) amax 1792: scale_inv 4, 1 -> 0.25 (0x28).
  Context ctx(Device::CPU);
  const int64_t N = 256, K = 256;
  Tensor w = ones_with(N, K, {{100, 5, 896}, {200, 0, 3}, {255, 255, -1792}}, true);
  Quantized q = run_quantize(ctx, w, TensorView(),
                             qcfg(QuantRecipe::fp8_block, QuantDirection::both, ScaleLayout::plain,
                                  DType::fp8e4m3, false, true));
  const auto d = quant_bytes(q.buf.data), c = quant_bytes(q.buf.columnwise_data);
  for (const bool col : {false, true}) {
    auto code = [&](int64_t r, int64_t k) {
      return col ? c[static_cast<size_t>(k * N + r)] : d[static_cast<size_t>(r * K + k)];
    };
    EXPECT_EQ(code(0, 0), 0x30);
    EXPECT_EQ(code(127, 127), 0x30);
    EXPECT_EQ(code(100, 5), 0x7E);
    EXPECT_EQ(code(0, 128), 0x7E);
    EXPECT_EQ(code(128, 0), 0x71);
    EXPECT_EQ(code(200, 0), 0x7E);
    EXPECT_EQ(code(255, 127), 0x71);
    EXPECT_EQ(code(128, 128), 0x28);
    EXPECT_EQ(code(255, 255), 0xFE);
  }
  const float* rs = q.buf.scale_inv.ptr<float>();  // [tiles, K/128]
  EXPECT_EQ(std::vector<float>(rs, rs + 4), (std::vector<float>{2, 1.0f / 448, 3.0f / 448, 4}));
  const float* cs = q.buf.columnwise_scale_inv.ptr<float>();  // [K/128, nb]: (kb, j)
  EXPECT_EQ(std::vector<float>(cs, cs + 4), (std::vector<float>{2, 3.0f / 448, 1.0f / 448, 4}));
}

TEST(QuantFormats, Nvfp4With16x16WeightBlocks) {
  // One expert [32, 32] of ones, with 6 at (15, 15), 3 at (31, 0), 2688 at (16, 16): amax 2688,
  // S_enc 1. Block (0,0) amax 6: s_b = e4m3(6 * fp32(1/6) = 1) = 0x38, 1 -> code 2, 6 -> 7.
  // Block (0,1) amax 1: s_b = e4m3(0.1667) = 0.171875 (0x23), 1 -> 5.82 -> 6 (7). Block (1,0)
  // amax 3: s_b = 0.5 (0x30), 1 -> 2 (4), 3 -> 6 (7). Block (1,1): s_b = 448 (0x7E), 1 -> 0.
  Context ctx(Device::CPU);
  const int64_t N = 32, K = 32;
  Tensor w = ones_with(N, K, {{15, 15, 6}, {31, 0, 3}, {16, 16, 2688}}, true);
  Quantized q = run_quantize(ctx, w, TensorView(),
                             qcfg(QuantRecipe::nvfp4, QuantDirection::both, ScaleLayout::plain,
                                  DType::fp8e4m3, false, true));
  EXPECT_EQ(q.buf.global_scale.ptr<float>()[0], 1.0f);
  const auto d = quant_bytes(q.buf.data), rs = quant_bytes(q.buf.scale_inv);
  auto row = [&](int64_t r) {
    return std::vector<uint8_t>(d.begin() + r * K / 2, d.begin() + (r + 1) * K / 2);
  };
  std::vector<uint8_t> r0(8, 0x22);
  r0.resize(16, 0x77);
  EXPECT_EQ(row(0), r0);
  r0[7] = 0x72;  // (15, 15) = 6 in the high nibble
  EXPECT_EQ(row(15), r0);
  std::vector<uint8_t> r31(8, 0x44);
  r31[0] = 0x47;
  r31.resize(16, 0x00);
  EXPECT_EQ(row(31), r31);
  EXPECT_EQ(row(16)[8], 0x07);
  for (int64_t r = 0; r < N; ++r) {  // rowwise scales [N, K/16]: each row has its blocks' scales
    EXPECT_EQ(rs[static_cast<size_t>(2 * r)], r < 16 ? 0x38 : 0x30) << r;
    EXPECT_EQ(rs[static_cast<size_t>(2 * r + 1)], r < 16 ? 0x23 : 0x7E) << r;
  }
  const auto cs = quant_bytes(q.buf.columnwise_scale_inv);  // [K, nb = 2]: (k, j)
  for (int64_t k = 0; k < K; ++k) {
    EXPECT_EQ(cs[static_cast<size_t>(2 * k)], k < 16 ? 0x38 : 0x23) << k;
    EXPECT_EQ(cs[static_cast<size_t>(2 * k + 1)], k < 16 ? 0x30 : 0x7E) << k;
  }
}

// An NVFP4 expert whose amax is 0: S_enc = 1 (not 2688 / 0), every block scale and code 0, and
// it dequantizes to exact zeros (not 0 / 0); the next expert is unaffected.
TEST(QuantFormats, Nvfp4ExpertWithZeroAmax) {
  Context ctx(Device::CPU);
  std::vector<float> v(4 * 32, 0.0f);
  v[2 * 32 + 0] = 2688;  // expert 1 (rows 2..3): S_enc 1
  v[3 * 32 + 1] = 1;
  Tensor x = make_input(v, DType::fp32, {4, 32}, Device::CPU);
  std::vector<int32_t> s = {2, 2};
  const auto cfg = qcfg(QuantRecipe::nvfp4, QuantDirection::both);
  Quantized q = run_quantize(ctx, x, host_view(s, DType::int32, {2}), cfg);
  EXPECT_EQ(q.buf.amax.ptr<float>()[0], 0.0f);
  EXPECT_EQ(q.buf.global_scale.ptr<float>()[0], 1.0f);
  EXPECT_EQ(q.buf.global_scale.ptr<float>()[1], 1.0f);
  const auto d = quant_bytes(q.buf.data), rs = quant_bytes(q.buf.scale_inv);
  EXPECT_EQ(std::vector<uint8_t>(d.begin(), d.begin() + 32), std::vector<uint8_t>(32, 0));
  EXPECT_EQ(std::vector<uint8_t>(rs.begin(), rs.begin() + 4), std::vector<uint8_t>(4, 0));
  EXPECT_EQ(rs[4], 0x7E);  // expert 1 row 2 block 0: s_b = e4m3(2688 / 6 = 448)
  const auto cs = quant_bytes(q.buf.columnwise_scale_inv);  // expert 0: [32, 1] zeros
  EXPECT_EQ(std::vector<uint8_t>(cs.begin(), cs.begin() + 32), std::vector<uint8_t>(32, 0));
  for (bool col : {false, true}) {
    Tensor o = Tensor::empty({4, 32}, DType::fp32, Device::CPU);
    fill_bytes(o, 0xFF);
    run_dequantize(ctx, q, cfg, col, o);
    const float* f = o.ptr<float>();
    for (int i = 0; i < 64; ++i) ASSERT_EQ(float_bits(f[i]), 0u) << "col=" << col << " " << i;
    EXPECT_EQ(f[64], 2688.0f);
    // (3, 1) = 1 has a block of its own (amax 1): s_b = e4m3(1/6) = 0.171875, 1 * 5.82 -> 6,
    // dequant 6 * 0.171875
    EXPECT_EQ(f[97], 1.03125f);
  }
}

TEST(QuantFormats, Nvfp4EveryE2m1CodeAndNibbleOrder) {
  // Second block holds 2688 = 448 * 6, so amax_g = 2688 and S_enc = 1. Block 0 has amax 6:
  // s_b = e4m3(6 * fp32(1/6)) = e4m3(1.0) = 0x38, so q = e2m1(x). Block 1: s_b = e4m3(448) = 0x7E,
  // q(2688) = e2m1(2688/448 = 6) = 0x7. Element 2j is the low nibble.
  Context ctx(Device::CPU);
  std::vector<float> row = {0, .5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -.5f, -1, -1.5f, -2, -3, -4, -6};
  row.resize(32, 0.0f);
  row[16] = 2688.0f;
  std::vector<int32_t> s;
  Tensor x;
  Quantized q = one_row(ctx, row, qcfg(QuantRecipe::nvfp4, QuantDirection::rowwise), s, x);
  EXPECT_EQ(quant_bytes(q.buf.data), (std::vector<uint8_t>{0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC,
                                                           0xFE, 0x07, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(quant_bytes(q.buf.scale_inv), (std::vector<uint8_t>{0x38, 0x7E}));
  EXPECT_EQ(q.buf.global_scale.ptr<float>()[0], 1.0f);
  EXPECT_EQ(q.buf.amax.ptr<float>()[0], 2688.0f);
}

TEST(QuantFormats, Nvfp4RoundsHalfwayToEven) {
  // S_enc = 1 and s_b = 1 as above; ties: .25 -> 0, .75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2,
  // 3.5 -> 4, 5 -> 4; 7 saturates to 6.
  Context ctx(Device::CPU);
  std::vector<float> row = {.25f, .75f, 1.25f, 1.75f, 2.5f, 3.5f, 5, 6, 0, 0, 0, 0, 0, 0, 0, 0};
  row.resize(32, 0.0f);
  row[16] = 2688.0f;
  std::vector<int32_t> s;
  Tensor x;
  Quantized q = one_row(ctx, row, qcfg(QuantRecipe::nvfp4, QuantDirection::rowwise), s, x);
  const auto d = quant_bytes(q.buf.data);
  // codes: 0, 2, 2, 4, 4, 6, 6, 7
  EXPECT_EQ(std::vector<uint8_t>(d.begin(), d.begin() + 4),
            (std::vector<uint8_t>{0x20, 0x42, 0x64, 0x76}));
}

TEST(QuantFormats, Nvfp4ElementScaleIsOneDivisionPerBlock) {
  // q = e2m1(x * (S_enc / s_b)) (TransformerEngine's order), not e2m1((x * S_enc) / s_b). With
  // amax_g = 7 (block 1): S_enc = 2688/7 = 384, block 0 amax 1: s_b = e4m3(384/6) = 64, so the
  // multiplier is 384/64 = 6 exactly and x = 0.3 -> 1.8 -> e2m1 2.0 (code 4).
  Context ctx(Device::CPU);
  std::vector<float> row(32, 0.0f);
  row[0] = 1.0f;
  row[1] = 0.3f;
  row[16] = 7.0f;
  std::vector<int32_t> s;
  Tensor x;
  Quantized q = one_row(ctx, row, qcfg(QuantRecipe::nvfp4, QuantDirection::rowwise), s, x);
  const auto d = quant_bytes(q.buf.data), sc = quant_bytes(q.buf.scale_inv);
  EXPECT_EQ(q.buf.global_scale.ptr<float>()[0], 384.0f);
  EXPECT_EQ(sc[0], float_to_e4m3(64.0f));
  EXPECT_EQ(d[0], 0x47);  // 1.0 * 6 = 6 -> 0x7 (low), 0.3 * 6 -> 0x4 (high)
  const float mul = qnum::nvfp4_elem_scale(384.0f, 64.0f);
  EXPECT_EQ(mul, 6.0f);
  EXPECT_EQ(qnum::nvfp4_code(0.3f, float_to_e4m3(64.0f), mul), 0x4);
  EXPECT_EQ(qnum::nvfp4_code(-5.0f, 0x80, mul), 0x0) << "a zero block scale encodes 0";
  // The quotient saturates instead of overflowing: 0 stays 0.
  EXPECT_EQ(qnum::nvfp4_elem_scale(3e38f, 1.0f / 512), 3.40282347e38f);
  EXPECT_EQ(qnum::nvfp4_code(0.0f, 0x01, qnum::nvfp4_elem_scale(3e38f, 1.0f / 512)), 0x0);
}

TEST(QuantFormats, E2m1PackedEncoderMatchesConvert) {
  // The kernels' 8-wide encoder against the pinned convert.hpp rule, on every non-NaN pattern of
  // both signs in the binades where codes change (|f| in [2^-7, 2^5): all ties and sticky bits),
  // and in every other binade (zero, subnormals, huge, Inf) a strided sweep of the mantissa plus
  // its ends. Values are fed 8 at a time, each landing in every nibble position over the sweep.
  uint64_t bad = 0, first = ~uint64_t(0);
#pragma omp parallel for reduction(+ : bad) reduction(min : first)
  for (int64_t se = 0; se < 512; ++se) {  // sign and biased exponent
    const uint32_t e = static_cast<uint32_t>(se & 255);
    std::vector<uint32_t> mant;
    if (e != 255) {
      for (uint32_t m = 0; m < (1u << 23); m += (e >= 120 && e < 132) ? 1 : 4093) mant.push_back(m);
      for (uint32_t m : {1u, 2u, 0x3FFFFFu, 0x400000u, 0x400001u, 0x7FFFFEu, 0x7FFFFFu})
        mant.push_back(m);
    } else {
      mant.push_back(0);  // Inf (NaN excluded: the kernels encode a NaN block as all 7s)
    }
    for (size_t i = 0; i < mant.size(); i += 7) {  // stride 7: every value visits every nibble
      float p[8];
      uint32_t want = 0;
      for (int j = 0; j < 8; ++j) {
        const uint32_t u = (static_cast<uint32_t>(se) << 23) | mant[(i + j) % mant.size()];
        p[j] = bits_float(u);
        want |= static_cast<uint32_t>(float_to_e2m1(p[j])) << (4 * j);
      }
      if (qnum::e2m1x8_nonan(p) != want) {
        ++bad;
        first = std::min<uint64_t>(first, float_bits(p[0]));
      }
    }
  }
  EXPECT_EQ(bad, 0u) << "first mismatching group starts at bits 0x" << std::hex << first;
}

TEST(QuantFormats, Fp8CurrentScaling) {
  // amax_g = 4. E4M3: scale = 448/4 = 112: 1 -> 112 (0x6E), -2 -> -224 (0xF6), 4 -> 448 (0x7E),
  // .5 -> 56 (0x66), .35 -> 39.2 between 36 (0x61) and 40 (0x62): 0x62, .3 -> 33.6: 32 (0x60).
  // pow2: scale 64: 1 -> 0x68, 4 -> 256 (0x78), .35 -> 22.4: 22 (0x5B), .3 -> 19.2 between 18
  // (0x59) and 20 (0x5A): 0x5A.
  // E5M2: scale = 57344/4 = 14336: 1 -> 1.75 * 2^13 (0x73), -2 -> 0xF7, 4 -> 57344 (0x7B),
  // .5 -> 7168 (0x6F), .35 -> 5017.6 between 4096 (0x6C) and 5120 (0x6D): 0x6D, .3 -> 4300.8:
  // 0x6C. pow2: scale 2^13: 1 -> 0x70, .35 -> 2867.2 between 2560 (0x69) and 3072 (0x6A): 0x6A,
  // .3 -> 2457.6 between 2048 (0x68) and 2560: 0x69.
  struct Case {
    DType t;
    bool pow2;
    float scale_inv;
    std::vector<uint8_t> codes;
  };
  const Case cases[] = {
      {DType::fp8e4m3, false, 1.0f / 112, {0x6E, 0xF6, 0x7E, 0x66, 0x62, 0x60}},
      {DType::fp8e4m3, true, 1.0f / 64, {0x68, 0xF0, 0x78, 0x60, 0x5B, 0x5A}},
      {DType::fp8e5m2, false, 1.0f / 14336, {0x73, 0xF7, 0x7B, 0x6F, 0x6D, 0x6C}},
      {DType::fp8e5m2, true, 1.0f / 8192, {0x70, 0xF4, 0x78, 0x6C, 0x6A, 0x69}},
  };
  for (const Case& c : cases) {
    Context ctx(Device::CPU);
    std::vector<float> row = {1, -2, 4, .5f, .35f, .3f};
    row.resize(16, 0.0f);
    std::vector<int32_t> s;
    Tensor x;
    Quantized q = one_row(
        ctx, row,
        qcfg(QuantRecipe::fp8_current, QuantDirection::rowwise, ScaleLayout::plain, c.t, c.pow2), s,
        x);
    const auto d = quant_bytes(q.buf.data);
    EXPECT_EQ(std::vector<uint8_t>(d.begin(), d.begin() + 6), c.codes)
        << dtype_name(c.t) << " pow2=" << c.pow2;
    EXPECT_EQ(q.buf.scale_inv.ptr<float>()[0], c.scale_inv);
    EXPECT_EQ(q.buf.amax.ptr<float>()[0], 4.0f);
  }
}

TEST(QuantFormats, Fp8Blockwise) {
  // Block amax 896 -> scale_inv = 896/448 = 2, x = 896 -> 448 (0x7E), x = 3 -> 1.5 (0x3C).
  // pow2 with amax 500: 500/448 = 1.116 rounds up to 2; 500 * 0.5 = 250 -> 256 (0x78).
  Context ctx(Device::CPU);
  std::vector<float> row(256, 0.0f);
  row[0] = 896;
  row[1] = 3;
  row[128] = 500;
  std::vector<int32_t> s;
  Tensor x;
  Quantized q = one_row(ctx, row, qcfg(QuantRecipe::fp8_block, QuantDirection::rowwise), s, x);
  auto d = quant_bytes(q.buf.data);
  EXPECT_EQ(d[0], 0x7E);
  EXPECT_EQ(d[1], 0x3C);
  EXPECT_EQ(q.buf.scale_inv.ptr<float>()[0], 2.0f);
  EXPECT_EQ(q.buf.scale_inv.ptr<float>()[1], 500.0f / 448.0f);
  Context ctx2(Device::CPU);
  Quantized p = one_row(ctx2, row,
                        qcfg(QuantRecipe::fp8_block, QuantDirection::rowwise, ScaleLayout::plain,
                             DType::fp8e4m3, true),
                        s, x);
  d = quant_bytes(p.buf.data);
  EXPECT_EQ(d[128], 0x78);
  EXPECT_EQ(p.buf.scale_inv.ptr<float>()[1], 2.0f);
}

TEST(QuantFormats, MxPartialColumnBlockUsesValidRowsOnly) {
  // One expert of 40 rows, K = 32, columnwise 32x1 blocks: rows 0..31 hold 448 in column 0, rows
  // 32..39 hold 1. Block 1 is rows 32..39 only: amax 1 -> v = fp32(1/448) = 1.14 * 2^-9 -> e = 119,
  // q(1) = e4m3(2^8) = 0x78. Block 0: e = 127, q(448) = 0x7E.
  Context ctx(Device::CPU);
  const int64_t M = 40, K = 32;
  std::vector<float> v(static_cast<size_t>(M * K), 0.0f);
  for (int64_t r = 0; r < M; ++r) v[static_cast<size_t>(r * K)] = r < 32 ? 448.0f : 1.0f;
  Tensor x = make_input(v, DType::bf16, {M, K}, Device::CPU);
  std::vector<int32_t> s;
  Quantized q = one_expert(ctx, x, qcfg(QuantRecipe::mxfp8, QuantDirection::columnwise), s);
  const auto d = quant_bytes(q.buf.columnwise_data), sc = quant_bytes(q.buf.columnwise_scale_inv);
  // column 0 of the transposed [K, 40] block is its first row
  EXPECT_EQ(d[0], 0x7E);
  EXPECT_EQ(d[32], 0x78);
  EXPECT_EQ(sc[0], 127);  // scale (k=0, j=0) of the per-expert [K, nb=2] matrix
  EXPECT_EQ(sc[1], 119);
}

TEST(QuantFormats, SwizzleIndexAtChosenPoints) {
  // (r/128)*128*Kp + (c/4)*512 + (r%32)*16 + ((r%128)/32)*4 + c%4, with Kp = 8:
  EXPECT_EQ(swizzle_128x4_index(0, 0, 8), 0);
  EXPECT_EQ(swizzle_128x4_index(1, 0, 8), 16);
  EXPECT_EQ(swizzle_128x4_index(32, 0, 8), 4);
  EXPECT_EQ(swizzle_128x4_index(0, 1, 8), 1);
  EXPECT_EQ(swizzle_128x4_index(0, 4, 8), 512);
  EXPECT_EQ(swizzle_128x4_index(128, 0, 8), 1024);
  EXPECT_EQ(swizzle_128x4_index(37, 6, 8), 598);    // 512 + 5*16 + 1*4 + 2
  EXPECT_EQ(swizzle_128x4_index(200, 5, 8), 1673);  // 1024 + 512 + 8*16 + 2*4 + 1
  EXPECT_EQ(swizzle_128x4_index(127, 7, 8), 1023);  // the last entry of the first block
}

// The shared index function itself (CPU and CUDA use it), at the same points, Kp = 8 and 12.
TEST(QuantFormats, SharedSwizzleIndexAtChosenPoints) {
  EXPECT_EQ(qnum::swizzle_128x4(0, 4, 8), 512);
  EXPECT_EQ(qnum::swizzle_128x4(37, 6, 8), 598);    // 512 + 5*16 + 1*4 + 2
  EXPECT_EQ(qnum::swizzle_128x4(200, 5, 8), 1673);  // 1024 + 512 + 8*16 + 2*4 + 1
  EXPECT_EQ(qnum::swizzle_128x4(127, 7, 8), 1023);
  EXPECT_EQ(qnum::swizzle_128x4(150, 9, 12), 2913);  // 1536 + 2*512 + 22*16 + 0 + 1
}

// One marked block per layout, found at the index worked out by hand (Kp >= 8): rowwise, K = 320
// (10 MX scales per row, Kp = 12), and columnwise, 300 rows (10 column blocks, padded to 12).
TEST(QuantFormats, SwizzledScaleOfAMarkedBlockByHand) {
  // All ones (e = 119) except a 2^20 (e = 127 + 20 - 9 + 1 = 139) in the marked block.
  struct Case {
    int64_t rows, K;
    Mark mark;
    bool col;
    int64_t index;
  };
  const Case cases[] = {
      // row 150, columns 7 * 32.. -> scale (150, 7) at 1*128*12 + 1*512 + 22*16 + 0*4 + 3
      {200, 320, {150, 7 * 32 + 3, 0x1p20f}, false, 2403},
      // column 5, rows 192..223 (block j = 6) -> scale (k=5, j=6) of the per-expert [32, 10]
      // matrix padded to [128, 12]: 1*512 + 5*16 + 0*4 + 2
      {300, 32, {200, 5, 0x1p20f}, true, 594},
  };
  Context ctx(Device::CPU);
  for (const Case& c : cases) {
    Tensor x = ones_with(c.rows, c.K, {c.mark}, false);
    std::vector<int32_t> s;
    Quantized q = one_expert(
        ctx, x, qcfg(QuantRecipe::mxfp8, QuantDirection::both, ScaleLayout::swizzled), s);
    const auto sc = quant_bytes(c.col ? q.buf.columnwise_scale_inv : q.buf.scale_inv);
    EXPECT_EQ(sc[static_cast<size_t>(c.index)], 139) << "col=" << c.col;
    EXPECT_EQ(std::count(sc.begin(), sc.end(), 139), 1) << "col=" << c.col;
    if (!c.col) continue;
    EXPECT_EQ(sc[1106], 0) << "padding column (5, 10): 2*512 + 5*16 + 2";
    EXPECT_EQ(sc[132], 0) << "padding row (40, 0) (K = 32 of 128): 8*16 + 1*4";
  }
}

TEST(QuantFormats, SwizzledRowwiseScalesPlacedPerExpertWithZeroPadding) {
  // Experts of 3 and 130 rows, K = 64 (2 MX scales per row, Kp = 4): expert 1 starts at swizzled
  // row 128; the padding of expert 0 (rows 3..127, columns 2..3) is 0.
  Context ctx(Device::CPU);
  const int64_t M = 133, K = 64;
  std::vector<float> v = rand_wide(static_cast<size_t>(M * K));
  Tensor x = make_input(v, DType::bf16, {M, K}, Device::CPU);
  std::vector<int32_t> s = {3, 130};
  Quantized sw =
      run_quantize(ctx, x, host_view(s, DType::int32, {2}),
                   qcfg(QuantRecipe::mxfp8, QuantDirection::rowwise, ScaleLayout::swizzled));
  Quantized pl = run_quantize(ctx, x, host_view(s, DType::int32, {2}),
                              qcfg(QuantRecipe::mxfp8, QuantDirection::rowwise));
  const auto a = quant_bytes(sw.buf.scale_inv), b = quant_bytes(pl.buf.scale_inv);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t c = 0; c < 2; ++c) {
      const int64_t sr = r < 3 ? r : 128 + (r - 3);
      ASSERT_EQ(a[static_cast<size_t>(swizzle_128x4_index(sr, c, 4))],
                b[static_cast<size_t>(r * 2 + c)])
          << r << "," << c;
    }
  for (int64_t r = 3; r < 128; ++r)
    EXPECT_EQ(a[static_cast<size_t>(swizzle_128x4_index(r, 0, 4))], 0);
  for (int64_t r = 0; r < 3; ++r)
    EXPECT_EQ(a[static_cast<size_t>(swizzle_128x4_index(r, 3, 4))], 0);
  EXPECT_EQ(a.size(), static_cast<size_t>((133 + 2 * 127) * 4));
}

}  // namespace
}  // namespace groupmm::test
