// grouped_gemm over quantized operands on the CPU reference backend: the reference against a hand
// decode of the quantized bytes (written here from the layouts in quantize.hpp, not through the
// library's dequantizer), accuracy against the bf16 GEMM, the wgrad alignment rule, and errors.
#include <cstring>

#include "common/qgemm_case.hpp"

namespace groupmm::test {
namespace {

double dec_fp8(uint8_t v, DType t) {
  return t == DType::fp8e4m3 ? e4m3_to_float(v) : e5m2_to_float(v);
}

// DeepGEMM's calc_diff: 1 - 2<x,y>/(|x|^2+|y|^2), fp64.
// The exact products of one problem, decoded from the quantized bytes by the formulas of
// quantize.hpp's "Layouts" (fp8_current: one scale_inv per expert; fp8_block plain layouts), and
// per output the sum of |terms| (the reference rounds each dequantized operand to fp32 once, an
// error of at most 2^-23 of each term).
struct Decoded {
  std::vector<double> sum, abs_sum;
};
Decoded hand_decode(const QGemmSpec& s, QGemmDevice& d) {
  const int64_t M = total_rows(s), N = s.N, K = s.K, G = s.G;
  const bool block = s.recipe == QuantRecipe::fp8_block;
  const GroupedTensor &A = d.qa.gt, &B = d.qb.gt;
  const auto a_bytes = quant_bytes(s.pass == GemmPass::wgrad ? A.columnwise_data : A.data);
  const auto b_bytes = quant_bytes(s.pass == GemmPass::forward ? B.data : B.columnwise_data);
  const DType at = (s.pass == GemmPass::wgrad ? A.columnwise_data : A.data).dtype;
  const DType bt = DType::fp8e4m3;
  const TensorView a_sc = s.pass == GemmPass::wgrad && block ? A.columnwise_scale_inv : A.scale_inv;
  const TensorView b_sc =
      s.pass != GemmPass::forward && block ? B.columnwise_scale_inv : B.scale_inv;
  const float* sa = a_sc.ptr<float>();
  const float* sb = b_sc.ptr<float>();
  Decoded out;
  int64_t start = 0, blocks = 0;
  const int64_t n_out =
      s.pass == GemmPass::wgrad ? G * N * K : M * (s.pass == GemmPass::forward ? N : K);
  out.sum.assign(size_t(n_out), 0.0);
  out.abs_sum.assign(size_t(n_out), 0.0);
  for (int64_t g = 0; g < G; ++g) {
    const int64_t m_g = s.splits[size_t(g)];
    for (int64_t i = 0; i < (s.pass == GemmPass::wgrad ? N : m_g); ++i) {
      const int64_t cols = s.pass == GemmPass::forward ? N : K;
      for (int64_t j = 0; j < cols; ++j) {
        double acc = 0, mag = 0;
        const int64_t depth = s.pass == GemmPass::forward ? K : s.pass == GemmPass::dgrad ? N : m_g;
        for (int64_t k = 0; k < depth; ++k) {
          double av, bv, scale;
          if (s.pass == GemmPass::forward) {  // x[start+i][k] * W[g][j][k]
            av = dec_fp8(a_bytes[size_t((start + i) * K + k)], at);
            bv = dec_fp8(b_bytes[size_t((g * N + j) * K + k)], bt);
            scale = block ? double(sa[(start + i) * (K / 128) + k / 128]) *
                                sb[(g * ((N + 127) / 128) + j / 128) * (K / 128) + k / 128]
                          : double(sa[g]) * sb[g];
          } else if (s.pass == GemmPass::dgrad) {  // dy[start+i][k] * W[g][k][j] (W^T copy [K, N])
            av = dec_fp8(a_bytes[size_t((start + i) * N + k)], at);
            bv = dec_fp8(b_bytes[size_t(g * N * K + j * N + k)], bt);
            scale = block ? double(sa[(start + i) * (N / 128) + k / 128]) *
                                sb[(g * (K / 128) + j / 128) * ((N + 127) / 128) + k / 128]
                          : double(sa[g]) * sb[g];
          } else {  // dy^T[i][start+k] * x^T[j][start+k], copies [N, m_g] and [K, m_g]
            const int64_t nb = (m_g + 127) / 128;
            av = dec_fp8(a_bytes[size_t(N * start + i * m_g + k)], at);
            bv = dec_fp8(b_bytes[size_t(K * start + j * m_g + k)], bt);
            scale = block ? double(sa[N * blocks + i * nb + k / 128]) *
                                sb[K * blocks + j * nb + k / 128]
                          : double(sa[g]) * sb[g];
          }
          acc += av * bv * scale;
          mag += std::abs(av * bv * scale);
        }
        const int64_t o = s.pass == GemmPass::wgrad ? (g * N + i) * K + j : (start + i) * cols + j;
        out.sum[size_t(o)] = acc;
        out.abs_sum[size_t(o)] = mag;
      }
    }
    start += m_g;
    blocks += (m_g + 127) / 128;
  }
  return out;
}

QGemmSpec small(GemmPass pass, QuantRecipe r, std::vector<int64_t> splits, int64_t N = 256,
                int64_t K = 256) {
  QGemmSpec s;
  s.pass = pass;
  s.recipe = r;
  s.G = int64_t(splits.size());
  s.splits = std::move(splits);
  s.N = N;
  s.K = K;
  s.out = pass == GemmPass::wgrad ? DType::fp32 : DType::bf16;
  return s;
}

std::vector<float> run_cpu(const QGemmSpec& s, QGemmDevice& d) {
  Context ctx(Device::CPU);
  grouped_gemm(ctx, d.args(s));
  ctx.check();
  return d.result(s);
}

class QuantizedGemmCpu : public ::testing::TestWithParam<std::tuple<GemmPass, QuantRecipe>> {};

TEST_P(QuantizedGemmCpu, MatchesHandDecodedProducts) {
  const auto [pass, recipe] = GetParam();
  // Partial 128-row blocks, an empty expert, and 16-multiple splits (the wgrad rule).
  QGemmSpec s = small(pass, recipe, {144, 0, 32, 96}, 256, 384);
  if (pass != GemmPass::forward)
    s.grad_fp8 = recipe == QuantRecipe::fp8_block ? DType::fp8e4m3 : DType::fp8e5m2;
  Context ctx(Device::CPU);
  QGemmDevice d(ctx, s, make_inputs(s));
  const std::vector<float> got = run_cpu(s, d);
  const Decoded want = hand_decode(s, d);
  for (size_t i = 0; i < want.sum.size(); ++i) {
    // The output rounding (half an ulp: 2^-24 relative for fp32, 2^-8 for bf16 with the
    // fp64 -> fp32 -> bf16 double rounding) plus the operands' fp32 rounding (2^-23 of |terms|).
    const double w = want.sum[i];
    const double tol = std::ldexp(std::abs(w), s.out == DType::fp32 ? -23 : -8) +
                       std::ldexp(want.abs_sum[i], -22) + 1e-30;
    ASSERT_NEAR(got[i], w, tol) << spec_name(s) << " element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Passes, QuantizedGemmCpu,
    ::testing::Combine(::testing::Values(GemmPass::forward, GemmPass::dgrad, GemmPass::wgrad),
                       ::testing::Values(QuantRecipe::fp8_current, QuantRecipe::fp8_block)),
    [](const auto& info) {
      return std::string(gemm_pass_name(std::get<0>(info.param))) + "_" +
             recipe_name(std::get<1>(info.param));
    });

// Quantized GEMM vs the bf16 GEMM of the same inputs: the FP8 error only (DeepGEMM's measure).
TEST(QuantizedGemmCpuAccuracy, CloseToBf16) {
  for (QuantRecipe r : {QuantRecipe::fp8_current, QuantRecipe::fp8_block, QuantRecipe::mxfp8}) {
    for (GemmPass pass : {GemmPass::forward, GemmPass::dgrad, GemmPass::wgrad}) {
      QGemmSpec s = small(pass, r, {128, 48, 0, 80}, 256, 256);
      const QGemmInputs in = make_inputs(s);
      Context ctx(Device::CPU);
      QGemmDevice d(ctx, s, in);
      const std::vector<float> q = run_cpu(s, d);
      // the bf16 reference on the same (bf16) inputs
      std::vector<float> ref(q.size());
      GroupedGemmArgs g;
      g.pass = pass;
      g.a = d.a_in;
      g.b = d.b_in;
      g.splits = d.splits;
      g.out = TensorView(ref.data(), DType::fp32, Device::CPU,
                         pass == GemmPass::wgrad ? std::initializer_list<int64_t>{s.G, s.N, s.K}
                                                 : std::initializer_list<int64_t>{1, 1, 1});
      if (pass != GemmPass::wgrad) {
        // fwd/dgrad write a's dtype: compute into bf16 then widen
        std::vector<uint16_t> o(q.size());
        g.out = TensorView(o.data(), DType::bf16, Device::CPU,
                           {total_rows(s), pass == GemmPass::forward ? s.N : s.K});
        grouped_gemm(ctx, g);
        for (size_t i = 0; i < o.size(); ++i) ref[i] = bf16_bits_to_float(o[i]);
      } else {
        grouped_gemm(ctx, g);
      }
      ctx.check();
      const double diff = calc_diff(q, ref);
      EXPECT_LT(diff, 1e-3) << recipe_name(r) << " " << gemm_pass_name(pass);
      EXPECT_GT(diff, 1e-7) << "no quantization error at all: the FP8 path is not exercised";
    }
  }
}

// wgrad reads [K, m_g] columnwise copies with leading dimension m_g: splits must be multiples of
// 16 for the FP8 kernels; the reference applies the same rule so that both backends agree.
TEST(QuantizedGemmCpuFaults, WgradMisalignedSplitReported) {
  QGemmSpec s = small(GemmPass::wgrad, QuantRecipe::fp8_current, {32, 17, 15, 0});
  Context ctx(Device::CPU);
  QGemmDevice d(ctx, s, make_inputs(s));
  grouped_gemm(ctx, d.args(s));
  EXPECT_THROW_MSG(ctx.check(), "alignment rule");
  const std::vector<float> got = d.result(s);
  const int64_t slab = s.N * s.K;
  for (int64_t i = 0; i < slab; ++i) ASSERT_FALSE(std::isnan(got[size_t(i)])) << "expert 0";
  for (int64_t i = slab; i < 3 * slab; ++i)
    ASSERT_TRUE(std::isnan(got[size_t(i)])) << "misaligned experts must stay unwritten";
  for (int64_t i = 3 * slab; i < 4 * slab; ++i) ASSERT_EQ(got[size_t(i)], 0.0f) << "empty expert";
}

TEST(QuantizedGemmCpuErrors, ClearMessages) {
  QGemmSpec s = small(GemmPass::forward, QuantRecipe::fp8_current, {32, 32});
  Context ctx(Device::CPU);
  QGemmDevice d(ctx, s, make_inputs(s));
  QuantizedGemmArgs a = d.args(s);
  {
    QuantizedGemmArgs b = a;
    b.b.recipe = QuantRecipe::fp8_block;
    EXPECT_THROW_MSG(grouped_gemm(ctx, b), "b.recipe=fp8_block must equal a.recipe=fp8_current");
  }
  {
    QuantizedGemmArgs b = a;
    b.a.recipe = b.b.recipe = QuantRecipe::none;
    EXPECT_THROW_MSG(grouped_gemm(ctx, b), "a.recipe=none must be fp8_current, fp8_block or mxfp8");
  }
  {
    QuantizedGemmArgs b = a;
    b.pass = GemmPass::dgrad;  // W has no columnwise copy
    b.out = TensorView(b.out.data, DType::bf16, Device::CPU, {64, 256});
    EXPECT_THROW_MSG(grouped_gemm(ctx, b), "b (W, columnwise) has no columnwise copy");
  }
  {
    QuantizedGemmArgs b = a;
    b.fast_accum = true;
    b.pass = GemmPass::wgrad;
    EXPECT_THROW_MSG(grouped_gemm(ctx, b), "fast_accum is an option of the fp8_current forward");
  }
  {
    QuantizedGemmArgs b = a;
    b.out = TensorView(b.out.data, DType::fp16, Device::CPU, {64, 256});
    EXPECT_THROW_MSG(grouped_gemm(ctx, b), "out (y).dtype=fp16 must be bf16");
  }
  {
    QuantizedGemmArgs b = a;
    b.b.num_groups = 3;
    EXPECT_THROW_MSG(grouped_gemm(ctx, b), "b (W).num_groups=3 must equal G=2");
  }
  {  // expected_rows: the heuristic's rows, at_most only, within the buffer; the same bits
    QuantizedGemmArgs b = a;
    b.expected_rows = 8;
    EXPECT_THROW_MSG(grouped_gemm(ctx, b),
                     "grouped_gemm: expected_rows=8 must be 0, or with splits_total=at_most in [1, "
                     "M_total=64]");
    b.splits_total = SplitsTotal::at_most;
    b.expected_rows = 65;
    EXPECT_THROW_MSG(grouped_gemm(ctx, b), "grouped_gemm: expected_rows=65 must be 0");
    b.expected_rows = -1;
    EXPECT_THROW_MSG(grouped_gemm(ctx, b), "grouped_gemm: expected_rows=-1 must be 0");
    const std::vector<float> want = run_cpu(s, d);
    b.expected_rows = 48;
    grouped_gemm(ctx, b);
    EXPECT_NO_THROW(ctx.check());
    const std::vector<float> got = d.result(s);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
    EXPECT_NE(b.to_string().find("expected_rows=48"), std::string::npos);
  }
  {  // fp8_block weights must carry 128x128 blocks
    QGemmSpec bs = small(GemmPass::forward, QuantRecipe::fp8_block, {32, 32});
    QGemmDevice bd(ctx, bs, make_inputs(bs));
    QuantizedGemmArgs b = bd.args(bs);
    b.b.block_2d = false;
    EXPECT_THROW_MSG(grouped_gemm(ctx, b), "b (W) must be quantized with 128x128 blocks");
  }
}

}  // namespace
}  // namespace groupmm::test
