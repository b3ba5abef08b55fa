// CUDA group_quantize / bgrad_group_quantize: plan kernel, per-expert amax pass (fp8_current and
// nvfp4 need the expert's amax before any element is scaled), the tile kernel, and the
// deterministic per-expert reduction of the bias-gradient partial sums. All stream-ordered,
// no host reads, no allocation: graph safe.
#include <type_traits>

#include "cuda/quantize_tile.cuh"

namespace groupmm::cuda {
namespace {

struct AmaxConfig {
  static constexpr int kThreads = 256;
  static_assert(kThreads % 32 == 0, "warps");
};

// One CTA per (128-row tile, 128-column tile), like the quantize kernel; the tile's amax is merged
// into the expert's with an unsigned atomicMax on the canonical bits (exact, order-free).
template <class In, class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads)
    expert_amax_kernel(const In* x, int64_t K, QuantPlan plan, uint32_t* amax_bits) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(In));
  constexpr int kChunksPerRow = 128 / kVec;
  const int64_t G = plan.G;
  const int64_t t = blockIdx.x;
  if (t >= plan.tile_start[G]) return;
  const int64_t gi = find_group(plan.tile_start, G, t);
  const qnum::Geom g = plan.geom(gi);
  const int64_t row0 = (t - g.tile_start) * 128;
  const int valid_rows = static_cast<int>(min(int64_t(128), g.rows - row0));
  const int64_t col0 = int64_t(blockIdx.y) * 128;
  const int valid_cols = static_cast<int>(min(int64_t(128), K - col0));
  const In* xg = x + (g.start + row0) * K + col0;
  uint32_t m = 0;
  for (int i = threadIdx.x; i < 128 * kChunksPerRow; i += Cfg::kThreads) {
    const int r = i / kChunksPerRow, ch = i % kChunksPerRow;
    if (r >= valid_rows || ch * kVec >= valid_cols) continue;
    const uint4 u = __ldcs(reinterpret_cast<const uint4*>(xg + r * K + ch * kVec));
    const In* e = reinterpret_cast<const In*>(&u);
#pragma unroll
    for (int j = 0; j < kVec; ++j)
      m = qnum::amax_merge(m, qnum::abs_bits(tile_detail::to_f<In>(e[j])));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = qnum::amax_merge(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  __shared__ uint32_t warp_max[Cfg::kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < Cfg::kThreads / 32; ++w) m = qnum::amax_merge(m, warp_max[w]);
    if (m != 0) atomicMax(amax_bits + gi, m);
  }
}

struct ReduceConfig {
  static constexpr int kThreads = 256;
  static_assert(kThreads % 32 == 0, "warps");
};

// db[g, k] = sum over the expert's tiles, in tile order, of the per-tile partial sums.
template <class Out, class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads)
    dbias_reduce_kernel(const float* partial, int64_t K, QuantPlan plan, Out* db) {
  const int64_t g = blockIdx.y;
  const int64_t k = int64_t(blockIdx.x) * Cfg::kThreads + threadIdx.x;
  if (k >= K) return;
  float d = 0.0f;
  for (int64_t t = plan.tile_start[g]; t < plan.tile_start[g + 1]; ++t) d += partial[t * K + k];
  d = qnum::canon_nan(d);
  if constexpr (sizeof(Out) == 4) {
    db[g * K + k] = d;
  } else if constexpr (std::is_same_v<Out, __half>) {
    reinterpret_cast<uint16_t*>(db)[g * K + k] = float_to_fp16_bits(d);
  } else {
    reinterpret_cast<uint16_t*>(db)[g * K + k] = float_to_bf16_bits(d);
  }
}

template <class In>
void launch_amax(Context& ctx, const void* x, int64_t M, int64_t K, const QuantPlan& plan,
                 uint32_t* amax_bits) {
  const dim3 grid(static_cast<unsigned>(tile_bound(M, plan.G)),
                  static_cast<unsigned>(qnum::ceil_div(K, 128)));
  expert_amax_kernel<In, AmaxConfig><<<grid, AmaxConfig::kThreads, 0, ctx.stream()>>>(
      static_cast<const In*>(x), K, plan, amax_bits);
  GROUPMM_CHECK_LAUNCH();
}

template <class Out>
void launch_reduce(Context& ctx, const float* partial, int64_t K, const QuantPlan& plan, void* db) {
  const dim3 grid(static_cast<unsigned>(qnum::ceil_div(K, ReduceConfig::kThreads)),
                  static_cast<unsigned>(plan.G));
  dbias_reduce_kernel<Out, ReduceConfig>
      <<<grid, ReduceConfig::kThreads, 0, ctx.stream()>>>(partial, K, plan, static_cast<Out*>(db));
  GROUPMM_CHECK_LAUNCH();
}

}  // namespace

void group_quantize(Context& ctx, const GroupQuantizeArgs& a, const QuantProblem& p,
                    const TensorView& dbias, void* ws, size_t ws_bytes) {
  (void)ws_bytes;  // checked by the caller
  GROUPMM_CHECK(!dbias.present() || p.G <= 65535, "bgrad_group_quantize: G=", p.G,
                " must be <= 65535");
  GROUPMM_CHECK(qnum::ceil_div(p.K, 128) <= 65535, "group_quantize: K=", p.K,
                " must be <= 65535*128");
  const QuantPlan plan = plan_view(ws, p.G);
  const int R = p.L.recipe;
  const bool need_amax = R == qnum::kFp8Current || R == qnum::kNvfp4;
  uint32_t* amax_bits = need_amax ? static_cast<uint32_t*>(a.out.amax.data) : nullptr;
  launch_quant_plan(ctx, plan, a.splits, p.M, p.L.cb, amax_bits, OpId::group_quantize);
  if (need_amax) {
    switch (a.input.dtype) {
      case DType::bf16:
        launch_amax<uint16_t>(ctx, a.input.data, p.M, p.K, plan, amax_bits);
        break;
      case DType::fp16:
        launch_amax<__half>(ctx, a.input.data, p.M, p.K, plan, amax_bits);
        break;
      default:
        launch_amax<float>(ctx, a.input.data, p.M, p.K, plan, amax_bits);
        break;
    }
  }
  TileParams tp{};
  tp.x = a.input.data;
  tp.M = p.M;
  tp.K = p.K;
  tp.plan = plan;
  tp.L = p.L;
  tp.rowwise = p.rowwise;
  tp.colwise = p.columnwise;
  tp.q_row = static_cast<uint8_t*>(a.out.data.data);
  tp.q_col = static_cast<uint8_t*>(a.out.columnwise_data.data);
  tp.s_row = a.out.scale_inv.data;
  tp.s_col = a.out.columnwise_scale_inv.data;
  tp.amax = static_cast<const float*>(a.out.amax.data);
  tp.scale_inv_g = R == qnum::kFp8Current ? static_cast<float*>(a.out.scale_inv.data) : nullptr;
  tp.global_scale = static_cast<float*>(a.out.global_scale.data);
  tp.dbias_partial = dbias.present()
                         ? reinterpret_cast<float*>(static_cast<char*>(ws) + plan_bytes(p.G))
                         : nullptr;
  tp.col_tiles = qnum::ceil_div(p.K, 128);
  tp.status = ctx.status();
  switch (R) {
    case qnum::kFp8Current:
    case qnum::kFp8Block:
      launch_quantize_fp8(ctx, tp, a.input.dtype);
      break;
    case qnum::kMxfp8:
      launch_quantize_mx(ctx, tp, a.input.dtype);
      break;
    default:
      launch_quantize_nvfp4(ctx, tp, a.input.dtype);
      break;
  }
  if (dbias.present()) {
    switch (dbias.dtype) {
      case DType::bf16:
        launch_reduce<uint16_t>(ctx, tp.dbias_partial, p.K, plan, dbias.data);
        break;
      case DType::fp16:
        launch_reduce<__half>(ctx, tp.dbias_partial, p.K, plan, dbias.data);
        break;
      default:
        launch_reduce<float>(ctx, tp.dbias_partial, p.K, plan, dbias.data);
        break;
    }
  }
}

}  // namespace groupmm::cuda
