// CUDA swizzle_scales: one CTA per 128-row block of an expert's padded scale matrix (rowwise: one
// per 128-row tile of the expert; columnwise: one per (expert, 128 rows of K)). Swizzling writes
// every padded entry (0 for padding); unswizzling writes only the real entries. Every CTA first
// zeroes its share of the destination's slack (slack.cuh).
#include "quantize/backends.hpp"
#include "quantize/cuda/plan.cuh"
#include "quantize/cuda/slack.cuh"

namespace groupmm::cuda {
namespace {

using SwizzleConfig = BlockConfig<256>;

struct SwizzleParams {
  QuantPlan plan;
  int64_t cols;
  int block;
  bool unswizzle;
  uint8_t* plain;
  uint8_t* swz;
  qnum::ScaleSlack slack;  // of the destination, zeroed by every CTA's share
};

__device__ __forceinline__ void zero_dest_slack(const SwizzleParams& p, int64_t block,
                                                int64_t blocks, int threads) {
  zero_scale_slack(p.unswizzle ? p.plain : p.swz, p.slack, p.plan.geom(p.plan.G),
                   block * threads + threadIdx.x, blocks * threads);
}

// blockIdx.x: global row tile (rowwise).
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) swizzle_rows_kernel(SwizzleParams p) {
  const int64_t G = p.plan.G;
  const int64_t t = blockIdx.x;
  zero_dest_slack(p, t, gridDim.x, Cfg::kThreads);
  if (t >= p.plan.tile_start[G]) return;
  const qnum::Geom g = p.plan.geom(find_expert(p.plan.tile_start, G, t));
  const int64_t lt = t - g.tile_start;
  const int64_t C = p.cols, Cp = qnum::round_up(C, 4);
  for (int64_t i = threadIdx.x; i < 128 * Cp; i += Cfg::kThreads) {
    // c fastest for coalesced plain access
    const int64_t r = i / Cp, c = i % Cp, lr = lt * 128 + r;
    const bool valid = lr < g.rows && c < C;
    const int64_t si = qnum::swizzle_128x4(t * 128 + r, c, Cp);
    const int64_t pi = (g.start + lr) * C + c;
    if (!p.unswizzle) {
      p.swz[si] = valid ? p.plain[pi] : 0;
    } else if (valid) {
      p.plain[pi] = p.swz[si];
    }
  }
}

// blockIdx.x: 128-row block of K, blockIdx.y: expert (columnwise [K, nb_g] matrices).
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) swizzle_cols_kernel(SwizzleParams p) {
  zero_dest_slack(p, int64_t(blockIdx.y) * gridDim.x + blockIdx.x, int64_t(gridDim.x) * gridDim.y,
                  Cfg::kThreads);
  const qnum::Geom g = p.plan.geom(blockIdx.y);
  if (g.rows == 0) return;
  const int64_t K = p.cols, nb = qnum::ceil_div(g.rows, p.block), Jp = qnum::round_up(nb, 4);
  const int64_t k0 = int64_t(blockIdx.x) * 128;
  const int64_t sbase = qnum::round_up(K, 128) * g.cs4_start, pbase = K * g.cb_start;
  for (int64_t i = threadIdx.x; i < 128 * Jp; i += Cfg::kThreads) {
    const int64_t k = k0 + i / Jp, j = i % Jp;
    const bool valid = k < K && j < nb;
    const int64_t si = sbase + qnum::swizzle_128x4(k, j, Jp);
    const int64_t pi = pbase + k * nb + j;
    if (!p.unswizzle) {
      p.swz[si] = valid ? p.plain[pi] : 0;
    } else if (valid) {
      p.plain[pi] = p.swz[si];
    }
  }
}

}  // namespace

void swizzle_scales(Context& ctx, const SwizzleScalesArgs& a, const qnum::ScaleSlack& dest_slack,
                    void* ws, size_t) {
  const int64_t G = a.splits.present() ? a.splits.dim(0) : a.groups;
  const QuantPlan plan = plan_view(ws, G);
  QuantPlanArgs pa;
  pa.splits = a.splits;
  pa.rows_total = a.rows_total;
  pa.col_block = a.columnwise ? a.block : 128;
  pa.op = OpId::swizzle_scales;
  launch_quant_plan(ctx, plan, pa);
  SwizzleParams p{plan,
                  a.cols,
                  a.block,
                  a.unswizzle,
                  static_cast<uint8_t*>(a.plain.data),
                  static_cast<uint8_t*>(a.swizzled.data),
                  dest_slack};
  if (a.columnwise) {
    const dim3 grid(static_cast<unsigned>(qnum::ceil_div(a.cols, 128)), static_cast<unsigned>(G));
    swizzle_cols_kernel<SwizzleConfig><<<grid, SwizzleConfig::kThreads, 0, ctx.stream()>>>(p);
  } else {
    const int64_t tiles = qnum::tile_bound(a.rows_total, G);
    swizzle_rows_kernel<SwizzleConfig>
        <<<static_cast<unsigned>(tiles), SwizzleConfig::kThreads, 0, ctx.stream()>>>(p);
  }
  GROUPMM_CHECK_LAUNCH();
}

}  // namespace groupmm::cuda
