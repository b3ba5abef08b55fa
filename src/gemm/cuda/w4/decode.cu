// The decode GEMM's host side: geometry from host-known values, the tensor maps, the launches
// (setup kernel, the decode kernel variant, the split-K reduction), the workspace. Graph safe: no
// host read of splits, grids sized from M, N, K, G.
#include <algorithm>

#include "kernels/common/launch.cuh"
#include "kernels/common/splits_scan.cuh"
#include "kernels/common/tma.cuh"
#include "kernels/common/warp_search.cuh"
#include "gemm/cuda/w4/decode.cuh"

namespace groupmm::cuda::w4 {
namespace {

// The split-K partial sums stay below this many bytes (K is split only for few experts, i.e. few
// rows; the cap only binds for forced decode of large M).
constexpr int64_t kMaxPartialBytes = int64_t(256) << 20;

using ReduceConfig = BlockConfig<256>;

struct ReduceParams {
  const float* partial;  // [ksplit, M, N]
  DecodePlan plan;
  const uint16_t* bias;
  uint16_t* out;
  int64_t M, N, G;
  int ksplit;
};

// y = bf16(sum over K ranges, in order, of the partial sums * factor_g + bias), 4 columns per
// thread (N % 8 == 0). CTA (x, y) takes the columns [4 kThreads x, 4 kThreads (x + 1)) of the
// rows y, y + gridDim.y, ...; a warp's lanes share their row, so its expert is a warp-parallel
// search (find_expert_warp: two rounds of loads for 128 experts where one thread's search took
// seven), issued after the partial sums' loads. Rows past the splits' sum are left unwritten.
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) w4_reduce_kernel(ReduceParams p) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t n = (int64_t(blockIdx.x) * Cfg::kThreads + threadIdx.x) * 4;
  const bool in = n < p.N;
  const int64_t rows = p.plan.start[p.G];
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (in) {
      s = *reinterpret_cast<const float4*>(p.partial + row * p.N + n);
      for (int ks = 1; ks < p.ksplit; ++ks) {
        const float4 v = *reinterpret_cast<const float4*>(p.partial + (ks * p.M + row) * p.N + n);
        s.x += v.x;
        s.y += v.y;
        s.z += v.z;
        s.w += v.w;
      }
    }
    const int64_t g = find_expert_warp(p.plan.start, p.G, row, lane);  // all 32 lanes
    if (!in) continue;
    const float f = p.plan.factor[g];
    float v[4] = {s.x * f, s.y * f, s.z * f, s.w * f};
    uint16_t o[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (p.bias != nullptr) v[j] += bf16_bits_to_float(p.bias[g * p.N + n + j]);
      o[j] = float_to_bf16_bits(v[j]);
    }
    *reinterpret_cast<uint2*>(p.out + row * p.N + n) =
        make_uint2(o[0] | (uint32_t(o[1]) << 16), o[2] | (uint32_t(o[3]) << 16));
  }
}

DecodeLaunch find_launch(QuantRecipe r, int token_tiles) {
  return r == QuantRecipe::nvfp4 ? decode_launch<QuantRecipe::nvfp4>(token_tiles)
                                 : decode_launch<QuantRecipe::mxfp4>(token_tiles);
}

}  // namespace

std::string DecodeGeometry::to_string() const {
  const std::string wide =
      wide_tiles > 0 ? detail::cat(" (", 8 * wide_tiles, " above ", 8 * token_tiles, " rows)") : "";
  const std::string grids =
      wide_tiles > 0 ? detail::cat(grid, " + ", wide_grid) : detail::cat(grid);
  return detail::cat(8 * token_tiles, " tokens/pass", wide, ", ", row_groups,
                     " row groups, split-K ", ksplit, ", grid ", grids);
}

// Tokens per pass from the average expert (or forced: W4Launch::decode_tokens). A pass costs
// nearly as much for 8 rows as for 16 (the dequantization, not the rows), so an expert with more
// rows than a pass takes wider ones: when the average expert fills more than half a pass, a
// routing's spread leaves many experts above it, and they run as a second launch of the
// twice-wider variant. K split when the items of a balanced routing would not fill the
// persistent grid twice; at most kMaxPartialBytes of partial sums. The pass and the split are
// sized by the rows the splits are expected to reach (W4Launch::expected_rows, else M); the
// bounds (items, partial sums) by M.
DecodeGeometry decode_geometry(const W4Launch& l, int sm_count) {
  const GemmDims& d = l.dims;
  DecodeGeometry geo;
  const int64_t rows = l.expected_rows > 0 ? l.expected_rows : d.M;
  const int64_t avg = qnum::ceil_div(rows, std::max<int64_t>(d.G, 1));
  geo.token_tiles = l.decode_tokens > 0 ? l.decode_tokens / 8 : avg <= 8 ? 1 : avg <= 16 ? 2 : 4;
  if (l.decode_tokens == 0 && geo.token_tiles < 4 && 2 * avg > 8 * geo.token_tiles)
    geo.wide_tiles = 2 * geo.token_tiles;
  const int64_t tokens = 8 * geo.token_tiles;
  geo.row_groups = static_cast<int>(qnum::ceil_div(d.N, DecodeConfig::kRows));
  geo.steps = static_cast<int>(qnum::ceil_div(d.K, DecodeConfig::kStepK));
  auto resident_ctas = [&](int tiles) {
    return int64_t(std::max(sm_count, 1)) * decode_blocks_per_sm(tiles);
  };
  const int64_t resident = resident_ctas(geo.token_tiles);
  const int64_t active = std::max<int64_t>(1, std::min(d.G, rows));
  const int64_t balanced_items =
      geo.row_groups * active * std::max<int64_t>(1, qnum::ceil_div(rows, active * tokens));
  int64_t ksplit = 1;
  if (balanced_items < 2 * resident)
    ksplit = std::min<int64_t>(geo.steps, qnum::ceil_div(2 * resident, balanced_items));
  while (ksplit > 1 && ksplit * d.M * d.N * 4 > kMaxPartialBytes) --ksplit;
  geo.steps_per_split = static_cast<int>(qnum::ceil_div(geo.steps, ksplit));
  geo.ksplit = static_cast<int>(qnum::ceil_div(geo.steps, geo.steps_per_split));  // none empty
  // Items of any routing in passes of 8 * tiles rows: sum over experts of ceil(m_g / pass).
  auto item_bound = [&](int tiles) {
    return (qnum::ceil_div(d.M, 8 * tiles) + std::min(d.G, d.M)) * geo.row_groups * geo.ksplit;
  };
  geo.item_bound = item_bound(geo.token_tiles);
  geo.grid = static_cast<int>(std::min<int64_t>(geo.item_bound, resident));
  if (geo.wide_tiles > 0) {
    geo.wide_item_bound = item_bound(geo.wide_tiles);
    geo.wide_grid =
        static_cast<int>(std::min<int64_t>(geo.wide_item_bound, resident_ctas(geo.wide_tiles)));
  }
  return geo;
}

}  // namespace groupmm::cuda::w4

namespace groupmm::cuda {

using namespace w4;

std::string w4_decode_name(const W4Launch& l, int sm_count) {
  return detail::cat("w4_decode(", recipe_name(l.recipe), ", ",
                     decode_geometry(l, sm_count).to_string(), ")");
}

size_t w4_decode_workspace_size(const W4Launch& l, int sm_count) {
  const DecodeGeometry geo = decode_geometry(l, sm_count);
  return DecodeWorkspace::plan_bytes(l.dims.G) + DecodeWorkspace::xp_bytes(l.dims.M, geo.steps) +
         DecodeWorkspace::partial_bytes(l.dims.M, l.dims.N, geo.ksplit);
}

void w4_decode_gemm(Context& ctx, const W4Launch& l, void* ws, size_t) {
  const GemmDims& d = l.dims;
  const DecodeGeometry geo = decode_geometry(l, ctx.sm_count());
  GROUPMM_CHECK(geo.item_bound + geo.grid < (int64_t(1) << 31) &&
                    geo.wide_item_bound + geo.wide_grid < (int64_t(1) << 31),
                "grouped_gemm: M=", d.M, ", N=", d.N, " gives too many decode items (",
                std::max(geo.item_bound, geo.wide_item_bound), ")");
  GROUPMM_CHECK(d.G * d.N < (int64_t(1) << 31), "grouped_gemm: G * N = ", d.G, " * ", d.N,
                " weight rows exceed the decode kernel's 32-bit copy coordinates");
  DecodeParams p{};
  p.plan = DecodeWorkspace::plan(ws, d.G);
  int64_t* wide_item_start = DecodeWorkspace::wide_item_start(ws, d.G);
  uint16_t* xp = DecodeWorkspace::xp(ws, d.G);
  launch_decode_plan(ctx, l, geo, p.plan, wide_item_start, xp);
  if (geo.grid == 0) return;  // no rows
  p.w = W4Weights::of(l);
  p.bias = static_cast<const uint16_t*>(l.bias);
  p.out = static_cast<uint16_t*>(l.out);
  p.partial = geo.ksplit > 1 ? DecodeWorkspace::partial(ws, d.G, d.M, geo.steps) : nullptr;
  p.M = d.M;
  p.N = d.N;
  p.K = d.K;
  p.G = d.G;
  p.row_groups = geo.row_groups;
  p.ksplit = geo.ksplit;
  p.steps = geo.steps;
  p.steps_per_split = geo.steps_per_split;
  {  // row_scale_col_offset is linear in the column for whole groups of 4 columns
    const int blk = l.recipe == QuantRecipe::nvfp4 ? 16 : 32;
    const int step_cols = DecodeConfig::kStepK / blk, sub_cols = DecodeConfig::kSubK / blk;
    static_assert(DecodeConfig::kSubK / 32 % 4 == 0, "sub-blocks hold whole 4-column groups");
    p.scale_step = static_cast<int>(qnum::row_scale_col_offset(l.L, step_cols));
    p.scale_sub = static_cast<int>(qnum::row_scale_col_offset(l.L, sub_cols));
    // The scale index's strides, from the layout's own (row, tile, expert) index.
    auto index = [&](int64_t g, int64_t lt, int r) {
      const qnum::Geom geom{g * d.N, d.N, g * p.w.tiles_per_expert, 0, 0};
      return qnum::row_scale_index_in_tile(l.L, geom, lt, r, 0);
    };
    p.scale_row8 = static_cast<int>(index(0, 0, 8) - index(0, 0, 0));
    p.scale_tile = index(0, 1, 0) - index(0, 0, 0);
    p.scale_expert = index(1, 0, 0) - index(0, 0, 0);
  }
  DecodeTmaParams tp{};
  tp.p = p;
  tp.codes = make_tensor_map_2d("grouped_gemm (decode, w.data)", l.w, 1, d.K / 2, d.G * d.N,
                                d.K / 2, DecodeConfig::kSubK / 2, DecodeConfig::kRows);
  // The activations in fragment order ([steps * M, kStepK]), in boxes of one pass's rows.
  GROUPMM_CHECK(int64_t(geo.steps) * d.M < (int64_t(1) << 31), "grouped_gemm: M=", d.M, ", K=", d.K,
                " exceed the decode kernel's 32-bit activation coordinates");
  auto x_map = [&](int tiles) {
    return make_tensor_map_2d("grouped_gemm (decode, x)", xp, 2, DecodeConfig::kStepK,
                              int64_t(geo.steps) * d.M, DecodeConfig::kXRowBytes,
                              DecodeConfig::kStepK, 8 * tiles);
  };
  tp.x = x_map(geo.token_tiles);
  find_launch(l.recipe, geo.token_tiles)(ctx, tp, geo.grid);
  if (geo.wide_tiles > 0) {  // the same plan but for its item prefix sums; other output rows
    tp.p.plan.item_start = wide_item_start;
    tp.x = x_map(geo.wide_tiles);
    find_launch(l.recipe, geo.wide_tiles)(ctx, tp, geo.wide_grid);
  }
  if (geo.ksplit == 1) return;
  ReduceParams r{p.partial, p.plan, p.bias, p.out, d.M, d.N, d.G, geo.ksplit};
  const dim3 grid(static_cast<unsigned>(qnum::ceil_div(d.N / 4, int64_t(ReduceConfig::kThreads))),
                  static_cast<unsigned>(std::clamp<int64_t>(d.M, 1, 65535)));
  w4_reduce_kernel<ReduceConfig><<<grid, ReduceConfig::kThreads, 0, ctx.stream()>>>(r);
  GROUPMM_CHECK_LAUNCH();
}

}  // namespace groupmm::cuda
