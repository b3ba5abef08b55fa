// Kernel launch helpers shared by the op families: programmatic dependent launch (both halves of
// the protocol) and the per-device kernel attribute the persistent kernels need.
#pragma once

#include <utility>

#include "groupmm/core.hpp"

namespace groupmm::cuda {

// The launch shape of a kernel that needs nothing but its CTA size.
template <int kThreads_>
struct BlockConfig {
  static constexpr int kThreads = kThreads_;
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, at most 1024 threads");
};

// ---- programmatic dependent launch (PDL) -------------------------------------------------------
// A kernel launched with launch_pdl may start while the kernel before it in the stream is still
// running (its launch latency and prologue overlap that kernel's tail). The protocol:
//  - the earlier kernel calls pdl_launch_dependents() once it no longer needs the SMs to itself
//    (at its start is fine: a dependent only becomes resident as the earlier kernel's CTAs retire);
//  - the dependent calls pdl_wait() before it touches anything the earlier kernel writes, or
//    anything the earlier kernel still reads and the dependent writes. pdl_wait() returns when
//    the earlier grid has completed and its memory is visible.
// Without the attribute (a plain <<<>>> launch) both calls are no-ops and the stream orders the
// kernels as usual. Stream capture records a PDL launch as a programmatic graph edge.
template <class... KArgs, class... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  GROUPMM_CHECK_CUDA(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}
__device__ __forceinline__ void pdl_wait() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// ---- kernel attributes --------------------------------------------------------------------------
// Raises the kernel's dynamic shared-memory limit to max_bytes on the Context's device, once per
// Context (Context::first_use). The attribute is per (function, device) and is not a stream
// operation, so the first call on a Context should come before a stream capture that launches the
// kernel.
template <class... KArgs>
void allow_dynamic_smem(Context& ctx, void (*kernel)(KArgs...), int max_bytes) {
  if (!ctx.first_use(reinterpret_cast<const void*>(kernel))) return;
  GROUPMM_CHECK_CUDA(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_bytes));
}

}  // namespace groupmm::cuda
