// ops_status.cpp: check_status, the Python-visible Context::check() for torch's current stream;
// empty_cache, groupmm's release_cached_device_memory().
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

// The memory groupmm's device pools keep for its internal buffers (plans, staging, workspaces)
// and no live buffer uses, back to the driver (core.hpp). Tensors the ops return are torch's.
void empty_cache() {
  groupmm::release_cached_device_memory();
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(groupmm, m) {
  // no tensor argument: a catch-all kernel
  m.def("empty_cache() -> ()", &empty_cache);
}

GROUPMM_TORCH_CPU_AND_CUDA(register_status_impls)

}  // namespace groupmm_torch
