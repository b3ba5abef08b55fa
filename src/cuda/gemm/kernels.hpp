// The instantiated SM90 grouped GEMM configurations (one .cu file each, see sm90_grouped.cuh).
#pragma once

#include <string>

#include "core/gemm_impl.hpp"

namespace groupmm::cuda::sm90 {

struct KernelEntry;

// name: <pass>_<dtype>[_<out>]_<tile>_<schedule>
#define GROUPMM_FOR_EACH_SM90_KERNEL(X) \
  X(fwd_bf16_128x256_coop)              \
  X(fwd_fp16_128x256_coop)              \
  X(fwdswap_bf16_128x32_pp)             \
  X(fwdswap_fp16_128x32_pp)             \
  X(dgrad_bf16_128x256_coop)            \
  X(dgrad_fp16_128x256_coop)            \
  X(wgrad_bf16_f32_128x256_coop)        \
  X(wgrad_fp16_f32_128x256_coop)        \
  X(wgrad_bf16_bf16_128x256_coop)       \
  X(wgrad_fp16_fp16_128x256_coop)

#define GROUPMM_DECLARE_KERNEL(name) KernelEntry name();
GROUPMM_FOR_EACH_SM90_KERNEL(GROUPMM_DECLARE_KERNEL)
#undef GROUPMM_DECLARE_KERNEL

}  // namespace groupmm::cuda::sm90
