// binding.cpp: Call, the Context pool and the dtype map (see binding.hpp).
//
// Only device-generic c10 APIs are used for the device guard and the current stream, so the
// extension links libc10/libtorch_cpu alone and builds against CPU-only and CUDA torch alike.
#include "binding.hpp"

#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <map>
#include <memory>
#include <mutex>
#include <utility>

namespace groupmm_torch {

groupmm::DType to_groupmm(at::ScalarType t, const char* op, const char* arg) {
  switch (t) {
    case at::kBFloat16:
      return groupmm::DType::bf16;
    case at::kHalf:
      return groupmm::DType::fp16;
    case at::kFloat:
      return groupmm::DType::fp32;
    case at::kInt:
      return groupmm::DType::int32;
    case at::kLong:
      return groupmm::DType::int64;
    case at::kFloat8_e4m3fn:
      return groupmm::DType::fp8e4m3;
    case at::kFloat8_e5m2:
      return groupmm::DType::fp8e5m2;
    case at::kFloat8_e8m0fnu:
      return groupmm::DType::e8m0;
    default:
      break;
  }
  TORCH_CHECK_TYPE(false, "groupmm.", op, ": ", arg, " has dtype ", t,
                   ", which groupmm does not take (bfloat16, float16, float32, int32, int64, "
                   "float8_e4m3fn, float8_e5m2, float8_e8m0fnu)");
}

groupmm::TensorView view_of(const at::Tensor& t, groupmm::Device d, const char* op,
                            const char* arg) {
  TORCH_CHECK_VALUE(t.dim() >= 1 && t.dim() <= 3, "groupmm.", op, ": ", arg, " has ", t.dim(),
                    " dims; groupmm takes 1 to 3");
  groupmm::TensorView v;
  v.data = t.data_ptr();
  v.dtype = to_groupmm(t.scalar_type(), op, arg);
  v.device = d;
  v.rank = static_cast<int>(t.dim());
  for (int i = 0; i < v.rank; ++i) v.shape[static_cast<size_t>(i)] = t.size(i);
  return v;
}

groupmm::Context& context_for(const at::Device& device) {
  if (device.is_cpu()) {
    // One per thread: autograd may run backward on another thread, and the CPU Context's
    // workspace and status block are plain host memory without locks.
    thread_local groupmm::Context cpu(groupmm::Device::CPU);
    return cpu;
  }
  TORCH_CHECK(device.is_cuda(), "groupmm: tensors on ", device, " are not supported (cpu, cuda)");
  const c10::impl::VirtualGuardImpl impl(device.type());
  const c10::Stream stream = impl.getStream(device);
  auto* handle = static_cast<cudaStream_t>(stream.native_handle());
  static std::mutex mu;
  // Never destroyed: a Context frees device memory in its destructor, which must not run after
  // the CUDA runtime has shut down at process exit.
  static auto* pool = new std::map<std::pair<int, cudaStream_t>, std::unique_ptr<groupmm::Context>>;
  const std::lock_guard<std::mutex> lock(mu);
  auto& slot = (*pool)[{device.index(), handle}];
  if (!slot) slot = std::make_unique<groupmm::Context>(groupmm::Device::CUDA, handle);
  return *slot;
}

struct Call::Guard {
  explicit Guard(const at::Device& d) : g(d) {}
  c10::OptionalDeviceGuard g;
};

Call::Call(const char* op, const at::Tensor& anchor)
    : op_(op), device_(anchor.device()), opts_(anchor.options()), guard_(nullptr) {
  if (device_.is_cuda()) guard_ = new Guard(device_);
  ctx_ = &context_for(device_);
}

Call::~Call() {
  delete guard_;
}

void Call::check_device(const at::Tensor& t, const char* arg) const {
  TORCH_CHECK(t.device() == device_, "groupmm.", op_, ": ", arg, " is on ", t.device(),
              " but the op runs on ", device_, " (every tensor of one call on one device)");
}

groupmm::TensorView Call::in(const at::Tensor& t, const char* arg) {
  check_device(t, arg);
  const groupmm::Device d = device_.is_cuda() ? groupmm::Device::CUDA : groupmm::Device::CPU;
  if (t.is_contiguous()) return view_of(t, d, op_, arg);
  keep_.push_back(t.contiguous());
  return view_of(keep_.back(), d, op_, arg);
}

groupmm::TensorView Call::in(const std::optional<at::Tensor>& t, const char* arg) {
  return t.has_value() ? in(*t, arg) : groupmm::TensorView();
}

groupmm::TensorView Call::out(const at::Tensor& t, const char* arg) {
  check_device(t, arg);
  TORCH_CHECK_VALUE(t.is_contiguous(), "groupmm.", op_, ": ", arg,
                    " is written in place and must be contiguous");
  return view_of(t, device_.is_cuda() ? groupmm::Device::CUDA : groupmm::Device::CPU, op_, arg);
}

at::Tensor Call::empty(at::IntArrayRef shape, at::ScalarType dtype) {
  return at::empty(shape, opts_.dtype(dtype));
}

void* Call::workspace(size_t bytes) {
  if (bytes == 0) return nullptr;
  keep_.push_back(at::empty({static_cast<int64_t>(bytes)}, opts_.dtype(at::kByte)));
  return keep_.back().data_ptr();
}

void Call::finish() {
  if (device_.is_cpu()) ctx_->check();
}

}  // namespace groupmm_torch
