// The router's dense GEMMs through cuBLAS (fp32 accumulation). Row-major operands are used as
// column-major transposes: row-major C[M, N] = A B is column-major C^T = B^T A^T.
//   logits [T, E] = x [T, H] W [E, H]^T   ->  cm: logits^T (E x T) = W^T(op T of cm H x E) x^T
//   dx [T, H]     = g [T, E] W [E, H]     ->  cm: dx^T (H x T) = W (cm H x E) g^T (cm E x T)
//   dW [E, H]     = g^T x                 ->  cm: dW^T (H x E) = x (cm H x T) g (op T of cm E x T)
// cuBLAS runs on a fixed-size workspace carved from ours (set per call: the handle's default pool
// may allocate, which graph capture forbids; a fixed size also fixes cuBLAS's algorithm choice, so
// results are deterministic). The backward first rounds d_logits to x's dtype into the workspace.
#include <cublas_v2.h>

#include "moe/backends.hpp"
#include "moe/cuda/moe_common.cuh"

namespace groupmm::cuda {
namespace {

using namespace moe;

constexpr size_t kCublasWorkspace = size_t(32) << 20;  // cuBLAS's recommendation for Hopper

struct RoundConfig {
  static constexpr int kThreads = 256;
};

template <class E>
__global__ void __launch_bounds__(RoundConfig::kThreads)
    round_kernel(const float* in, typename E::Storage* out, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = E::from_float(in[i]);
}

cudaDataType_t cuda_type(DType t) {
  return t == DType::bf16 ? CUDA_R_16BF : (t == DType::fp16 ? CUDA_R_16F : CUDA_R_32F);
}

cublasHandle_t handle_with_workspace(Context& ctx, void* ws) {
  auto h = static_cast<cublasHandle_t>(ctx.cublas_handle());  // (re)binds the stream
  GROUPMM_CHECK_CUBLAS(cublasSetWorkspace(h, ws, kCublasWorkspace));
  return h;
}

void gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n,
          int64_t k, const void* A, DType at, int64_t lda, const void* B, int64_t ldb, float beta,
          void* C, DType ct, int64_t ldc) {
  const float alpha = 1.0f;
  GROUPMM_CHECK_CUBLAS(cublasGemmEx(h, ta, tb, int(m), int(n), int(k), &alpha, A, cuda_type(at),
                                    int(lda), B, cuda_type(at), int(ldb), &beta, C, cuda_type(ct),
                                    int(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

size_t moe_router_logits_workspace_size(int64_t tokens, int64_t experts) {
  return kCublasWorkspace + size_t(qnum::round_up(tokens * experts * 2, 256));
}

void moe_router_logits(Context& ctx, const TensorView& x, const TensorView& w,
                       const TensorView& logits, void* ws, size_t) {
  const int64_t T = x.dim(0), H = x.dim(1), E = w.dim(0);
  if (T == 0) return;
  gemm(handle_with_workspace(ctx, ws), CUBLAS_OP_T, CUBLAS_OP_N, E, T, H, w.data, x.dtype, H,
       x.data, H, 0.0f, logits.data, DType::fp32, E);
}

void moe_router_logits_backward(Context& ctx, const TensorView& d_logits, const TensorView& x,
                                const TensorView& w, const TensorView& dx, const TensorView& dw,
                                bool accumulate_dx, bool accumulate_dw, void* ws, size_t) {
  const int64_t T = x.dim(0), H = x.dim(1), E = w.dim(0);
  void* g = static_cast<char*>(ws) + kCublasWorkspace;
  if (T > 0) {
    const int64_t n = T * E;
    const unsigned blocks = grid_size(
        std::min<int64_t>(qnum::ceil_div(n, RoundConfig::kThreads), int64_t(ctx.sm_count()) * 8));
    dispatch_element(x.dtype, "router_gemm dtype", [&](auto e) {
      using E = decltype(e);
      round_kernel<E><<<blocks, RoundConfig::kThreads, 0, ctx.stream()>>>(
          d_logits.ptr<float>(), static_cast<typename E::Storage*>(g), n);
    });
    GROUPMM_CHECK_LAUNCH();
  }
  cublasHandle_t h = handle_with_workspace(ctx, ws);
  if (dx.present() && T > 0)
    gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, H, T, E, w.data, x.dtype, H, g, E,
         accumulate_dx ? 1.0f : 0.0f, dx.data, dx.dtype, H);
  if (dw.present()) {
    if (T == 0) {  // no tokens: dW = 0 (or unchanged when accumulating)
      if (!accumulate_dw)
        GROUPMM_CHECK_CUDA(cudaMemsetAsync(dw.data, 0, dw.nbytes(), ctx.stream()));
      return;
    }
    gemm(h, CUBLAS_OP_N, CUBLAS_OP_T, H, E, T, x.data, x.dtype, H, g, E,
         accumulate_dw ? 1.0f : 0.0f, dw.data, dw.dtype, H);
  }
}

}  // namespace groupmm::cuda
