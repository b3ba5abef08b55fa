// How a family declares its CUDA backend's entry points (the `namespace groupmm::cuda` part of
// its backends.hpp), so that a CPU-only library links.
//
// A library configured with GROUPMM_CUDA_KERNELS=OFF has no source under src/kernels/ or
// src/<family>/cuda/: there, GROUPMM_CUDA_ENTRY makes each CUDA entry point a weak declaration
// that resolves to nothing. None is reached, because every call is behind either a Context on
// Device::CUDA, which that build refuses (base/context.cpp), or cuda_kernels_built().
#pragma once

#include "groupmm/version.hpp"

#if GROUPMM_WITH_CUDA_KERNELS
#define GROUPMM_CUDA_ENTRY
#else
#define GROUPMM_CUDA_ENTRY __attribute__((weak))
#endif

namespace groupmm {
// Whether this library has its CUDA kernels (GROUPMM_WITH_CUDA_KERNELS).
constexpr bool cuda_kernels_built() {
  return GROUPMM_WITH_CUDA_KERNELS != 0;
}
}  // namespace groupmm
