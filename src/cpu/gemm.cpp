// CPU reference of grouped_gemm: fp32 accumulation over fp32 copies of the operands.
#include <vector>

#include "core/gemm_impl.hpp"
#include "cpu/cpu_util.hpp"

namespace groupmm::cpu {

void grouped_gemm(Context& ctx, const GroupedGemmArgs& a, const GemmDims& d) {
  const auto ranges = expert_rows(ctx, a.splits, d.M, OpId::grouped_gemm);
  const std::vector<float> A = to_floats(a.a);
  const std::vector<float> B = to_floats(a.b);
  const int64_t N = d.N, K = d.K;
  for (int64_t g = 0; g < d.G; ++g) {
    const RowRange r = ranges[static_cast<size_t>(g)];
    if (a.pass == GemmPass::wgrad) {
      // dW_g[n][k] = sum_m dy[m][n] * x[m][k]; one parallel region per expert (rows of dW are
      // independent), rows m summed in order so the result does not depend on the thread count.
      std::vector<float> acc(static_cast<size_t>(N * K), 0.0f);
#pragma omp parallel for schedule(static)
      for (int64_t n = 0; n < N; ++n) {
        float* row = &acc[static_cast<size_t>(n * K)];
        for (int64_t m = r.start; m < r.start + r.rows; ++m) {
          const float d = A[static_cast<size_t>(m * N + n)];
          const float* x = &B[static_cast<size_t>(m * K)];
          for (int64_t k = 0; k < K; ++k) row[k] += d * x[k];
        }
      }
      for (int64_t i = 0; i < N * K; ++i) {
        const int64_t o = g * N * K + i;
        float v = a.alpha * acc[static_cast<size_t>(i)];
        if (a.beta != 0.0f) v += a.beta * load_f(a.out, o);
        store_f(a.out, o, v);
      }
      continue;
    }
    const bool fwd = a.pass == GemmPass::forward;
    const int64_t Kin = fwd ? K : N, Nout = fwd ? N : K;
    const float* W = &B[static_cast<size_t>(g * N * K)];
#pragma omp parallel for
    for (int64_t m = r.start; m < r.start + r.rows; ++m) {
      const float* in = &A[static_cast<size_t>(m * Kin)];
      std::vector<float> acc(static_cast<size_t>(Nout), 0.0f);
      if (fwd) {  // y[m][n] = sum_k x[m][k] W[n][k]
        for (int64_t n = 0; n < N; ++n) {
          float s = 0;
          for (int64_t k = 0; k < K; ++k) s += in[k] * W[n * K + k];
          acc[static_cast<size_t>(n)] = s;
        }
      } else {  // dx[m][k] = sum_n dy[m][n] W[n][k]
        for (int64_t n = 0; n < N; ++n)
          for (int64_t k = 0; k < K; ++k) acc[static_cast<size_t>(k)] += in[n] * W[n * K + k];
      }
      for (int64_t j = 0; j < Nout; ++j) {
        float v = a.alpha * acc[static_cast<size_t>(j)];
        if (fwd && a.bias.present()) v += load_f(a.bias, g * N + j);
        store_f(a.out, m * Nout + j, v);
      }
    }
  }
}

}  // namespace groupmm::cpu
