// The router's dense GEMMs through cuBLAS (fp32 accumulation). Row-major operands are used as
// column-major transposes: row-major C[M, N] = A B is column-major C^T = B^T A^T.
// Up to kRouterGemvTokens tokens (decode batches) the logits come from router_gemv_kernel
// instead, bias included: one launch where cuBLAS took a GEMM, its split-K reduction and the
// bias's add. Above that, cuBLAS and the bias in a second kernel.
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

struct GemvConfig {
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kTokens = 16;  // kRouterGemvTokens: the accumulators a thread holds
  static_assert(kThreads <= 1024, "block size");
};
constexpr int64_t kRouterGemvTokens = GemvConfig::kTokens;

// CTA e: logits[t, e] = sum_h x[t, h] w[e, h] (+ bias[e]) for the T <= kTokens tokens. Thread i
// adds vectors i, i + kThreads, ... of the row (elements in order, fp32 fmas), then a butterfly
// per warp, then thread t adds the warps' sums in warp order: a fixed order, deterministic.
template <class E, int N>
__global__ void __launch_bounds__(GemvConfig::kThreads)
    router_gemv_kernel(const typename E::Storage* x, const typename E::Storage* w,
                       const typename E::Storage* bias, float* logits, int T, int64_t H, int Ex) {
  using P = ElementVec<E, N>;
  __shared__ float part[GemvConfig::kWarps][GemvConfig::kTokens];
  const int e = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t V = H / N;
  const P* wr = reinterpret_cast<const P*>(w + int64_t(e) * H);
  const P* xr = reinterpret_cast<const P*>(x);
  float acc[GemvConfig::kTokens];
#pragma unroll
  for (int t = 0; t < GemvConfig::kTokens; ++t) acc[t] = 0.0f;
  for (int64_t v = threadIdx.x; v < V; v += GemvConfig::kThreads) {
    // Every token's vector is loaded (predicated, no early exit) before the first product: the
    // loads are in flight together, not one latency per token.
    const P wv = wr[v];
    P xv[GemvConfig::kTokens];
#pragma unroll
    for (int t = 0; t < GemvConfig::kTokens; ++t)
      if (t < T) xv[t] = xr[t * V + v];
    float wf[N];
#pragma unroll
    for (int n = 0; n < N; ++n) wf[n] = E::to_float(wv.v[n]);
#pragma unroll
    for (int t = 0; t < GemvConfig::kTokens; ++t)
      if (t < T) {
#pragma unroll
        for (int n = 0; n < N; ++n) acc[t] = fmaf(E::to_float(xv[t].v[n]), wf[n], acc[t]);
      }
  }
#pragma unroll
  for (int t = 0; t < GemvConfig::kTokens; ++t) {
    if (t >= T) break;
#pragma unroll
    for (int step = 16; step >= 1; step /= 2) acc[t] += __shfl_xor_sync(kFullMask, acc[t], step);
    if (lane == 0) part[warp][t] = acc[t];
  }
  __syncthreads();
  const int t = threadIdx.x;
  if (t < T) {
    float sum = part[0][t];
#pragma unroll
    for (int i = 1; i < GemvConfig::kWarps; ++i) sum += part[i][t];
    if (bias != nullptr) sum += E::to_float(bias[e]);
    logits[int64_t(t) * Ex + e] = sum;
  }
}

// logits [n / E, E] += bias (promoted to fp32).
template <class E>
__global__ void __launch_bounds__(RoundConfig::kThreads)
    bias_add_kernel(float* logits, const typename E::Storage* bias, int64_t n, int64_t Ex) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    logits[i] += E::to_float(bias[i % Ex]);
}

// The router GEMM's operands are bf16 or fp16 on CUDA (moe_router_logits checks): only those
// two are instantiated for the kernels above.
template <class F>
void dispatch_16bit(DType t, F&& f) {
  GROUPMM_CHECK(t == DType::bf16 || t == DType::fp16, "router_logits dtype ", dtype_name(t));
  if (t == DType::bf16)
    f(Bf16{});
  else
    f(Fp16{});
}

unsigned elementwise_blocks(Context& ctx, int64_t n) {
  return grid_size(
      std::min<int64_t>(qnum::ceil_div(n, RoundConfig::kThreads), int64_t(ctx.sm_count()) * 8));
}

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
                       const TensorView& bias, const TensorView& logits, void* ws, size_t) {
  const int64_t T = x.dim(0), H = x.dim(1), E = w.dim(0);
  if (T == 0) return;
  if (T <= kRouterGemvTokens) {
    dispatch_16bit(x.dtype, [&](auto e) {
      using El = decltype(e);
      using S = typename El::Storage;
      constexpr int kVec = kVec16<El>;
      const bool vec = H % kVec == 0 && aligned16(x.data) && aligned16(w.data);
      auto kernel = vec ? router_gemv_kernel<El, kVec> : router_gemv_kernel<El, 1>;
      kernel<<<unsigned(E), GemvConfig::kThreads, 0, ctx.stream()>>>(
          static_cast<const S*>(x.data), static_cast<const S*>(w.data),
          bias.present() ? static_cast<const S*>(bias.data) : nullptr, logits.ptr<float>(), int(T),
          H, int(E));
    });
    GROUPMM_CHECK_LAUNCH();
    return;
  }
  gemm(handle_with_workspace(ctx, ws), CUBLAS_OP_T, CUBLAS_OP_N, E, T, H, w.data, x.dtype, H,
       x.data, H, 0.0f, logits.data, DType::fp32, E);
  if (bias.present()) {
    dispatch_16bit(x.dtype, [&](auto e) {
      using El = decltype(e);
      bias_add_kernel<El>
          <<<elementwise_blocks(ctx, T * E), RoundConfig::kThreads, 0, ctx.stream()>>>(
              logits.ptr<float>(), static_cast<const typename El::Storage*>(bias.data), T * E, E);
    });
    GROUPMM_CHECK_LAUNCH();
  }
}

void moe_router_logits_backward(Context& ctx, const TensorView& d_logits, const TensorView& x,
                                const TensorView& w, const TensorView& dx, const TensorView& dw,
                                bool accumulate_dx, bool accumulate_dw, void* ws, size_t) {
  const int64_t T = x.dim(0), H = x.dim(1), E = w.dim(0);
  void* g = static_cast<char*>(ws) + kCublasWorkspace;
  if (T > 0) {
    const int64_t n = T * E;
    const unsigned blocks = elementwise_blocks(ctx, n);
    dispatch_16bit(x.dtype, [&](auto e) {
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
