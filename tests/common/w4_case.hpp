// A grouped GEMM over 4-bit weights (W4GemmArgs): bf16 inputs, the weights quantized on a device
// by group_quantize (bit-exact across backends), the output poisoned. Shared by the CPU and GPU
// suites.
#pragma once

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "common/quant_test_util.hpp"
#include "groupmm/gemm.hpp"
#include "groupmm/nn/grouped_linear.hpp"

namespace groupmm::test {

struct W4Spec {
  QuantRecipe recipe = QuantRecipe::nvfp4;
  int64_t G = 4, N = 256, K = 256;
  std::vector<int64_t> splits;
  bool bias = false;
  float alpha = 1.0f;
  ScaleLayout layout = ScaleLayout::plain;
  W4Path path = W4Path::automatic;
  std::string config;     // the fused path's kernel ("" default)
  float w_scale = 0.05f;  // weights ~ N(0, w_scale); wide: spread over many binades
  bool wide = false;
};

inline int64_t w4_rows(const W4Spec& s) {
  int64_t m = 0;
  for (auto v : s.splits) m += v;
  return m;
}

inline std::string w4_name(const W4Spec& s) {
  std::string n = std::string(recipe_name(s.recipe)) + "_" + w4_path_name(s.path);
  n += "_G" + std::to_string(s.G) + "_M" + std::to_string(w4_rows(s)) + "_N" + std::to_string(s.N) +
       "_K" + std::to_string(s.K);
  if (!s.config.empty()) n += "_" + s.config;
  if (s.layout == ScaleLayout::swizzled) n += "_swz";
  if (s.bias) n += "_bias";
  if (s.alpha != 1.0f) n += "_alpha";
  if (s.wide) n += "_wide";
  return n;
}

struct W4Inputs {
  std::vector<float> x, w, bias;  // bf16 values
};

inline W4Inputs make_w4_inputs(const W4Spec& s) {
  W4Inputs in;
  in.x = randn(static_cast<size_t>(w4_rows(s) * s.K));
  in.w = s.wide ? rand_wide(static_cast<size_t>(s.G * s.N * s.K))
                : randn(static_cast<size_t>(s.G * s.N * s.K), s.w_scale);
  if (s.bias) in.bias = randn(static_cast<size_t>(s.G * s.N));
  for (auto* v : {&in.x, &in.w, &in.bias})
    for (auto& x : *v) x = bf16_bits_to_float(float_to_bf16_bits(x));
  return in;
}

// Inputs, quantized weights and output on one device.
struct W4Device {
  Device dev;
  Tensor x, w_in, splits, bias, out;
  Quantized w;

  W4Device(Context& ctx, const W4Spec& s, const W4Inputs& in) : dev(ctx.device()) {
    const int64_t M = w4_rows(s);
    x = make_input(in.x, DType::bf16, {M, s.K}, dev);
    w_in = make_input(in.w, DType::bf16, {s.G, s.N, s.K}, dev);
    std::vector<int64_t> sp = s.splits;
    splits = clone_to(TensorView(sp.data(), DType::int64, Device::CPU, {s.G}), dev);
    if (s.bias) bias = make_input(in.bias, DType::bf16, {s.G, s.N}, dev);
    w = run_quantize(ctx, w_in, TensorView(), qcfg(s.recipe, QuantDirection::rowwise, s.layout));
    out = Tensor::empty({M, s.N}, DType::bf16, dev);
    fill_bytes(out, 0xFF, ctx.stream());  // NaN poison
  }

  W4GemmArgs args(const W4Spec& s) const {
    W4GemmArgs a;
    a.x = x;
    a.w = w.gt;
    a.out = out;
    a.splits = splits;
    if (s.bias) a.bias = bias;
    a.alpha = s.alpha;
    if (dev == Device::CUDA) a.path = s.path;
    if (dev == Device::CUDA) a.config = s.config;
    return a;
  }

  std::vector<float> result() const { return cpu_floats(out); }
};

// The at-most splits mode (W4GemmArgs::splits_total): the GEMM over a buffer of M = S + tail rows
// whose tail is NaN, out poisoned, against exact splits over the S rows on the same device (the
// at-most call expects S rows, so both size their path and kernels by S): the experts' rows equal
// (bit for bit at tol 0, else within tol), out's tail rows untouched, no fault; then a sum one
// past M is reported. S must be > 0.
inline void check_w4_at_most(Device dev, const W4Spec& s, int64_t tail, double tol) {
  const int64_t S = w4_rows(s), M = S + tail;
  const std::string what = w4_name(s) + " tail " + std::to_string(tail);
  const W4Inputs in = make_w4_inputs(s);
  Context ctx(dev);
  W4Device exact(ctx, s, in);
  std::vector<float> xm = in.x;
  xm.resize(size_t(M * s.K), std::numeric_limits<float>::quiet_NaN());
  Tensor x = make_input(xm, DType::bf16, {M, s.K}, dev);
  Tensor out = Tensor::empty({M, s.N}, DType::bf16, dev);
  fill_bytes(out, 0xFF, ctx.stream());
  W4GemmArgs a = exact.args(s);
  a.x = x;
  a.out = out;
  a.splits_total = SplitsTotal::at_most;
  a.expected_rows = S;
  grouped_gemm(ctx, a);
  EXPECT_EQ(ctx.take_status().bits, 0u) << what;
  grouped_gemm(ctx, exact.args(s));
  EXPECT_EQ(ctx.take_status().bits, 0u) << what;
  const std::vector<uint8_t> got = bytes_of(out), want = bytes_of(exact.out);
  const size_t cut = size_t(S * s.N * 2);
  if (tol == 0) {
    EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin())) << what << ": the experts' rows";
  } else {
    std::vector<float> g = cpu_floats(out);
    g.resize(size_t(S * s.N));
    EXPECT_LE(rel_error(g, exact.result()), tol) << what << ": the experts' rows";
  }
  for (size_t i = cut; i < got.size(); ++i)
    ASSERT_EQ(got[i], 0xFF) << what << ": out byte " << i << " past the sum was written";
  // A sum one past M: reported.
  std::vector<int64_t> over = s.splits;
  over.back() += tail + 1;
  copy(exact.splits, TensorView(over.data(), DType::int64, Device::CPU, {s.G}), ctx.stream());
  a.expected_rows = 0;
  grouped_gemm(ctx, a);
  EXPECT_NE(ctx.take_status().bits, 0u) << what << ": a sum past M";
}

// A GroupedLinear with an inference recipe of 4-bit weights.
inline nn::GroupedLinearConfig w4_layer_config(QuantRecipe r, int64_t G, int64_t K, int64_t N,
                                               int64_t max_tokens, bool bias) {
  nn::GroupedLinearConfig c;
  c.experts = G;
  c.in_features = K;
  c.out_features = N;
  c.max_tokens = max_tokens;
  c.bias = bias;
  c.seed = 5;
  c.recipe = r == QuantRecipe::nvfp4 ? nn::nvfp4_weight_recipe() : nn::mxfp4_weight_recipe();
  return c;
}

}  // namespace groupmm::test
