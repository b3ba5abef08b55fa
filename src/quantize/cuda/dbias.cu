// CUDA group_dbias, deterministic and graph safe, in three launches:
//   1. the quantize family's plan (src/quantize/cuda/plan.cuh): each expert's clamped rows and
//      its first 128-row tile, by the splits rule;
//   2. dbias_tile_sums_kernel: one CTA per (tile, strip of columns): warp s sums rows
//      [16 s, 16 s + 16) of the tile in order, then the 8 segment sums are added in order;
//   3. the shared per-expert reduction (dbias_reduce.cuh): the tile sums in tile order.
// That is dbias.hpp's summation order, the one bgrad_group_quantize uses, bit for bit. Tiles
// never straddle two experts and there are at most tile_bound(M, G) of them (host-known), so a
// skewed routing spreads over the whole GPU without atomics.
#include "quantize/dbias_backends.hpp"
#include "kernels/common/element.cuh"
#include "quantize/cuda/dbias_reduce.cuh"
#include "quantize/cuda/plan.cuh"
#include "quantize/cuda/workspace.cuh"

namespace groupmm::cuda {
namespace {

struct DbiasConfig {
  static constexpr int kTileRows = qnum::kTileRows;
  static constexpr int kSegmentRows = 16;
  static constexpr int kSegments = kTileRows / kSegmentRows;  // one warp each
  static constexpr int kColThreads = 32;
  static constexpr int kThreads = kColThreads * kSegments;
  static_assert(kSegments * kSegmentRows == kTileRows, "segments split a tile");
  static_assert(kThreads <= 1024, "block size");
};

struct TileSumParams {
  const void* dy;
  int64_t N;
  QuantPlan plan;
  float* partial;  // [tile_bound(M, G), N]
};

// blockIdx.x: global row tile; blockIdx.y: a strip of 32 * kVec columns. Residency: 8 CTAs per SM
// (32 registers) for the element-at-a-time variant, 6 (40 registers) for the vector ones.
template <class E, int kVec>
__global__ void __launch_bounds__(DbiasConfig::kThreads, kVec == 1 ? 8 : 6)
    dbias_tile_sums_kernel(TileSumParams p) {
  using Cfg = DbiasConfig;
  using S = typename E::Storage;
  constexpr int kCols = Cfg::kColThreads * kVec;
  __shared__ float segment_sums[Cfg::kSegments][kCols];
  const int64_t G = p.plan.G, t = blockIdx.x;
  if (t >= p.plan.tile_start[G]) return;  // past the tiles of valid rows
  const int64_t g = find_expert(p.plan.tile_start, G, t);
  const int64_t row0 = (t - p.plan.tile_start[g]) * Cfg::kTileRows;  // expert-local
  const int64_t valid_rows = min(int64_t(Cfg::kTileRows), p.plan.rows[g] - row0);
  const int col_thread = threadIdx.x % Cfg::kColThreads, segment = threadIdx.x / Cfg::kColThreads;
  const int64_t col0 = int64_t(blockIdx.y) * kCols + int64_t(col_thread) * kVec;
  float acc[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) acc[i] = 0.0f;
  if (col0 < p.N) {  // kVec > 1 only when N % kVec == 0, so the whole vector is in range
    const S* dy = static_cast<const S*>(p.dy) + (p.plan.start[g] + row0) * p.N + col0;
    const int64_t r1 = min(int64_t(segment + 1) * Cfg::kSegmentRows, valid_rows);
    for (int64_t r = int64_t(segment) * Cfg::kSegmentRows; r < r1; ++r) {
      const ElementVec<E, kVec> x = *reinterpret_cast<const ElementVec<E, kVec>*>(dy + r * p.N);
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[i] += E::to_float(x.v[i]);
    }
  }
#pragma unroll
  for (int i = 0; i < kVec; ++i) segment_sums[segment][col_thread * kVec + i] = acc[i];
  __syncthreads();
  for (int j = threadIdx.x; j < kCols; j += Cfg::kThreads) {
    const int64_t col = int64_t(blockIdx.y) * kCols + j;
    if (col >= p.N) continue;
    float s = 0.0f;
#pragma unroll
    for (int l = 0; l < Cfg::kSegments; ++l) s += segment_sums[l][j];
    p.partial[t * p.N + col] = s;
  }
}

template <class E, int kVec>
void launch_tile_sums(const TileSumParams& p, int64_t tiles, cudaStream_t s) {
  constexpr int64_t kCols = DbiasConfig::kColThreads * kVec;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(qnum::ceil_div(p.N, kCols)));
  dbias_tile_sums_kernel<E, kVec><<<grid, DbiasConfig::kThreads, 0, s>>>(p);
}

QuantWorkspace workspace_of(int64_t M, int64_t N, int64_t G) {
  return QuantWorkspace::of(M, N, G, /*amax_slots=*/false, /*dbias=*/true);
}

}  // namespace

size_t group_dbias_workspace_size(int64_t M, int64_t N, int64_t G) {
  return workspace_of(M, N, G).total();
}

void group_dbias(Context& ctx, const TensorView& dy, const TensorView& splits, const TensorView& db,
                 bool accumulate, SplitsTotal total, void* workspace, size_t) {
  const int64_t M = dy.dim(0), N = dy.dim(1), G = db.dim(0);
  const QuantWorkspace ws = workspace_of(M, N, G);
  const QuantPlan plan = plan_view(QuantWorkspace::plan(workspace), G);
  QuantPlanArgs pa;
  pa.splits = splits;
  pa.rows_total = M;
  pa.total_at_most = total == SplitsTotal::at_most;
  pa.op = OpId::group_dbias;
  launch_quant_plan(ctx, plan, pa);
  if (N == 0) return;
  const TileSumParams p{dy.data, N, plan, ws.dbias_partial(workspace)};
  const int64_t tiles = qnum::tile_bound(M, G);
  dispatch_element(dy.dtype, "group_dbias: dy.dtype", [&](auto e) {
    using E = decltype(e);
    constexpr int kVec = 16 / int(sizeof(typename E::Storage));
    if (N % kVec == 0 && reinterpret_cast<uintptr_t>(dy.data) % 16 == 0) {
      launch_tile_sums<E, kVec>(p, tiles, ctx.stream());
    } else {
      launch_tile_sums<E, 1>(p, tiles, ctx.stream());
    }
  });
  GROUPMM_CHECK_LAUNCH();
  DbiasReduceArgs ra;
  ra.partial = p.partial;
  ra.K = N;
  ra.plan = plan;
  ra.db = db;
  ra.accumulate = accumulate;
  launch_dbias_reduce(ctx, ra);
}

}  // namespace groupmm::cuda
