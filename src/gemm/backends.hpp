// Backend entry points of grouped_gemm (args already validated; dims derived).
#pragma once

#include "base/cuda_entry.hpp"
#include <string>
#include <vector>

#include "groupmm/gemm.hpp"

namespace groupmm {

// What the CUTLASS engine needs of either public args struct, resolved by the validation: raw
// operand pointers (for quantized operands the copy the pass reads) and their element types.
struct GemmLaunch {
  GemmPass pass = GemmPass::forward;
  GemmDims dims;
  DType a_dtype = DType::bf16, b_dtype = DType::bf16, out_dtype = DType::bf16;
  // none, fp8_current, fp8_block, or nvfp4: bf16 operands (dequantized 4-bit weights) with a
  // per-expert alpha = alpha * scale_b[g] (scale_a null)
  QuantRecipe recipe = QuantRecipe::none;
  bool fast_accum = false;
  const void* a = nullptr;
  const void* b = nullptr;
  void* out = nullptr;
  const void* bias = nullptr;
  TensorView splits;
  float alpha = 1.0f, beta = 0.0f;
  const float* scale_a = nullptr;  // fp8_current: [G] scale_inv; fp8_block: block scales; null: 1
  const float* scale_b = nullptr;
  std::string config;           // a kernel name, or empty for the heuristic
  bool splits_at_most = false;  // SplitsTotal::at_most: a short sum of splits is no fault
  int64_t expected_rows = 0;    // the args' expected_rows: the heuristic's M (0: dims.M)
  std::string to_string() const;
};

GemmLaunch make_launch(const GroupedGemmArgs& args, const GemmDims& dims);

// Every grouped GEMM's expected_rows rule (GroupedGemmArgs, QuantizedGemmArgs, W4GemmArgs): 0, or
// with at-most splits in [1, M]; the error names op, the value and M.
void check_expected_rows(const char* op, SplitsTotal total, int64_t expected_rows, int64_t M);

}  // namespace groupmm

namespace groupmm::cpu {
void grouped_gemm(Context& ctx, const GroupedGemmArgs& args, const GemmDims& dims);
// GroupedGemmArgs::zero_tail: zeros in out's rows [min(sum(splits), M), M) (splits on the host).
void zero_rows_past_splits(const TensorView& splits, const TensorView& out);
// The reference of quantized GEMMs: operands already dequantized to fp32 ([M, K] / [G, N, K]
// un-transposed, as grouped_gemm's 16-bit operands), products summed in fp64. wgrad experts whose
// split is not a multiple of wgrad_row_multiple (> 1) are skipped with kFaultSplitAlignment.
void grouped_gemm_dequantized(Context& ctx, GemmPass pass, const std::vector<float>& a,
                              const std::vector<float>& b, const TensorView& splits,
                              const GemmDims& dims, float alpha, float beta, const TensorView& bias,
                              const TensorView& out, int64_t wgrad_row_multiple,
                              bool splits_at_most);
}  // namespace groupmm::cpu

namespace groupmm::cuda {
// CUTLASS SM90 engine (src/gemm/cuda/).
GROUPMM_CUDA_ENTRY size_t cutlass_gemm_workspace_size(const GemmLaunch& l, int sm_count);
// The caller's workspace, or (null) the Context's, grown to what the launch needs.
GROUPMM_CUDA_ENTRY void cutlass_grouped_gemm(Context& ctx, const GemmLaunch& l, void* workspace,
                                             size_t workspace_bytes);
GROUPMM_CUDA_ENTRY std::string cutlass_config_name(const GemmLaunch& l);
// GroupedGemmArgs::zero_tail (src/gemm/cuda/zero_tail.cu): zeros in out's rows
// [min(sum(splits), M), M), the sum read on the device (graph safe; negative splits count as 0).
// out is [M, row] with 16-byte aligned rows.
GROUPMM_CUDA_ENTRY void zero_rows_past_splits(Context& ctx, const TensorView& splits,
                                              const TensorView& out);
// cuBLAS per-expert loop baseline (src/gemm/cuda/cublas_loop.cu): reads splits on the host.
GROUPMM_CUDA_ENTRY void cublas_loop_gemm(Context& ctx, const GroupedGemmArgs& args,
                                         const GemmDims& dims);
}  // namespace groupmm::cuda
