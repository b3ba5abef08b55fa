// The 4-bit weight GEMM (W4GemmArgs) on the CPU backend: the reference against a direct fp64
// computation from the quantized bytes, its argument checks (messages name op, argument, value),
// and the GroupedLinear inference recipes nvfp4_weight / mxfp4_weight.
#include <cmath>

#include "common/w4_case.hpp"
#include "numerics/quantize_layout.hpp"

namespace groupmm::test {
namespace {

// y from the quantized bytes by the format rule, summed in fp64.
std::vector<float> direct(const W4Spec& s, const W4Inputs& in, const Quantized& w) {
  const int64_t M = w4_rows(s), N = s.N, K = s.K;
  const auto data = quant_bytes(w.buf.data), sc = quant_bytes(w.buf.scale_inv);
  const bool nv = s.recipe == QuantRecipe::nvfp4;
  const int64_t blk = nv ? 16 : 32;
  std::vector<float> y(size_t(M * N), NAN);
  int64_t row = 0;
  for (int64_t g = 0; g < s.G; ++g) {
    for (int64_t m = 0; m < s.splits[size_t(g)]; ++m, ++row)
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) {
          const int64_t e = (g * N + n) * K + k;
          const uint8_t c =
              (e & 1) ? uint8_t(data[size_t(e / 2)] >> 4) : uint8_t(data[size_t(e / 2)] & 15);
          const uint8_t sb = sc[size_t((g * N + n) * (K / blk) + k / blk)];
          const double wv =
              nv ? double(e2m1_to_float(c)) * e4m3_to_float(sb) / w.buf.global_scale.ptr<float>()[g]
                 : double(e2m1_to_float(c)) * std::ldexp(1.0, int(sb) - 127);
          acc += double(in.x[size_t(row * K + k)]) * wv;
        }
        float v = float(double(s.alpha) * acc);
        if (s.bias) v += in.bias[size_t(g * N + n)];
        y[size_t(row * N + n)] = bf16_bits_to_float(float_to_bf16_bits(v));
      }
  }
  return y;
}

// Four experts (one without rows), N and K off every tile, a bias.
W4Spec small_spec(QuantRecipe r) {
  W4Spec s;
  s.recipe = r;
  s.G = 4;
  s.N = 40;
  s.K = 96;
  s.splits = {3, 0, 5, 1};
  s.bias = true;
  return s;
}

TEST(W4GemmCpu, ReferenceMatchesTheFormatRule) {
  for (QuantRecipe r : {QuantRecipe::nvfp4, QuantRecipe::mxfp4}) {
    W4Spec s = small_spec(r);
    s.alpha = 0.75f;
    const W4Inputs in = make_w4_inputs(s);
    Context ctx(Device::CPU);
    W4Device d(ctx, s, in);
    grouped_gemm(ctx, d.args(s));
    ctx.check();
    const std::vector<float> got = d.result(), want = direct(s, in, d.w);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-2 * std::abs(want[i]) + 1e-6)
          << recipe_name(r) << " element " << i;
    EXPECT_EQ(gemm_config_name(ctx, d.args(s)), "reference");
  }
}

TEST(W4GemmCpu, RowsPastTheSplitsStayUnwritten) {
  W4Spec s;
  s.recipe = QuantRecipe::mxfp4;
  s.G = 2;
  s.N = 8;
  s.K = 32;
  s.splits = {2, 1};
  const W4Inputs in = make_w4_inputs(s);
  Context ctx(Device::CPU);
  W4Device d(ctx, s, in);
  std::vector<int64_t> fewer = {1, 1};  // sums to 2 of the 3 rows: a fault, row 2 untouched
  copy(d.splits, TensorView(fewer.data(), DType::int64, Device::CPU, {2}));
  grouped_gemm(ctx, d.args(s));
  EXPECT_THROW_MSG(ctx.check(), "grouped_gemm");
  const auto y = d.result();
  for (int64_t n = 0; n < s.N; ++n) EXPECT_TRUE(std::isnan(y[size_t(2 * s.N + n)]));
}

TEST(W4GemmCpu, AtMostSplitsComputeTheExpertsRowsOnly) {
  for (QuantRecipe r : {QuantRecipe::nvfp4, QuantRecipe::mxfp4})
    for (int64_t tail : {int64_t(0), int64_t(7)})
      check_w4_at_most(Device::CPU, small_spec(r), tail, 0.0);
}

TEST(W4GemmCpu, ErrorsNameOpArgumentAndValue) {
  W4Spec s;
  s.G = 2;
  s.N = 64;
  s.K = 64;
  s.splits = {3, 5};
  Context ctx(Device::CPU);
  const W4Inputs in = make_w4_inputs(s);
  W4Device d(ctx, s, in);
  const W4GemmArgs ok = d.args(s);
  EXPECT_NO_THROW(grouped_gemm(ctx, ok));

  W4GemmArgs a = ok;
  Tensor x16 = Tensor::empty({8, 64}, DType::fp16, Device::CPU);
  a.x = x16;
  EXPECT_THROW_MSG(grouped_gemm(ctx, a), "grouped_gemm: x.dtype=fp16 must be bf16");
  a = ok;
  a.w.recipe = QuantRecipe::mxfp8;
  EXPECT_THROW_MSG(grouped_gemm(ctx, a), "grouped_gemm: w.recipe=mxfp8 must be nvfp4 or mxfp4");
  a = ok;
  a.w.global_scale = TensorView();
  EXPECT_THROW_MSG(grouped_gemm(ctx, a), "grouped_gemm: w.global_scale is required");
  a = ok;
  a.w.global_scale.data = static_cast<char*>(a.w.global_scale.data) + 2;
  EXPECT_THROW_MSG(grouped_gemm(ctx, a), "grouped_gemm: w.global_scale.data=");
  EXPECT_THROW_MSG(grouped_gemm(ctx, a), "must be aligned to its 4-byte elements");
  a = ok;
  a.w.block_2d = true;
  EXPECT_THROW_MSG(grouped_gemm(ctx, a), "grouped_gemm: w must be quantized in 1x16 blocks");
  a = ok;
  Tensor x48 = Tensor::empty({8, 48}, DType::bf16, Device::CPU);
  a.x = x48;
  EXPECT_THROW_MSG(grouped_gemm(ctx, a),
                   "grouped_gemm: K=x.shape[1]=48 must be a positive multiple of 32");
  a = ok;
  Tensor y60 = Tensor::empty({8, 60}, DType::bf16, Device::CPU);
  a.out = y60;
  EXPECT_THROW_MSG(grouped_gemm(ctx, a),
                   "grouped_gemm: N=out.shape[1]=60 must be a positive multiple of 8");
  a = ok;
  Tensor y128 = Tensor::empty({8, 128}, DType::bf16, Device::CPU);
  a.out = y128;
  EXPECT_THROW_MSG(grouped_gemm(ctx, a), "grouped_gemm: w.data.numel=8192");
  a = ok;
  a.engine = GemmEngine::cublas_loop;
  EXPECT_THROW_MSG(grouped_gemm(ctx, a), "grouped_gemm: engine cublas_loop does not run 4-bit");
  a = ok;
  std::vector<int32_t> s3 = {1, 2, 5};
  a.splits = host_view(s3, DType::int32, {3});
  EXPECT_THROW_MSG(grouped_gemm(ctx, a), "grouped_gemm: splits.shape[0]=3 must equal");
  a = ok;
  a.w.splits = d.splits;
  EXPECT_THROW_MSG(grouped_gemm(ctx, a), "grouped_gemm: w must be weights");
  a = ok;
  a.path = static_cast<W4Path>(7);
  EXPECT_THROW_MSG(grouped_gemm(ctx, a),
                   "grouped_gemm: path=7 must be automatic, decode, prefill or fused");
  // A forced path is checked on every context (the CPU ignores it otherwise): the fused kernel's
  // tile tables hold kW4FusedMaxGroups experts.
  W4Spec many = s;
  many.G = kW4FusedMaxGroups + 1;
  many.splits.assign(size_t(many.G), 0);
  W4Device dm(ctx, many, make_w4_inputs(many));
  a = dm.args(many);
  a.path = W4Path::fused;
  EXPECT_THROW_MSG(grouped_gemm(ctx, a),
                   "grouped_gemm: path fused runs at most 1024 experts, w.num_groups=1025");
  a.path = W4Path::prefill;
  EXPECT_NO_THROW(grouped_gemm(ctx, a));
  // A kernel name only with its path (fused: a kernel, decode: tokens a pass), and only a known
  // one.
  a = ok;
  a.config = "rs_256x128";
  EXPECT_THROW_MSG(grouped_gemm(ctx, a),
                   "grouped_gemm: config='rs_256x128' must be empty, or "
                   "with path fused 'rs_sw_256x128', 'rs_256x128' or 'coop_128x256', or with "
                   "path decode 'pass8', 'pass16' or 'pass32'");
  a.path = W4Path::fused;
  EXPECT_NO_THROW(grouped_gemm(ctx, a));
  a.config = "rs_sw_256x128";
  EXPECT_NO_THROW(grouped_gemm(ctx, a));
  a.config = "pass16";  // a decode pass on the fused path
  EXPECT_THROW_MSG(grouped_gemm(ctx, a), "grouped_gemm: config='pass16' must be empty");
  a.path = W4Path::decode;
  for (const char* c : {"pass8", "pass16", "pass32"}) {
    a.config = c;
    EXPECT_NO_THROW(grouped_gemm(ctx, a)) << c;
  }
  for (const char* c : {"pass4", "pass64", "rs_sw_256x128"}) {
    a.config = c;
    EXPECT_THROW_MSG(grouped_gemm(ctx, a),
                     std::string("grouped_gemm: config='") + c + "' must be empty");
  }
  a.config = "fast";
  EXPECT_THROW_MSG(grouped_gemm(ctx, a), "grouped_gemm: config='fast' must be empty");
  // expected_rows only with at-most splits, within the rows; the coop kernel takes exact splits
  a = ok;
  a.expected_rows = 4;
  EXPECT_THROW_MSG(grouped_gemm(ctx, a),
                   "grouped_gemm: expected_rows=4 must be 0, or with splits_total=at_most in [1, "
                   "M_total=8]");
  a.splits_total = SplitsTotal::at_most;
  EXPECT_NO_THROW(grouped_gemm(ctx, a));
  a.expected_rows = 9;
  EXPECT_THROW_MSG(grouped_gemm(ctx, a), "grouped_gemm: expected_rows=9 must be 0");
  a.expected_rows = 0;
  a.path = W4Path::fused;
  a.config = "coop_128x256";
  EXPECT_THROW_MSG(grouped_gemm(ctx, a),
                   "grouped_gemm: config='coop_128x256' takes exact splits (splits_total=at_most "
                   "runs on the default fused kernel)");
  a.config = "";
  EXPECT_NO_THROW(grouped_gemm(ctx, a));
  a.splits_total = static_cast<SplitsTotal>(5);
  EXPECT_THROW_MSG(grouped_gemm(ctx, a), "grouped_gemm: splits_total=5 must be exact or at_most");
}

// ---- GroupedLinear inference recipes ------------------------------------------------------------

nn::GroupedLinearConfig w4_layer(QuantRecipe r, bool bias) {
  return w4_layer_config(r, 3, 64, 40, 32, bias);
}

TEST(W4GroupedLinearCpu, ForwardIsTheW4GemmOfTheQuantizedWeights) {
  for (QuantRecipe r : {QuantRecipe::nvfp4, QuantRecipe::mxfp4}) {
    Context ctx(Device::CPU);
    const nn::GroupedLinearConfig c = w4_layer(r, true);
    nn::GroupedLinear layer(ctx, c);
    EXPECT_EQ(layer.recipe().name(), r == QuantRecipe::nvfp4 ? "nvfp4_weight" : "mxfp4_weight");
    std::vector<int64_t> sp = {4, 0, 7};
    Tensor splits = clone_to(TensorView(sp.data(), DType::int64, Device::CPU, {3}), Device::CPU);
    Tensor x = make_input(randn(11 * 64), DType::bf16, {11, 64}, Device::CPU);
    auto reference = [&]() {
      Quantized w =
          run_quantize(ctx, layer.weight(), TensorView(), qcfg(r, QuantDirection::rowwise));
      Tensor y = Tensor::empty({11, 40}, DType::bf16, Device::CPU);
      W4GemmArgs a;
      a.x = x;
      a.w = w.gt;
      a.out = y;
      a.splits = splits;
      a.bias = layer.bias();
      grouped_gemm(ctx, a);
      return cpu_floats(y);
    };
    EXPECT_EQ(cpu_floats(layer.forward(ctx, x, splits)), reference());
    // New weights: the cached quantization is dropped and redone.
    std::vector<std::vector<float>> wv(3);
    std::vector<Tensor> wt;
    std::vector<TensorView> views;
    for (int g = 0; g < 3; ++g) {
      wt.push_back(make_input(randn(40 * 64, 0.1f), DType::bf16, {40, 64}, Device::CPU));
      views.push_back(wt.back());
    }
    layer.import_weights(ctx, views);
    EXPECT_EQ(cpu_floats(layer.forward(ctx, x, splits)), reference()) << "after import_weights";
  }
}

// splits_total = at_most (and expected_rows): y's rows equal an exact layer's with the same weights
// over the experts' rows; rows past the sum untouched, the input tail (NaN) never read.
TEST(W4GroupedLinearCpu, AtMostRunsTheExpertsRowsOnly) {
  for (QuantRecipe r : {QuantRecipe::nvfp4, QuantRecipe::mxfp4}) {
    Context ctx(Device::CPU);
    nn::GroupedLinearConfig c = w4_layer(r, true);
    nn::GroupedLinear exact(ctx, c);
    c.splits_total = SplitsTotal::at_most;
    c.expected_rows = 12;
    nn::GroupedLinear short_sum(ctx, c);
    std::vector<int64_t> sp = {4, 0, 7};
    Tensor splits = clone_to(TensorView(sp.data(), DType::int64, Device::CPU, {3}), Device::CPU);
    std::vector<float> xv = randn(11 * 64);
    xv.resize(16 * 64, std::numeric_limits<float>::quiet_NaN());
    Tensor x = make_input(xv, DType::bf16, {16, 64}, Device::CPU);
    fill_bytes(short_sum.forward(ctx, x, splits), 0xFF);  // the layer's own y, poisoned
    const std::vector<uint8_t> y = bytes_of(short_sum.forward(ctx, x, splits));
    EXPECT_EQ(ctx.take_status().bits, 0u);
    const std::vector<uint8_t> want = bytes_of(
        exact.forward(ctx, TensorView(x.data(), DType::bf16, Device::CPU, {11, 64}), splits));
    EXPECT_TRUE(std::equal(want.begin(), want.end(), y.begin())) << recipe_name(r);
    for (size_t i = want.size(); i < y.size(); ++i)
      ASSERT_EQ(y[i], 0xFF) << recipe_name(r) << ": y byte " << i << " past the sum";
  }
}

TEST(W4GroupedLinearCpu, BackwardRefusesNamingTheRecipe) {
  for (QuantRecipe r : {QuantRecipe::nvfp4, QuantRecipe::mxfp4}) {
    Context ctx(Device::CPU);
    nn::GroupedLinear layer(ctx, w4_layer(r, false));
    std::vector<int64_t> sp = {2, 2, 2};
    Tensor splits = clone_to(TensorView(sp.data(), DType::int64, Device::CPU, {3}), Device::CPU);
    Tensor x = make_input(randn(6 * 64), DType::bf16, {6, 64}, Device::CPU);
    Tensor dy = make_input(randn(6 * 40), DType::bf16, {6, 40}, Device::CPU);
    layer.forward(ctx, x, splits);
    EXPECT_THROW_MSG(layer.backward(ctx, dy),
                     std::string(r == QuantRecipe::nvfp4 ? "nvfp4_weight" : "mxfp4_weight") +
                         ": backward is not supported");
  }
}

TEST(W4GroupedLinearCpu, ConfigErrors) {
  Context ctx(Device::CPU);
  nn::GroupedLinearConfig c = w4_layer(QuantRecipe::mxfp4, false);
  c.in_features = 48;
  EXPECT_THROW_MSG(nn::GroupedLinear(ctx, c),
                   "mxfp4_weight: in_features=48 must be a multiple of 32");
  c = w4_layer(QuantRecipe::nvfp4, false);
  c.dtype = DType::fp16;
  EXPECT_THROW_MSG(nn::GroupedLinear(ctx, c), "nvfp4_weight: dtype=fp16 must be bf16");
}

}  // namespace
}  // namespace groupmm::test
