// Hand-computed vectors pinning the format rules of docs/numerics.md, independent of our code:
// E8M0 exponents at the edges, E2M1 codes and nibble order, FP8 current/blockwise scaling,
// partial blocks, the swizzle index formula.
#include <algorithm>
#include <cmath>
#include <limits>

#include "common/quant_test_util.hpp"
#include "core/quantize_numerics.hpp"

namespace groupmm::test {
namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

// One expert, one row of K fp32 values, rowwise plain; returns (data bytes, scale bytes).
Quantized one_row(Context& ctx, std::vector<float> row, const QuantizeConfig& cfg,
                  std::vector<int32_t>& splits_storage, Tensor& x) {
  const int64_t K = static_cast<int64_t>(row.size());
  x = make_input(row, DType::fp32, {1, K}, Device::CPU);
  splits_storage = {1};
  return run_quantize(ctx, x, host_view(splits_storage, DType::int32, {1}), cfg);
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
  // amax_g = 4 -> scale = 448/4 = 112: 1 -> 112 (0x6E), -2 -> -224 (0xF6), 4 -> 448 (0x7E),
  // .5 -> 56 (0x66). scale_inv = 1/112. pow2: scale rounds down to 64: 1 -> 64 (0x68),
  // 4 -> 256 (0x78), scale_inv = 1/64.
  for (bool pow2 : {false, true}) {
    Context ctx(Device::CPU);
    std::vector<float> row = {1, -2, 4, .5f};
    row.resize(16, 0.0f);
    std::vector<int32_t> s;
    Tensor x;
    Quantized q = one_row(ctx, row,
                          qcfg(QuantRecipe::fp8_current, QuantDirection::rowwise,
                               ScaleLayout::plain, DType::fp8e4m3, pow2),
                          s, x);
    const auto d = quant_bytes(q.buf.data);
    if (!pow2) {
      EXPECT_EQ(std::vector<uint8_t>(d.begin(), d.begin() + 4),
                (std::vector<uint8_t>{0x6E, 0xF6, 0x7E, 0x66}));
      EXPECT_EQ(q.buf.scale_inv.ptr<float>()[0], 1.0f / 112.0f);
    } else {
      EXPECT_EQ(std::vector<uint8_t>(d.begin(), d.begin() + 4),
                (std::vector<uint8_t>{0x68, 0xF0, 0x78, 0x60}));
      EXPECT_EQ(q.buf.scale_inv.ptr<float>()[0], 1.0f / 64.0f);
    }
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
  std::vector<int32_t> s = {40};
  Quantized q = run_quantize(ctx, x, host_view(s, DType::int32, {1}),
                             qcfg(QuantRecipe::mxfp8, QuantDirection::columnwise));
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
