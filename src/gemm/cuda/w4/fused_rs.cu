// The 4-bit weight GEMM's fused path in the RS form (kernels/sm90/w4_rs_gemm.cuh): the weights
// dequantized by the consumers straight into wgmma's register operand. The fused path's default
// kernel, the scale-warp form (W4GemmArgs::config "" or "rs_sw_256x128"), and the form without
// scale warps ("rs_256x128").
// No workspace; graph safe (the splits are read on the device).
#include <algorithm>
#include <cmath>
#include <string>

#include "gemm/w4_backends.hpp"
#include "kernels/common/launch.cuh"
#include "kernels/common/tma.cuh"
#include "kernels/sm90/w4_rs_gemm.cuh"

namespace groupmm::cuda {
namespace {

// The kernels of this file, each configuration named once: 128 weight rows x 256 tokens a tile,
// 4 stages of 36 KiB (38 with the scale warps' records), a 36 KiB epilogue buffer.
//   rs_sw_256x128  warps 1-3 of the producer warpgroup compute the block multipliers into each
//                  stage (kScaleWarps; the default)
//   rs_256x128     the consumers load the scales and compute the multipliers themselves
template <QuantRecipe kRecipe, bool kScaleWarps>
using W4RsConfig = sm90::W4RsGemmConfig<kRecipe, 256, 4, kScaleWarps>;
static_assert(W4RsConfig<QuantRecipe::mxfp4, false>::kMaxGroups == kW4FusedMaxGroups &&
                  W4RsConfig<QuantRecipe::mxfp4, true>::kMaxGroups == kW4FusedMaxGroups,
              "the fused path's expert limit is the kernel's tile tables");

template <QuantRecipe kRecipe, bool kScaleWarps>
void launch_rs(Context& ctx, const W4Launch& l) {
  using Config = W4RsConfig<kRecipe, kScaleWarps>;
  const GemmDims& d = l.dims;
  sm90::W4RsParams p{};
  p.bias = static_cast<const uint16_t*>(l.bias);
  p.out = static_cast<uint16_t*>(l.out);
  p.scales = static_cast<const uint8_t*>(l.scales);
  p.s_enc = l.s_enc;
  p.splits = l.splits.data;
  p.splits64 = l.splits.dtype == DType::int64;
  p.splits_at_most = l.splits_at_most;
  p.scale_swizzled = l.L.swizzled;
  {
    // swizzled rows start 4-byte aligned and keep 4 columns together; plain rows of scale_ld
    // bytes keep a stage's columns aligned when scale_ld is a multiple of them
    const int64_t per = kRecipe == QuantRecipe::nvfp4 ? 4 : 2;
    const bool aligned = reinterpret_cast<uintptr_t>(l.scales) % 4 == 0;
    p.scale_words = aligned && (l.L.swizzled || l.L.row_ncols % per == 0);
  }
  p.alpha = l.alpha;
  p.scale_ld = static_cast<int32_t>(l.L.swizzled ? l.L.row_kp : l.L.row_ncols);
  p.scale_tiles = static_cast<int32_t>(qnum::ceil_div(d.N, qnum::kTileRows));
  p.M = d.M;
  p.N = d.N;
  p.K = d.K;
  p.G = d.G;
  p.status = ctx.status();
  const char* op = "grouped_gemm (4-bit weights)";
  const CUtensorMap tma_codes = make_tensor_map_3d(
      op, l.w, 1, d.K / 2, d.N, d.G, d.K / 2, d.N * d.K / 2, Config::kTileK / 2, Config::kTileW);
  // x [M, K] in boxes of kTileK x 64 tokens (zeros past M and K); with no rows a valid dummy line
  const CUtensorMap tma_x =
      d.M > 0 ? make_tensor_map_2d(op, l.x, 2, d.K, d.M, d.K * 2, Config::kTileK, Config::kXBoxRows,
                                   /*swizzle128=*/true)
              : make_tensor_map_2d(op, l.w, 2, 64, 1, 128, Config::kTileK, Config::kXBoxRows,
                                   /*swizzle128=*/true);
  auto kernel = sm90::w4_rs_gemm_kernel<Config>;
  allow_dynamic_smem(ctx, kernel, Config::kSmemBytes);
  const int64_t tiles_n = qnum::ceil_div(d.N, Config::kTileW);
  const int64_t tiles = (d.M / Config::kTileT + d.G) * tiles_n;
  const int64_t grid =
      std::max<int64_t>(1, std::min<int64_t>(tiles, std::max(ctx.gemm_sm_count(), 1)));
  p.band_n = static_cast<int32_t>(
      std::max(1.0, std::round(std::sqrt(double(grid) * Config::kTileT / Config::kTileW))));
  kernel<<<static_cast<unsigned>(grid), Config::kThreads, Config::kSmemBytes, ctx.stream()>>>(
      p, tma_x, tma_codes);
  GROUPMM_CHECK_LAUNCH();
}

}  // namespace

void w4_fused_rs_gemm(Context& ctx, const W4Launch& l, bool scale_warps) {
  if (l.recipe == QuantRecipe::nvfp4)
    scale_warps ? launch_rs<QuantRecipe::nvfp4, true>(ctx, l)
                : launch_rs<QuantRecipe::nvfp4, false>(ctx, l);
  else
    scale_warps ? launch_rs<QuantRecipe::mxfp4, true>(ctx, l)
                : launch_rs<QuantRecipe::mxfp4, false>(ctx, l);
}

}  // namespace groupmm::cuda
