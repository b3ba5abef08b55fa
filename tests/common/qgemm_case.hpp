// A grouped GEMM over quantized operands: bf16 inputs, their quantized copies (the ones each pass
// reads) on a device, and the QuantizedGemmArgs over them. Shared by the CPU and GPU suites.
#pragma once

#include <memory>
#include <vector>

#include "common/quant_test_util.hpp"
#include "groupmm/gemm.hpp"

namespace groupmm::test {

struct QGemmSpec {
  GemmPass pass = GemmPass::forward;
  QuantRecipe recipe = QuantRecipe::fp8_current;
  DType grad_fp8 = DType::fp8e4m3;  // dy's FP8 dtype (dgrad, wgrad); x and W are e4m3
  int64_t G = 4, N = 256, K = 256;
  std::vector<int64_t> splits;
  bool bias = false;
  float beta = 0;
  DType out = DType::bf16;  // wgrad: fp32 or bf16
  bool fast_accum = false;
  ScaleLayout mx_layout = ScaleLayout::plain;  // mxfp8: plain or swizzled scales
};

inline int64_t total_rows(const QGemmSpec& s) {
  int64_t m = 0;
  for (auto v : s.splits) m += v;
  return m;
}

inline std::string spec_name(const QGemmSpec& s) {
  std::string n = std::string(gemm_pass_name(s.pass)) + "_" + recipe_name(s.recipe);
  if (s.grad_fp8 == DType::fp8e5m2) n += "_e5m2grad";
  if (s.fast_accum) n += "_fast";
  if (s.mx_layout == ScaleLayout::swizzled) n += "_swz";
  n += "_G" + std::to_string(s.G) + "_M" + std::to_string(total_rows(s)) + "_N" +
       std::to_string(s.N) + "_K" + std::to_string(s.K);
  if (s.bias) n += "_bias";
  if (s.beta != 0) n += "_accum";
  if (s.pass == GemmPass::wgrad) n += std::string("_out") + dtype_name(s.out);
  return n;
}

// The bf16 inputs of one problem (host), in the roles of the pass: forward x [M, K] and W
// [G, N, K]; dgrad dy [M, N] and W; wgrad dy [M, N] and x [M, K].
struct QGemmInputs {
  std::vector<float> a, b, bias;
  std::vector<uint8_t> out_init;  // NaN poison, or random fp32 main grad for beta = 1
};

inline QGemmInputs make_inputs(const QGemmSpec& s) {
  const int64_t M = total_rows(s);
  QGemmInputs in;
  const int64_t a_cols = s.pass == GemmPass::forward ? s.K : s.N;
  in.a = randn(static_cast<size_t>(M * a_cols));
  in.b = s.pass == GemmPass::wgrad ? randn(static_cast<size_t>(M * s.K))
                                   : randn(static_cast<size_t>(s.G * s.N * s.K), 0.05f);
  // bf16 inputs, as a layer would hold them
  for (auto* v : {&in.a, &in.b})
    for (auto& x : *v) x = bf16_bits_to_float(float_to_bf16_bits(x));
  if (s.bias) {
    in.bias = randn(static_cast<size_t>(s.G * s.N));
    for (auto& x : in.bias) x = bf16_bits_to_float(float_to_bf16_bits(x));
  }
  const int64_t out_elems =
      s.pass == GemmPass::wgrad ? s.G * s.N * s.K : M * (s.pass == GemmPass::forward ? s.N : s.K);
  in.out_init.assign(static_cast<size_t>(out_elems) * (s.out == DType::fp32 ? 4 : 2), 0xFF);
  if (s.beta != 0) {
    const auto init = randn(static_cast<size_t>(out_elems));
    std::memcpy(in.out_init.data(), init.data(), in.out_init.size());
  }
  return in;
}

// Quantized operands and output on one device.
struct QGemmDevice {
  Device dev;
  Tensor a_in, b_in, splits, bias, out;
  Quantized qa, qb;

  QGemmDevice(Context& ctx, const QGemmSpec& s, const QGemmInputs& in) : dev(ctx.device()) {
    const int64_t M = total_rows(s);
    const bool wg = s.pass == GemmPass::wgrad, fwd = s.pass == GemmPass::forward;
    a_in = make_input(in.a, DType::bf16, {M, fwd ? s.K : s.N}, dev);
    b_in = wg ? make_input(in.b, DType::bf16, {M, s.K}, dev)
              : make_input(in.b, DType::bf16, {s.G, s.N, s.K}, dev);
    std::vector<int64_t> sp = s.splits;
    splits = clone_to(TensorView(sp.data(), DType::int64, Device::CPU, {s.G}), dev);
    if (s.bias) bias = make_input(in.bias, DType::bf16, {s.G, s.N}, dev);
    const QuantDirection a_dir = wg ? QuantDirection::columnwise : QuantDirection::rowwise;
    const QuantDirection b_dir = fwd ? QuantDirection::rowwise : QuantDirection::columnwise;
    const ScaleLayout layout = s.recipe == QuantRecipe::mxfp8 ? s.mx_layout : ScaleLayout::plain;
    const DType a_fp8 = fwd ? DType::fp8e4m3 : s.grad_fp8;
    qa = run_quantize(ctx, a_in, splits, qcfg(s.recipe, a_dir, layout, a_fp8));
    qb = run_quantize(ctx, b_in, wg ? splits.view() : TensorView(),
                      qcfg(s.recipe, b_dir, layout, DType::fp8e4m3, false,
                           !wg && s.recipe == QuantRecipe::fp8_block));
    std::vector<uint8_t> init = in.out_init;
    out = clone_to(TensorView(init.data(), DType::e8m0, Device::CPU, {int64_t(init.size())}), dev);
  }

  QuantizedGemmArgs args(const QGemmSpec& s) const {
    QuantizedGemmArgs q;
    q.pass = s.pass;
    q.a = qa.gt;
    q.b = qb.gt;
    const int64_t M = total_rows(s);
    q.out = s.pass == GemmPass::wgrad     ? TensorView(out.data(), s.out, dev, {s.G, s.N, s.K})
            : s.pass == GemmPass::forward ? TensorView(out.data(), s.out, dev, {M, s.N})
                                          : TensorView(out.data(), s.out, dev, {M, s.K});
    q.splits = splits;
    if (s.bias) q.bias = bias;
    q.beta = s.beta;
    q.fast_accum = s.fast_accum;
    return q;
  }

  // The output as fp32 values.
  std::vector<float> result(const QGemmSpec& s) const {
    const TensorView o = args(s).out;
    return cpu_floats(TensorView(o.data, o.dtype, dev, {o.numel()}));
  }
};

}  // namespace groupmm::test
