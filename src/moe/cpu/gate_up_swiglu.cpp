// CPU reference of moe_gate_up_swiglu, by definition the unfused composition: gather x's rows
// through src_row (a zero row for -1), the grouped GEMM's CPU reference, weighted_swiglu_forward's
// CPU reference. And moe_permute_sources: the inverse of the plan's dest_row.
#include "base/cpu_util.hpp"
#include "groupmm/gemm.hpp"
#include "moe/backends.hpp"
#include "moe/cpu/gather_rows.hpp"

namespace groupmm::cpu {

void moe_gate_up_swiglu(Context& ctx, const MoeGateUpArgs& a) {
  const int64_t R = a.src_row.dim(0), F = a.w.dim(1) / 2;
  Tensor xp = gather_rows(ctx, a.x, a.src_row, OpId::moe_gate_up);
  Tensor gu_own;
  TensorView gu = a.gate_up;
  if (!gu.present()) {
    gu_own = Tensor::empty({R, 2 * F}, a.x.dtype, Device::CPU);
    gu = gu_own.view();
  }
  gemm_forward(ctx, xp.view(), a.w, a.splits, gu);
  weighted_swiglu_forward(ctx, gu, a.prob, a.out);
}

void moe_permute_sources(Context&, const PermuteMap& m, const TensorView& src_row,
                         const TensorView& weights, const TensorView& probs) {
  int32_t* src = src_row.ptr<int32_t>();
  for (int64_t r = 0; r < m.rows; ++r) src[r] = -1;
  if (probs.present())
    for (int64_t r = 0; r < m.rows; ++r) probs.ptr<float>()[r] = 0.0f;
  const int32_t* dest = m.dest_row.ptr<int32_t>();
  for (int64_t t = 0; t < m.tokens; ++t)
    for (int64_t j = 0; j < m.topk; ++j) {
      const int64_t d = dest[t * m.topk + j];
      if (d < 0 || d >= m.rows) continue;
      src[d] = int32_t(t);
      if (probs.present()) probs.ptr<float>()[d] = weights.ptr<float>()[t * m.topk + j];
    }
}

}  // namespace groupmm::cpu
