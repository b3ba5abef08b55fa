// The decode GEMM's setup kernel: the common splits scan (CTA 0, any G) with the experts' work
// items (passes x row groups x K ranges; narrow and wide passes counted apart) and their fp32
// accumulator factors; the other CTAs write the activations in fragment order
// (DecodeWorkspace::xp), read by the decode kernel's copies.
#include <algorithm>

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
  const uint16_t* x;   // [M, K] bf16
  uint16_t* xp;        // DecodeWorkspace::xp
  int M, K;
  int pieces;  // 16-byte pieces of xp: steps * M * kChunks * 4
};

// Piece q = ((step * M + row) * kChunks + slot) * 4 + t of xp (DecodeWorkspace::xp): chunk
// c = slot ^ (row % 8) = 4 i + j, the 8 activations of `row` at K = step * kStepK + i * kSubK +
// t * kThreadK + j * kPieceK, in w4_x_pairs order; zeros past K (K % 8 == 0: a piece is all in or
// all out). Consecutive threads write consecutive pieces.
__device__ __forceinline__ void permute_x(const PlanParams& p, int q) {
  using Cfg = DecodeConfig;
  const int t = q & 3, slot = (q >> 2) % Cfg::kChunks, sr = q / (4 * Cfg::kChunks);
  const int step = sr / p.M, row = sr - step * p.M;
  const int c = slot ^ (row & 7);
  const int k = step * Cfg::kStepK + (c / Cfg::kWords) * Cfg::kSubK + t * Cfg::kThreadK +
                (c % Cfg::kWords) * Cfg::kPieceK;
  uint4 o = make_uint4(0, 0, 0, 0);
  if (k < p.K) {
    const uint4 v = *reinterpret_cast<const uint4*>(p.x + int64_t(row) * p.K + k);
    uint32_t w[4];
    qnum::w4_x_pairs(v.x, v.y, v.z, v.w, w);
    o = make_uint4(w[0], w[1], w[2], w[3]);
  }
  reinterpret_cast<uint4*>(p.xp)[q] = o;
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) w4_decode_plan_kernel(PlanParams p) {
  // The decode kernel is launched with PDL and waits for the whole plan before reading it. The
  // x pass's CTAs do not trigger it: it launches once they exit, so its CTAs never wait beside
  // them for registers.
  pdl_wait();  // the splits and x may come from the kernel before
  if (blockIdx.x > 0) {
    const int stride = (gridDim.x - 1) * Cfg::kThreads;
    for (int q = (blockIdx.x - 1) * Cfg::kThreads + threadIdx.x; q < p.pieces; q += stride)
      permute_x(p, q);
    return;
  }
  pdl_launch_dependents();
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
                        const DecodePlan& plan, int64_t* wide_item_start, uint16_t* xp) {
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
  p.x = static_cast<const uint16_t*>(l.x);
  p.xp = xp;
  p.M = static_cast<int>(l.dims.M);
  p.K = static_cast<int>(l.dims.K);
  const int64_t pieces = int64_t(geo.steps) * DecodeConfig::kChunks * l.dims.M * 4;
  GROUPMM_CHECK(pieces < (int64_t(1) << 31) && l.dims.K < (int64_t(1) << 31),
                "grouped_gemm: M=", l.dims.M, ", K=", l.dims.K,
                " exceed the decode path's 32-bit activation indices");
  p.pieces = static_cast<int>(pieces);
  // CTA 0 scans the splits; up to two CTAs an SM permute x (a piece a thread and round).
  const int64_t permute_ctas = std::min<int64_t>(
      qnum::ceil_div(pieces, int64_t(PlanConfig::kThreads)), 2 * int64_t(ctx.sm_count()));
  launch_pdl(w4_decode_plan_kernel<PlanConfig>, dim3(static_cast<unsigned>(1 + permute_ctas)),
             dim3(PlanConfig::kThreads), 0, ctx.stream(), p);
}

}  // namespace groupmm::cuda::w4
