// The decode GEMM's setup kernel: the common splits scan (one CTA, any G) with the experts' work
// items (passes x row groups x K ranges; narrow and wide passes counted apart) and their fp32
// accumulator factors.
#include "numerics/w4.hpp"
#include "kernels/common/launch.cuh"
#include "kernels/common/splits_scan.cuh"
#include "gemm/cuda/w4/decode.cuh"

namespace groupmm::cuda::w4 {
namespace {

using PlanConfig = BlockConfig<256>;

struct PlanParams {
  SplitsScanArgs splits;
  DecodePlan plan;
  int64_t* wide_item_start;  // [G + 1] when wide_tokens > 0
  int64_t tokens;            // rows per (narrow) pass
  int64_t wide_tokens;  // rows per wide pass, for the experts of more than `tokens` rows; 0: none
  int64_t items_per_pass;  // row groups x K ranges
  QuantRecipe recipe;
  float alpha;
  const float* s_enc;  // nvfp4 [G]
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) w4_decode_plan_kernel(PlanParams p) {
  // The decode kernel is launched with PDL and waits for the whole plan before reading it.
  pdl_launch_dependents();
  pdl_wait();  // the splits may come from the kernel before
  const DecodePlan& plan = p.plan;
  // Items of the narrow and the wide launch: an expert's passes all of one kind.
  auto items = [&](int64_t rows) {
    const bool wide = p.wide_tokens > 0 && rows > p.tokens;
    const int64_t per = wide ? p.wide_tokens : p.tokens;
    const int64_t n = (rows + per - 1) / per * p.items_per_pass;
    return Counts<2>{{wide ? 0 : n, wide ? n : 0}};
  };
  const SplitsTotals<2> total =
      scan_splits<Cfg::kThreads, 2>(p.splits, items, [&](const ExpertSpan<2>& e) {
        plan.start[e.g] = e.start;
        plan.rows[e.g] = e.rows;
        plan.item_start[e.g] = e.before.v[0];
        if (p.wide_tokens > 0) p.wide_item_start[e.g] = e.before.v[1];
        plan.factor[e.g] = qnum::w4_expert_factor(p.recipe, p.alpha, p.s_enc ? p.s_enc[e.g] : 1.0f);
      });
  if (threadIdx.x == 0) {
    const int64_t G = p.splits.G;
    plan.start[G] = min(total.rows, p.splits.row_bound);
    plan.item_start[G] = total.derived.v[0];
    if (p.wide_tokens > 0) p.wide_item_start[G] = total.derived.v[1];
  }
}

}  // namespace

void launch_decode_plan(Context& ctx, const W4Launch& l, const DecodeGeometry& geo,
                        const DecodePlan& plan, int64_t* wide_item_start) {
  PlanParams p{};
  p.splits.splits = l.splits.data;
  p.splits.splits64 = l.splits.dtype == DType::int64;
  p.splits.G = l.dims.G;
  p.splits.row_bound = l.dims.M;
  p.splits.expected_total = l.dims.M;
  p.splits.total_at_most = l.splits_at_most;
  p.splits.status = ctx.status();
  p.splits.op = OpId::grouped_gemm;
  p.plan = plan;
  p.wide_item_start = wide_item_start;
  p.tokens = 8 * geo.token_tiles;
  p.wide_tokens = 8 * geo.wide_tiles;
  p.items_per_pass = int64_t(geo.row_groups) * geo.ksplit;
  p.recipe = l.recipe;
  p.alpha = l.alpha;
  p.s_enc = l.s_enc;
  launch_pdl(w4_decode_plan_kernel<PlanConfig>, dim3(1), dim3(PlanConfig::kThreads), 0,
             ctx.stream(), p);
}

}  // namespace groupmm::cuda::w4
