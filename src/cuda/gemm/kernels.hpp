// The instantiated SM90 grouped GEMM configurations (one .cu file each, see sm90_grouped.cuh).
// name: <pass>_<dtype>[_<out dtype>]_<tile>_<schedule>_c<cluster MxN>
#pragma once

#include "core/gemm_impl.hpp"

namespace groupmm::cuda::sm90 {

struct KernelEntry;

//      name                              pass      in      out
#define GROUPMM_FOR_EACH_SM90_KERNEL(X)                  \
  X(fwd_bf16_128x256_coop_c12, forward, bf16, bf16)      \
  X(fwd_fp16_128x256_coop_c12, forward, fp16, fp16)      \
  X(fwdswap_bf16_128x32_pp_c11, forward, bf16, bf16)     \
  X(fwdswap_fp16_128x32_pp_c11, forward, fp16, fp16)     \
  X(dgrad_bf16_128x256_coop_c11, dgrad, bf16, bf16)      \
  X(dgrad_fp16_128x256_coop_c11, dgrad, fp16, fp16)      \
  X(wgrad_bf16_f32_128x256_coop_c21, wgrad, bf16, fp32)  \
  X(wgrad_fp16_f32_128x256_coop_c21, wgrad, fp16, fp32)  \
  X(wgrad_bf16_bf16_128x256_coop_c21, wgrad, bf16, bf16) \
  X(wgrad_fp16_fp16_128x256_coop_c21, wgrad, fp16, fp16)

#define GROUPMM_DECLARE_KERNEL(name, pass, in, out) KernelEntry name();
GROUPMM_FOR_EACH_SM90_KERNEL(GROUPMM_DECLARE_KERNEL)
#undef GROUPMM_DECLARE_KERNEL

}  // namespace groupmm::cuda::sm90
