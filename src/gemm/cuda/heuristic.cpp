// The cutlass_sm90 heuristic (heuristic.hpp): a short decision tree over the host-known shapes,
// naming configurations by their configs.def identifiers. Each threshold is a named constant whose
// comment states what it separates; the measurements behind it are the docs/decisions.md entry it
// names.
#include "gemm/cuda/heuristic.hpp"

namespace groupmm::cuda {
namespace {

using C = GemmConfig;

// ---- thresholds ---------------------------------------------------------------------------------

// A 16-bit forward with at most this many rows per expert (M / G, rounded down: the decode case)
// swaps its operands: the weight rows fill the 128-wide M tile and the tokens a 32-wide N tile,
// so the problem streams each weight once; with more rows the swapped tile runs several times
// per expert. docs/decisions.md, "GEMM heuristic: small-M swap-AB threshold".
constexpr int64_t kSwapMaxRowsPerExpert = 32;

// The FP8 forward swaps up to this many rows per expert (M <= this * G).
// docs/decisions.md, "GEMM FP8 heuristic: swap-AB threshold at 64 rows".
constexpr int64_t kFp8SwapMaxRowsPerExpert = 64;

// A bf16 forward whose reduction K is at most this long runs the 128x128 ping-pong tile: the
// epilogue is then a large share of each tile and ping-pong overlaps it with the other
// warpgroup's mainloop; a longer reduction favors the wide tile's operand reuse.
// docs/decisions.md, "GEMM heuristic: short-reduction forward on a ping-pong tile".
constexpr int64_t kPingPongForwardMaxK = 1536;

// A bf16 forward whose expert weight (N * K elements) is at least this large, far larger than L2,
// pairs its cluster along M so that the pair shares each weight tile; so does one whose N tiles
// are odd in number (a pair along N would idle a CTA).
// docs/decisions.md, "GEMM heuristic: forward 2x1 cluster for odd N tiles or huge experts".
constexpr int64_t kHugeExpertWeightElements = int64_t(64) << 20;

// The bf16 wgrad's 128x128 ping-pong tile serves experts of at least this many rows (the
// reduction per expert); below it the tile count is the cost and the cooperative tile wins. The
// lower bound of the split's ping-pong class, and of the ragged-width rule. docs/decisions.md,
// "GEMM heuristic: per-expert tile classes for wgrad (the split)" and "GEMM heuristic: 128x192
// wgrad for widths 192 divides and 256 does not".
constexpr int64_t kWgradPingPongMinRows = 129;

// The upper bound of the split's ping-pong class. Into bf16 the cooperative tile writes dW through
// a 128x128 epilogue subtile, which makes it the faster tile from fewer rows than into fp32.
// docs/decisions.md, "GEMM heuristic: the split's class bound, 768 rows into bf16".
constexpr int64_t kWgradPingPongMaxRowsBf16 = 768;
constexpr int64_t kWgradPingPongMaxRowsF32 = 1024;

// The split runs where experts of both classes are likely: an average number of rows per expert
// in this range. docs/decisions.md, "GEMM heuristic: per-expert tile classes for wgrad (the
// split)".
constexpr int64_t kWgradSplitMinAvgRows = 65;
constexpr int64_t kWgradSplitMaxAvgRows = 1024;

// A wgrad visits its tiles across N' when its output grid (tile rows by tile columns of the
// cooperative wgrad tile) is at least kAlongNTallNum / kAlongNTallDen times taller than wide.
// docs/decisions.md, "GEMM heuristic: wgrad tile order across N' for tall output grids".
constexpr int64_t kAlongNTallNum = 3;
constexpr int64_t kAlongNTallDen = 2;

// ---- the tiles the rules measure shapes against -------------------------------------------------
constexpr const sm90::KernelRow& kForwardTile = kernel_row(C::fwd_bf16_128x256_coop_c12);
constexpr const sm90::KernelRow& kWgradTile = kernel_row(C::wgrad_bf16_bf16_128x256_coop_c21);
constexpr const sm90::KernelRow& kWgradTile192 = kernel_row(C::wgrad_bf16_bf16_128x192_coop_c21);

// Tiles along a dimension of `n` for a tile `t` wide.
constexpr int64_t tiles(int64_t n, int64_t t) {
  return (n + t - 1) / t;
}

GemmConfig heuristic_16bit(const GemmLaunch& l) {
  const bool bf = l.a_dtype == DType::bf16;
  const bool f32 = l.out_dtype == DType::fp32;
  const GemmDims& d = l.dims;
  // Average rows per expert: host-known (M, or the rows the splits are expected to reach, and G),
  // unlike the split values.
  const int64_t M = l.expected_rows > 0 ? l.expected_rows : d.M;
  const int64_t rows = d.G > 0 ? M / d.G : 0;
  switch (l.pass) {
    case GemmPass::forward:
      // Into fp32: the cooperative kernel at every size (the swapped kernel writes 16-bit only).
      if (f32) return bf ? C::fwd_bf16_f32_128x256_coop_c12 : C::fwd_fp16_f32_128x256_coop_c12;
      if (rows <= kSwapMaxRowsPerExpert)
        return bf ? C::fwdswap_bf16_128x32_pp_c11 : C::fwdswap_fp16_128x32_pp_c11;
      if (bf && d.K <= kPingPongForwardMaxK) return C::fwd_bf16_128x128_pp_c12;
      if (bf &&
          (tiles(d.N, kForwardTile.tile_n) % 2 == 1 || d.N * d.K >= kHugeExpertWeightElements))
        return C::fwd_bf16_128x256_coop_c21;
      return bf ? C::fwd_bf16_128x256_coop_c12 : C::fwd_fp16_128x256_coop_c12;
    case GemmPass::dgrad:
      if (f32) return bf ? C::dgrad_bf16_f32_128x256_coop_c11 : C::dgrad_fp16_f32_128x256_coop_c11;
      return bf ? C::dgrad_bf16_128x256_coop_c11 : C::dgrad_fp16_128x256_coop_c11;
    case GemmPass::wgrad:
      // fp16 keeps the base tiles (fp16 MoE training is rare: a kernel less each to compile).
      if (!bf)
        return f32 ? C::wgrad_fp16_f32_128x256_coop_c21 : C::wgrad_fp16_fp16_128x256_coop_c21;
      // An output width K that the cooperative tile does not cover wastes a share of its tiles:
      // the 128-wide ping-pong tile for every expert, or into bf16 the 128x192 tile where 192
      // divides K (into fp32 that tile is no faster than ping-pong: docs/decisions.md, "GEMM
      // bf16: 128x192 wgrad into fp32 (not kept)").
      if (d.K % kWgradTile.tile_n != 0 && rows >= kWgradPingPongMinRows) {
        if (f32) return C::wgrad_bf16_f32_128x128_pp_c21;
        return d.K % kWgradTile192.tile_n == 0 ? C::wgrad_bf16_bf16_128x192_coop_c21
                                               : C::wgrad_bf16_bf16_128x128_pp_c21;
      }
      if (rows >= kWgradSplitMinAvgRows && rows <= kWgradSplitMaxAvgRows)
        return f32 ? C::wgrad_bf16_f32_split_pp128x128_coop128x256
                   : C::wgrad_bf16_bf16_split_pp128x128_coop128x256;
      return f32 ? C::wgrad_bf16_f32_128x256_coop_c21 : C::wgrad_bf16_bf16_128x256_coop_c21;
  }
  GROUPMM_CHECK(false, "grouped_gemm: unknown pass");
  return C{};
}

// The kernel row that computes the launch, swapped or not (configs.hpp asserts there is at most
// one of each for a scaled recipe).
std::optional<GemmConfig> scaled_kernel(const GemmLaunch& l, bool swapped) {
  for (int i = 0; i < kKernelCount; ++i)
    if (serves(kKernelRows[i], l) && (kKernelRows[i].role == sm90::Role::forward_swap) == swapped)
      return GemmConfig(i);
  return std::nullopt;
}

// Scaled operands: the one kernel of the launch's kind, or for a decode-sized forward (M, or the
// rows the splits are expected to reach) its swapped kernel where the kind has one.
GemmConfig heuristic_scaled(const GemmLaunch& l) {
  const int64_t M = l.expected_rows > 0 ? l.expected_rows : l.dims.M;
  const bool decode = l.pass == GemmPass::forward && M <= kFp8SwapMaxRowsPerExpert * l.dims.G;
  std::optional<GemmConfig> c = scaled_kernel(l, decode);
  if (!c) c = scaled_kernel(l, !decode);
  GROUPMM_CHECK(c.has_value(), "grouped_gemm: no scaled kernel computes ",
                describe_kind(l.pass, l.a_dtype, l.b_dtype, l.out_dtype, l.recipe),
                l.fast_accum ? " with fast accumulation" : "");
  return *c;
}

// A split's inside class (lo > hi: not a split).
constexpr SplitRows split_class(GemmConfig split) {
  switch (split) {
    case C::wgrad_bf16_bf16_split_pp128x128_coop128x256:
      return {kWgradPingPongMinRows, kWgradPingPongMaxRowsBf16};
    case C::wgrad_bf16_f32_split_pp128x128_coop128x256:
      return {kWgradPingPongMinRows, kWgradPingPongMaxRowsF32};
    default:
      return {1, 0};
  }
}
#define GROUPMM_GEMM_SPLIT(name, ...)                               \
  static_assert(split_class(C::name).lo <= split_class(C::name).hi, \
                "heuristic.cpp: the split " #name                   \
                " of configs.def has no "                           \
                "row class in split_class()");
#include "gemm/cuda/configs.def"

}  // namespace

GemmConfig heuristic_config(const GemmLaunch& l) {
  return l.recipe == QuantRecipe::none ? heuristic_16bit(l) : heuristic_scaled(l);
}

// Every expert's dW is the same grid of tm by tn tiles; only the reduction (its tokens) differs,
// and a tile reads a dy block (tile_m columns) and an x block (tile_n columns) of the expert's
// tokens. A wave of W CTAs down M' reads min(W, tm) dy blocks and about W/tm x blocks; across N'
// about W/tn dy blocks and tn x blocks. So a grid taller than wide reads fewer blocks per wave
// across N', a wide one fewer down M'. Forward and dgrad stay down M' (their weight tiles would
// lose the sharing between an expert's M tiles).
bool heuristic_along_n(const GemmLaunch& l) {
  if (l.pass != GemmPass::wgrad) return false;
  const int64_t tm = tiles(l.dims.N, kWgradTile.tile_m), tn = tiles(l.dims.K, kWgradTile.tile_n);
  return kAlongNTallDen * tm >= kAlongNTallNum * tn;
}

SplitRows split_rows(GemmConfig split) {
  const SplitRows r = split_class(split);
  GROUPMM_CHECK(r.lo <= r.hi, "grouped_gemm: '", config_name(split),
                "' is not a split configuration");
  return r;
}

}  // namespace groupmm::cuda
