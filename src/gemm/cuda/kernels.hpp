// The instantiated SM90 grouped GEMM configurations (one .cu file each, see sm90_grouped.cuh).
// name: <pass>_<a dtype>[x<b dtype>]_<out dtype>[_block|_fast]_<tile>_<schedule>_c<cluster MxN>
#pragma once

#include "gemm/backends.hpp"

namespace groupmm::cuda::sm90 {

struct KernelEntry;

// 16-bit operands (a and b of one dtype).
//      name                              pass      in      out
#define GROUPMM_FOR_EACH_SM90_KERNEL(X)                  \
  X(fwd_bf16_128x256_coop_c12, forward, bf16, bf16)      \
  X(fwd_fp16_128x256_coop_c12, forward, fp16, fp16)      \
  X(fwd_bf16_f32_128x256_coop_c12, forward, bf16, fp32)  \
  X(fwd_fp16_f32_128x256_coop_c12, forward, fp16, fp32)  \
  X(fwdswap_bf16_128x32_pp_c11, forward, bf16, bf16)     \
  X(fwdswap_fp16_128x32_pp_c11, forward, fp16, fp16)     \
  X(dgrad_bf16_128x256_coop_c11, dgrad, bf16, bf16)      \
  X(dgrad_fp16_128x256_coop_c11, dgrad, fp16, fp16)      \
  X(dgrad_bf16_f32_128x256_coop_c11, dgrad, bf16, fp32)  \
  X(dgrad_fp16_f32_128x256_coop_c11, dgrad, fp16, fp32)  \
  X(wgrad_bf16_f32_128x256_coop_c21, wgrad, bf16, fp32)  \
  X(wgrad_fp16_f32_128x256_coop_c21, wgrad, fp16, fp32)  \
  X(wgrad_bf16_bf16_128x256_coop_c21, wgrad, bf16, bf16) \
  X(wgrad_fp16_fp16_128x256_coop_c21, wgrad, fp16, fp16) \
  X(fwd_bf16_128x256_coop_c21, forward, bf16, bf16)      \
  X(wgrad_bf16_bf16_128x128_pp_c21, wgrad, bf16, bf16)   \
  X(wgrad_bf16_bf16_128x192_coop_c21, wgrad, bf16, bf16) \
  X(fwd_bf16_128x128_pp_c12, forward, bf16, bf16)        \
  X(wgrad_bf16_f32_128x128_pp_c21, wgrad, bf16, fp32)

// Scaled operands. recipe: fp8_current (per-expert scales in the epilogue) or fp8_block (block
// scales in the mainloop); fast: no periodic fp32 promotion (inference). nvfp4: bf16 operands
// (the dequantized 4-bit weights) with a per-expert alpha in the epilogue.
//      name                                       pass     a        b        out   recipe    fast
#define GROUPMM_FOR_EACH_SM90_FP8_KERNEL(X)                                                   \
  X(fwd_e4m3_bf16_128x192_coop_c21, forward, fp8e4m3, fp8e4m3, bf16, fp8_current, false)      \
  X(fwd_e4m3_bf16_fast_128x256_coop_c12, forward, fp8e4m3, fp8e4m3, bf16, fp8_current, true)  \
  X(fwdswap_e4m3_bf16_128x32_pp_c11, forward, fp8e4m3, fp8e4m3, bf16, fp8_current, false)     \
  X(dgrad_e4m3_bf16_128x192_coop_c11, dgrad, fp8e4m3, fp8e4m3, bf16, fp8_current, false)      \
  X(dgrad_e5m2xe4m3_bf16_128x192_coop_c11, dgrad, fp8e5m2, fp8e4m3, bf16, fp8_current, false) \
  X(wgrad_e4m3_f32_128x192_coop_c21, wgrad, fp8e4m3, fp8e4m3, fp32, fp8_current, false)       \
  X(wgrad_e5m2xe4m3_f32_128x192_coop_c21, wgrad, fp8e5m2, fp8e4m3, fp32, fp8_current, false)  \
  X(wgrad_e4m3_bf16_128x192_coop_c21, wgrad, fp8e4m3, fp8e4m3, bf16, fp8_current, false)      \
  X(wgrad_e5m2xe4m3_bf16_128x192_coop_c21, wgrad, fp8e5m2, fp8e4m3, bf16, fp8_current, false) \
  X(fwd_e4m3_bf16_block_128x192_coop_c21, forward, fp8e4m3, fp8e4m3, bf16, fp8_block, false)  \
  X(dgrad_e4m3_bf16_block_128x192_coop_c11, dgrad, fp8e4m3, fp8e4m3, bf16, fp8_block, false)  \
  X(fwdswap_e4m3_bf16_block_128x32_pp_c11, forward, fp8e4m3, fp8e4m3, bf16, fp8_block, false) \
  X(wgrad_e4m3_f32_block_128x128_coop_c12, wgrad, fp8e4m3, fp8e4m3, fp32, fp8_block, false)   \
  X(wgrad_e4m3_bf16_block_128x128_coop_c12, wgrad, fp8e4m3, fp8e4m3, bf16, fp8_block, false)  \
  X(fwd_bf16_alpha_128x256_coop_c12, forward, bf16, bf16, bf16, nvfp4, false)

#define GROUPMM_DECLARE_KERNEL(name, ...) KernelEntry name();
GROUPMM_FOR_EACH_SM90_KERNEL(GROUPMM_DECLARE_KERNEL)
GROUPMM_FOR_EACH_SM90_FP8_KERNEL(GROUPMM_DECLARE_KERNEL)
#undef GROUPMM_DECLARE_KERNEL

}  // namespace groupmm::cuda::sm90
