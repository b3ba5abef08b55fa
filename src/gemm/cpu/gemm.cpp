// CPU reference of grouped_gemm: plain loops over fp32 copies of the operands. 16-bit operands
// accumulate in fp32 (what the tensor cores do); dequantized FP8/MXFP8 operands in fp64 (the
// exact product the quantized GEMMs approximate). Every pass adds alpha, bias (forward, in out's
// dtype) and beta * out in fp32, then converts once to out's dtype: a 16-bit out is rounded there,
// an fp32 out (any pass) stores the fp32 value as is, as the GPU epilogues do.
#include <algorithm>
#include <vector>

#include "gemm/backends.hpp"
#include "base/cpu_util.hpp"

namespace groupmm::cpu {

namespace {

struct Operands {
  GemmPass pass;
  bool splits_at_most;          // SplitsTotal::at_most: a short sum is no fault
  int64_t wgrad_row_multiple;   // > 1: wgrad experts whose split breaks it are skipped (FP8)
  const std::vector<float>& a;  // x [M, K] (forward) or dy [M, N]
  const std::vector<float>& b;  // W [G, N, K] or x [M, K] (wgrad)
  float alpha, beta;
  const TensorView& bias;
  const TensorView& out;
};

template <class Acc>
void gemm_loops(Context& ctx, const Operands& o, const TensorView& splits, const GemmDims& d) {
  const auto ranges = expert_rows(ctx, splits, d.M, OpId::grouped_gemm, d.M, o.splits_at_most);
  const std::vector<float>& A = o.a;
  const std::vector<float>& B = o.b;
  const int64_t N = d.N, K = d.K;
  for (int64_t g = 0; g < d.G; ++g) {
    const RowRange r = ranges[static_cast<size_t>(g)];
    if (o.pass == GemmPass::wgrad && o.wgrad_row_multiple > 1 && r.rows % o.wgrad_row_multiple) {
      report_fault_host(ctx.status(), kFaultSplitAlignment, OpId::grouped_gemm,
                        static_cast<int32_t>(g), r.rows);
      continue;
    }
    if (o.pass == GemmPass::wgrad) {
      // dW_g[n][k] = sum_m dy[m][n] * x[m][k]; one parallel region per expert (rows of dW are
      // independent), rows m summed in order so the result does not depend on the thread count.
      std::vector<Acc> acc(static_cast<size_t>(N * K), Acc(0));
#pragma omp parallel for schedule(static)
      for (int64_t n = 0; n < N; ++n) {
        Acc* row = &acc[static_cast<size_t>(n * K)];
        for (int64_t m = r.start; m < r.start + r.rows; ++m) {
          const Acc dv = A[static_cast<size_t>(m * N + n)];
          const float* x = &B[static_cast<size_t>(m * K)];
          for (int64_t k = 0; k < K; ++k) row[k] += dv * Acc(x[k]);
        }
      }
      for (int64_t i = 0; i < N * K; ++i) {
        const int64_t idx = g * N * K + i;
        float v = static_cast<float>(Acc(o.alpha) * acc[static_cast<size_t>(i)]);
        if (o.beta != 0.0f) v += o.beta * load_f(o.out, idx);
        store_f(o.out, idx, v);
      }
      continue;
    }
    const bool fwd = o.pass == GemmPass::forward;
    const int64_t Kin = fwd ? K : N, Nout = fwd ? N : K;
    const float* W = &B[static_cast<size_t>(g * N * K)];
#pragma omp parallel for
    for (int64_t m = r.start; m < r.start + r.rows; ++m) {
      const float* in = &A[static_cast<size_t>(m * Kin)];
      std::vector<Acc> acc(static_cast<size_t>(Nout), Acc(0));
      if (fwd) {  // y[m][n] = sum_k x[m][k] W[n][k]
        for (int64_t n = 0; n < N; ++n) {
          Acc s = 0;
          for (int64_t k = 0; k < K; ++k) s += Acc(in[k]) * Acc(W[n * K + k]);
          acc[static_cast<size_t>(n)] = s;
        }
      } else {  // dx[m][k] = sum_n dy[m][n] W[n][k]
        for (int64_t n = 0; n < N; ++n)
          for (int64_t k = 0; k < K; ++k)
            acc[static_cast<size_t>(k)] += Acc(in[n]) * Acc(W[n * K + k]);
      }
      for (int64_t j = 0; j < Nout; ++j) {
        float v = static_cast<float>(Acc(o.alpha) * acc[static_cast<size_t>(j)]);
        if (fwd && o.bias.present()) v += load_f(o.bias, g * N + j);
        store_f(o.out, m * Nout + j, v);
      }
    }
  }
}

}  // namespace

void grouped_gemm(Context& ctx, const GroupedGemmArgs& a, const GemmDims& d) {
  const std::vector<float> A = to_floats(a.a);
  const std::vector<float> B = to_floats(a.b);
  gemm_loops<float>(
      ctx,
      {a.pass, a.splits_total == SplitsTotal::at_most, 1, A, B, a.alpha, a.beta, a.bias, a.out},
      a.splits, d);
}

void zero_rows_past_splits(const TensorView& splits, const TensorView& out) {
  const int64_t M = out.dim(0), row = out.numel() / std::max<int64_t>(M, 1);
  int64_t sum = 0;
  for (int64_t g = 0; g < splits.dim(0); ++g) {
    const int64_t m =
        splits.dtype == DType::int64 ? splits.ptr<int64_t>()[g] : splits.ptr<int32_t>()[g];
    sum += std::clamp<int64_t>(m, 0, M);  // clamped: the sum cannot overflow
    sum = std::min(sum, M);
  }
  for (int64_t i = sum * row; i < M * row; ++i) store_f(out, i, 0.0f);
}

void grouped_gemm_dequantized(Context& ctx, GemmPass pass, const std::vector<float>& a,
                              const std::vector<float>& b, const TensorView& splits,
                              const GemmDims& d, float alpha, float beta, const TensorView& bias,
                              const TensorView& out, int64_t wgrad_row_multiple,
                              bool splits_at_most) {
  gemm_loops<double>(ctx, {pass, splits_at_most, wgrad_row_multiple, a, b, alpha, beta, bias, out},
                     splits, d);
}

}  // namespace groupmm::cpu
