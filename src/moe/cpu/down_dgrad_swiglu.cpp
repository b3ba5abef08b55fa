// CPU reference of moe_down_dgrad_swiglu, by definition the unfused composition: gather dy's rows
// through src_row (a zero row for -1: unpermute's backward), the grouped GEMM's dgrad CPU
// reference, weighted_swiglu_backward's CPU reference.
#include "groupmm/gemm.hpp"
#include "moe/backends.hpp"
#include "moe/cpu/gather_rows.hpp"

namespace groupmm::cpu {

void moe_down_dgrad_swiglu(Context& ctx, const MoeDownDgradArgs& a) {
  const int64_t R = a.src_row.dim(0), F = a.w.dim(2);
  Tensor dyp = gather_rows(ctx, a.dy, a.src_row, OpId::moe_down_dgrad);
  Tensor da = Tensor::empty({R, F}, a.dy.dtype, Device::CPU);
  gemm_dgrad(ctx, dyp.view(), a.w, a.splits, da.view());
  weighted_swiglu_backward(ctx, da.view(), a.gate_up, a.prob, a.dgate_up, a.dprob);
}

}  // namespace groupmm::cpu
