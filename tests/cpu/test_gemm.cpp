// grouped_gemm on the CPU reference: within the tolerance table of an independent fp64 per-expert
// dense loop (long sums, G = 1, several split patterns), output rounding by hand, and bad input
// gets clear errors.
#include "common/gemm_case.hpp"
#include "common/tolerance.hpp"

namespace groupmm::test {
namespace {

// fp64 dense product of every expert from the stored operands, laid out like the output, with
// bias (forward) and the initial output (beta = 1) added: the exact result before the output
// rounding.
std::vector<double> dense_ref(const GemmProblem& p) {
  auto as_bytes = [](const std::vector<uint16_t>& v) {
    return std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(v.data()),
                                reinterpret_cast<const uint8_t*>(v.data() + v.size()));
  };
  const auto A = decode(as_bytes(p.a), p.dtype), B = decode(as_bytes(p.b), p.dtype);
  const auto bias = p.bias ? decode(p.biasv, p.out_dtype) : std::vector<float>{};
  const auto init = p.beta != 0 ? decode(p.out_init, p.out_dtype) : std::vector<float>{};
  const int64_t N = p.N, K = p.K;
  std::vector<double> out(static_cast<size_t>(p.out_elems()), 0.0);
  int64_t start = 0;
  for (int64_t g = 0; g < p.G; ++g) {
    const int64_t m = p.splits[size_t(g)];
    for (int64_t i = start; i < start + m; ++i) {
      if (p.pass == GemmPass::forward) {
        for (int64_t n = 0; n < N; ++n) {
          double s = p.bias ? bias[size_t(g * N + n)] : 0.0;
          for (int64_t k = 0; k < K; ++k)
            s += double(A[size_t(i * K + k)]) * B[size_t(g * N * K + n * K + k)];
          out[size_t(i * N + n)] = s;
        }
      } else if (p.pass == GemmPass::dgrad) {
        for (int64_t k = 0; k < K; ++k) {
          double s = 0;
          for (int64_t n = 0; n < N; ++n)
            s += double(A[size_t(i * N + n)]) * B[size_t(g * N * K + n * K + k)];
          out[size_t(i * K + k)] = s;
        }
      } else {
        for (int64_t n = 0; n < N; ++n)
          for (int64_t k = 0; k < K; ++k)
            out[size_t(g * N * K + n * K + k)] +=
                double(A[size_t(i * N + n)]) * B[size_t(i * K + k)];
      }
    }
    start += m;
  }
  if (p.beta != 0)
    for (size_t i = 0; i < out.size(); ++i) out[i] += p.beta * double(init[i]);
  return out;
}

struct GemmCase {
  GemmPass pass;
  DType dtype, out;
  Pattern pattern;
  int64_t G, M, N, K;
  bool bias = false;
  float beta = 0;
};

std::string gemm_case_name(const GemmCase& c) {
  return detail::cat(gemm_pass_name(c.pass), "_", dtype_name(c.dtype), "_to_", dtype_name(c.out),
                     "_", pattern_name(c.pattern), "_G", c.G, "_M", c.M, "_N", c.N, "_K", c.K,
                     c.bias ? "_bias" : "", c.beta != 0 ? "_accum" : "");
}
void PrintTo(const GemmCase& c, std::ostream* os) {
  *os << gemm_case_name(c);
}

class GemmCpuRef : public ::testing::TestWithParam<GemmCase> {};

// Per expert, within the (gemm, dtype, out) tolerance of the exact product. The long sums (K, N
// or M in the thousands) make an accumulation in a 16-bit format, or a dropped tail, visible.
TEST_P(GemmCpuRef, MatchesExactProductPerExpert) {
  const GemmCase c = GetParam();
  GemmProblem p = GemmProblem::make(c.pass, c.dtype, c.G, make_splits(c.pattern, c.G, c.M), c.N,
                                    c.K, c.bias, c.beta, c.out);
  const auto out = decode(p.run_cpu(), p.out_dtype);
  const auto ref = dense_ref(p);
  const auto ranges = p.expert_ranges();
  for (int64_t g = 0; g < p.G; ++g) {
    const int64_t terms = c.pass == GemmPass::forward ? c.K
                          : c.pass == GemmPass::dgrad ? c.N
                                                      : p.splits[size_t(g)] + (c.beta != 0);
    const Tolerance tol = tolerance(TolOp::gemm, c.dtype, c.out, terms);
    const auto [lo, hi] = ranges[size_t(g)];
    const std::vector<float> got(out.begin() + lo, out.begin() + hi);
    const std::vector<double> want(ref.begin() + lo, ref.begin() + hi);
    if (p.pass == GemmPass::wgrad && p.splits[size_t(g)] == 0) {  // 0, or main_grad unchanged
      for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(double(got[i]), want[i]) << "expert " << g;
      continue;
    }
    EXPECT_TRUE(close_to(got, want, tol, detail::cat(gemm_case_name(c), " expert ", g)));
  }
}

std::vector<GemmCase> gemm_cases() {
  const auto F = GemmPass::forward, D = GemmPass::dgrad, W = GemmPass::wgrad;
  const auto bf = DType::bf16, hf = DType::fp16, f32 = DType::fp32;
  return {
      {F, bf, bf, Pattern::zipf, 4, 160, 48, 2048},           // K in the thousands
      {F, hf, hf, Pattern::balanced, 1, 64, 40, 1003, true},  // G = 1, K not a multiple of 8
      {F, bf, bf, Pattern::zero_middle, 5, 77, 24, 40, true},
      {D, bf, bf, Pattern::random_odd, 6, 150, 2048, 24},  // sums over N
      {D, hf, hf, Pattern::zero_first, 3, 90, 1001, 16},
      {F, bf, f32, Pattern::zipf, 4, 160, 48, 2048},              // fp32 out: no output rounding
      {F, hf, f32, Pattern::zero_middle, 5, 77, 24, 1003, true},  // fp32 bias
      {F, bf, f32, Pattern::zero_first, 3, 90, 40, 512, true},
      {D, bf, f32, Pattern::random_odd, 6, 150, 2048, 24},
      {D, hf, f32, Pattern::zero_last, 3, 90, 1001, 16},
      {W, bf, f32, Pattern::quarter_empty, 5, 3000, 24, 16},       // sums over M, fp32 main_grad
      {W, hf, f32, Pattern::balanced, 1, 2001, 16, 24, false, 1},  // G = 1, accumulate
      {W, bf, bf, Pattern::zero_last, 4, 1200, 16, 24},
      {W, hf, hf, Pattern::random_odd, 3, 700, 24, 8},
  };
}

INSTANTIATE_TEST_SUITE_P(Cases, GemmCpuRef, ::testing::ValuesIn(gemm_cases()),
                         [](const auto& info) { return gemm_case_name(info.param); });

// Output conversion by hand: sums that land exactly between two neighbours of the output format
// round to the even one (round-to-nearest-even, not truncation or half-up), and sums past the
// largest finite value round to Inf (IEEE overflow, no saturation).
TEST(GemmCpu, OutputRoundingTiesAndOverflowByHand) {
  struct Row {
    float x0, x1, want;  // y = x0 * 1 + x1 * 0.5 (exact in fp32) in the output format
  };
  const float i = INFINITY;
  const std::vector<Row> bf16_rows = {
      {1.0f, 0x1p-7f, 1.0f},                       // 1 + 2^-8, a tie: 0x3F80 (even)
      {1.0f + 0x1p-7f, 0x1p-7f, 1.0f + 0x1p-6f},   // a tie: 0x3F82 (even), not 0x3F81
      {1.0f, 0x1p-7f + 0x1p-14f, 1.0f + 0x1p-7f},  // just above the tie: up
      {-1.0f, -0x1p-7f, -1.0f},                    // ties are symmetric in sign
      {0x1.FEp127f, 0x1p120f, i},                  // bf16 max + half an ulp: tie to Inf
      {0x1.FEp127f, 0x1p119f, 0x1.FEp127f},        // below the tie: stays at the max
  };
  const std::vector<Row> fp16_rows = {
      {1.0f, 0x1p-10f, 1.0f},                       // 1 + 2^-11, a tie: 0x3C00 (even)
      {1.0f + 0x1p-10f, 0x1p-10f, 1.0f + 0x1p-9f},  // a tie: 0x3C02 (even), not 0x3C01
      {0x1p-24f, 0x1p-24f, 0x1p-23f},               // subnormal tie: 0x0002 (even)
      {0.0f, 0x1p-24f, 0.0f},                       // half the smallest subnormal: 0 (even)
      {65504.0f, 32.0f, i},                         // fp16 max + half an ulp: tie to Inf
      {65504.0f, 30.0f, 65504.0f},                  // below: stays at the max
      {-65504.0f, -64.0f, -i},
  };
  for (DType t : {DType::bf16, DType::fp16}) {
    const auto& rows = t == DType::bf16 ? bf16_rows : fp16_rows;
    const int64_t M = static_cast<int64_t>(rows.size());
    GemmProblem p = GemmProblem::make(GemmPass::forward, t, 1, {M}, 1, 2, false, 0, t);
    std::vector<float> a;
    for (const Row& r : rows) a.insert(a.end(), {r.x0, r.x1});
    p.a = encode16(a, t);
    p.b = encode16({1.0f, 0.5f}, t);
    ASSERT_EQ(decode(std::vector<uint8_t>(reinterpret_cast<uint8_t*>(p.a.data()),
                                          reinterpret_cast<uint8_t*>(p.a.data() + p.a.size())),
                     t),
              a)
        << "the inputs must be exact in " << dtype_name(t);
    const auto y = decode(p.run_cpu(), t);
    for (size_t r = 0; r < rows.size(); ++r)
      EXPECT_EQ(y[r], rows[r].want) << dtype_name(t) << " row " << r << ": " << std::hexfloat
                                    << rows[r].x0 << " + " << rows[r].x1 << " / 2";
  }
}

TEST(GemmCpu, BiasAndAccumulate) {
  GemmProblem p =
      GemmProblem::make(GemmPass::forward, DType::fp16, 3, {5, 0, 7}, 16, 8, true, 0, DType::fp16);
  const auto with_bias = decode(p.run_cpu(), DType::fp16);
  p.bias = false;
  const auto no_bias = decode(p.run_cpu(), DType::fp16);
  const auto b = decode(p.biasv, DType::fp16);
  // row 0 belongs to expert 0, row 5 to expert 2
  EXPECT_NEAR(with_bias[3] - no_bias[3], b[3], 2e-2);
  EXPECT_NEAR(with_bias[5 * 16 + 3] - no_bias[5 * 16 + 3], b[2 * 16 + 3], 2e-2);

  GemmProblem w =
      GemmProblem::make(GemmPass::wgrad, DType::bf16, 3, {4, 0, 6}, 16, 8, false, 1, DType::fp32);
  const auto init = decode(w.out_init, DType::fp32);
  const auto acc = decode(w.run_cpu(), DType::fp32);
  for (int64_t i = 16 * 8; i < 2 * 16 * 8; ++i)
    ASSERT_EQ(acc[size_t(i)], init[size_t(i)]) << "empty expert changed";
  w.beta = 0;
  const auto fresh = decode(w.run_cpu(), DType::fp32);
  for (int64_t i = 0; i < 16 * 8; ++i)
    ASSERT_NEAR(acc[size_t(i)], fresh[size_t(i)] + init[size_t(i)], 1e-4);
  for (int64_t i = 16 * 8; i < 2 * 16 * 8; ++i) ASSERT_EQ(fresh[size_t(i)], 0.0f);
}

// An fp32 out is the 16-bit out before its one rounding: the same sums (and the same bias values,
// stored in fp32) converted to bf16/fp16 give the 16-bit out bit for bit, in forward with bias and
// in dgrad.
TEST(GemmCpu, Fp32OutIsThe16BitOutUnrounded) {
  for (GemmPass pass : {GemmPass::forward, GemmPass::dgrad}) {
    for (DType t : {DType::bf16, DType::fp16}) {
      const bool bias = pass == GemmPass::forward;
      GemmProblem p16 = GemmProblem::make(pass, t, 4, make_splits(Pattern::zero_middle, 4, 300), 40,
                                          56, bias, 0, t);
      GemmProblem p32 = p16;
      p32.out_dtype = DType::fp32;
      p32.out_init.assign(p32.out_bytes(), 0xFF);
      if (bias) {
        const auto b = decode(p16.biasv, t);  // the same values, exact in fp32
        p32.biasv.resize(b.size() * 4);
        std::memcpy(p32.biasv.data(), b.data(), p32.biasv.size());
      }
      const auto y16 = decode(p16.run_cpu(), t), y32 = decode(p32.run_cpu(), DType::fp32);
      ASSERT_EQ(y16.size(), y32.size());
      size_t inexact = 0;  // values fp32 holds and the 16-bit format does not: the rounding seen
      for (size_t i = 0; i < y16.size(); ++i) {
        const float r = t == DType::bf16 ? bf16_bits_to_float(float_to_bf16_bits(y32[i]))
                                         : fp16_bits_to_float(float_to_fp16_bits(y32[i]));
        ASSERT_EQ(y16[i], r) << gemm_pass_name(pass) << " " << dtype_name(t) << " element " << i;
        inexact += r != y32[i];
      }
      EXPECT_GT(inexact, y16.size() / 2) << "fp32 out looks rounded to " << dtype_name(t);
    }
  }
}

TEST(GemmCpu, BadInputMessages) {
  Context ctx(Device::CPU);
  GemmProblem p =
      GemmProblem::make(GemmPass::forward, DType::bf16, 2, {3, 5}, 16, 8, false, 0, DType::bf16);
  std::vector<uint8_t> out(p.out_bytes());
  GroupedGemmArgs a =
      p.args(p.a.data(), p.b.data(), out.data(), p.splits.data(), nullptr, Device::CPU);
  GroupedGemmArgs bad = a;
  bad.a.shape[1] = 12;
  EXPECT_THROW_MSG(grouped_gemm(ctx, bad),
                   "grouped_gemm: a (x).shape[1]=12 must equal b (W).shape[2]=8 (K: W is "
                   "[G, N, K])");
  // Operands of two dtypes: named from a's side (an input in another dtype than a layer's
  // weight), with both dtypes, in every pass.
  bad = a;
  bad.b.dtype = DType::fp16;
  EXPECT_THROW_MSG(grouped_gemm(ctx, bad),
                   "grouped_gemm: a (x).dtype=bf16 must equal b (W).dtype=fp16 (both operands in "
                   "one dtype)");
  bad = a;
  bad.a.dtype = DType::fp32;
  EXPECT_THROW_MSG(grouped_gemm(ctx, bad),
                   "grouped_gemm: a (x).dtype=fp32 must equal b (W).dtype=bf16");
  bad.pass = GemmPass::dgrad;
  EXPECT_THROW_MSG(grouped_gemm(ctx, bad),
                   "grouped_gemm: a (dy).dtype=fp32 must equal b (W).dtype=bf16");
  bad.pass = GemmPass::wgrad;
  EXPECT_THROW_MSG(grouped_gemm(ctx, bad),
                   "grouped_gemm: a (dy).dtype=fp32 must equal b (x).dtype=bf16");
  {  // wgrad: x's rows against dy's
    GemmProblem w =
        GemmProblem::make(GemmPass::wgrad, DType::bf16, 2, {3, 5}, 16, 8, false, 0, DType::fp32);
    std::vector<uint8_t> o(w.out_bytes());
    GroupedGemmArgs wa =
        w.args(w.a.data(), w.b.data(), o.data(), w.splits.data(), nullptr, Device::CPU);
    wa.b.shape[0] = 7;
    EXPECT_THROW_MSG(grouped_gemm(ctx, wa),
                     "grouped_gemm: b (x).shape[0]=7 must equal a (dy).shape[0]=8 (the rows M)");
  }
  bad = a;
  bad.splits.shape[0] = 3;
  EXPECT_THROW_MSG(grouped_gemm(ctx, bad),
                   "grouped_gemm: splits.shape[0]=3 must equal the number of groups 2");
  bad = a;
  bad.a.dtype = bad.b.dtype = bad.out.dtype = DType::int32;  // (fp32 is valid on a CPU context)
  EXPECT_THROW_MSG(grouped_gemm(ctx, bad), "grouped_gemm: a (x).dtype=int32 must be bf16 or fp16");
  bad = a;
  bad.out.dtype = DType::fp16;  // neither a's dtype nor fp32
  EXPECT_THROW_MSG(grouped_gemm(ctx, bad),
                   "grouped_gemm: out.dtype=fp16 must be bf16 or fp32 for forward");
  bad.pass = GemmPass::dgrad;
  bad.a.shape[1] = 16, bad.out.shape[1] = 8;
  EXPECT_THROW_MSG(grouped_gemm(ctx, bad),
                   "grouped_gemm: out.dtype=fp16 must be bf16 or fp32 for dgrad");
  bad.out.dtype = DType::bf16;
  bad.a.shape[1] = 12;  // dy [M, N] against W [G, N=16, K=8]
  EXPECT_THROW_MSG(grouped_gemm(ctx, bad),
                   "grouped_gemm: a (dy).shape[1]=12 must equal b (W).shape[1]=16 (N: W is "
                   "[G, N, K])");
  bad = a;
  bad.a.dtype = bad.b.dtype = DType::fp32;  // fp32 operands (CPU) write fp32 only
  EXPECT_THROW_MSG(grouped_gemm(ctx, bad), "grouped_gemm: out.dtype=bf16 must be fp32 for forward");
  // bias follows out's dtype, both ways
  std::vector<float> bias32(2 * 16), out32(8 * 16);
  std::vector<uint16_t> bias16(2 * 16);
  bad = a;
  bad.bias = TensorView(bias16.data(), DType::bf16, Device::CPU, {2, 16});
  bad.out = TensorView(out32.data(), DType::fp32, Device::CPU, {8, 16});
  EXPECT_THROW_MSG(grouped_gemm(ctx, bad),
                   "grouped_gemm: bias.dtype=bf16 must equal out.dtype=fp32");
  bad = a;
  bad.bias = TensorView(bias32.data(), DType::fp32, Device::CPU, {2, 16});
  EXPECT_THROW_MSG(grouped_gemm(ctx, bad),
                   "grouped_gemm: bias.dtype=fp32 must equal out.dtype=bf16");
  bad.out = TensorView(out32.data(), DType::fp32, Device::CPU, {8, 16});
  EXPECT_NO_THROW(grouped_gemm(ctx, bad));  // fp32 out with fp32 bias
  bad = a;
  bad.beta = 1;
  EXPECT_THROW_MSG(grouped_gemm(ctx, bad), "grouped_gemm: beta=1 must be 0 for forward");
  bad = a;
  bad.config = "fwd_bf16_128x256_coop_c12";
  EXPECT_THROW_MSG(grouped_gemm(ctx, bad),
                   "grouped_gemm: config 'fwd_bf16_128x256_coop_c12' selects a cutlass_sm90 "
                   "kernel; engine automatic on cpu has none");
  bad = a;
  bad.engine = GemmEngine::cutlass_sm90;
  EXPECT_THROW_MSG(grouped_gemm(ctx, bad),
                   "grouped_gemm: engine cutlass_sm90 needs a CUDA context");
}

TEST(GemmCpu, SplitsFaultsReported) {
  Context ctx(Device::CPU);
  GemmProblem p =
      GemmProblem::make(GemmPass::forward, DType::bf16, 2, {3, 5}, 16, 8, false, 0, DType::bf16);
  p.splits = {3, 9};  // runs past M=8: clamped, reported
  std::vector<uint8_t> out(p.out_bytes(), 0xFF);
  grouped_gemm(ctx,
               p.args(p.a.data(), p.b.data(), out.data(), p.splits.data(), nullptr, Device::CPU));
  EXPECT_THROW_MSG(ctx.check(), "splits run past the buffer (rows clamped)");
}

// ---- SplitsTotal::at_most: buffers longer than sum(splits) ------------------------------------
// Per pass: the result over the experts' rows is bit for bit the exact problem's (so no NaN tail
// row of a or b was read), the output rows past the sum are untouched (at_most) or zero
// (zero_tail), and a short sum is no fault. Splits with empty experts, including an all-empty one.
TEST(GemmCpuTail, RowsPastTheSumAreNeitherReadNorWritten) {
  const std::vector<std::vector<int64_t>> patterns = {{5, 0, 9, 3}, {0, 0, 7, 0}, {0, 0, 0, 0}};
  for (GemmPass pass : {GemmPass::forward, GemmPass::dgrad, GemmPass::wgrad})
    for (const auto& splits : patterns)
      for (bool zero_tail : {false, true}) {
        if (zero_tail && pass == GemmPass::wgrad) continue;
        const DType out_t = pass == GemmPass::wgrad ? DType::fp32 : DType::bf16;
        GemmProblem exact = GemmProblem::make(pass, DType::bf16, 4, splits, 24, 40,
                                              pass == GemmPass::forward, 0, out_t);
        // (no rows at all: the exact problem has no buffers; a wgrad gives dW = 0)
        const std::vector<uint8_t> want =
            exact.M > 0 ? exact.run_cpu()
                        : std::vector<uint8_t>(pass == GemmPass::wgrad ? exact.out_bytes() : 0, 0);
        TailProblem t = TailProblem::make(exact, 11);
        std::vector<uint8_t> out(t.out_bytes(), 0xFF);
        Context ctx(Device::CPU);
        grouped_gemm(ctx, t.args(t.a.data(), t.b.data(), out.data(), t.p.splits.data(),
                                 t.p.biasv.data(), Device::CPU, zero_tail));
        const std::string what = detail::cat(gemm_pass_name(pass), " splits[2]=", splits[2],
                                             zero_tail ? " zero_tail" : "");
        EXPECT_NO_THROW(ctx.check()) << what;
        ASSERT_TRUE(std::equal(want.begin(), want.end(), out.begin())) << what;
        EXPECT_TRUE(t.tail_is(out, zero_tail ? 0x00 : 0xFF)) << what;
      }
}

// A sum past the buffer is still a fault in at_most mode (both bits, as in the strict rule), a
// short sum still is one in the default (exact) mode, and zero_tail needs at_most (not wgrad).
TEST(GemmCpuTail, FaultsAndArguments) {
  GemmProblem exact =
      GemmProblem::make(GemmPass::forward, DType::bf16, 2, {3, 5}, 16, 8, false, 0, DType::bf16);
  TailProblem t = TailProblem::make(exact, 4);  // 12 rows
  std::vector<uint8_t> out(t.out_bytes(), 0xFF);
  {
    Context ctx(Device::CPU);
    t.p.splits = {3, 10};  // 13 > 12 rows
    grouped_gemm(ctx, t.args(t.a.data(), t.b.data(), out.data(), t.p.splits.data(), nullptr,
                             Device::CPU, true));
    const StatusBlock st = ctx.take_status();
    EXPECT_TRUE(st.bits & kFaultSplitsOverflow);
    EXPECT_TRUE(st.bits & kFaultSplitsTotalMismatch);
  }
  {
    Context ctx(Device::CPU);
    t.p.splits = {3, 5};  // 8 < 12 rows, strict rule
    GroupedGemmArgs a =
        t.args(t.a.data(), t.b.data(), out.data(), t.p.splits.data(), nullptr, Device::CPU, false);
    a.splits_total = SplitsTotal::exact;
    grouped_gemm(ctx, a);
    EXPECT_THROW_MSG(ctx.check(), "sum of splits != expected rows");
    a.zero_tail = true;
    EXPECT_THROW_MSG(grouped_gemm(ctx, a), "grouped_gemm: zero_tail needs splits_total=at_most");
    EXPECT_NE(a.to_string().find("zero_tail"), std::string::npos);
    a.zero_tail = false;
    a.expected_rows = 8;  // the heuristic's rows: at_most only, within the buffer
    EXPECT_THROW_MSG(grouped_gemm(ctx, a),
                     "grouped_gemm: expected_rows=8 must be 0, or with splits_total=at_most in [1, "
                     "M_total=12]");
    a.splits_total = SplitsTotal::at_most;
    a.expected_rows = 13;
    EXPECT_THROW_MSG(grouped_gemm(ctx, a), "grouped_gemm: expected_rows=13 must be 0");
    a.expected_rows = -1;
    EXPECT_THROW_MSG(grouped_gemm(ctx, a), "grouped_gemm: expected_rows=-1 must be 0");
    a.expected_rows = 8;
    grouped_gemm(ctx, a);
    EXPECT_NO_THROW(ctx.check());
    EXPECT_NE(a.to_string().find("expected_rows=8"), std::string::npos);
  }
  {
    GemmProblem w =
        GemmProblem::make(GemmPass::wgrad, DType::bf16, 2, {3, 5}, 16, 8, false, 0, DType::fp32);
    TailProblem tw = TailProblem::make(w, 4);
    std::vector<uint8_t> o(tw.out_bytes(), 0xFF);
    Context ctx(Device::CPU);
    EXPECT_THROW_MSG(grouped_gemm(ctx, tw.args(tw.a.data(), tw.b.data(), o.data(),
                                               tw.p.splits.data(), nullptr, Device::CPU, true)),
                     "zero_tail is for forward and dgrad");
  }
}

}  // namespace
}  // namespace groupmm::test
