// ops_status.cpp: check_status, the Python-visible Context::check() for torch's current stream.
#include <torch/library.h>

#include "binding.hpp"

namespace groupmm_torch {
namespace {

// Synchronizes the stream and throws the first device fault recorded there since the last check.
void check_status(const at::Tensor& device_like) {
  Call call("check_status", device_like);
  call.ctx().check();
}

}  // namespace

TORCH_LIBRARY_IMPL(groupmm, CPU, m) {
  m.impl("check_status", &check_status);
}
TORCH_LIBRARY_IMPL(groupmm, CUDA, m) {
  m.impl("check_status", &check_status);
}

}  // namespace groupmm_torch
