// The 4-bit weight decode GEMM (gemm.hpp, W4GemmArgs, path decode): its fixed configuration, its
// variants, the device plan and the kernel arguments. The parts:
//   decode_config.cuh  this file
//   decode_plan.cu     the setup kernel: splits -> per-expert rows, work items, fp32 factors
//   decode_kernel.cuh  the kernel: loads, the activation stage, the mma loop, the epilogue
//   decode.cu          host side: geometry, launches, the split-K reduction kernel
//   decode_<format>.cu the variants of one weight format
//
// Work. An item is (expert g, 128 rows of W_g, a range of K, a pass of up to kTokens of the
// expert's rows); its CTA streams those 128 x K-range 4-bit weights once and multiplies them with
// the pass's activations. Items of one expert and rows differ only in the pass and are numbered
// consecutively, so the CTAs of an expert with more rows than one pass read its weights together
// (the later ones from L2). A zero-row expert has no items. The persistent CTAs take items b,
// b + grid, ...; an item runs in steps of kStepK, and the next step's weights are loaded (into
// registers) and its activations copied (cp.async into shared memory) while the current one is
// multiplied. A thread's load addresses are computed once per item (decode_item); a step adds
// constants to them.
//
// A warp owns 16 rows of the item (one m16n8k16 tile along N): lane (gid, t) = (lane / 4,
// lane % 4) loads rows gid and gid + 8, at K offsets 128 i + 32 t of the step (one 16-byte load
// each: a warp instruction covers 64 contiguous bytes of 8 rows). The K order inside a 128-wide
// sub-block is permuted (qnum::e2m1x8_raw): logical columns 2t.. of mma (j, h) are the codes of
// thread t's word j. The activations of the step are staged in shared memory in that order by
// every thread (qnum::w4_x_pairs), one 16-byte B fragment per (sub-block, word, token, t), so a
// warp's B load is 512 contiguous bytes.
#pragma once

#include <cstdint>
#include <string>

#include "cuda/w4/weights.cuh"

namespace groupmm::cuda::w4 {

struct DecodeConfig {
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kWarpRows = 16;              // one mma tile of W rows per warp
  static constexpr int kRows = kWarps * kWarpRows;  // W rows per item
  static constexpr int kThreadK = 32;               // codes per 16-byte load
  static constexpr int kSubK = 4 * kThreadK;        // K per sub-block: 4 lanes per row
  static constexpr int kSubs = 2;                   // sub-blocks per step
  static constexpr int kStepK = kSubs * kSubK;      // K per step
  static constexpr int kWords = kThreadK / 8;       // 32-bit code words per load
  static constexpr int kPieceK = 8;                 // activations per 16-byte staging piece
  static constexpr int kPiecesPerToken = kStepK / kPieceK;
  static_assert(kWarpRows == 16, "one m16n8k16 A tile (16 rows) per warp");
  static_assert(kSubK == 128 && kWords == 4, "4 lanes x 32 codes per row and sub-block");
  static_assert(kStepK % 32 == 0, "steps hold whole mxfp4 blocks");
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps");
};

// CTAs per SM of the variant with kTokenTiles token tiles (its __launch_bounds__; the host's
// grid uses the same number). The kernel is bound by instruction issue (most of a step is the
// dequantization), not by loads in flight: cp.async rings and bulk L2 prefetches measured slower
// than one register-held step ahead. So the most warps that fit without spilling in the step loop
// win: three CTAs with 8 or 16 tokens per pass; two with 32, whose accumulators spill at three;
// four spill at every size. The measurements: bench/RESULTS.md, "4-bit decode".
constexpr int decode_blocks_per_sm(int token_tiles) {
  return token_tiles == 4 ? 2 : 3;
}

// A variant: the weight format and the tokens of a pass (8 per mma N tile).
template <QuantRecipe kRecipe_, int kTokenTiles_>
struct DecodeVariant {
  using Cfg = DecodeConfig;
  static constexpr int kMinBlocks = decode_blocks_per_sm(kTokenTiles_);  // CTAs per SM
  static constexpr QuantRecipe kRecipe = kRecipe_;
  static constexpr int kTokenTiles = kTokenTiles_;
  static constexpr int kTokens = 8 * kTokenTiles;
  static constexpr bool kNvfp4 = kRecipe == QuantRecipe::nvfp4;
  static constexpr int kBlockK = kNvfp4 ? 16 : 32;                // codes per scale
  static constexpr int kPieces = kTokens * Cfg::kPiecesPerToken;  // staging pieces per step
  static constexpr int kPiecesPerThread = kPieces / Cfg::kThreads;
  static constexpr int kStageBytes = kTokens * Cfg::kStepK * 2;  // bf16 activations of a step
  static constexpr int kSmemBytes = 3 * kStageBytes;  // two permuted stages, the raw copies
  static_assert(kRecipe == QuantRecipe::nvfp4 || kRecipe == QuantRecipe::mxfp4, "4-bit weights");
  static_assert(kTokenTiles == 1 || kTokenTiles == 2 || kTokenTiles == 4, "8, 16 or 32 tokens");
  static_assert(kPieces % Cfg::kThreads == 0, "every thread stages whole pieces");
};

// Per-expert arrays in the workspace, written by the setup kernel (decode_plan.cu).
struct DecodePlan {
  int64_t* start;       // [G + 1] clamped first row; [G]: the rows covered (min(sum, M))
  int64_t* rows;        // [G] clamped rows
  int64_t* item_start;  // [G + 1] prefix sums of the experts' items; [G]: the total
  float* factor;        // [G] the accumulator's fp32 factor (qnum::w4_expert_factor)
};

struct DecodeParams {
  W4Weights w;           // [G, N, K]
  const uint16_t* x;     // [M, K] bf16
  const uint16_t* bias;  // [G, N] bf16 or null
  uint16_t* out;         // [M, N] bf16
  float* partial;        // [ksplit, M, N] fp32 when ksplit > 1
  DecodePlan plan;
  int64_t M, N, K, G;
  int row_groups;  // ceil(N / kRows)
  int ksplit;      // K ranges per item row group
  int steps;       // ceil(K / kStepK)
  int steps_per_split;
  int scale_step,
      scale_sub;   // scale-byte offset of one step / one sub-block along K (the layout's)
  int scale_row8;  // ... of 8 rows on, inside a 32-row group
  int64_t w_row8;  // code bytes of 8 rows
  int64_t scale_expert, scale_tile;  // scale bytes of one expert / one 128-row tile
};

// Launch geometry (host-known: M, N, K, G, the SM count).
struct DecodeGeometry {
  int token_tiles = 1;
  int ksplit = 1;
  int steps = 0, steps_per_split = 0, row_groups = 0;
  int64_t item_bound = 0;  // items of any routing: sum over experts of ceil(m_g / tokens) bounded
  int grid = 0;
  std::string to_string() const;
};

// Workspace layout (each part 256-byte aligned): plan arrays, then split-K partial sums.
struct DecodeWorkspace {
  static constexpr size_t kAlign = 256;
  static size_t aligned(size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }
  static size_t plan_bytes(int64_t G) {
    return aligned(static_cast<size_t>(3 * (G + 1)) * 8 + static_cast<size_t>(G) * 4);
  }
  static size_t partial_bytes(int64_t M, int64_t N, int ksplit) {
    return ksplit > 1 ? aligned(static_cast<size_t>(ksplit * M * N) * 4) : 0;
  }
  static DecodePlan plan(void* ws, int64_t G) {
    int64_t* b = static_cast<int64_t*>(ws);
    return {b, b + (G + 1), b + 2 * (G + 1), reinterpret_cast<float*>(b + 3 * (G + 1))};
  }
  static float* partial(void* ws, int64_t G) {
    return reinterpret_cast<float*>(static_cast<char*>(ws) + plan_bytes(G));
  }
};

}  // namespace groupmm::cuda::w4
