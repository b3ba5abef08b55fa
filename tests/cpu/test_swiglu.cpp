// SwiGLU forward / backward on the CPU backend: float64 formula, the gate/up column layout, a
// finite-difference check of the backward formula, dtypes, validation messages.
#include <cmath>

#include "common/tolerance.hpp"
#include "base/cpu_util.hpp"
#include "groupmm/moe.hpp"

namespace groupmm::test {
namespace {

double silu(double g) {
  return g / (1.0 + std::exp(-g));
}

// Values rounded to dtype, stored in dtype.
struct Buf {
  std::vector<uint8_t> bytes;
  TensorView v;
  Buf(DType t, int64_t rows, int64_t cols)
      : bytes(static_cast<size_t>(dtype_storage_bytes(t, rows * cols)), 0xFF) {
    v = TensorView(bytes.data(), t, Device::CPU, {rows, cols});
  }
  void fill(const std::vector<float>& x) {
    for (size_t i = 0; i < x.size(); ++i) cpu::store_f(v, static_cast<int64_t>(i), x[i]);
  }
  std::vector<float> floats() const { return cpu::to_floats(v); }
};

TEST(SwigluCpu, GateIsFirstHalfUpIsSecond) {
  Context ctx(Device::CPU);
  std::vector<float> gu = {1.0f, -2.0f, 3.0f, 0.5f};  // one row, I = 2: gate {1,-2}, up {3, .5}
  std::vector<float> out(2);
  swiglu_forward(ctx, host_view(gu, DType::fp32, {1, 4}), host_view(out, DType::fp32, {1, 2}));
  EXPECT_NEAR(out[0], silu(1.0) * 3.0, 1e-6);
  EXPECT_NEAR(out[1], silu(-2.0) * 0.5, 1e-6);
}

class SwigluCpuDtype : public ::testing::TestWithParam<DType> {};

TEST_P(SwigluCpuDtype, ForwardAndBackwardMatchFloat64) {
  const DType t = GetParam();
  Context ctx(Device::CPU);
  const int64_t M = 67, I = 48;
  Buf gu(t, M, 2 * I), out(t, M, I), dout(t, M, I), dgu(t, M, 2 * I);
  gu.fill(randn(static_cast<size_t>(M * 2 * I), 2.0f));
  dout.fill(randn(static_cast<size_t>(M * I)));
  swiglu_forward(ctx, gu.v, out.v);
  swiglu_backward(ctx, dout.v, gu.v, dgu.v);
  const auto g = gu.floats(), d = dout.floats();
  std::vector<double> ref_out(static_cast<size_t>(M * I)), ref_dgu(static_cast<size_t>(M * 2 * I));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t i = 0; i < I; ++i) {
      const double a = g[static_cast<size_t>(m * 2 * I + i)],
                   u = g[static_cast<size_t>(m * 2 * I + I + i)];
      const double s = 1.0 / (1.0 + std::exp(-a)), dd = d[static_cast<size_t>(m * I + i)];
      ref_out[static_cast<size_t>(m * I + i)] = silu(a) * u;
      ref_dgu[static_cast<size_t>(m * 2 * I + i)] = dd * u * s * (1 + a * (1 - s));
      ref_dgu[static_cast<size_t>(m * 2 * I + I + i)] = dd * silu(a);
    }
  const Tolerance tol = tolerance(TolOp::swiglu, t, t);
  EXPECT_TRUE(close_to(out.floats(), ref_out, tol, "out"));
  EXPECT_TRUE(close_to(dgu.floats(), ref_dgu, tol, "dgate_up"));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SwigluCpuDtype,
                         ::testing::Values(DType::bf16, DType::fp16, DType::fp32),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// The backward formula is the derivative of the forward one (central differences, fp32 path).
TEST(SwigluCpu, BackwardIsTheGradientOfForward) {
  Context ctx(Device::CPU);
  const int64_t I = 16;
  std::vector<float> gu = randn(static_cast<size_t>(2 * I), 1.5f), dout(I, 1.0f), dgu(2 * I),
                     out(I);
  swiglu_backward(ctx, host_view(dout, DType::fp32, {1, I}), host_view(gu, DType::fp32, {1, 2 * I}),
                  host_view(dgu, DType::fp32, {1, 2 * I}));
  for (int64_t j = 0; j < 2 * I; ++j) {
    const float h = 1e-2f;
    auto f = [&](float delta) {
      std::vector<float> x = gu;
      x[static_cast<size_t>(j)] += delta;
      swiglu_forward(ctx, host_view(x, DType::fp32, {1, 2 * I}),
                     host_view(out, DType::fp32, {1, I}));
      double s = 0;
      for (float o : out) s += o;
      return s;
    };
    const double num = (f(h) - f(-h)) / (2.0 * h);
    EXPECT_NEAR(dgu[static_cast<size_t>(j)], num, 2e-3 * (1.0 + std::fabs(num))) << "column " << j;
  }
}

TEST(SwigluCpu, ValidationNamesOpArgumentAndValue) {
  Context ctx(Device::CPU);
  std::vector<float> a(4 * 6), b(4 * 3), c(4 * 6);
  std::vector<int32_t> ints(4 * 6);
  EXPECT_THROW_MSG(
      swiglu_forward(ctx, host_view(a, DType::fp32, {4, 5}), host_view(b, DType::fp32, {4, 3})),
      "swiglu_forward: gate_up.shape[1]=5 must be even");
  EXPECT_THROW_MSG(
      swiglu_forward(ctx, host_view(a, DType::fp32, {4, 6}), host_view(b, DType::fp32, {4, 2})),
      "swiglu_forward: out.shape[1]=2 must equal 3");
  EXPECT_THROW_MSG(
      swiglu_forward(ctx, host_view(a, DType::fp32, {4, 6}), host_view(b, DType::fp32, {3, 3})),
      "swiglu_forward: out.shape[0]=3 must equal 4");
  EXPECT_THROW_MSG(
      swiglu_forward(ctx, host_view(ints, DType::int32, {4, 6}), host_view(b, DType::fp32, {4, 3})),
      "swiglu_forward: gate_up.dtype=int32 must be bf16, fp16 or fp32");
  EXPECT_THROW_MSG(
      swiglu_forward(ctx, host_view(a, DType::fp32, {4, 6}), host_view(b, DType::bf16, {4, 3})),
      "swiglu_forward: out.dtype=bf16 must be fp32");
  EXPECT_THROW_MSG(
      swiglu_forward(ctx, host_view(a, DType::fp32, {4, 6}), host_view(a, DType::fp32, {4, 3})),
      "swiglu_forward: out may not alias gate_up");
  EXPECT_THROW_MSG(
      swiglu_backward(ctx, host_view(b, DType::fp32, {4, 3}), host_view(a, DType::fp32, {4, 6}),
                      host_view(c, DType::fp32, {4, 5})),
      "swiglu_backward: dgate_up.shape[1]=5 must equal 6");
  EXPECT_THROW_MSG(
      swiglu_backward(ctx, host_view(b, DType::fp32, {4, 3}), host_view(a, DType::fp32, {4, 6}),
                      host_view(a, DType::fp32, {4, 6})),
      "swiglu_backward: dgate_up may not alias gate_up or dout");
  TensorView on_gpu = host_view(b, DType::fp32, {4, 3});
  on_gpu.device = Device::CUDA;
  EXPECT_THROW_MSG(swiglu_backward(ctx, on_gpu, host_view(a, DType::fp32, {4, 6}),
                                   host_view(c, DType::fp32, {4, 6})),
                   "swiglu_backward: dout is on cuda but the context is cpu");
}

}  // namespace
}  // namespace groupmm::test
