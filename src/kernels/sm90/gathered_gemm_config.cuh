// The configuration side of the kernel layer's gathered grouped GEMM (gathered_gemm.cuh):
// the config struct every instantiation is checked against, the kernel's parameters and how a
// launcher fills them, a tile's coordinates, and the shared-memory layout (stages, the epilogue
// warps' tile, tile tables, barriers).
#pragma once

#include <cstdint>

#include "groupmm/core.hpp"

namespace groupmm::cuda::sm90 {

// ---- configuration -----------------------------------------------------------------------------
// Element: cutlass::bfloat16_t or cutlass::half_t. kBHalves: the B tile is loaded as kBHalves
// row blocks of kTileN / kBHalves rows, block h from rows h * B_rows / kBHalves + column tile *
// kTileN / kBHalves of the expert (2: the gate and up halves of a fused gate_up weight land side
// by side in one tile, so a SwiGLU epilogue finds both in the same thread's registers).
// kCooperative: both consumer warpgroups work on every tile (64 rows each; the epilogue does not
// overlap MMAs, but a tile of 128 x kTileN with kTileN up to 256 moves fewer bytes per FLOP);
// else ping-pong (a warpgroup owns a whole 128 x kTileN tile, kTileN <= 128 for its registers).
// kCluster: CTAs of a cluster (1 or 2). With 2, the pair works on two row tiles of the same
// expert and column tile: each CTA loads one half of the B tile and multicasts it to both, so
// every CTA reads half the weight bytes from L2 (the A rows are gathered per CTA).
// kBMajorMN: B is N-major [G, K, N] (see above), loaded as kTileN / 64 boxes of 64 columns by
// kTileK rows. kRowOwner: a CTA runs the column tiles of a row tile one after another (cooperative
// only: each consumer then sees every column of its 64 rows). kEpilogueWarps (cooperative): two
// warps of the producer warpgroup run the epilogue from shared memory while the consumers run
// the next tile's mainloop (the other two gather A); the consumers only round their accumulators
// to 16 bits into a tile buffer (one tile: they wait for the epilogue to have read the previous
// one). Not a fourth warpgroup: ptxas compiles every warp of a 512-thread CTA within 128
// registers, whatever setmaxnreg later allows, and a 64 x 256 fp32 accumulator needs more.
// kBCodes (nvfp4 or mxfp4; none: B is 16-bit): B holds 4-bit weight codes [G, N, K / 2] with
// their block scales; the TMA unit copies the stages' codes into a ring of kRawSlots raw slots
// ahead of time and the producer threads dequantize them into the stage's bf16 B tile
// (numerics/w4.hpp: exact bf16 weights, the per-expert fp32 factor left to the epilogue) under the
// MMAs of the stages before; A (grouped by expert) is copied by TMA.
template <class Element_, int kTileN_, int kStages_, int kBHalves_, bool kCooperative_,
          int kCluster_ = 1, bool kBMajorMN_ = false, bool kRowOwner_ = false,
          bool kEpilogueWarps_ = false, QuantRecipe kBCodes_ = QuantRecipe::none>
struct GatheredGemmConfig {
  using Element = Element_;
  static constexpr QuantRecipe kBCodes = kBCodes_;
  static constexpr bool kB4 = kBCodes != QuantRecipe::none;
  static constexpr bool kCooperative = kCooperative_;
  static constexpr int kCluster = kCluster_;
  static constexpr bool kBMajorMN = kBMajorMN_;
  static constexpr bool kRowOwner = kRowOwner_;
  static constexpr bool kEpilogueWarps = kEpilogueWarps_;
  static constexpr int kTileM = 128;
  static constexpr int kWarpgroupM = kCooperative ? 64 : 128;  // rows of a consumer's MMAs
  static constexpr int kTileN = kTileN_;
  static constexpr int kTileK = 64;  // one 128-byte swizzle row of 16-bit elements
  static constexpr int kStages = kStages_;
  static constexpr int kBHalves = kBHalves_;
  static constexpr int kConsumers = 2;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kGatherThreads = kEpilogueWarps ? 64 : 128;  // producer threads gathering A
  static constexpr int kEpilogueThreads = kEpilogueWarps ? 64 : 0;  // the producer's others
  static constexpr int kMaxGroups = 1024;
  // setmaxnreg budgets: 128 * (producer + 2 consumers) <= 128 * 504, what the launch gives a
  // 384-thread CTA (168 a thread); the producer's epilogue warps need more than its gather
  static constexpr int kProducerRegs = kEpilogueWarps || kB4 ? 72 : 56;
  static constexpr int kConsumerRegs = kEpilogueWarps || kB4 ? 216 : 224;
  static constexpr int kStageBytesA = kTileM * kTileK * 2;
  static constexpr int kStageBytesB = kTileN * kTileK * 2;
  static constexpr int kStageBytes = kStageBytesA + kStageBytesB;
  // kB4: a raw slot of codes, kTileN rows of kTileK / 2 bytes; a ring of kRawSlots, deep enough
  // that a stage's codes are copied several conversions before it is converted
  static constexpr int kRawSlots = kB4 ? 6 : 0;
  static constexpr int kRawSlotBytes = kB4 ? kTileN * kTileK / 2 : 0;
  // the epilogue warps' tile: kTileM rows of kTileN 16-bit values, 16-byte chunk c of row r
  // at chunk c ^ (r % 8) (conflict-free both for the consumers' writes, 8 rows a warp, and the
  // epilogue's reads, one row a warp)
  static constexpr int kEpiTileBytes = kEpilogueWarps ? kTileM * kTileN * 2 : 0;
  // tables: tile prefix [G + 1], row start [G], rows [G] (int32); then the barriers: full and
  // empty per stage, the ping-pong consumers' two turns, the epilogue tile's full and empty, the
  // raw slots' full
  static constexpr int kTableBytes = (3 * kMaxGroups + 1) * 4;
  static constexpr int kSmemBytes = 1024 /* alignment slack */ + kStages * kStageBytes +
                                    kRawSlots * kRawSlotBytes + kEpiTileBytes + kTableBytes +
                                    (2 * kStages + 4 + kRawSlots) * 8 + 8;
  static_assert(sizeof(Element) == 2, "16-bit operands (bf16, fp16)");
  static_assert(kTileN % (16 * kBHalves) == 0 && kTileN >= 64 && kTileN <= 256,
                "a wgmma N of 64..256 in steps of 16 per half");
  static_assert(kTileN / kBHalves <= 256, "one TMA box per half");
  static_assert(kWarpgroupM * kTileN / 128 <= 128, "fp32 accumulators per consumer thread");
  static_assert(kCluster == 1 || (kCluster == 2 && kBHalves % 2 == 0),
                "a pair of CTAs splits the B tile's halves between them");
  static_assert(kStages >= 2 && kStages <= 8, "at least double buffering");
  static_assert(!kBMajorMN || (kBHalves == 1 && kCluster == 1 && kTileN % 64 == 0),
                "an N-major B tile: whole 64-column boxes, no halves, no cluster");
  static_assert(!kRowOwner || (kCooperative && kCluster == 1),
                "a row owner is one CTA whose two consumers see all columns of their rows");
  static_assert(!kEpilogueWarps || (kCooperative && kCluster == 1),
                "the epilogue warps take a cooperative tile, one CTA");
  static_assert(128 * (kProducerRegs + 2 * kConsumerRegs) <= (65536 / kThreads) / 8 * 8 * kThreads,
                "register budgets within what the launch allocates");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one sm_90 CTA");
  static_assert(kStageBytesA % 1024 == 0 && kStageBytesB % 1024 == 0,
                "every stage buffer starts 1024-byte aligned (the swizzle's period)");
  static_assert(kBCodes == QuantRecipe::none || kBCodes == QuantRecipe::nvfp4 ||
                    kBCodes == QuantRecipe::mxfp4,
                "B codes are nvfp4 or mxfp4");
  static_assert(!kB4 || (kRawSlots >= 2 && kBHalves == 1 && kCluster == 1 && !kBMajorMN &&
                         !kEpilogueWarps && !kRowOwner && kTileN % 64 == 0 &&
                         sizeof(Element) == 2 && kTileK == 64),
                "4-bit B: K-major, one CTA, whole 64-row passes of the producer");
};

struct GatheredGemmParams {
  const void* a;           // [a_rows, K]
  int64_t a_rows;          // rows of A (src_row values must be < a_rows)
  int64_t lda;             // elements between A rows (>= K, multiple of 8)
  const int32_t* src_row;  // [R]
  int64_t R;               // rows of the grouped output (sum of the splits)
  const void* splits;      // [G] int32 / int64 on the device
  bool splits64;
  int64_t G;
  int64_t K;
  int64_t b_rows;  // N of the GEMM: rows of one expert's K-major B, columns of an N-major one
  int32_t band_n;  // column tiles per raster band (>= 1)
  StatusBlock* status;
  OpId op;
  // kB4 only: B's rowwise block scales of G * b_rows rows (16 codes a scale: nvfp4, 32: mxfp4),
  // plain (b_scale_ld = scale columns a row) or swizzled 128x4 (b_scale_ld = scale columns rounded
  // up to 4; b_scale_tiles 128-row tiles an expert). Kept small: a larger parameter block cost the
  // down dgrad's consumers spills.
  const uint8_t* b_scales = nullptr;
  int32_t b_scale_ld = 0;
  int32_t b_scale_tiles = 0;
  bool b_scale_swizzled = false;
};

// The params of a gathered GEMM whose A is a contiguous row-major [a_rows, K] view (x or dy),
// gathered through src_row [R] for the splits' G experts of N output columns each; band_n 1
// (the launcher sets its raster band).
inline GatheredGemmParams gathered_gemm_params(const TensorView& a, const TensorView& src_row,
                                               const TensorView& splits, int64_t G, int64_t N,
                                               StatusBlock* status, OpId op) {
  GatheredGemmParams p;
  p.a = a.data;
  p.a_rows = a.dim(0);
  p.lda = a.dim(1);
  p.src_row = src_row.present() ? src_row.ptr<int32_t>() : nullptr;
  p.R = src_row.present() ? src_row.dim(0) : 0;
  p.splits = splits.data;
  p.splits64 = splits.dtype == DType::int64;
  p.G = G;
  p.K = a.dim(1);
  p.b_rows = N;
  p.band_n = 1;
  p.status = status;
  p.op = op;
  return p;
}

// The params of a grouped GEMM whose A [R, K] is already grouped by expert
// (gathered_gemm_w4_kernel: output row r reads A row r; src_row null).
inline GatheredGemmParams grouped_gemm_params(const TensorView& a, const TensorView& splits,
                                              int64_t G, int64_t N, StatusBlock* status, OpId op) {
  GatheredGemmParams p = gathered_gemm_params(a, TensorView(), splits, G, N, status, op);
  p.R = a.dim(0);
  return p;
}

// Where a tile lies: expert g, output rows [row0, row0 + rows) (rows <= kTileM), column tile ct.
struct TileCoord {
  int g;
  int64_t row0;
  int rows;
  int ct;
};

namespace detail {
// The last g with prefix[g] <= t (prefix non-decreasing, prefix[0] = 0 <= t < prefix[G]).
__device__ __forceinline__ int find_tile_group(const int32_t* prefix, int G, int32_t t) {
  int lo = 0, hi = G - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (prefix[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}
}  // namespace detail

// 16-byte chunk c (columns 8c .. 8c + 7) of row r of the epilogue warps' tile of kTileN
// 16-bit columns (GatheredGemmConfig::kEpiTileBytes: the chunk index swizzled by r % 8).
template <int kTileN>
__device__ __forceinline__ uint8_t* epi_tile_chunk(uint8_t* tile, int r, int c) {
  return tile + r * (kTileN * 2) + ((c ^ (r % 8)) * 16);
}
template <int kTileN>
__device__ __forceinline__ const uint8_t* epi_tile_chunk(const uint8_t* tile, int r, int c) {
  return tile + r * (kTileN * 2) + ((c ^ (r % 8)) * 16);
}

template <class Config>
struct GatheredGemmSmem {
  uint8_t* stages;  // kStages x (A tile, B tile), 1024-byte aligned
  uint8_t* epi;     // the epilogue warps' tile (kEpiTileBytes)
  int32_t* tile_prefix;
  int32_t* row_start;
  int32_t* rows;
  uint64_t* full;
  uint64_t* empty;
  uint64_t* turn;       // [2]: consumer c may start its next mainloop
  uint64_t* epi_full;   // the epilogue tile written (256 consumer arrivals)
  uint64_t* epi_empty;  // the epilogue tile read (kEpilogueThreads arrivals)
  uint8_t* raw_slots;   // kB4: kRawSlots raw slots of codes
  uint64_t* raw_full;   // [kRawSlots] kB4: a raw slot's codes landed (TMA bytes)
  __device__ __forceinline__ explicit GatheredGemmSmem(uint8_t* raw) {
    stages =
        reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
    raw_slots = stages + Config::kStages * Config::kStageBytes;
    epi = raw_slots + Config::kRawSlots * Config::kRawSlotBytes;
    tile_prefix = reinterpret_cast<int32_t*>(epi + Config::kEpiTileBytes);
    row_start = tile_prefix + Config::kMaxGroups + 1;
    rows = row_start + Config::kMaxGroups;
    full = reinterpret_cast<uint64_t*>(
        (reinterpret_cast<uintptr_t>(rows + Config::kMaxGroups) + 7) & ~uintptr_t(7));
    empty = full + Config::kStages;
    turn = empty + Config::kStages;
    epi_full = turn + 2;
    epi_empty = turn + 3;
    raw_full = turn + 4;
  }
  __device__ __forceinline__ uint8_t* a(int s) const { return stages + s * Config::kStageBytes; }
  __device__ __forceinline__ uint8_t* b(int s) const {
    return stages + s * Config::kStageBytes + Config::kStageBytesA;
  }
};

}  // namespace groupmm::cuda::sm90
