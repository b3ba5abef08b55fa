// Backend entry points of grouped_gemm (args already validated; dims derived).
#pragma once

#include "groupmm/gemm.hpp"

namespace groupmm::cpu {
void grouped_gemm(Context& ctx, const GroupedGemmArgs& args, const GemmDims& dims);
}
namespace groupmm::cuda {
// CUTLASS SM90 engine (src/cuda/gemm/).
size_t cutlass_gemm_workspace_size(const GroupedGemmArgs& args, const GemmDims& dims, int sm_count);
void cutlass_grouped_gemm(Context& ctx, const GroupedGemmArgs& args, const GemmDims& dims,
                          void* workspace, size_t workspace_bytes);
std::string cutlass_config_name(const GroupedGemmArgs& args, const GemmDims& dims);
std::vector<std::string> cutlass_config_names();
// cuBLAS per-expert loop baseline (src/cuda/gemm_cublas_loop.cu): reads splits on the host.
void cublas_loop_gemm(Context& ctx, const GroupedGemmArgs& args, const GemmDims& dims);
}  // namespace groupmm::cuda
