// cuBLAS per-expert loop baseline: reads splits on the host (synchronizes: NOT graph safe), then
// one cublasGemmEx per non-empty expert. Row-major operands are handled as transposed
// column-major ones: row-major C = A B is column-major C^T = B^T A^T. C takes out's dtype (a's
// 16-bit dtype or fp32, any pass) with fp32 compute; no bias (refused: the baseline has none).
#include <cublas_v2.h>

#include <vector>

#include "gemm/backends.hpp"

namespace groupmm::cuda {

static cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::fp16:
      return CUDA_R_16F;
    case DType::fp32:
      return CUDA_R_32F;
    default:
      break;
  }
  GROUPMM_CHECK(false, "cublas_loop: unsupported dtype ", dtype_name(t));
  return CUDA_R_32F;
}

void cublas_loop_gemm(Context& ctx, const GroupedGemmArgs& a, const GemmDims& d) {
  GROUPMM_CHECK(!a.bias.present(), "grouped_gemm: the cublas_loop engine does not apply bias");
  GROUPMM_CHECK(!ctx.capturing(),
                "grouped_gemm: the cublas_loop engine reads splits on the host "
                "and cannot run under CUDA graph capture; use engine cutlass_sm90");
  const int64_t G = d.G;
  std::vector<int64_t> m(static_cast<size_t>(G));
  if (a.splits.dtype == DType::int64) {
    GROUPMM_CHECK_CUDA(
        cudaMemcpyAsync(m.data(), a.splits.data, G * 8, cudaMemcpyDeviceToHost, ctx.stream()));
    GROUPMM_CHECK_CUDA(cudaStreamSynchronize(ctx.stream()));
  } else {
    std::vector<int32_t> m32(static_cast<size_t>(G));
    GROUPMM_CHECK_CUDA(
        cudaMemcpyAsync(m32.data(), a.splits.data, G * 4, cudaMemcpyDeviceToHost, ctx.stream()));
    GROUPMM_CHECK_CUDA(cudaStreamSynchronize(ctx.stream()));
    for (int64_t g = 0; g < G; ++g) m[static_cast<size_t>(g)] = m32[static_cast<size_t>(g)];
  }
  auto h = static_cast<cublasHandle_t>(ctx.cublas_handle());
  const cudaDataType_t ti = cuda_type(a.a.dtype), to = cuda_type(a.out.dtype);
  const size_t ei = a.a.dtype == DType::fp32 ? 4 : 2, eo = a.out.dtype == DType::fp32 ? 4 : 2;
  const auto* A = static_cast<const char*>(a.a.data);
  const auto* B = static_cast<const char*>(a.b.data);
  auto* C = static_cast<char*>(a.out.data);
  const int N = static_cast<int>(d.N), K = static_cast<int>(d.K);
  int64_t start = 0;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t mg = std::max<int64_t>(0, m[static_cast<size_t>(g)]);
    GROUPMM_CHECK(start + mg <= d.M, "grouped_gemm (cublas_loop): splits sum past M_total=", d.M,
                  " at group ", g);
    const int rows = static_cast<int>(mg);
    switch (a.pass) {
      case GemmPass::forward:
        if (rows > 0)
          GROUPMM_CHECK_CUBLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, rows, K, &a.alpha,
                                            B + g * N * K * ei, ti, K, A + start * K * ei, ti, K,
                                            &a.beta, C + start * N * eo, to, N, CUBLAS_COMPUTE_32F,
                                            CUBLAS_GEMM_DEFAULT));
        break;
      case GemmPass::dgrad:
        if (rows > 0)
          GROUPMM_CHECK_CUBLAS(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, K, rows, N, &a.alpha,
                                            B + g * N * K * ei, ti, K, A + start * N * ei, ti, N,
                                            &a.beta, C + start * K * eo, to, K, CUBLAS_COMPUTE_32F,
                                            CUBLAS_GEMM_DEFAULT));
        break;
      case GemmPass::wgrad:
        if (rows > 0) {
          GROUPMM_CHECK_CUBLAS(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, K, N, rows, &a.alpha,
                                            B + start * K * ei, ti, K, A + start * N * ei, ti, N,
                                            &a.beta, C + g * N * K * eo, to, K, CUBLAS_COMPUTE_32F,
                                            CUBLAS_GEMM_DEFAULT));
        } else if (a.beta == 0.0f) {
          GROUPMM_CHECK_CUDA(
              cudaMemsetAsync(C + g * N * K * eo, 0, size_t(N) * K * eo, ctx.stream()));
        }
        break;
    }
    start += mg;
  }
}

}  // namespace groupmm::cuda
