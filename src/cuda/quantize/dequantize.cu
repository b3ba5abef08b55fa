// CUDA group_dequantize: one thread per 16-element row segment of the output; the expert of a row
// comes from a binary search over the device plan. Correctness-first (not a bandwidth target).
#include <cuda_fp16.h>

#include "core/quantize_impl.hpp"
#include "cuda/common/element.cuh"
#include "cuda/quantize/plan.cuh"

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
};

// E: the output element type.
template <class E, class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) dequant_kernel(DequantParams p) {
  const int64_t segs_per_row = p.K / Cfg::kSeg;
  const int64_t i = int64_t(blockIdx.x) * Cfg::kThreads + threadIdx.x;
  if (i >= p.M * segs_per_row) return;
  const int64_t row = i / segs_per_row, k0 = (i % segs_per_row) * Cfg::kSeg;
  const int64_t G = p.plan.G;
  if (row >= p.plan.start[G]) return;  // past sum(splits): unwritten
  const int64_t gi = find_expert(p.plan.start, G, row);
  const qnum::Geom g = p.plan.geom(gi);
  const int64_t lr = row - g.start;
  if (lr >= g.rows) return;
  if (p.col && qnum::is_fp4(p.L.recipe) && (g.rows & 1)) return;  // never quantized
  for (int j = 0; j < Cfg::kSeg; ++j) {
    const float v =
        qnum::dequant_value(p.L, g, gi, lr, k0 + j, p.col, p.data, p.scales, p.per_expert);
    static_cast<typename E::Storage*>(p.out)[row * p.K + k0 + j] = E::from_float(v);
  }
}

}  // namespace

void group_dequantize(Context& ctx, const GroupDequantizeArgs& a, const QuantProblem& p, void* ws,
                      size_t) {
  const QuantPlan plan = plan_view(ws, p.G);
  QuantPlanArgs pa;
  pa.splits = a.in.splits;
  pa.rows_total = p.M;
  pa.col_block = p.L.cb;
  pa.op = OpId::group_dequantize;
  launch_quant_plan(ctx, plan, pa);
  DequantParams d{};
  d.plan = plan;
  d.L = p.L;
  d.M = p.M;
  d.K = p.K;
  d.col = a.from_columnwise;
  d.data = static_cast<const uint8_t*>(d.col ? a.in.columnwise_data.data : a.in.data.data);
  d.scales = d.col ? a.in.columnwise_scale_inv.data : a.in.scale_inv.data;
  d.per_expert =
      p.L.recipe == QuantRecipe::fp8_current ? static_cast<const float*>(a.in.scale_inv.data)
      : p.L.recipe == QuantRecipe::nvfp4     ? static_cast<const float*>(a.in.global_scale.data)
                                             : nullptr;
  d.out = a.out.data;
  const int64_t n = p.M * (p.K / DequantConfig::kSeg);
  if (n == 0) return;
  const auto blocks = static_cast<unsigned>(qnum::ceil_div(n, DequantConfig::kThreads));
  dispatch_element(a.out.dtype, "group_dequantize: out.dtype", [&](auto e) {
    dequant_kernel<decltype(e), DequantConfig>
        <<<blocks, DequantConfig::kThreads, 0, ctx.stream()>>>(d);
  });
  GROUPMM_CHECK_LAUNCH();
}

}  // namespace groupmm::cuda
