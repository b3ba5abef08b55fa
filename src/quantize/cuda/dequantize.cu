// CUDA group_dequantize. Two kernels, both exact by construction: every element goes through
// qnum::dequant_scale + qnum::dequant_code, the two halves of the CPU reference's dequant_value.
//  - rowwise copy: one thread per 16-element segment of an output row (one scale block holds the
//    whole segment: rowwise blocks are 16, 32 or 128 wide), one 16-byte load (8 for fp4) and
//    16-byte stores (validation requires 16-byte aligned rowwise data and output, K % 16 == 0);
//  - columnwise copy (per expert [K, m_g], the transpose of the output's rows): one block per
//    (128-row expert tile, 64 columns), read along m into shared memory, written along K, so that
//    both sides are coalesced.
// The mxfp8 GEMM path dequantizes both operands with it on every call: bandwidth matters.
#include <cuda_fp16.h>

#include "quantize/backends.hpp"
#include "kernels/common/element.cuh"
#include "quantize/cuda/plan.cuh"

namespace groupmm::cuda {
namespace {

struct DequantConfig {
  static constexpr int kThreads = 256;
  static constexpr int kSeg = 16;        // rowwise: elements per thread
  static constexpr int kTileRows = 128;  // columnwise: the plan's expert-local row tiles
  static constexpr int kTileCols = 64;
  static_assert(kThreads % 32 == 0, "warps");
  static_assert(kTileRows == qnum::kTileRows, "a columnwise tile is one tile of the plan");
  static_assert(kTileRows % 16 == 0, "a 4-row run of a tile stays in one scale block");
  static_assert(kSeg == 16, "one segment is one 16-byte fp8 load and within one scale block");
};

struct DequantParams {
  QuantPlan plan;
  qnum::Layout L;
  int64_t M, K;
  const uint8_t* data;
  const void* scales;
  const float* per_expert;
  void* out;
};

// 16 outputs of a 16-byte aligned segment as 16-byte stores.
template <class E>
__device__ __forceinline__ void store16(typename E::Storage* dst, const float (&v)[16]) {
  alignas(16) typename E::Storage o[16];
#pragma unroll
  for (int j = 0; j < 16; ++j) o[j] = E::from_float(v[j]);
  constexpr int kVecs = int(sizeof(o) / sizeof(uint4));
#pragma unroll
  for (int j = 0; j < kVecs; ++j)
    reinterpret_cast<uint4*>(dst)[j] = reinterpret_cast<const uint4*>(o)[j];
}

// ---- rowwise copy ----------------------------------------------------------------------------
template <class E, class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) dequant_rows_kernel(DequantParams p) {
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
  const qnum::BlockScale s = qnum::dequant_scale(p.L, g, gi, lr, k0, false, p.scales, p.per_expert);
  const int64_t e0 = row * p.K + k0;
  alignas(16) uint8_t codes[16];
  if (qnum::is_fp4(p.L.recipe)) {  // 8 bytes, element 2j in the low nibble
    alignas(8) uint8_t b[8];
    *reinterpret_cast<uint2*>(b) = *reinterpret_cast<const uint2*>(p.data + e0 / 2);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      codes[2 * j] = b[j] & 0xFu;
      codes[2 * j + 1] = b[j] >> 4;
    }
  } else {
    *reinterpret_cast<uint4*>(codes) = *reinterpret_cast<const uint4*>(p.data + e0);
  }
  float v[16];
#pragma unroll
  for (int j = 0; j < 16; ++j) v[j] = qnum::dequant_code(p.L, codes[j], s);
  store16<E>(static_cast<typename E::Storage*>(p.out) + e0, v);
}

// ---- columnwise copy -------------------------------------------------------------------------
// Block (t, c): the plan's row tile t (of some expert), output columns [64 c, 64 c + 64).
template <class E, class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) dequant_cols_kernel(DequantParams p) {
  __shared__ float tile[Cfg::kTileCols][Cfg::kTileRows + 1];  // [k][row], +1: no bank conflicts
  const int64_t G = p.plan.G, t = blockIdx.x;
  if (t >= p.plan.tile_start[G]) return;  // the grid is the host's bound on the tiles
  const int64_t gi = find_expert(p.plan.tile_start, G, t);
  const qnum::Geom g = p.plan.geom(gi);
  if (qnum::is_fp4(p.L.recipe) && (g.rows & 1)) return;  // never quantized
  const int64_t r0 = (t - g.tile_start) * Cfg::kTileRows, k0 = int64_t(blockIdx.y) * Cfg::kTileCols;
  const int rows = g.rows - r0 < Cfg::kTileRows ? int(g.rows - r0) : Cfg::kTileRows;
  const int cols = p.K - k0 < Cfg::kTileCols ? int(p.K - k0) : Cfg::kTileCols;
  // Read: for each column k, the tile's rows are contiguous in the copy ([K, m_g] per expert).
  // A thread takes kRun consecutive rows: they share one scale (blocks along m are 16, 32 or 128
  // rows and start at multiples of 16 of the expert's rows), so the index rule runs once per run.
  constexpr int kRun = 4, kRuns = Cfg::kTileRows / kRun;
  const bool fp4 = qnum::is_fp4(p.L.recipe);
  for (int idx = threadIdx.x; idx < Cfg::kTileCols * kRuns; idx += Cfg::kThreads) {
    const int c = idx / kRuns, r = (idx % kRuns) * kRun;  // r fastest: coalesced
    if (c >= cols || r >= rows) continue;
    const int64_t lr = r0 + r, k = k0 + c;
    const qnum::BlockScale s = qnum::dequant_scale(p.L, g, gi, lr, k, true, p.scales, p.per_expert);
    const int64_t e = p.L.K * g.start + k * g.rows + lr;  // element index in the copy
#pragma unroll
    for (int j = 0; j < kRun; ++j) {
      if (r + j >= rows) break;
      const uint8_t b = p.data[fp4 ? (e + j) / 2 : e + j];
      const uint8_t code = !fp4 ? b : ((e + j) & 1) ? uint8_t(b >> 4) : uint8_t(b & 0xFu);
      tile[c][r + j] = qnum::dequant_code(p.L, code, s);
    }
  }
  __syncthreads();
  // Write: output row lr, columns [k0, k0 + cols): consecutive threads take consecutive columns.
  auto* out = static_cast<typename E::Storage*>(p.out);
  for (int idx = threadIdx.x; idx < Cfg::kTileRows * Cfg::kTileCols; idx += Cfg::kThreads) {
    const int r = idx / Cfg::kTileCols, c = idx % Cfg::kTileCols;
    if (r >= rows || c >= cols) continue;
    out[(g.start + r0 + r) * p.K + k0 + c] = E::from_float(tile[c][r]);
  }
}

}  // namespace

void group_dequantize(Context& ctx, const GroupDequantizeArgs& a, const QuantProblem& p, void* ws,
                      size_t) {
  const QuantPlan plan = plan_view(ws, p.G);
  QuantPlanArgs pa;
  pa.splits = a.in.splits;
  pa.rows_total = p.M;
  pa.total_at_most = a.splits_total == SplitsTotal::at_most;
  pa.col_block = p.L.cb;
  pa.op = OpId::group_dequantize;
  launch_quant_plan(ctx, plan, pa);
  const bool col = a.from_columnwise;
  DequantParams d{};
  d.plan = plan;
  d.L = p.L;
  d.M = p.M;
  d.K = p.K;
  d.data = static_cast<const uint8_t*>(col ? a.in.columnwise_data.data : a.in.data.data);
  d.scales = col ? a.in.columnwise_scale_inv.data : a.in.scale_inv.data;
  d.per_expert =
      p.L.recipe == QuantRecipe::fp8_current ? static_cast<const float*>(a.in.scale_inv.data)
      : p.L.recipe == QuantRecipe::nvfp4     ? static_cast<const float*>(a.in.global_scale.data)
                                             : nullptr;
  d.out = a.out.data;
  using Cfg = DequantConfig;
  if (p.M == 0 || p.K == 0) return;
  dispatch_element(a.out.dtype, "group_dequantize: out.dtype", [&](auto e) {
    using E = decltype(e);
    if (!col) {
      const int64_t n = p.M * (p.K / Cfg::kSeg);
      const auto blocks = static_cast<unsigned>(qnum::ceil_div(n, Cfg::kThreads));
      dequant_rows_kernel<E, Cfg><<<blocks, Cfg::kThreads, 0, ctx.stream()>>>(d);
    } else {
      GROUPMM_CHECK(qnum::ceil_div(p.K, Cfg::kTileCols) <= 65535, "group_dequantize: K=", p.K,
                    " must be at most ", 65535 * Cfg::kTileCols, " to read a columnwise copy");
      const dim3 grid(static_cast<unsigned>(qnum::tile_bound(p.M, p.G)),
                      static_cast<unsigned>(qnum::ceil_div(p.K, Cfg::kTileCols)));
      dequant_cols_kernel<E, Cfg><<<grid, Cfg::kThreads, 0, ctx.stream()>>>(d);
    }
  });
  GROUPMM_CHECK_LAUNCH();
}

}  // namespace groupmm::cuda
