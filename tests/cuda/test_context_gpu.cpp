// Context on the GPU: a stream capturing a CUDA graph is refused with a clear error before any
// call that would invalidate the capture (the capture then ends cleanly), and the same stream
// gets its Context as usual once the capture is over.
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

}  // namespace
}  // namespace groupmm::test
