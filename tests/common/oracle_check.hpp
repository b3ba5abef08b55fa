// Holding group_quantize (either backend) to the independent oracle of common/quant_oracle.hpp:
// inputs that reach every rule (zero-row experts, an all-zero expert, NaN and Inf experts, fp32
// subnormals, experts near the bottom of the fp32 range, blocks far below their expert's amax,
// partial blocks and tiles), a byte-exact comparison of every output, and a round trip held to
// half a step of each element's own block.
#pragma once

#include <sstream>

#include "common/quant_oracle.hpp"
#include "common/quant_test_util.hpp"

namespace groupmm::test {

struct OracleInput {
  oracle::Problem p;
  Tensor x;  // on the CPU, in the input dtype
  std::vector<int64_t> splits;
  TensorView splits_view() { return host_view(splits, DType::int64, {int64_t(splits.size())}); }
};

// Rounds v to a value representable in t by truncation (an exact input, whatever the library's
// own conversion does with it).
inline float representable(float v, DType t) {
  if (t == DType::bf16) return bits_float(float_bits(v) & 0xFFFF0000u);
  if (t == DType::fp16) {
    if (!std::isfinite(v)) return v;
    const float a = std::fabs(v);
    if (a > 65504.0f) return std::copysign(65504.0f, v);
    const int e = std::max(std::ilogb(a), -14);  // fp16 step: 2^(e - 10), subnormals 2^-24
    const float step = std::ldexp(1.0f, e - 10);
    return a == 0 ? v : std::copysign(std::trunc(a / step) * step, v);
  }
  return v;
}

// Activations [M, K] in experts of the given rows (weights: G experts of `rows[0]` rows each, as
// [G, N, K]). Expert roles by index (mod 8): 0 wide random; 1 the largest magnitudes with -0,
// an fp32 subnormal and a 16x32 corner 1e-7 below the rest (NVFP4 block scales that round to
// 0); 2 all zero; 3 holds +-Inf (with specials); 4 holds NaN and -NaN (with specials); 5 amax
// near 2^-121 (fp8 scales past FLT_MAX, MX exponents of a subnormal v); 6 small (2^-9); 7 amax
// near 2^-111 with a corner 2^-17 below it (NVFP4 multipliers S_enc / s_b past FLT_MAX).
inline OracleInput oracle_input(const std::vector<int64_t>& rows, int64_t K, DType t, bool specials,
                                bool weights = false) {
  OracleInput in;
  in.splits = rows;
  int64_t M = 0;
  for (int64_t r : rows) M += r;
  in.p.M = M;
  in.p.K = K;
  in.p.splits = rows;
  std::vector<float> v = rand_wide(static_cast<size_t>(M * K));
  int64_t start = 0;
  for (size_t g = 0; g < rows.size(); ++g) {
    const int64_t m = rows[g];
    auto at = [&](int64_t r, int64_t k) -> float& { return v[size_t((start + r) * K + k)]; };
    const int role = static_cast<int>(g % 8);
    const float mag = role == 1   ? 0x1p20f
                      : role == 5 ? 0x1p-135f
                      : role == 6 ? 0x1p-9f
                      : role == 7 ? 0x1p-125f
                                  : 1.0f;
    for (int64_t r = 0; r < m; ++r)
      for (int64_t k = 0; k < K; ++k) at(r, k) *= mag;
    if (role == 2)
      for (int64_t r = 0; r < m; ++r)
        for (int64_t k = 0; k < K; ++k) at(r, k) = 0.0f;
    if (role == 1 && m >= 16 && K >= 32) {
      for (int64_t r = 0; r < 16; ++r)
        for (int64_t k = 0; k < 32; ++k) at(r, k) *= 1e-7f;
      at(m - 1, K - 1) = -0.0f;
      at(m / 2, 1) = 1e-41f;  // fp32 subnormal (0 in bf16)
    }
    if (role == 7 && m >= 16 && K >= 32)
      for (int64_t r = 0; r < 16; ++r)
        for (int64_t k = 0; k < 32; ++k) at(r, k) *= 0x1p-16f;
    if (specials && role == 3 && m > 0) {
      at(0, K / 2) = INFINITY;
      at(m - 1, 3) = -INFINITY;
      at(m / 2, K - 1) = -0.0f;
    }
    if (specials && role == 4 && m > 0) {
      at(m - 1, 0) = NAN;
      at(0, K - 1) = -NAN;
    }
    start += m;
  }
  for (auto& x : v) x = representable(x, t);
  in.p.x = v;
  const int64_t G = static_cast<int64_t>(rows.size());
  in.x = weights ? make_input(v, t, {G, rows[0], K}, Device::CPU)
                 : make_input(v, t, {M, K}, Device::CPU);
  return in;
}

// The oracle's outputs for the library's buffers of `q`.
inline oracle::Outputs oracle_outputs(const OracleInput& in, const Quantized& q,
                                      const QuantizeConfig& cfg) {
  auto nb = [](const Tensor& t) { return t.view().present() ? t.nbytes() : int64_t(0); };
  return oracle::quantize(in.p, cfg,
                          {nb(q.buf.data), nb(q.buf.scale_inv), nb(q.buf.columnwise_data),
                           nb(q.buf.columnwise_scale_inv)});
}

// Every byte the oracle specifies equals the library's; per-expert amax / S_enc / scale_inv equal
// (NaN equals NaN). Reports the count and the first few mismatches by location.
inline void expect_matches_oracle(const Quantized& q, const oracle::Outputs& o,
                                  const std::string& what) {
  ASSERT_TRUE(o.error.empty()) << what << ": " << o.error;
  const std::pair<const char*, std::pair<const Tensor*, const oracle::Expected*>> bufs[] = {
      {"data", {&q.buf.data, &o.data}},
      {"scale_inv", {&q.buf.scale_inv, &o.scale_inv}},
      {"columnwise_data", {&q.buf.columnwise_data, &o.columnwise_data}},
      {"columnwise_scale_inv", {&q.buf.columnwise_scale_inv, &o.columnwise_scale_inv}}};
  for (const auto& [name, pr] : bufs) {
    if (!pr.first->view().present()) continue;
    const std::vector<uint8_t> got = quant_bytes(*pr.first);
    const oracle::Expected& want = *pr.second;
    ASSERT_EQ(got.size(), want.bytes.size()) << what << " " << name;
    size_t bad = 0;
    std::ostringstream first;
    for (size_t i = 0; i < got.size(); ++i) {
      if (want.tags[i] == 0 || got[i] == want.bytes[i]) continue;
      if (++bad <= 4)
        first << "\n  byte " << i << " (" << oracle::describe(want.tags[i]) << "): got 0x"
              << std::hex << int(got[i]) << ", want 0x" << int(want.bytes[i]) << std::dec;
    }
    EXPECT_EQ(bad, 0u) << what << " " << name << ": " << bad << " bytes differ" << first.str();
  }
  auto expect_floats = [&](const Tensor& t, const std::vector<float>& want, const char* name) {
    if (want.empty()) return;
    ASSERT_TRUE(t.view().present()) << what << " " << name;
    const std::vector<float> got = cpu_floats(t);
    ASSERT_GE(got.size(), want.size()) << what << " " << name;
    for (size_t g = 0; g < want.size(); ++g)
      EXPECT_TRUE(float_bits(got[g]) == float_bits(want[g]) ||
                  (std::isnan(got[g]) && std::isnan(want[g])))
          << what << " " << name << "[" << g << "]: got " << got[g] << ", want " << want[g];
  };
  expect_floats(q.buf.amax, o.amax, "amax");
  expect_floats(q.buf.global_scale, o.global_scale, "global_scale");
  if (!o.expert_scale_inv.empty()) expect_floats(q.buf.scale_inv, o.expert_scale_inv, "scale_inv");
}

// dequantize(quantize(x)) from either copy, per element within the error a correct
// quantization can have, derived from the oracle's block scale (not the library's, so errors in
// the scales cannot cancel): with code = round(x * mul) and dequant = code * dq,
//   |dequant - x| <= rounding_bound(|x| * mul) * dq + |x| * |mul * dq - 1|
// (rounding_bound: half the format's step at that value, or its distance past the largest value;
// the second term: the stored scale's own rounding, or NVFP4's saturated multiplier), plus the
// fp32 rounding of the products. Checks every finite x of a block with a finite scale (the
// codes of the others are held to the oracle by expect_matches_oracle).
inline void expect_round_trip_within_half_step(Context& ctx, const OracleInput& in,
                                               const Quantized& q, const oracle::Outputs& o,
                                               const QuantizeConfig& cfg, bool col,
                                               const std::string& what) {
  TensorView ov = in.x.view();
  ov.dtype = DType::fp32;
  Tensor out = Tensor::empty_like(ov, ctx.device(), ctx.stream());
  fill_bytes(out, 0xFF, ctx.stream());
  run_dequantize(ctx, q, cfg, col, out);
  const std::vector<float> got = cpu_floats(out);
  const bool fp4 = cfg.recipe == QuantRecipe::nvfp4 || cfg.recipe == QuantRecipe::mxfp4;
  const oracle::Format& f = fp4                               ? oracle::e2m1()
                            : cfg.fp8_dtype == DType::fp8e5m2 ? oracle::e5m2()
                                                              : oracle::e4m3();
  const auto& mul = col ? o.col_mul : o.row_mul;
  const auto& dq = col ? o.col_dq : o.row_dq;
  size_t bad = 0, checked = 0;
  std::ostringstream first;
  for (size_t i = 0; i < got.size(); ++i) {
    const double x = in.p.x[i], m = mul[i], s = dq[i];
    if (!std::isfinite(x) || std::isnan(m) || std::isnan(s)) continue;  // NaN / Inf blocks
    ++checked;
    const double a = std::fabs(x);
    double bound = (s == 0 ? 0.0 : oracle::rounding_bound(f, a * m) * s) + a * std::fabs(m * s - 1);
    bound += 0x1p-20 * (a + bound) + 0x1p-149;
    const double err = std::fabs(double(got[i]) - x);
    if (!(err <= bound) && ++bad <= 4)
      first << "\n  element " << i << " (row " << i / size_t(in.p.K) << ", col "
            << i % size_t(in.p.K) << "): x " << x << ", dequant " << got[i] << ", error " << err
            << " > bound " << bound;
  }
  EXPECT_GT(checked, got.size() * 3 / 4) << what << ": too few finite elements to check";
  EXPECT_EQ(bad, 0u) << what << (col ? " columnwise" : " rowwise") << ": " << bad
                     << " elements off by more than half a step of their block" << first.str();
}

// Both checks of one quantized case: every byte against the oracle, the round trip of each copy.
inline void expect_oracle_case(Context& ctx, const OracleInput& in, const Quantized& q,
                               const QuantizeConfig& cfg, const std::string& what) {
  const oracle::Outputs o = oracle_outputs(in, q, cfg);
  expect_matches_oracle(q, o, what);
  for (bool col : {false, true})
    if (col ? has_columnwise(cfg.direction) : has_rowwise(cfg.direction))
      expect_round_trip_within_half_step(ctx, in, q, o, cfg, col, what);
}

// ---- the cases both backends run
// -----------------------------------------------------------------
struct OracleCase {
  QuantizeConfig cfg;
  DType in = DType::bf16;
  bool weights = false;
};

inline std::string oracle_case_name(const OracleCase& c) {
  return cfg_name(c.cfg) + "_" + dtype_name(c.in) + (c.weights ? "_weights" : "");
}
inline void PrintTo(const OracleCase& c, std::ostream* os) {
  *os << oracle_case_name(c);
}

// Experts by role (oracle_input): a zero-row expert in the middle, partial 128-row tiles and
// partial column blocks everywhere, experts of more than 128 rows (columnwise swizzled scales
// with 5+ blocks, padded to 8+), K with 5 MX / 10 NVFP4 scale columns (rowwise swizzle Kp = 8 /
// 12, K padded to 256 in the columnwise swizzle), 2 fp8 128-column blocks.
inline OracleInput case_input(const OracleCase& c) {
  const bool fp4 = c.cfg.recipe == QuantRecipe::nvfp4 || c.cfg.recipe == QuantRecipe::mxfp4;
  const int64_t K = c.cfg.recipe == QuantRecipe::fp8_block ? 256 : 160;
  if (c.weights) return oracle_input({144, 144, 144}, K, c.in, true, true);
  const std::vector<int64_t> rows = fp4 ? std::vector<int64_t>{128, 160, 34, 2, 40, 66, 0, 130, 18}
                                        : std::vector<int64_t>{129, 160, 33, 1, 40, 65, 0, 130, 17};
  return oracle_input(rows, K, c.in, true);
}

inline std::vector<OracleCase> oracle_cases() {
  using R = QuantRecipe;
  const auto B = QuantDirection::both;
  const auto P = ScaleLayout::plain, S = ScaleLayout::swizzled, N = ScaleLayout::mn_major;
  const auto e4 = DType::fp8e4m3, e5 = DType::fp8e5m2;
  return {
      {qcfg(R::fp8_current, B)},
      {qcfg(R::fp8_current, B, P, e5, true)},
      {qcfg(R::fp8_current, B, P, e4, true), DType::fp32},
      {qcfg(R::fp8_block, B)},
      {qcfg(R::fp8_block, B, P, e5, true)},
      {qcfg(R::fp8_block, B, N)},
      {qcfg(R::fp8_block, B, N, e4, true), DType::fp16},
      {qcfg(R::mxfp8, B)},
      {qcfg(R::mxfp8, B, S)},
      {qcfg(R::mxfp8, B, P, e5)},
      {qcfg(R::mxfp8, B, S, e5), DType::fp32},
      {qcfg(R::nvfp4, B)},
      {qcfg(R::nvfp4, B, S), DType::fp16},
      {qcfg(R::mxfp4, B)},
      {qcfg(R::mxfp4, B, S), DType::fp32},
      // weights [G, N, K]: 2D blocks (128x128, 16x16) with partial blocks (N = 144)
      {qcfg(R::fp8_block, B, P, e4, false, true), DType::bf16, true},
      {qcfg(R::fp8_block, B, N, e5, true, true), DType::bf16, true},
      {qcfg(R::nvfp4, B, P, e4, false, true), DType::bf16, true},
      {qcfg(R::nvfp4, B, S, e4, false, true), DType::bf16, true},
      {qcfg(R::mxfp8, B, S), DType::bf16, true},
      {qcfg(R::mxfp4, B, S), DType::bf16, true},
  };
}

}  // namespace groupmm::test
