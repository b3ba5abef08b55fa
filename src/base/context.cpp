// Context: stream, workspace, cuBLAS handle, device status block.
#include <cublas_v2.h>

#include <cstdlib>
#include <cstring>

#include "base/cuda_entry.hpp"
#include "groupmm/core.hpp"

namespace groupmm {

static int usable_cuda_device() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return -1;
  }
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return -1;
  return dev;
}

bool cuda_available() {
  if (!cuda_kernels_built()) return false;
  const int dev = usable_cuda_device();
  if (dev < 0) return false;
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  return major == 9;  // the kernels are built for sm_90a only
}

Device default_device() {
  return cuda_available() ? Device::CUDA : Device::CPU;
}

bool stream_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: a later launch check must not see it
    return false;
  }
  return capture != cudaStreamCaptureStatusNone;
}

Context::Context(Device device, cudaStream_t stream) : device_(device), stream_(stream) {
  if (device_ == Device::CPU) {
    status_ = static_cast<StatusBlock*>(std::calloc(1, sizeof(StatusBlock)));
    return;
  }
  GROUPMM_CHECK(cuda_kernels_built(),
                "Context: Device::CUDA requested but this groupmm library was built without its "
                "CUDA kernels (GROUPMM_CUDA_KERNELS=OFF); rebuild with the default options");
  device_index_ = usable_cuda_device();
  GROUPMM_CHECK(device_index_ >= 0,
                "Context: Device::CUDA requested but no CUDA device is visible");
  // Before any call that capture forbids (cudaMalloc below), which would also invalidate it; as
  // workspace() refuses to grow during capture.
  GROUPMM_CHECK(!stream_capturing(stream_), "Context: stream ", static_cast<void*>(stream_),
                " is capturing a CUDA graph; a Context allocates device memory (its status block), "
                "which capture forbids: create the stream's Context (run one op on it) before "
                "capturing");
  int major = 0, minor = 0;
  GROUPMM_CHECK_CUDA(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_index_));
  GROUPMM_CHECK_CUDA(
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_index_));
  cc_ = major * 10 + minor;
  GROUPMM_CHECK(major == 9,
                "Context: groupmm's CUDA kernels are built for sm_90a (Hopper); device ",
                device_index_, " is sm_", cc_, ". Use Device::CPU on this machine.");
  GROUPMM_CHECK_CUDA(
      cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device_index_));
  GROUPMM_CHECK_CUDA(cudaDeviceGetAttribute(
      &smem_per_sm_, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device_index_));
  int l2 = 0;
  GROUPMM_CHECK_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device_index_));
  l2_bytes_ = l2;
  GROUPMM_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&status_), sizeof(StatusBlock)));
  GROUPMM_CHECK_CUDA(cudaMemsetAsync(status_, 0, sizeof(StatusBlock), stream_));
}

Context::~Context() {
  if (device_ == Device::CPU) {
    std::free(status_);
    std::free(ws_);
    return;
  }
  cudaStreamSynchronize(stream_);
  if (cublas_) cublasDestroy(static_cast<cublasHandle_t>(cublas_));
  if (ws_) cudaFree(ws_);
  if (status_) cudaFree(status_);
}

void Context::set_gemm_sm_limit(int sms) {
  GROUPMM_CHECK(sms >= 0, "Context::set_gemm_sm_limit: sms=", sms, " must be >= 0 (0: no limit)");
  gemm_sm_limit_ = sms;
}

bool Context::capturing() const {
  return device_ == Device::CUDA && stream_capturing(stream_);
}

void Context::synchronize() {
  if (device_ == Device::CUDA) GROUPMM_CHECK_CUDA(cudaStreamSynchronize(stream_));
}

bool Context::first_use(const void* kernel) {
  for (const void* k : used_kernels_)
    if (k == kernel) return false;
  used_kernels_.push_back(kernel);
  return true;
}

void* Context::workspace(size_t bytes) {
  if (bytes <= ws_bytes_) return ws_;
  GROUPMM_CHECK(!capturing(), "Context::workspace: ", bytes, " bytes needed but only ", ws_bytes_,
                " reserved, and the stream is capturing a CUDA graph (allocation is not graph "
                "safe). Call reserve_workspace() or pass a workspace before capture.");
  const size_t grown = (bytes + 4095) / 4096 * 4096;
  if (device_ == Device::CUDA) {
    GROUPMM_CHECK_CUDA(cudaStreamSynchronize(stream_));  // old buffer may still be in use
    if (ws_) GROUPMM_CHECK_CUDA(cudaFree(ws_));
    ws_ = nullptr;
    GROUPMM_CHECK_CUDA(cudaMalloc(&ws_, grown));
  } else {
    std::free(ws_);
    ws_ = std::aligned_alloc(256, grown);
    GROUPMM_CHECK(ws_ != nullptr, "Context::workspace: host allocation failed");
  }
  ws_bytes_ = grown;
  return ws_;
}

void* Context::cublas_handle() {
  GROUPMM_CHECK(device_ == Device::CUDA, "Context::cublas_handle: CPU context has no cuBLAS");
  if (!cublas_) {
    cublasHandle_t h = nullptr;
    GROUPMM_CHECK_CUBLAS(cublasCreate(&h));
    cublas_ = h;
  }
  GROUPMM_CHECK_CUBLAS(cublasSetStream(static_cast<cublasHandle_t>(cublas_), stream_));
  return cublas_;
}

StatusBlock Context::take_status() {
  StatusBlock s{};
  if (device_ == Device::CPU) {
    s = *status_;
    std::memset(status_, 0, sizeof(StatusBlock));
    return s;
  }
  GROUPMM_CHECK_CUDA(cudaMemcpyAsync(&s, status_, sizeof(s), cudaMemcpyDeviceToHost, stream_));
  GROUPMM_CHECK_CUDA(cudaMemsetAsync(status_, 0, sizeof(StatusBlock), stream_));
  GROUPMM_CHECK_CUDA(cudaStreamSynchronize(stream_));
  return s;
}

void Context::check() {
  const StatusBlock s = take_status();
  GROUPMM_CHECK(s.bits == 0, describe_status(s));
}

void Context::after_op() {
  if (debug_checks_ && !capturing()) check();
}

}  // namespace groupmm
