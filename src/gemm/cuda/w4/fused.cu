// The 4-bit weight GEMM's fused path (gemm.hpp, W4GemmArgs, path fused): the kernel layer's
// grouped GEMM (kernels/sm90/gathered_gemm.cuh) with 4-bit B, whose producer warps dequantize each
// stage's codes into the bf16 B tile under the MMAs of the stages before it (w4_b_tile.cuh), and
// an epilogue that applies the expert's fp32 factor and the bias. No workspace: the bf16 weights
// exist one stage at a time in shared memory. Graph safe: the kernel reads the splits on the
// device; the grid is sized from M, N, G and the SM count.
#include <algorithm>
#include <cmath>
#include <string>

#include "gemm/w4_backends.hpp"
#include "kernels/common/element.cuh"
#include "kernels/common/launch.cuh"
#include "kernels/common/tma.cuh"
#include "kernels/sm90/gathered_gemm.cuh"
#include "kernels/sm90/quad_transpose.cuh"
#include "numerics/w4.hpp"

namespace groupmm::cuda {
namespace {

using namespace cute;

// The configuration (named once here): cooperative 128 x 256 tiles, 3 stages of 48 KiB plus the
// ring of 8 KiB raw slots of codes.
template <QuantRecipe kRecipe>
using W4FusedCoop =
    sm90::GatheredGemmConfig<cutlass::bfloat16_t, 256, 3, 1, true, 1, false, false, false, kRecipe>;
static_assert(W4FusedCoop<QuantRecipe::mxfp4>::kMaxGroups == kW4FusedMaxGroups,
              "the fused path's expert limit is the kernel's tile tables");
constexpr const char* kW4FusedName = "coop_128x256";

// y[row, n] = bf16(acc * factor_g + bias[g, n]) for the tile's rows below its row count and
// columns below N (N % 8 == 0: an 8-column group is all in or all out).
template <int kTileN>
struct W4StoreEpilogue {
  struct State {};
  uint16_t* out;         // [M, N]
  const uint16_t* bias;  // [G, N] or null
  const float* s_enc;    // nvfp4: [G]
  QuantRecipe recipe;
  float alpha;
  int64_t N;

  __device__ __forceinline__ void prefetch(const sm90::TileCoord&, int, int) const {}

  template <class Accum, class Coords>
  __device__ __forceinline__ void operator()(const Accum& acc, const Coords& coords,
                                             const sm90::TileCoord& t, int row_off, State&) const {
    constexpr int kGroups = kTileN / 8;
    static_assert(size<0, 2>(Accum{}) == kGroups, "m64nNk16 accumulator: N/8 column groups");
    static_assert(size<2>(Accum{}) == 1, "one wgmma N block per tile");
    static_assert(kGroups % 4 == 0, "whole quads of 8-column groups");
    const int q = static_cast<int>(threadIdx.x % 4);
    const float f = qnum::w4_expert_factor(recipe, alpha, s_enc != nullptr ? s_enc[t.g] : 1.0f);
    const int64_t col0 = int64_t(t.ct) * kTileN;
    const uint16_t* brow = bias != nullptr ? bias + int64_t(t.g) * N : nullptr;
    CUTE_UNROLL
    for (int mi = 0; mi < size<1>(Accum{}); ++mi) {
      CUTE_UNROLL
      for (int v1 = 0; v1 < 2; ++v1) {
        const int m = row_off + get<0>(coords(make_coord(0, v1, 0), mi, 0));
        const bool live = m < t.rows;  // warp-uniform loop, divergent stores (shuffles below)
        const int64_t row = t.row0 + m;
        CUTE_UNROLL
        for (int c = 0; c < kGroups; c += 4) {
          uint32_t h[4];
          CUTE_UNROLL
          for (int j = 0; j < 4; ++j) {
            const int64_t n = col0 + get<1>(coords(make_coord(0, v1, c + j), mi, 0));
            float lo = acc(make_coord(0, v1, c + j), mi, 0) * f;
            float hi = acc(make_coord(1, v1, c + j), mi, 0) * f;
            if (brow != nullptr && n < N) {
              const uint32_t b2 = *reinterpret_cast<const uint32_t*>(brow + n);
              lo += __uint_as_float(b2 << 16);
              hi += __uint_as_float(b2 & 0xFFFF0000u);
            }
            h[j] = Bf16::pair_from_floats(lo, hi);
          }
          sm90::quad_transpose(h, q);
          // this lane's 8 columns: group c + q
          const int64_t col = col0 + get<1>(coords(make_coord(0, v1, c + q), mi, 0)) - 2 * q;
          if (live && col < N) sm90::store16(out + row * N + col, h);
        }
      }
    }
  }
};

template <QuantRecipe kRecipe>
void launch_fused(Context& ctx, const W4Launch& l) {
  using Config = W4FusedCoop<kRecipe>;
  using Epi = W4StoreEpilogue<Config::kTileN>;
  const GemmDims& d = l.dims;
  const TensorView x(const_cast<void*>(l.x), DType::bf16, Device::CUDA, {d.M, d.K});
  sm90::GatheredGemmParams p =
      sm90::grouped_gemm_params(x, l.splits, d.G, d.N, ctx.status(), OpId::grouped_gemm);
  p.b_scales = static_cast<const uint8_t*>(l.scales);
  p.b_scale_swizzled = l.L.swizzled;
  p.b_scale_ld = static_cast<int32_t>(l.L.swizzled ? l.L.row_kp : l.L.row_ncols);  // < K
  p.b_scale_tiles = static_cast<int32_t>(qnum::ceil_div(d.N, qnum::kTileRows));    // < N
  // codes [G, N, K / 2] bytes, boxes of 32 bytes (64 codes) by kTileN rows of one expert: zeros
  // past K and past N, never the next expert's rows
  const CUtensorMap tma_b =
      make_tensor_map_3d("grouped_gemm (4-bit weights)", l.w, 1, d.K / 2, d.N, d.G, d.K / 2,
                         d.N * d.K / 2, Config::kTileK / 2, Config::kTileN);
  // x [M, K] in boxes of kTileK x kTileM with the 128-byte swizzle (zeros past M and K). With no
  // rows there is no tile to copy: the map then covers a valid 64-byte line of the codes instead
  // (the kernel still checks the splits).
  const CUtensorMap tma_a =
      d.M > 0 ? make_tensor_map_2d("grouped_gemm (4-bit weights)", l.x, 2, d.K, d.M, d.K * 2,
                                   Config::kTileK, Config::kTileM, /*swizzle128=*/true)
              : make_tensor_map_2d("grouped_gemm (4-bit weights)", l.w, 2, 64, 1, 128,
                                   Config::kTileK, Config::kTileM, /*swizzle128=*/true);
  const Epi epi{static_cast<uint16_t*>(l.out),
                static_cast<const uint16_t*>(l.bias),
                l.s_enc,
                kRecipe,
                l.alpha,
                d.N};
  auto kernel = sm90::gathered_gemm_w4_kernel<Config, Epi>;
  allow_dynamic_smem(ctx, kernel, Config::kSmemBytes);
  // Tiles are at most (M / 128 + G) row tiles times the column tiles (a host-known bound).
  const int64_t tiles_n = qnum::ceil_div(d.N, Config::kTileN);
  const int64_t tiles = (d.M / Config::kTileM + d.G) * tiles_n;
  const int64_t grid =
      std::max<int64_t>(1, std::min<int64_t>(tiles, std::max(ctx.gemm_sm_count(), 1)));
  // The raster band (see moe_gate_up_swiglu's launcher): about sqrt(CTAs * 128 / kTileN) column
  // tiles, so that the A rows and the weight columns in flight stay in L2.
  p.band_n = static_cast<int32_t>(
      std::max(1.0, std::round(std::sqrt(double(grid) * Config::kTileM / Config::kTileN))));
  kernel<<<static_cast<unsigned>(grid), Config::kThreads, Config::kSmemBytes, ctx.stream()>>>(
      p, tma_a, tma_b, epi);
  GROUPMM_CHECK_LAUNCH();
}

}  // namespace

std::string w4_fused_name(const W4Launch& l) {
  return std::string("w4_fused(") + recipe_name(l.recipe) + ", " + kW4FusedName + ")";
}

void w4_fused_gemm(Context& ctx, const W4Launch& l) {
  if (l.recipe == QuantRecipe::nvfp4)
    launch_fused<QuantRecipe::nvfp4>(ctx, l);
  else
    launch_fused<QuantRecipe::mxfp4>(ctx, l);
}

}  // namespace groupmm::cuda
