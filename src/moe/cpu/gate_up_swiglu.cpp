// CPU references of moe_gate_up_swiglu and moe_down_dgrad_swiglu, by definition the unfused
// compositions: gather the rows through src_row (a zero row for -1), the grouped GEMM's CPU
// reference (forward, or dgrad), weighted_swiglu's CPU reference (forward, or backward). And
// moe_permute_sources: the inverse of the plan's dest_row.
#include <cstring>

#include "base/cpu_util.hpp"
#include "groupmm/gemm.hpp"
#include "moe/backends.hpp"

namespace groupmm::cpu {

namespace {

// rows[r] = x[src_row[r]], a zero row for -1 (another value outside [0, T): a fault of `op`).
Tensor gather_rows(Context& ctx, const TensorView& x, const TensorView& src_row, OpId op) {
  const int64_t T = x.dim(0), H = x.dim(1), R = src_row.dim(0);
  const size_t row_bytes = size_t(H) * size_t(dtype_bits(x.dtype)) / 8;
  Tensor xp = Tensor::empty({R, H}, x.dtype, Device::CPU);
  const int32_t* src = src_row.ptr<int32_t>();
  for (int64_t r = 0; r < R; ++r) {
    uint8_t* dst = static_cast<uint8_t*>(xp.data()) + r * row_bytes;
    const int32_t s = src[r];
    if (s >= 0 && s < T) {
      std::memcpy(dst, static_cast<const uint8_t*>(x.data) + s * row_bytes, row_bytes);
    } else {
      if (s != -1) report_fault_host(ctx.status(), kFaultBadIndex, op, -1, s);
      std::memset(dst, 0, row_bytes);
    }
  }
  return xp;
}

}  // namespace

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

void moe_down_dgrad_swiglu(Context& ctx, const MoeDownDgradArgs& a) {
  const int64_t R = a.src_row.dim(0), F = a.w.dim(2);
  Tensor dyp = gather_rows(ctx, a.dy, a.src_row, OpId::moe_down_dgrad);
  Tensor da = Tensor::empty({R, F}, a.dy.dtype, Device::CPU);
  gemm_dgrad(ctx, dyp.view(), a.w, a.splits, da.view());
  weighted_swiglu_backward(ctx, da.view(), a.gate_up, a.prob, a.dgate_up, a.dprob);
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
