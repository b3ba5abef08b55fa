// The quantize plan kernel: the common splits scan (one CTA, any G) with the quantize family's
// per-expert counts.
#include "quantize/cuda/plan.cuh"
#include "quantize/cuda/workspace.cuh"

namespace groupmm::cuda {
namespace {

using PlanConfig = BlockConfig<256>;

struct PlanParams {
  QuantPlan plan;
  SplitsScanArgs splits;
  int64_t col_block;
  int col_block_shift;  // log2(col_block)
  uint32_t* amax_bits;
  uint32_t* amax_slots;
  int64_t slot_count;
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) quant_plan_kernel(PlanParams p) {
  // The kernels after the plan are launched with PDL and wait for the whole plan before reading
  // it: let them start launching now. The plan is launched the same way (its launch overlaps the
  // previous kernel's tail) and waits for that kernel before it reads the splits or writes the
  // plan (which that kernel may still read).
  pdl_launch_dependents();
  pdl_wait();
  // The fused amax slots first: their count is host-known, so the stores overlap the scan.
  if (p.amax_slots != nullptr)
    for (int64_t i = threadIdx.x; i < p.slot_count; i += Cfg::kThreads)
      p.amax_slots[i] = kSlotEmpty;
  // Per expert: 128-row tiles, column blocks, column blocks padded to 4 (swizzled scales).
  auto derive = [&](int64_t rows) {
    const int64_t blocks = (rows + p.col_block - 1) >> p.col_block_shift;
    return Counts<3>{{qnum::ceil_div(rows, qnum::kTileRows), blocks, qnum::round_up(blocks, 4)}};
  };
  const QuantPlan& plan = p.plan;
  const SplitsTotals<3> total =
      scan_splits<Cfg::kThreads, 3>(p.splits, derive, [&](const ExpertSpan<3>& e) {
        plan.start[e.g] = e.start;
        plan.rows[e.g] = e.rows;
        plan.tile_start[e.g] = e.before.v[0];
        plan.cb_start[e.g] = e.before.v[1];
        plan.cs4_start[e.g] = e.before.v[2];
        if (p.amax_bits) p.amax_bits[e.g] = 0;
      });
  if (threadIdx.x == 0) {
    const int64_t G = plan.G;
    plan.start[G] = min(total.rows, p.splits.row_bound);
    plan.rows[G] = 0;
    plan.tile_start[G] = total.derived.v[0];
    plan.cb_start[G] = total.derived.v[1];
    plan.cs4_start[G] = total.derived.v[2];
    *plan.ticket = 0;
  }
}

}  // namespace

QuantPlan plan_view(void* plan_part, int64_t G) {
  int64_t* b = static_cast<int64_t*>(plan_part);
  const int64_t n = G + 1;
  return {b, b + n, b + 2 * n, b + 3 * n, b + 4 * n, reinterpret_cast<uint32_t*>(b + 5 * n), G};
}

size_t quant_plan_workspace_size(int64_t G) {
  return QuantWorkspace::plan_size(G);
}

void launch_quant_plan(Context& ctx, const QuantPlan& plan, const QuantPlanArgs& a) {
  const int shift = qnum::log2_exact(a.col_block);
  GROUPMM_CHECK(shift >= 0, "quant plan: column block ", a.col_block, " must be a power of two");
  PlanParams p{};
  p.plan = plan;
  p.splits.splits = a.splits.present() ? a.splits.data : nullptr;
  p.splits.splits64 = a.splits.present() && a.splits.dtype == DType::int64;
  p.splits.G = plan.G;
  p.splits.uniform_rows = a.rows_total / plan.G;
  p.splits.row_bound = a.rows_total;
  p.splits.expected_total = a.splits.present() ? a.rows_total : -1;
  p.splits.total_at_most = a.total_at_most;
  p.splits.status = ctx.status();
  p.splits.op = a.op;
  p.col_block = a.col_block;
  p.col_block_shift = shift;
  p.amax_bits = a.amax_bits;
  p.amax_slots = a.amax_slots;
  p.slot_count = a.amax_slots != nullptr ? a.slot_count : 0;
  launch_pdl(quant_plan_kernel<PlanConfig>, dim3(1), dim3(PlanConfig::kThreads), 0, ctx.stream(),
             p);
}

}  // namespace groupmm::cuda
