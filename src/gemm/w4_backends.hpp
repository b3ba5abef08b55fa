// Backend entry points of the 4-bit weight grouped GEMM (gemm.hpp, W4GemmArgs), after validation.
#pragma once

#include "base/cuda_entry.hpp"
#include <string>

#include "gemm/backends.hpp"
#include "numerics/quantize_layout.hpp"

namespace groupmm {

// What the CUDA kernels need of W4GemmArgs: raw pointers, dims, the weights' scale layout.
struct W4Launch {
  GemmDims dims;
  QuantRecipe recipe = QuantRecipe::nvfp4;  // nvfp4 or mxfp4
  qnum::Layout L;                           // the weights' rowwise scale layout
  const void* x = nullptr;                  // [M, K] bf16
  const void* w = nullptr;                  // [G * N, K / 2] e2m1 codes
  const void* scales = nullptr;             // block scales (layout L)
  const float* s_enc = nullptr;             // nvfp4: [G] global_scale
  const void* bias = nullptr;               // [G, N] bf16 or null
  void* out = nullptr;                      // [M, N] bf16
  TensorView splits;
  bool splits_at_most = false;  // SplitsTotal::at_most: a short sum of splits is no fault
  int64_t expected_rows = 0;    // the rows the splits are expected to reach (0: dims.M)
  float alpha = 1.0f;
  int decode_tokens = 0;  // decode: tokens a pass (8, 16 or 32); 0: from the average expert
};

}  // namespace groupmm

namespace groupmm::cuda {
// Decode path (src/gemm/cuda/w4/decode.cu): a description of the launch, its workspace, the launch.
GROUPMM_CUDA_ENTRY std::string w4_decode_name(const W4Launch& l, int sm_count);
GROUPMM_CUDA_ENTRY size_t w4_decode_workspace_size(const W4Launch& l, int sm_count);
GROUPMM_CUDA_ENTRY void w4_decode_gemm(Context& ctx, const W4Launch& l, void* ws, size_t ws_bytes);
// Prefill path (src/gemm/cuda/w4/dequant.cu): the weights of the experts with rows as bf16 [G, N,
// K] into `wide` (qnum::w4_weight_value; other experts untouched), the experts' fp32 accumulator
// factors (qnum::w4_expert_factor) into factor [G].
// Fused path, no workspace, G <= kW4FusedMaxGroups. Its default kernel, the RS form
// (src/gemm/cuda/w4/fused_rs.cu): the consumers dequantize into wgmma's register A operand;
// scale_warps (config rs_sw_256x128, the default): the producer warpgroup's idle warps compute
// the block multipliers into the stage (false: config rs_256x128, the consumers compute them).
GROUPMM_CUDA_ENTRY void w4_fused_rs_gemm(Context& ctx, const W4Launch& l, bool scale_warps);
// config coop_128x256 (src/gemm/cuda/w4/fused.cu): the kernel layer's grouped GEMM dequantizing
// each stage's codes in shared memory.
GROUPMM_CUDA_ENTRY std::string w4_fused_name(const W4Launch& l);
GROUPMM_CUDA_ENTRY void w4_fused_gemm(Context& ctx, const W4Launch& l);
GROUPMM_CUDA_ENTRY void w4_dequantize_weights(Context& ctx, const W4Launch& l, void* wide,
                                              float* factor);
}  // namespace groupmm::cuda

namespace groupmm::cpu {
// Reference: x and the exactly dequantized weights in fp32, products summed in fp64.
void w4_gemm(Context& ctx, const W4GemmArgs& a, const GemmDims& d);
}  // namespace groupmm::cpu
