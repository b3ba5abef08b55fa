// grouped_gemm on the CPU reference: agrees with an independent fp64 per-expert dense loop, and
// bad input gets clear errors.
#include "common/gemm_case.hpp"

namespace groupmm::test {
namespace {

// fp64 dense product of one expert, from the stored operands.
std::vector<double> dense_ref(const GemmProblem& p, int64_t g, int64_t start) {
  const auto A = decode(
      std::vector<uint8_t>((uint8_t*)p.a.data(), (uint8_t*)(p.a.data() + p.a.size())), p.dtype);
  const auto B = decode(
      std::vector<uint8_t>((uint8_t*)p.b.data(), (uint8_t*)(p.b.data() + p.b.size())), p.dtype);
  const int64_t m = p.splits[size_t(g)], N = p.N, K = p.K;
  std::vector<double> out;
  if (p.pass == GemmPass::forward) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t n = 0; n < N; ++n) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k)
          s += double(A[size_t((start + i) * K + k)]) * B[size_t(g * N * K + n * K + k)];
        out.push_back(s);
      }
  } else if (p.pass == GemmPass::dgrad) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t k = 0; k < K; ++k) {
        double s = 0;
        for (int64_t n = 0; n < N; ++n)
          s += double(A[size_t((start + i) * N + n)]) * B[size_t(g * N * K + n * K + k)];
        out.push_back(s);
      }
  } else {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        double s = 0;
        for (int64_t i = 0; i < m; ++i)
          s += double(A[size_t((start + i) * N + n)]) * B[size_t((start + i) * K + k)];
        out.push_back(s);
      }
  }
  return out;
}

TEST(GemmCpu, ReferenceMatchesDenseFp64PerExpert) {
  for (GemmPass pass : {GemmPass::forward, GemmPass::dgrad, GemmPass::wgrad}) {
    GemmProblem p =
        GemmProblem::make(pass, DType::bf16, 5, make_splits(Pattern::zero_middle, 5, 77), 24, 40,
                          false, 0, pass == GemmPass::wgrad ? DType::fp32 : DType::bf16);
    const auto out = decode(p.run_cpu(), p.out_dtype);
    const auto ranges = p.expert_ranges();
    int64_t start = 0;
    for (int64_t g = 0; g < p.G; ++g) {
      const auto ref = dense_ref(p, g, start);
      const auto [lo, hi] = ranges[size_t(g)];
      ASSERT_EQ(size_t(hi - lo), ref.size());
      std::vector<float> x(out.begin() + lo, out.begin() + hi), y(ref.begin(), ref.end());
      EXPECT_LE(rel_error(x, y), 1e-2) << gemm_pass_name(pass) << " expert " << g;
      start += p.splits[size_t(g)];
    }
  }
}

TEST(GemmCpu, BiasAndAccumulate) {
  GemmProblem p =
      GemmProblem::make(GemmPass::forward, DType::fp16, 3, {5, 0, 7}, 16, 8, true, 0, DType::fp16);
  const auto with_bias = decode(p.run_cpu(), DType::fp16);
  p.bias = false;
  const auto no_bias = decode(p.run_cpu(), DType::fp16);
  const auto b = decode(
      std::vector<uint8_t>((uint8_t*)p.biasv.data(), (uint8_t*)(p.biasv.data() + p.biasv.size())),
      DType::fp16);
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

TEST(GemmCpu, BadInputMessages) {
  Context ctx(Device::CPU);
  GemmProblem p =
      GemmProblem::make(GemmPass::forward, DType::bf16, 2, {3, 5}, 16, 8, false, 0, DType::bf16);
  std::vector<uint8_t> out(p.out_bytes());
  GroupedGemmArgs a =
      p.args(p.a.data(), p.b.data(), out.data(), p.splits.data(), nullptr, Device::CPU);
  GroupedGemmArgs bad = a;
  bad.a.shape[1] = 12;
  EXPECT_THROW_MSG(grouped_gemm(ctx, bad), "grouped_gemm: a (x).shape[1]=12 must equal 8");
  bad = a;
  bad.b.dtype = DType::fp16;
  EXPECT_THROW_MSG(grouped_gemm(ctx, bad), "grouped_gemm: b (W).dtype=fp16 must be bf16");
  bad = a;
  bad.splits.shape[0] = 3;
  EXPECT_THROW_MSG(grouped_gemm(ctx, bad),
                   "grouped_gemm: splits.shape[0]=3 must equal the number of groups 2");
  bad = a;
  bad.a.dtype = bad.b.dtype = bad.out.dtype = DType::int32;  // (fp32 is valid on a CPU context)
  EXPECT_THROW_MSG(grouped_gemm(ctx, bad), "grouped_gemm: a.dtype=int32 must be bf16 or fp16");
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

}  // namespace
}  // namespace groupmm::test
