// Context on the GPU: a stream capturing a CUDA graph is refused with a clear error before any
// call that would invalidate the capture (the capture then ends cleanly), and the same stream
// gets its Context as usual once the capture is over. Device Tensors' memory pool.
#include "common/test_util.hpp"

namespace groupmm::test {
namespace {

TEST(ContextGpu, RefusesAStreamThatIsCapturing) {
  GROUPMM_REQUIRE_GPU();
  cudaStream_t stream;
  GROUPMM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  EXPECT_FALSE(stream_capturing(stream));
  GROUPMM_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  EXPECT_TRUE(stream_capturing(stream));
  EXPECT_THROW_MSG(Context(Device::CUDA, stream), "is capturing a CUDA graph");
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess) << "the capture was invalidated";
  if (graph != nullptr) cudaGraphDestroy(graph);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_FALSE(stream_capturing(stream));
  {
    Context ctx(Device::CUDA, stream);
    ctx.check();
  }
  cudaStreamDestroy(stream);
}

// Device Tensors come from groupmm's pool, which keeps freed memory across a synchronization (the
// device's default pool gives it back to the driver there) until release_cached_device_memory().
TEST(ContextGpu, FreedTensorsStayPooledAcrossASynchronizeUntilReleased) {
  GROUPMM_REQUIRE_GPU();
  cudaStream_t stream;
  GROUPMM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const auto free_bytes = [] {
    size_t free_b = 0, total_b = 0;
    GROUPMM_CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
    return int64_t(free_b);
  };
  // The driver's free count, not the pool's own counters: what the test is about is memory the
  // driver got back. Earlier tests may leave live Tensors in the pool's chunks, whose free parts
  // release cannot return, so a GiB may be partly served from those: the checks compare the
  // free count while the GiB is alive with the counts after it is freed, not with one GiB.
  constexpr int64_t kBytes = int64_t(1) << 30, kSlack = kBytes / 16;
  GROUPMM_CHECK_CUDA(cudaStreamSynchronize(stream));
  release_cached_device_memory();
  const int64_t before = free_bytes();
  int64_t mapped = 0, alive = 0;
  {
    Tensor t = Tensor::empty({kBytes / 4}, DType::int32, Device::CUDA, stream);
    alive = free_bytes();
    mapped = before - alive;  // what the GiB took from the driver
  }                           // freed
  ASSERT_GE(mapped, kBytes / 2) << "the GiB came from memory the pool kept: nothing to test";
  GROUPMM_CHECK_CUDA(cudaStreamSynchronize(stream));
  const int64_t pooled = free_bytes();
  EXPECT_LE(pooled - alive, kSlack) << "the freed GiB went back to the driver at the synchronize";
  {
    Tensor again = Tensor::empty({kBytes / 4}, DType::int32, Device::CUDA, stream);
    EXPECT_LE(pooled - free_bytes(), kSlack) << "the pooled GiB was not reused";
  }
  GROUPMM_CHECK_CUDA(cudaStreamSynchronize(stream));
  release_cached_device_memory();
  EXPECT_GE(free_bytes() - pooled, mapped - kSlack)
      << "release_cached_device_memory() kept the GiB";
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace groupmm::test
