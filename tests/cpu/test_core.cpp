// Core types: views, owning tensors, validation helpers, context and status reporting.
#include "common/test_util.hpp"
#include "groupmm/version.hpp"

namespace groupmm::test {
namespace {

TEST(Core, DTypeSizes) {
  EXPECT_EQ(dtype_storage_bytes(DType::fp4e2m1x2, 7), 4);
  EXPECT_EQ(dtype_storage_bytes(DType::bf16, 3), 6);
  EXPECT_EQ(dtype_storage_bytes(DType::e8m0, 5), 5);
  EXPECT_STREQ(dtype_name(DType::fp8e4m3), "fp8e4m3");
}

TEST(Core, TensorViewPrintsAndCounts) {
  TensorView v(nullptr, DType::bf16, Device::CUDA, {4, 8, 2});
  EXPECT_EQ(v.numel(), 64);
  EXPECT_EQ(v.nbytes(), 128);
  EXPECT_EQ(v.to_string(), "bf16[4, 8, 2]@cuda");
  EXPECT_THROW_MSG(TensorView(nullptr, DType::fp32, Device::CPU, {1, 2, 3, 4}),
                   "TensorView: rank=4 must be 1..3");
  EXPECT_THROW_MSG(TensorView(nullptr, DType::fp32, Device::CPU, {-1}),
                   "TensorView: shape[0]=-1 must be >= 0");
}

TEST(Core, HostTensorOwnsMemoryAndCopies) {
  Tensor t = Tensor::empty({3, 5}, DType::fp32, Device::CPU);
  ASSERT_NE(t.data(), nullptr);
  fill_bytes(t, 0xFF);
  EXPECT_TRUE(std::isnan(t.ptr<float>()[14]));
  Tensor u = clone_to(t, Device::CPU);
  EXPECT_EQ(std::memcmp(u.data(), t.data(), 60), 0);
  Tensor moved = std::move(u);
  EXPECT_EQ(u.data(), nullptr);
  EXPECT_NE(moved.data(), nullptr);
}

TEST(Core, CheckViewMessages) {
  std::vector<float> buf(8);
  TensorView v = host_view(buf, DType::fp32, {2, 4});
  EXPECT_THROW_MSG(check_view("grouped_gemm", "x", v, DType::bf16, 2, Device::CPU),
                   "grouped_gemm: x.dtype=fp32 must be bf16");
  EXPECT_THROW_MSG(check_view("grouped_gemm", "x", v, DType::fp32, 3, Device::CPU),
                   "grouped_gemm: x.rank=2 must be 3 (shape [2, 4])");
  EXPECT_THROW_MSG(check_dim("grouped_gemm", "x", v, 1, 4096),
                   "grouped_gemm: x.shape[1]=4 must equal 4096");
  EXPECT_THROW_MSG(check_view("grouped_gemm", "bias", TensorView(), DType::fp32, 2, Device::CPU),
                   "grouped_gemm: bias is required");
  std::vector<int32_t> s(3);
  EXPECT_THROW_MSG(check_splits("grouped_gemm", host_view(s, DType::int32, {3}), 4, Device::CPU),
                   "grouped_gemm: splits.shape[0]=3 must equal the number of groups 4");
}

TEST(Core, StatusReportsFirstFault) {
  Context ctx(Device::CPU);
  report_fault_host(ctx.status(), kFaultSplitsOverflow, OpId::grouped_gemm, 7, 99);
  report_fault_host(ctx.status(), kFaultNegativeSplit, OpId::group_offsets, 1, -1);
  EXPECT_THROW_MSG(ctx.check(), "device fault in grouped_gemm (status 0x5)");
  EXPECT_NO_THROW(ctx.check());
}

TEST(Core, CpuContextWorkspaceGrows) {
  Context ctx(Device::CPU);
  void* a = ctx.workspace(100);
  ASSERT_NE(a, nullptr);
  EXPECT_GE(ctx.workspace_size(), 100u);
  EXPECT_EQ(ctx.workspace(50), a);
  EXPECT_THROW_MSG(ctx.cublas_handle(), "CPU context has no cuBLAS");
}

TEST(Core, NoGpuMeansCpuDefault) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is visible";
  EXPECT_EQ(default_device(), Device::CPU);
  EXPECT_THROW_MSG(Context ctx(Device::CUDA),
                   GROUPMM_WITH_CUDA_KERNELS ? "Context: Device::CUDA requested but no CUDA device"
                                             : "built without its CUDA kernels");
}

}  // namespace
}  // namespace groupmm::test
