// The 4-bit weight decode GEMM (gemm.hpp, W4GemmArgs, path decode): its fixed configuration, its
// variants, the device plan and the kernel arguments. The parts:
//   decode_config.cuh  this file
//   decode_plan.cu     the setup kernel: splits -> per-expert rows, work items, fp32 factors;
//                      the activations in fragment order
//   decode_kernel.cuh  the kernel: items, the copies, the mma loop, the epilogue
//   decode.cu          host side: geometry, tensor maps, launches, the split-K reduction kernel
//   decode_<format>.cu the variants of one weight format
//
// Work. An item is (expert g, 128 rows of W_g, a range of K, a pass of up to kTokens of the
// expert's rows); its CTA streams those 128 x K-range 4-bit weights once and multiplies them with
// the pass's activations. Items of one expert and rows differ only in the pass and are numbered
// consecutively, so the CTAs of an expert with more rows than one pass read its weights together
// (the later ones from L2). A zero-row expert has no items. The persistent CTAs take items b,
// b + grid, ...; an item runs in units of kStepK along K. With two kinds of pass
// (DecodeGeometry::wide_tiles) the experts above a narrow pass are items of a second launch, of
// the wider variant, numbered by their own prefix sums.
//
// Copies. A unit's weights (128 rows x kStepK codes) and activations (kTokens x kStepK bf16, in
// B-fragment order, below) arrive in a ring slot of shared memory by bulk tensor copies (TMA),
// which one thread issues kDepth - 1 units ahead; a barrier per slot counts the bytes, and a CTA
// barrier closing each unit frees its slot. So the threads spend neither instructions nor
// registers on weight loads (the kernel is bound by instruction issue: a unit's dequantization
// and mma are most of its instructions); only the scale bytes go through registers, one unit
// ahead. Past K, M or the last weight row the copies fill zeros; the weight rows of the next
// expert and the activation rows that a box also covers (of the next pass, or the next step's
// first rows) only reach outputs that are never stored (y columns past N, y rows past the pass).
//
// A warp owns 16 rows of the item (one m16n8k16 tile along N): lane (gid, t) = (lane / 4,
// lane % 4) reads rows gid and gid + 8, at K offsets 128 i + 32 t of the unit (16 bytes each; a
// sub-block's rows are 64 bytes apart in the slot, so a quarter warp reads 128 contiguous
// bytes). The K order inside a 128-wide sub-block is permuted (qnum::e2m1x8_raw): logical
// columns 2t.. of mma (j, h) are the codes of thread t's word j. The setup kernel writes the
// activations in that order once per call (qnum::w4_x_pairs; DecodeWorkspace::xp): a row's step
// is 8 chunks (sub-block, word) of four 16-byte B fragments (t), the chunks rotated by the row, so
// a unit's box of kTokens rows lands as 512-byte rows and a warp's B load of one chunk (8 tokens x
// 4 t) touches every bank once a quarter warp.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>

#include "gemm/cuda/w4/weights.cuh"

namespace groupmm::cuda::w4 {

struct DecodeConfig {
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kWarpRows = 16;                      // one mma tile of W rows per warp
  static constexpr int kRows = kWarps * kWarpRows;          // W rows per item
  static constexpr int kThreadK = 32;                       // codes per 16-byte load
  static constexpr int kSubK = 4 * kThreadK;                // K per sub-block: 4 lanes per row
  static constexpr int kSubs = 2;                           // sub-blocks per step
  static constexpr int kStepK = kSubs * kSubK;              // K per step
  static constexpr int kWords = kThreadK / 8;               // 32-bit code words per load
  static constexpr int kPieceK = 8;                         // activations per 16-byte B fragment
  static constexpr int kChunks = kSubs * kWords;            // (sub-block, word) chunks of a step
  static constexpr int kChunkBytes = 4 * kPieceK * 2;       // a chunk of a row: t = 0..3
  static constexpr int kXRowBytes = kChunks * kChunkBytes;  // a row's step: kStepK bf16
  static_assert(kChunks == 8 && kXRowBytes == kStepK * 2, "8 chunks a step: a 3-bit rotation");
  static_assert(kWarpRows == 16, "one m16n8k16 A tile (16 rows) per warp");
  static_assert(kSubK == 128 && kWords == 4, "4 lanes x 32 codes per row and sub-block");
  static_assert(kStepK % 32 == 0, "steps hold whole mxfp4 blocks");
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps");
};

// Ring slots and CTAs per SM of the variant with kTokenTiles token tiles, within an SM's 227 KiB
// of shared memory. The most warps that fit without spilling win: three CTAs with 8 tokens, two
// with 16 and 32, which spill at three (80 registers hold neither the 32-token accumulators nor
// the 16-token ones beside the scales); then the deepest ring that still fits them: three slots
// for every variant, a fourth gains nothing at two CTAs (see docs/decisions.md, "4-bit decode:
// weights fed by the TMA unit", "4-bit decode: four CTAs per SM (not kept)" and "4-bit decode:
// two CTAs an SM for 16-token passes").
constexpr int kDecodeDepth = 3;
constexpr int decode_blocks_per_sm(int token_tiles) {
  return token_tiles == 1 ? 3 : 2;
}

// A variant: the weight format and the tokens of a pass (8 per mma N tile).
template <QuantRecipe kRecipe_, int kTokenTiles_>
struct DecodeVariant {
  using Cfg = DecodeConfig;
  static constexpr QuantRecipe kRecipe = kRecipe_;
  static constexpr int kTokenTiles = kTokenTiles_;
  static constexpr int kTokens = 8 * kTokenTiles;
  static constexpr bool kNvfp4 = kRecipe == QuantRecipe::nvfp4;
  static constexpr int kBlockK = kNvfp4 ? 16 : 32;               // codes per scale
  static constexpr int kStageBytes = kTokens * Cfg::kStepK * 2;  // bf16 activations of a unit
  static_assert(kRecipe == QuantRecipe::nvfp4 || kRecipe == QuantRecipe::mxfp4, "4-bit weights");
  static_assert(kTokenTiles == 1 || kTokenTiles == 2 || kTokenTiles == 4, "8, 16 or 32 tokens");
};

// The shared memory of a variant: kDepth slots = [sub-block 0: 128 rows x 64 code bytes]
// [sub-block 1][activations: kTokens rows of kXRowBytes], then one barrier per slot.
template <class V, int kDepth_ = kDecodeDepth,
          int kMinBlocks_ = decode_blocks_per_sm(V::kTokenTiles)>
struct DecodeShape {
  using Cfg = DecodeConfig;
  static constexpr int kDepth = kDepth_;
  static constexpr int kMinBlocks = kMinBlocks_;    // CTAs per SM (__launch_bounds__)
  static constexpr int kRowBytes = Cfg::kSubK / 2;  // a weight row of one sub-block
  static constexpr int kSubBytes = Cfg::kRows * kRowBytes;
  static constexpr int kCodeBytes = Cfg::kSubs * kSubBytes;
  static constexpr int kSlotBytes = kCodeBytes + V::kStageBytes;
  static constexpr int kRingBytes = kDepth * kSlotBytes;
  static constexpr int kSmemBytes = kRingBytes + kDepth * 8;
  static_assert(kRowBytes == 64 && Cfg::kThreadK / 2 == 16,
                "a lane's codes: 16 of a row's 64 bytes");
  static_assert(kSubBytes % 128 == 0 && V::kStageBytes % 128 == 0, "copies land 128-byte aligned");
  static_assert(kCodeBytes % 512 == 0 && kSlotBytes % 512 == 0,
                "activation boxes 512-byte aligned (the chunk rotation's XOR)");
  static_assert(kDepth >= 2, "one slot in use, one being filled");
  static_assert(kMinBlocks * (kSmemBytes + 1024) <= 228 * 1024, "the CTAs fit an SM");
};

// Per-expert arrays in the workspace, written by the setup kernel (decode_plan.cu) with the
// activations in fragment order (DecodeWorkspace::xp).
struct DecodePlan {
  int64_t* start;       // [G + 1] clamped first row; [G]: the rows covered (min(sum, M))
  int64_t* rows;        // [G] clamped rows
  int64_t* item_start;  // [G + 1] prefix sums of the experts' items; [G]: the total
  float* factor;        // [G] the accumulator's fp32 factor (qnum::w4_expert_factor)
};

struct DecodeParams {
  W4Weights w;           // [G, N, K] (the codes also through DecodeTmaParams::codes)
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
  int64_t scale_expert, scale_tile;  // scale bytes of one expert / one 128-row tile
};

// The kernel's arguments: DecodeParams and the tensor maps of the codes ([G * N, K / 2] bytes,
// boxes of 128 rows x 64 bytes) and of the activations in fragment order ([steps * M, kStepK]
// bf16, boxes of kTokens rows), made on the host for each call (they hold the pointers, not the
// splits).
struct DecodeTmaParams {
  DecodeParams p;
  CUtensorMap codes;
  CUtensorMap x;
};

// Launch geometry (host-known: M, N, K, G, the SM count). Two kinds of pass when wide_tiles > 0:
// an expert with at most 8 * token_tiles rows takes one narrow pass, one with more takes passes
// of 8 * wide_tiles rows, each kind in its own launch of its variant (same K split).
struct DecodeGeometry {
  int token_tiles = 1;
  int wide_tiles = 0;  // 0: every expert in passes of 8 * token_tiles rows
  int ksplit = 1;
  int steps = 0, steps_per_split = 0, row_groups = 0;
  int64_t item_bound = 0;  // items of any routing: sum over experts of ceil(m_g / tokens) bounded
  int64_t wide_item_bound = 0;
  int grid = 0, wide_grid = 0;
  std::string to_string() const;
};

// Workspace layout (each part 256-byte aligned): plan arrays, the activations in fragment order,
// then split-K partial sums.
struct DecodeWorkspace {
  static constexpr size_t kAlign = 256;
  static size_t aligned(size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }
  static size_t plan_bytes(int64_t G) {
    return aligned(static_cast<size_t>(4 * (G + 1)) * 8 + static_cast<size_t>(G) * 4);
  }
  // x in B-fragment order: [steps][M][kChunks][4] 16-byte pieces; chunk c = 4 i + j of row r sits
  // at position c ^ (r % 8) of the row's step and holds the 8 activations at K = step * kStepK +
  // i * kSubK + t * kThreadK + j * kPieceK (t = 0..3) in w4_x_pairs order; zeros past K.
  static size_t xp_bytes(int64_t M, int steps) {
    return aligned(static_cast<size_t>(steps) * DecodeConfig::kStepK * M * 2);
  }
  static size_t partial_bytes(int64_t M, int64_t N, int ksplit) {
    return ksplit > 1 ? aligned(static_cast<size_t>(ksplit * M * N) * 4) : 0;
  }
  static DecodePlan plan(void* ws, int64_t G) {
    int64_t* b = static_cast<int64_t*>(ws);
    return {b, b + (G + 1), b + 2 * (G + 1), reinterpret_cast<float*>(b + 4 * (G + 1))};
  }
  // The wide passes' item_start (DecodeGeometry::wide_tiles): the wide launch's plan is the plan
  // with this array in place of item_start.
  static int64_t* wide_item_start(void* ws, int64_t G) {
    return static_cast<int64_t*>(ws) + 3 * (G + 1);
  }
  static uint16_t* xp(void* ws, int64_t G) {
    return reinterpret_cast<uint16_t*>(static_cast<char*>(ws) + plan_bytes(G));
  }
  static float* partial(void* ws, int64_t G, int64_t M, int steps) {
    return reinterpret_cast<float*>(static_cast<char*>(ws) + plan_bytes(G) + xp_bytes(M, steps));
  }
};

}  // namespace groupmm::cuda::w4
