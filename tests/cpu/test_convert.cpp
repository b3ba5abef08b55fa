// Conversions fp32 <-> bf16/fp16/e4m3/e5m2/e2m1/e8m0 against an oracle that does not share code
// with convert.hpp: hand tables for the decodes, and a brute-force nearest-value search (ties to
// the even code, saturation at the largest finite value) for the encodes.
#include <cmath>
#include <limits>

#include "common/test_util.hpp"

namespace groupmm::test {
namespace {

// ---- decode tables written by hand from the format definitions --------------------------------
TEST(ConvertDecode, E2M1TableAndSign) {
  const float pos[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int c = 0; c < 8; ++c) {
    EXPECT_EQ(e2m1_to_float(static_cast<uint8_t>(c)), pos[c]) << c;
    EXPECT_EQ(e2m1_to_float(static_cast<uint8_t>(c | 8)), -pos[c]) << c;
  }
  EXPECT_TRUE(std::signbit(e2m1_to_float(0x8)));
}

TEST(ConvertDecode, E4M3KnownCodes) {
  EXPECT_EQ(e4m3_to_float(0x00), 0.0f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(e4m3_to_float(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0xFE), -448.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xFF)));
}

TEST(ConvertDecode, E5M2KnownCodes) {
  EXPECT_EQ(e5m2_to_float(0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(e5m2_to_float(0x04), std::ldexp(1.0f, -14));
  EXPECT_EQ(e5m2_to_float(0x3C), 1.0f);
  EXPECT_EQ(e5m2_to_float(0x7B), 57344.0f);
  EXPECT_EQ(e5m2_to_float(0x7C), INFINITY);
  EXPECT_EQ(e5m2_to_float(0xFC), -INFINITY);
  EXPECT_TRUE(std::isnan(e5m2_to_float(0x7D)));
}

TEST(ConvertDecode, E8M0) {
  EXPECT_EQ(e8m0_to_float(127), 1.0f);
  EXPECT_EQ(e8m0_to_float(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(e8m0_to_float(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(e8m0_to_float(255)));
}

TEST(ConvertDecode, Fp16AndBf16KnownCodes) {
  EXPECT_EQ(fp16_bits_to_float(0x3C00), 1.0f);
  EXPECT_EQ(fp16_bits_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(fp16_bits_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(fp16_bits_to_float(0x7C00), INFINITY);
  EXPECT_EQ(bf16_bits_to_float(0x3F80), 1.0f);
  EXPECT_EQ(bf16_bits_to_float(0xC000), -2.0f);
}

// ---- brute-force encode oracle -----------------------------------------------------------------
struct Format {
  const char* name;
  int codes;          // number of magnitude codes to search (sign handled separately)
  uint32_t max_code;  // largest finite magnitude code
  float (*decode)(uint32_t);
  uint32_t (*encode)(float);
  uint32_t sign_bit;
};

uint32_t enc_e4m3(float f) {
  return float_to_e4m3(f);
}
uint32_t enc_e5m2(float f) {
  return float_to_e5m2(f);
}
uint32_t enc_e2m1(float f) {
  return float_to_e2m1(f);
}
float dec_e4m3(uint32_t c) {
  return e4m3_to_float(static_cast<uint8_t>(c));
}
float dec_e5m2(uint32_t c) {
  return e5m2_to_float(static_cast<uint8_t>(c));
}
float dec_e2m1(uint32_t c) {
  return e2m1_to_float(static_cast<uint8_t>(c));
}

// Nearest finite magnitude code to |x| (ties -> even code), saturating.
uint32_t oracle_mag(const Format& f, double ax) {
  uint32_t best = 0;
  double bestd = INFINITY;
  for (uint32_t c = 0; c <= f.max_code; ++c) {
    const double d = std::fabs(double(f.decode(c)) - ax);
    if (d < bestd || (d == bestd && (c & 1u) == 0)) {
      bestd = d;
      best = c;
    }
  }
  return best;
}

std::vector<float> probe_values(const Format& f) {
  std::vector<float> v;
  // every code, the midpoints between neighbours (ties), and points just either side of them
  for (uint32_t c = 0; c <= f.max_code; ++c) {
    const float a = f.decode(c);
    v.push_back(a);
    if (c < f.max_code) {
      const float b = f.decode(c + 1);
      const float mid = 0.5f * (a + b);
      v.push_back(mid);
      v.push_back(std::nextafter(mid, 0.0f));
      v.push_back(std::nextafter(mid, INFINITY));
    }
  }
  const float mx = f.decode(f.max_code);
  for (float s : {1.0001f, 1.03f, 1.1f, 2.0f, 1e6f}) v.push_back(mx * s);
  v.push_back(std::numeric_limits<float>::denorm_min());
  v.push_back(1e-30f);
  for (float x : rand_wide(4000)) v.push_back(x);
  const size_t n = v.size();
  for (size_t i = 0; i < n; ++i) v.push_back(-v[i]);
  return v;
}

void PrintTo(const Format& f, std::ostream* os) {
  *os << f.name;
}

class EncodeOracle : public ::testing::TestWithParam<Format> {};

TEST_P(EncodeOracle, MatchesNearestEvenSaturating) {
  const Format f = GetParam();
  for (float x : probe_values(f)) {
    const uint32_t got = f.encode(x);
    const uint32_t want = oracle_mag(f, std::fabs(double(x))) | (std::signbit(x) ? f.sign_bit : 0);
    ASSERT_EQ(got, want) << f.name << " x=" << x << " (" << std::hexfloat << x << ")";
  }
}

TEST_P(EncodeOracle, EveryCodeRoundTrips) {
  const Format f = GetParam();
  for (uint32_t c = 0; c <= f.max_code; ++c) {
    EXPECT_EQ(f.encode(f.decode(c)), c) << f.name << " code " << c;
    EXPECT_EQ(f.encode(-f.decode(c)), c | f.sign_bit) << f.name << " code -" << c;
  }
}

TEST_P(EncodeOracle, SpecialValues) {
  const Format f = GetParam();
  EXPECT_EQ(f.encode(INFINITY), f.max_code) << "Inf saturates";
  EXPECT_EQ(f.encode(-INFINITY), f.max_code | f.sign_bit);
  EXPECT_EQ(f.encode(-0.0f), f.sign_bit) << "-0 keeps its sign";
  EXPECT_EQ(f.encode(0.0f), 0u);
}

INSTANTIATE_TEST_SUITE_P(Formats, EncodeOracle,
                         ::testing::Values(Format{"e4m3", 128, 0x7E, dec_e4m3, enc_e4m3, 0x80},
                                           Format{"e5m2", 128, 0x7B, dec_e5m2, enc_e5m2, 0x80},
                                           Format{"e2m1", 8, 0x7, dec_e2m1, enc_e2m1, 0x8}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(ConvertEncode, NaNRules) {
  EXPECT_EQ(float_to_e4m3(NAN), 0x7F);
  EXPECT_EQ(float_to_e4m3(-NAN) & 0x7F, 0x7F);
  EXPECT_EQ(float_to_e5m2(NAN), 0x7F);
  EXPECT_EQ(float_to_e2m1(NAN), 0x7);   // +6, as the CUDA conversion does
  EXPECT_EQ(float_to_e2m1(-NAN), 0x7);  // whatever the NaN's sign
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(NAN))));
  EXPECT_TRUE(std::isnan(fp16_bits_to_float(float_to_fp16_bits(NAN))));
}

TEST(ConvertEncode, E8M0Rules) {
  // exact powers of two stay; anything above rounds up; 448/448 = 1 -> 127
  EXPECT_EQ(float_to_e8m0_roundup(1.0f), 127);
  EXPECT_EQ(float_to_e8m0_roundup(448.0f * (1.0f / 448.0f)), 127);
  EXPECT_EQ(float_to_e8m0_roundup(std::nextafter(1.0f, 2.0f)), 128);
  EXPECT_EQ(float_to_e8m0_roundup(1.5f), 128);
  EXPECT_EQ(float_to_e8m0_roundup(0.75f), 127);
  EXPECT_EQ(float_to_e8m0_roundup(0.0f), 0);
  EXPECT_EQ(float_to_e8m0_roundup(INFINITY), 254);
  EXPECT_EQ(float_to_e8m0_roundup(NAN), 255);
  EXPECT_EQ(float_to_e8m0_roundup(std::numeric_limits<float>::max()), 254);  // 255 clamped
  EXPECT_EQ(float_to_e8m0_roundup(std::numeric_limits<float>::denorm_min()), 1);
  EXPECT_EQ(float_to_e8m0_roundup(std::ldexp(1.0f, -126)), 1);
}

// fp16 and bf16 against independent implementations: the compiler's _Float16 (IEEE RNE) and the
// brute-force rule for bf16 (truncate-and-round on the top 16 bits, tie to even).
TEST(ConvertEncode, Fp16MatchesCompiler) {
#if defined(__FLT16_MAX__)
  std::vector<float> xs = rand_wide(20000);
  for (float x : {65504.0f, 65519.9f, 65520.0f, 1e9f, 6e-8f, 3e-8f, 2.98e-8f, -0.0f, INFINITY})
    xs.push_back(x);
  for (uint32_t h = 0; h < 0x7C00; ++h) xs.push_back(fp16_bits_to_float(static_cast<uint16_t>(h)));
  for (float x : xs) {
    const _Float16 r = static_cast<_Float16>(x);
    uint16_t want;
    std::memcpy(&want, &r, 2);
    ASSERT_EQ(float_to_fp16_bits(x), want) << std::hexfloat << x;
  }
#else
  GTEST_SKIP() << "compiler has no _Float16";
#endif
}

TEST(ConvertEncode, Bf16RoundsToNearestEven) {
  for (float x : rand_wide(20000)) {
    const uint32_t u = float_bits(x);
    const double lo = bf16_bits_to_float(static_cast<uint16_t>(u >> 16));
    const double hi = bf16_bits_to_float(static_cast<uint16_t>((u >> 16) + 1));
    const double dlo = std::fabs(double(x) - lo), dhi = std::fabs(double(x) - hi);
    const uint16_t want = static_cast<uint16_t>(
        (dlo < dhi || (dlo == dhi && ((u >> 16) & 1) == 0)) ? (u >> 16) : (u >> 16) + 1);
    ASSERT_EQ(float_to_bf16_bits(x), want) << x;
  }
}

// Ties and overflow by hand, from the bit patterns: round-to-nearest-even (not truncation, not
// half-up), IEEE overflow to Inf past the largest finite value plus half an ulp.
TEST(ConvertEncode, Bf16TiesAndOverflowByHand) {
  const std::pair<uint32_t, uint16_t> cases[] = {
      {0x3F808000u, 0x3F80},                         // 1 + 2^-8: tie, down to the even 0x3F80
      {0x3F818000u, 0x3F82},                         // 1 + 2^-7 + 2^-8: tie, up to the even 0x3F82
      {0x3F808001u, 0x3F81},                         // just above the tie
      {0x3F80FFFFu, 0x3F81}, {0xBF808000u, 0xBF80},  // negative tie
      {0xBF818000u, 0xBF82}, {0x00008000u, 0x0000},  // subnormal ties
      {0x00018000u, 0x0002}, {0x7F7F7FFFu, 0x7F7F},  // below max + half an ulp: the max
      {0x7F7F8000u, 0x7F80},  // max + half an ulp: tie to the even code, which is Inf
      {0x7F7FFFFFu, 0x7F80},  // FLT_MAX -> Inf
      {0xFF7F8000u, 0xFF80}, {0x7F800000u, 0x7F80},
  };
  for (const auto& [in, want] : cases)
    EXPECT_EQ(float_to_bf16_bits(bits_float(in)), want) << std::hex << "0x" << in;
}

TEST(ConvertEncode, Fp16TiesAndOverflowByHand) {
  const std::pair<float, uint16_t> cases[] = {
      {1.0f + 0x1p-11f, 0x3C00},             // tie, down to the even code
      {1.0f + 0x1p-10f + 0x1p-11f, 0x3C02},  // tie, up to the even code
      {1.0f + 0x1p-11f + 0x1p-20f, 0x3C01},  // just above the tie
      {-(1.0f + 0x1p-10f + 0x1p-11f), 0xBC02},
      {0x1p-25f, 0x0000},  // half the smallest subnormal: 0 (even)
      {0x1p-25f + 0x1p-40f, 0x0001},
      {3 * 0x1p-25f, 0x0002},         // subnormal tie: even
      {0x1p-14f - 0x1p-25f, 0x0400},  // largest subnormal + half: up to the min normal
      {65519.99f, 0x7BFF},            // below max + half an ulp: the max
      {65520.0f, 0x7C00},             // max + half an ulp: tie to Inf (even)
      {-65520.0f, 0xFC00},
      {1e30f, 0x7C00},
  };
  for (const auto& [in, want] : cases)
    EXPECT_EQ(float_to_fp16_bits(in), want) << std::hexfloat << in;
}

TEST(ConvertEncode, PackNibbleOrder) {
  EXPECT_EQ(pack_e2m1x2(float_to_e2m1(0.5f), float_to_e2m1(-6.0f)), 0xF1);
}

}  // namespace
}  // namespace groupmm::test
