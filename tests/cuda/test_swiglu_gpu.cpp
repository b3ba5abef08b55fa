// SwiGLU on the GPU: equals the CPU reference within one ulp of the output format (expf may differ
// by an ulp between host and device), on the vectorized and scalar paths, every output written;
// captured in a CUDA graph it replays to the same bits.
#include <cmath>

#include "common/test_util.hpp"
#include "base/cpu_util.hpp"
#include "groupmm/moe.hpp"

namespace groupmm::test {
namespace {

std::vector<float> device_floats(const TensorView& v) {
  std::vector<uint8_t> h(static_cast<size_t>(v.nbytes()));
  copy(TensorView(h.data(), DType::e8m0, Device::CPU, {v.nbytes()}), v);
  return cpu::to_floats(TensorView(h.data(), v.dtype, Device::CPU, {v.numel()}));
}

// Within one ulp of dtype for bf16/fp16 (relative 2^-7, 2^-10); fp32 within 2^-20 (device expf
// and the fused multiply-adds differ from the host by a few fp32 ulps), or tiny absolute.
void expect_close(const std::vector<float>& got, const std::vector<float>& ref, DType t,
                  const char* what) {
  const double rel = t == DType::bf16 ? 1.0 / 128 : (t == DType::fp16 ? 1.0 / 1024 : 1.0 / 1048576);
  size_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i]) || std::fabs(got[i] - ref[i]) > rel * std::fabs(ref[i]) + 1e-6) {
      if (++bad <= 5)
        ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", reference " << ref[i];
    }
  }
  EXPECT_EQ(bad, 0u) << what;
}

struct Case {
  int64_t M, I;
  DType t;
};

std::string case_name(const Case& c) {
  return detail::cat("M", c.M, "_I", c.I, "_", dtype_name(c.t));
}
void PrintTo(const Case& c, std::ostream* os) {
  *os << case_name(c);
}

class SwigluGpu : public ::testing::TestWithParam<Case> {};

TEST_P(SwigluGpu, MatchesCpuReference) {
  GROUPMM_REQUIRE_GPU();
  const Case c = GetParam();
  Context cctx(Device::CPU), gctx(Device::CUDA);
  auto make = [&](int64_t rows, int64_t cols, float scale) {
    std::vector<uint8_t> b(static_cast<size_t>(dtype_storage_bytes(c.t, rows * cols)));
    TensorView v(b.data(), c.t, Device::CPU, {rows, cols});
    const auto r = randn(static_cast<size_t>(rows * cols), scale);
    for (int64_t i = 0; i < rows * cols; ++i) cpu::store_f(v, i, r[static_cast<size_t>(i)]);
    return b;
  };
  auto hgu = make(c.M, 2 * c.I, 3.0f), hd = make(c.M, c.I, 1.0f);
  std::vector<uint8_t> hout(static_cast<size_t>(dtype_storage_bytes(c.t, c.M * c.I)));
  std::vector<uint8_t> hdgu(static_cast<size_t>(dtype_storage_bytes(c.t, c.M * 2 * c.I)));
  const TensorView gu(hgu.data(), c.t, Device::CPU, {c.M, 2 * c.I}),
      d(hd.data(), c.t, Device::CPU, {c.M, c.I});
  const TensorView out(hout.data(), c.t, Device::CPU, {c.M, c.I}),
      dgu(hdgu.data(), c.t, Device::CPU, {c.M, 2 * c.I});
  swiglu_forward(cctx, gu, out);
  swiglu_backward(cctx, d, gu, dgu);

  Tensor ggu = clone_to(gu, Device::CUDA), gd = clone_to(d, Device::CUDA);
  Tensor gout = Tensor::empty({c.M, c.I}, c.t, Device::CUDA),
         gdgu = Tensor::empty({c.M, 2 * c.I}, c.t, Device::CUDA);
  fill_bytes(gout, 0xFF);
  fill_bytes(gdgu, 0xFF);
  swiglu_forward(gctx, ggu, gout);
  swiglu_backward(gctx, gd, ggu, gdgu);
  EXPECT_NO_THROW(gctx.check());
  expect_close(device_floats(gout), cpu::to_floats(out), c.t, "out");
  expect_close(device_floats(gdgu), cpu::to_floats(dgu), c.t, "dgate_up");
}

INSTANTIATE_TEST_SUITE_P(Shapes, SwigluGpu,
                         ::testing::Values(Case{32768, 768, DType::bf16},
                                           Case{4096, 1536, DType::fp16},
                                           Case{1000, 512, DType::fp32}, Case{333, 33, DType::bf16},
                                           Case{17, 100, DType::fp16}, Case{1, 8, DType::bf16},
                                           Case{0, 64, DType::bf16}),
                         [](const auto& info) { return case_name(info.param); });

TEST(SwigluGpuGraph, CapturedEqualsEager) {
  GROUPMM_REQUIRE_GPU();
  const int64_t M = 2048, I = 768;
  cudaStream_t stream;
  GROUPMM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    Context ctx(Device::CUDA, stream);
    std::vector<uint16_t> h(static_cast<size_t>(M * 2 * I));
    const auto r = randn(h.size(), 2.0f);
    for (size_t i = 0; i < h.size(); ++i) h[i] = float_to_bf16_bits(r[i]);
    Tensor gu = clone_to(host_view(h, DType::bf16, {M, 2 * I}), Device::CUDA, stream);
    Tensor d = clone_to(host_view(h, DType::bf16, {M, I}), Device::CUDA, stream);
    Tensor o1 = Tensor::empty({M, I}, DType::bf16, Device::CUDA, stream),
           o2 = Tensor::empty({M, I}, DType::bf16, Device::CUDA, stream);
    Tensor g1 = Tensor::empty({M, 2 * I}, DType::bf16, Device::CUDA, stream),
           g2 = Tensor::empty({M, 2 * I}, DType::bf16, Device::CUDA, stream);
    GROUPMM_CHECK_CUDA(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    GROUPMM_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    swiglu_forward(ctx, gu, o1);
    swiglu_backward(ctx, d, gu, g1);
    GROUPMM_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    GROUPMM_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    GROUPMM_CHECK_CUDA(cudaGraphLaunch(exec, stream));
    swiglu_forward(ctx, gu, o2);
    swiglu_backward(ctx, d, gu, g2);
    GROUPMM_CHECK_CUDA(cudaStreamSynchronize(stream));
    EXPECT_EQ(device_floats(o1), device_floats(o2));
    EXPECT_EQ(device_floats(g1), device_floats(g2));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace groupmm::test
