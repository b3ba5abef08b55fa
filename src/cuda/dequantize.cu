// CUDA group_dequantize: one thread per 16-element row segment of the output; the expert of a row
// comes from a binary search over the device plan. Correctness-first (not a bandwidth target).
#include <cuda_fp16.h>

#include "core/quantize_impl.hpp"
#include "cuda/quantize_plan.cuh"

namespace groupmm::cuda {
namespace {

struct DequantConfig {
  static constexpr int kThreads = 256;
  static constexpr int kSeg = 16;
  static_assert(kThreads % 32 == 0, "warps");
};

struct DequantParams {
  QuantPlan plan;
  qnum::Layout L;
  int64_t M, K;
  bool col;
  const uint8_t* data;
  const void* scales;
  const float* per_expert;
  void* out;
  DType out_dtype;
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) dequant_kernel(DequantParams p) {
  const int64_t segs_per_row = p.K / Cfg::kSeg;
  const int64_t i = int64_t(blockIdx.x) * Cfg::kThreads + threadIdx.x;
  if (i >= p.M * segs_per_row) return;
  const int64_t row = i / segs_per_row, k0 = (i % segs_per_row) * Cfg::kSeg;
  const int64_t G = p.plan.G;
  if (row >= p.plan.start[G]) return;  // past sum(splits): unwritten
  const int64_t gi = find_group(p.plan.start, G, row);
  const qnum::Geom g = p.plan.geom(gi);
  const int64_t lr = row - g.start;
  if (lr >= g.rows) return;
  if (p.col && p.L.recipe == qnum::kNvfp4 && (g.rows & 1)) return;  // never quantized
  for (int j = 0; j < Cfg::kSeg; ++j) {
    const float v =
        qnum::dequant_value(p.L, g, gi, lr, k0 + j, p.col, p.data, p.scales, p.per_expert);
    const int64_t e = row * p.K + k0 + j;
    if (p.out_dtype == DType::fp32) {
      static_cast<float*>(p.out)[e] = v;
    } else if (p.out_dtype == DType::bf16) {
      static_cast<uint16_t*>(p.out)[e] = float_to_bf16_bits(v);
    } else {
      static_cast<uint16_t*>(p.out)[e] = float_to_fp16_bits(v);
    }
  }
}

}  // namespace

void group_dequantize(Context& ctx, const GroupDequantizeArgs& a, const QuantProblem& p, void* ws,
                      size_t) {
  const QuantPlan plan = plan_view(ws, p.G);
  launch_quant_plan(ctx, plan, a.in.splits, p.M, p.L.cb, nullptr, OpId::group_dequantize);
  DequantParams d{};
  d.plan = plan;
  d.L = p.L;
  d.M = p.M;
  d.K = p.K;
  d.col = a.from_columnwise;
  d.data = static_cast<const uint8_t*>(d.col ? a.in.columnwise_data.data : a.in.data.data);
  d.scales = d.col ? a.in.columnwise_scale_inv.data : a.in.scale_inv.data;
  d.per_expert = p.L.recipe == qnum::kFp8Current ? static_cast<const float*>(a.in.scale_inv.data)
                 : p.L.recipe == qnum::kNvfp4    ? static_cast<const float*>(a.in.global_scale.data)
                                                 : nullptr;
  d.out = a.out.data;
  d.out_dtype = a.out.dtype;
  const int64_t n = p.M * (p.K / DequantConfig::kSeg);
  if (n == 0) return;
  const int64_t blocks = qnum::ceil_div(n, DequantConfig::kThreads);
  dequant_kernel<DequantConfig>
      <<<static_cast<unsigned>(blocks), DequantConfig::kThreads, 0, ctx.stream()>>>(d);
  GROUPMM_CHECK_LAUNCH();
}

}  // namespace groupmm::cuda
