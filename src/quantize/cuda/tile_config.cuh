// The grouped quantize tile kernel: its fixed configuration, its variants (the dispatch table's
// key), and its argument block. The kernel is split by concern:
//   tile_config.cuh    this file
//   tile_smem.cuh      the swizzled shared-memory input tile and its asynchronous loads
//   tile_schedule.cuh  which 128x128 tile (item) each CTA runs next
//   tile_convert.cuh   per-expert scalars, block scales and the packed code conversions
//   tile_amax.cuh      the expert amax fused into the kernel, and 2D block amax
//   tile_store.cuh     column-run stores and swizzle padding
//   tile_rows.cuh      the rowwise copy of a tile
//   tile_columns.cuh   the columnwise copy of a tile and its bias-gradient sums
//   tile_kernel.cuh    the kernel body and its launcher
//   slack.cuh          the scale buffers' slack, zeroed by every CTA (also used by swizzle.cu)
// instances_<recipe>.cu instantiate the variants; dispatch.cu picks one per call.
//
// Work items are tiles of 128 expert-local rows x 128 columns (row tile t of the expert's
// ceil(m_g / 128), column tile ct). Tiles start at multiples of 128 inside an expert, so every
// 1x16 / 1x32 / 1x128 row block, every 16 / 32 / 128-row column block, every 16x16 / 128x128 2D
// block and every 128-row swizzle block lies inside one tile: a tile computes all its scales
// locally and writes the swizzle padding of its own block.
//
// The kernel is persistent: 512-thread CTAs, two per SM for 16-bit inputs (64 registers per
// thread), one for fp32. Thread 0 schedules the items and publishes each one's CTA-uniform
// description in shared memory; per-thread addresses are 32-bit offsets from it, recomputed per
// tile (holding them across the loop costs registers the 64-register budget does not have). The
// next tile is fetched with cp.async while the current one is quantized.
#pragma once

#include <cstdint>
#include <string>

#include "numerics/quantize_layout.hpp"
#include "kernels/common/status.cuh"
#include "quantize/cuda/plan.cuh"

namespace groupmm::cuda {

struct TileConfig {
  static constexpr int kThreads = 512;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kRows = qnum::kTileRows;
  static constexpr int kCols = 128;
  static constexpr int kSlab = 32;                                   // rowwise elements / thread
  static constexpr int kSlabsPerRow = kCols / kSlab;                 // lanes sharing a row
  static constexpr int kRowIters = kRows * kSlabsPerRow / kThreads;  // slabs per thread
  static constexpr int kColSeg = 16;                                 // columnwise rows / thread
  static constexpr int kColSegs = kRows / kColSeg;
  // Input tile buffers: item i + 1 loads while item i runs. Two: a third queues more work per CTA
  // when the tickets run out and, under the fused amax schedule, moves an expert's amax reads
  // further from its quantize re-reads (see docs/decisions.md, "Quantize: two input buffers, not
  // three").
  static constexpr int kStages = 2;
  // Fused amax schedule: the early expert-amax reduction covers experts of at most
  // 32 * kPendSlots items (one warp, kPendSlots slot loads per lane).
  static constexpr int kPendSlots = 4;
  static constexpr int kMinBlocks = 2;  // per SM, for 16-bit inputs: 64 registers per thread
  // The scheduler reads the plan (its five arrays) from shared memory when G is at most this:
  // thread 0's dependent global loads were on every item's critical path.
  static constexpr int kPlanCacheG = 256;
  static constexpr int kPlanArrays = 5;  // tile_start, start, rows, cb_start, cs4_start
  static constexpr int kPlanCache = kPlanArrays * (kPlanCacheG + 1) * 8;
  static_assert(kRows == 128 && kCols == 128, "layouts assume 128x128 tiles (swizzle, 2D blocks)");
  static_assert(kSlabsPerRow == 4 && kRowIters == 1, "one 1x32 slab per thread");
  static_assert((kCols / 2) * kColSegs == kThreads, "2 columns x 16 rows per thread");
  static_assert(kWarps == 2 * kColSegs, "two warps (64 column pairs) per column segment");
  static_assert(kColSegs == 8 && kCols == 8 * kWarps,
                "columnwise: a warp owns 8 columns, 8x16 rows");
  static_assert(kWarps <= 64, "fp8 2D amax: one block_amax_2d entry per warp");
};

// How a variant obtains the expert amax of fp8_current / nvfp4 (QuantizeConfig::amax_schedule):
//  - tiles: items dealt out in row-major order; the expert amax (if any) is complete on entry
//    (the separate amax pass ran before);
//  - fused_amax: every tile is an amax item and later a quantize item (tile_schedule.cuh);
//  - fused_amax_early: fused, and the last warp reduces each expert's amax ahead of its first
//    quantize item (tile_amax.cuh). A separate variant because the dormant code alone, its
//    pending loads held in registers across the loop, slows the kernel where no expert fits it.
enum class TileSchedule : uint8_t { tiles, fused_amax, fused_amax_early };
const char* tile_schedule_name(TileSchedule s);

// A kernel variant: the dispatch table's key.
struct TileKernelKey {
  QuantRecipe recipe;
  DType input;  // bf16, fp16, fp32
  bool e5m2;    // fp8 data format (always false for nvfp4)
  TileSchedule schedule;
  bool gathered;  // rows read through GroupQuantizeArgs::row_map
  bool operator==(const TileKernelKey& o) const {
    return recipe == o.recipe && input == o.input && e5m2 == o.e5m2 && schedule == o.schedule &&
           gathered == o.gathered;
  }
  std::string to_string() const;
};

// The compile-time form of a key: E the input element (common/element.cuh).
template <class E_, QuantRecipe kRecipe_, bool kE5m2_, TileSchedule kSchedule_,
          bool kGathered_ = false>
struct TileVariant {
  using E = E_;
  using Pair = typename E::Pair;
  static constexpr QuantRecipe kRecipe = kRecipe_;
  static constexpr bool kE5m2 = kE5m2_;
  static constexpr TileSchedule kSchedule = kSchedule_;
  static constexpr bool kFp4 = qnum::is_fp4(kRecipe);  // nvfp4, mxfp4: packed e2m1 data
  static constexpr bool kNvfp4 = kRecipe == QuantRecipe::nvfp4;
  static constexpr bool kExpertAmax =
      kRecipe == QuantRecipe::fp8_current || kRecipe == QuantRecipe::nvfp4;
  static constexpr bool kFused = kSchedule != TileSchedule::tiles;
  static constexpr bool kEarly = kSchedule == TileSchedule::fused_amax_early;
  // Rows gathered through a row map (tile_smem.cuh, load_async_gathered): the FP8 training
  // recipes' bf16 activations only, whose amax (fp8_current) is fused.
  static constexpr bool kGathered = kGathered_;
  // Only mxfp8 and nvfp4 scales may be swizzled (and so padded): the other recipes compile no
  // padding code.
  static constexpr bool kMaySwizzle = kRecipe == QuantRecipe::mxfp8 || kFp4;
  static constexpr int kInBytes = static_cast<int>(sizeof(typename E::Storage));
  static constexpr int kMinBlocks = kInBytes == 4 ? 1 : TileConfig::kMinBlocks;
  static_assert(kRecipe != QuantRecipe::none, "a quantization recipe");
  static_assert(kExpertAmax || !kFused, "only fp8_current and nvfp4 have an expert amax");
  static_assert(!(kFp4 && kE5m2), "nvfp4 and mxfp4 have no fp8 data format");
  static_assert(!kGathered || ((kRecipe == QuantRecipe::fp8_current && kFused) ||
                               kRecipe == QuantRecipe::fp8_block),
                "gathered rows: fp8_current (fused amax) or fp8_block");
  static constexpr TileKernelKey key() { return {kRecipe, E::kDType, kE5m2, kSchedule, kGathered}; }
};

// The kernel's arguments (built by dispatch.cu; everything CTA-uniform).
struct TileParams {
  const void* x;  // [M, K] input ([x_rows, K] with row_map)
  int64_t M, K;
  const int32_t* row_map;  // [M] gathered variants: the input row of each row, -1 a zero row
  int64_t x_rows;          // gathered variants: the input's rows (row_map's bound)
  QuantPlan plan;
  qnum::Layout L;
  bool rowwise, colwise;
  int lag;  // fused: the quantize items of expert k run with the amax items of expert k + lag
  uint8_t* q_row;
  uint8_t* q_col;
  void* s_row;
  void* s_col;
  qnum::ScaleSlack slack_row, slack_col;  // written 0 by the kernel (quantize_layout.hpp)
  uint32_t* amax_bits;   // [G] per-expert amax (fused: output; else complete on entry)
  uint32_t* slots;       // fused: [items] each amax item's maximum, kSlotEmpty until written
  float* scale_inv_g;    // fp8_current [G]
  float* global_scale;   // nvfp4 [G]
  float* dbias_partial;  // [tile bound, K] or null
  int64_t col_tiles;
  double rcp_col_tiles;  // 1 / col_tiles rounded up (see div_col_tiles)
  StatusBlock* status;
  int grid;  // persistent CTAs
  // dynamic shared memory carve-up (bytes): the input tiles, then the plan cache at smem_plan
  int smem_plan, smem_total;
};

// Launch geometry: shared-memory carve-up and persistent grid (dispatch.cu).
void set_tile_geometry(const Context& ctx, TileParams& p, int in_bytes);

// The dispatch table: each instance file lists its variants.
using TileLaunch = void (*)(Context&, const TileParams&);
struct TileKernel {
  TileKernelKey key;
  TileLaunch launch;
};
struct TileKernelList {
  const TileKernel* rows;
  int count;
};
TileKernelList fp8_current_tile_kernels();
TileKernelList fp8_block_tile_kernels();
TileKernelList mxfp8_tile_kernels();
TileKernelList nvfp4_tile_kernels();
TileKernelList mxfp4_tile_kernels();

}  // namespace groupmm::cuda
