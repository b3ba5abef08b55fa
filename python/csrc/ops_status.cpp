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

void register_status_impls(Kernels& m) {
  m.impl("check_status", &check_status);
}

}  // namespace

GROUPMM_TORCH_CPU_AND_CUDA(register_status_impls)

}  // namespace groupmm_torch
