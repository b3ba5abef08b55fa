// The grouped quantize kernel, templated on the input dtype and the recipe; quantize_fp8.cu,
// quantize_mx.cu and quantize_nvfp4.cu instantiate it.
//
// Work items are tiles of 128 expert-local rows x 128 columns (tile t of the expert's
// ceil(m_g/128) row tiles, column tile ct). Tiles start at multiples of 128 inside an expert, so
// every 1x16 / 1x32 / 1x128 row block, every 16/32/128-row column block, every 16x16 / 128x128 2D
// block and every 128-row swizzle block lies inside one tile: a tile computes all its scales
// locally and writes the swizzle padding of its own block.
//
// Why it is shaped like this (H200: ~4.2 TB/s, 132 SMs, i.e. ~16 bytes per SM clock):
//  - Persistent 512-thread CTAs (2 per SM for 16-bit inputs, 64 registers per thread: 50%
//    occupancy; two input tile buffers). Thread 0 schedules the items (see "item schedule"
//    below: tiles dealt out by an atomic ticket counter, or for fp8_current one ticket sequence
//    that interleaves each expert's amax items with an earlier expert's quantize items, so the
//    expert amax needs no separate pass) and publishes each item's CTA-uniform description
//    (ItemInfo) and its expert (GroupInfo) in shared memory; per-thread addresses are 32-bit
//    offsets from those, recomputed per tile (registers, see the loop).
//  - The next tiles are fetched with cp.async (16-byte, zero-filled past the expert / past K)
//    while the current one is quantized (see TileConfig::kStages).
//  - The fp8 format (e4m3 / e5m2) is a kernel template parameter, not a per-conversion branch.
//  - The smem tile has no padding but an XOR swizzle of its 16-byte chunks (swz below) so that
//    every access pattern is free of bank conflicts.
//  - Rowwise: 4 lanes per row, 32 elements per lane: fp4 one 1x32 slab (one 16-byte store of
//    codes), fp8 the 16-element runs s and 4 + s, so that each 16-byte warp store writes 64
//    contiguous bytes of each of 8 rows (whole sectors; 1x128 amax by two shuffles, mxfp8 1x32 by
//    one). nvfp4 signs come from the input words (prmt; see row_signs8).
//  - Columnwise: a warp owns 8 whole columns, a lane 2 columns x 16 rows. Column blocks (16, 32
//    or 128 rows) merge by shuffles, and the 8 lanes of a column store its codes from registers
//    as one contiguous run of the expert's [K, m_g] block (16-byte pieces, 8 for fp4, when the
//    block is aligned, else 4-byte or byte stores). Round 4 staged a transposed tile in shared
//    memory and merged through it (two more CTA barriers and a copy-out pass per tile, 16 KB of
//    shared memory); dropping that was neutral for bandwidth by itself (the kernels are bound by
//    instruction issue, see block_quant) but freed the shared memory of the third buffer.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "core/byte_realign.hpp"
#include "core/quantize_impl.hpp"
#include "cuda/quantize_plan.cuh"
#include "cuda/status.cuh"

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
  // Input tile buffers: item i + 1 loads while item i runs. A third buffer measured worse once
  // items were dealt out dynamically (more work queued per CTA when the tickets run out: H200,
  // mxfp8 both 72.2 -> 73.7% on [32768, 2048], 80.4 -> 81.3% on [65536, 7168] with two), and under
  // the fused amax schedule it moved an expert's amax reads further from its quantize re-reads
  // (fewer L2 hits; fp8_current rowwise 59 -> 56%).
  static constexpr int kStages = 2;
  // Fused amax schedule: the early expert-amax reduction (see the loop) covers experts of at most
  // 32 * kPendSlots items (one warp, kPendSlots slot loads per lane).
  static constexpr int kPendSlots = 4;
  static constexpr int kMinBlocks = 2;  // per SM, for 16-bit inputs: 64 registers per thread
  // The scheduler reads the plan (its five arrays) from shared memory when G is at most this
  // (thread 0's dependent global loads were on every item's critical path).
  static constexpr int kPlanCacheG = 256;
  static constexpr int kPlanArrays = 5;  // tile_start, start, rows, cb_start, cs4_start
  static constexpr int kPlanCache = kPlanArrays * (kPlanCacheG + 1) * 8;
  static_assert(kRows == 128 && kCols == 128, "layouts assume 128x128 tiles (swizzle, 2D blocks)");
  static_assert(kSlabsPerRow == 4 && kRowIters == 1, "one 1x32 slab per thread");
  static_assert((kCols / 2) * kColSegs == kThreads, "2 columns x 16 rows per thread");
  static_assert(kWarps == 2 * kColSegs, "two warps (64 column pairs) per column segment");
  static_assert(kColSegs == 8 && kCols == 8 * kWarps,
                "columnwise: a warp owns 8 columns, 8x16 rows");
  static_assert(kWarps <= 64, "fp8 2D amax: one blk2d entry per warp");
};

struct TileParams {
  const void* x;
  int64_t M, K;
  QuantPlan plan;
  qnum::Layout L;
  bool rowwise, colwise;
  bool fused;  // fp8_current / nvfp4: amax items in this kernel (else amax_bits is complete)
  int lag;     // fused: the quantize items of expert k run with the amax items of expert k + lag
  bool early_amax;  // fused: reduce expert amaxes ahead of their quantize items (see the loop)
  uint8_t* q_row;
  uint8_t* q_col;
  void* s_row;
  void* s_col;
  uint32_t* amax_bits;   // [G] per-expert amax (fused: output; else complete on entry)
  uint32_t* slots;       // fused: [items] each amax item's maximum, kSlotEmpty until written
  float* scale_inv_g;    // fp8_current [G]
  float* global_scale;   // nvfp4 [G]
  float* dbias_partial;  // [tile bound, K] or null
  int64_t col_tiles;
  double rcp_col_tiles;  // 1 / col_tiles rounded up (see div_col_tiles)
  int64_t row_ncols;     // K / rowwise block (K/128 for fp8_block)
  int64_t row_kp;        // round_up(row_ncols, 4): swizzled rowwise scale columns
  int64_t col_k128;      // round_up(K, 128): swizzled columnwise scale rows
  int cb_shift;          // log2 of the columnwise block (16, 32 or 128 rows)
  StatusBlock* status;
  int grid;  // persistent CTAs
  // dynamic shared memory carve-up (bytes)
  int smem_plan, smem_total;
};

// Host: shared-memory carve-up, persistent grid, and launch.
void tile_layout(const Context& ctx, TileParams& p, int in_size);
template <class In, int R>
void launch_quantize_tile(Context& ctx, const TileParams& p);

// Per-recipe launchers (one translation unit each), dispatching on the input dtype.
void launch_quantize_fp8(Context& ctx, const TileParams& p, DType in);
void launch_quantize_mx(Context& ctx, const TileParams& p, DType in);
void launch_quantize_nvfp4(Context& ctx, const TileParams& p, DType in);

namespace tile_detail {

// ---- input element traits: a Pair is two adjacent elements of one row -------------------------
// Amax runs on raw magnitudes (for 16-bit inputs two at a time with max.u16x2); the unsigned order
// of magnitude bits is the numeric order with NaN above Inf, so canonicalizing the maximum once
// (canon) gives exactly qnum::amax_merge over qnum::abs_bits of every element.
__device__ __forceinline__ uint32_t canon(uint32_t abs_bits) {
  return abs_bits > 0x7F800000u ? 0x7FC00000u : abs_bits;
}
__device__ __forceinline__ uint32_t max_u16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("max.u16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

template <class In>
struct Elt;
template <>
struct Elt<uint16_t> {  // bf16 bits
  using Pair = uint32_t;
  static __device__ __forceinline__ Pair zero() { return 0u; }
  static __device__ __forceinline__ Pair absmax(Pair m, Pair w) {
    return max_u16x2(m, w & 0x7FFF7FFFu);
  }
  static __device__ __forceinline__ Pair max2(Pair a, Pair b) { return max_u16x2(a, b); }
  static __device__ __forceinline__ uint32_t lo_bits(Pair m) { return canon(m << 16); }
  static __device__ __forceinline__ uint32_t hi_bits(Pair m) { return canon(m & 0xFFFF0000u); }
  static __device__ __forceinline__ float2 f2(Pair w) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xFFFF0000u));
  }
};
template <>
struct Elt<__half> {
  using Pair = uint32_t;
  static __device__ __forceinline__ Pair zero() { return 0u; }
  static __device__ __forceinline__ Pair absmax(Pair m, Pair w) {
    return max_u16x2(m, w & 0x7FFF7FFFu);
  }
  static __device__ __forceinline__ Pair max2(Pair a, Pair b) { return max_u16x2(a, b); }
  static __device__ __forceinline__ uint32_t lo_bits(Pair m) {
    return qnum::abs_bits(__half2float(__ushort_as_half(static_cast<unsigned short>(m))));
  }
  static __device__ __forceinline__ uint32_t hi_bits(Pair m) {
    return qnum::abs_bits(__half2float(__ushort_as_half(static_cast<unsigned short>(m >> 16))));
  }
  static __device__ __forceinline__ float2 f2(Pair w) {
    return make_float2(__half2float(__ushort_as_half(static_cast<unsigned short>(w))),
                       __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16))));
  }
};
template <>
struct Elt<float> {
  using Pair = uint2;
  static __device__ __forceinline__ Pair zero() { return make_uint2(0u, 0u); }
  static __device__ __forceinline__ Pair absmax(Pair m, Pair w) {
    return make_uint2(max(m.x, w.x & 0x7FFFFFFFu), max(m.y, w.y & 0x7FFFFFFFu));
  }
  static __device__ __forceinline__ Pair max2(Pair a, Pair b) {
    return make_uint2(max(a.x, b.x), max(a.y, b.y));
  }
  static __device__ __forceinline__ uint32_t lo_bits(Pair m) { return canon(m.x); }
  static __device__ __forceinline__ uint32_t hi_bits(Pair m) { return canon(m.y); }
  static __device__ __forceinline__ float2 f2(Pair w) {
    return make_float2(__uint_as_float(w.x), __uint_as_float(w.y));
  }
};

__device__ __forceinline__ uint32_t shfl_xor_pair(uint32_t v, int m) {
  return __shfl_xor_sync(0xFFFFFFFFu, v, m);
}
__device__ __forceinline__ uint2 shfl_xor_pair(uint2 v, int m) {
  return make_uint2(__shfl_xor_sync(0xFFFFFFFFu, v.x, m), __shfl_xor_sync(0xFFFFFFFFu, v.y, m));
}

// ---- columnwise run store ----------------------------------------------------------------------
// One column's codes for the tile's rows, len bytes at `run` in the expert's [K, m_g] block, held
// by the lanes pq + 4 rg (rg = 0..7, 4N bytes each; pq: the lane's column pair). The run starts
// wherever col * m_g lands, unaligned for any m_g that is not a multiple of 16 (8 for fp4), i.e.
// for nearly every real routing: the warp then realigns each run across its 8 lanes (qnum::
// store_col_run_*: vector stores of whole chunks, byte stores spread over the lanes at the edges).
// A warp whose runs are all aligned skips the realignment. Every lane calls this (shuffles);
// `ok`: this lane's column is inside the tile.
template <int N>
__device__ __forceinline__ void store_col_run(uint8_t* run, int len, bool ok, int pq, int rg,
                                              const uint32_t (&w)[N]) {
  constexpr int kB = 4 * N;
  uint32_t tl[N];
  if (__all_sync(0xFFFFFFFFu, (reinterpret_cast<uintptr_t>(run) & (kB - 1)) == 0)) {
    if (ok) qnum::store_col_run_chunk<N>(run, len, rg, 0, w);
    if (len % kB != 0) {  // warp-uniform: len is the tile's valid rows
      const int t = qnum::col_run_tail_lane<N>(len, 0);
#pragma unroll
      for (int i = 0; i < N; ++i) tl[i] = __shfl_sync(0xFFFFFFFFu, w[i], pq + 4 * t);
      if (ok) qnum::store_col_run_edges<N, true>(run, len, rg, 0, tl, tl);
    }
    return;
  }
  uint32_t nx[N], o[N], hd[N];
#pragma unroll
  for (int i = 0; i < N; ++i) nx[i] = __shfl_down_sync(0xFFFFFFFFu, w[i], 4);  // rg + 1's
  const int b = qnum::col_run_head<N>(run);
  qnum::realign_bytes<N>(w, nx, b, o);
  if (ok) qnum::store_col_run_chunk<N>(run, len, rg, b, o);
  const int t = qnum::col_run_tail_lane<N>(len, b);
#pragma unroll
  for (int i = 0; i < N; ++i) {
    hd[i] = __shfl_sync(0xFFFFFFFFu, w[i], pq);
    tl[i] = __shfl_sync(0xFFFFFFFFu, o[i], pq + 4 * t);
  }
  if (ok) qnum::store_col_run_edges<N, false>(run, len, rg, b, hd, tl);
}

// ---- shared-memory tile: 128 rows of 128 elements, 16-byte chunks XOR-swizzled ------------------
// Chunk ch of row r sits at ch ^ (r & 1) ^ ((ch >> 2) & 6) ^ ((r >> 4) & 7); a bank group is the
// stored chunk mod 8. Each access pattern meets 8 groups per phase: cp.async writes and the
// fused / 2D amax reads (8 consecutive chunks of one row; the XOR terms are constant over an
// aligned group of 8 chunks), the rowwise reads (chunk k of the 4 slabs, ch = 2s + k / 4s + k, of
// two adjacent rows of one 16-row group), and the columnwise reads (one chunk, at rows
// 16 rg + j of the 8 row groups rg: the last term; 2-way for fp32 rows of 32 chunks).
__device__ __forceinline__ int swz(int r, int ch) {
  return ch ^ (r & 1) ^ ((ch >> 2) & 6) ^ ((r >> 4) & 7);
}
template <class In>
struct TileSmem {
  static constexpr int kVec = 16 / static_cast<int>(sizeof(In));  // elements per chunk
  static constexpr int kChunksPerRow = TileConfig::kCols / kVec;  // 16 or 32
  static constexpr int kRowBytes = TileConfig::kCols * static_cast<int>(sizeof(In));
  static constexpr int kBytes = TileConfig::kRows * kRowBytes;  // one buffer
  static constexpr int kLoads = TileConfig::kRows * kChunksPerRow / TileConfig::kThreads;
  static_assert(kLoads * TileConfig::kThreads == TileConfig::kRows * kChunksPerRow, "load split");

  static __device__ __forceinline__ const uint8_t* chunk(const uint8_t* buf, int r, int ch) {
    return buf + r * kRowBytes + (swz(r, ch) << 4);
  }
  // Columns (2cp, 2cp+1) of row r.
  static __device__ __forceinline__ typename Elt<In>::Pair pair(const uint8_t* buf, int r, int cp) {
    constexpr int kPairsPerChunk = 16 / (2 * static_cast<int>(sizeof(In)));
    const uint8_t* c = chunk(buf, r, cp / kPairsPerChunk);
    return *reinterpret_cast<const typename Elt<In>::Pair*>(c + (cp % kPairsPerChunk) * 2 *
                                                                    static_cast<int>(sizeof(In)));
  }
  // The 16 elements [e0, e0 + 16) of row r (e0 a multiple of 16) as 8 pairs.
  static __device__ __forceinline__ void run16(const uint8_t* buf, int r, int e0,
                                               typename Elt<In>::Pair* v) {
    constexpr int kChunks = 16 / kVec;  // 2 or 4
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const uint4 u = *reinterpret_cast<const uint4*>(chunk(buf, r, e0 / kVec + k));
      if constexpr (sizeof(In) == 4) {
        v[2 * k] = make_uint2(u.x, u.y);
        v[2 * k + 1] = make_uint2(u.z, u.w);
      } else {
        v[4 * k] = u.x;
        v[4 * k + 1] = u.y;
        v[4 * k + 2] = u.z;
        v[4 * k + 3] = u.w;
      }
    }
  }
};

// No L2 eviction-priority hints: an L2::cache_hint cp.async with a createpolicy descriptor in
// the fused kernel faulted with an illegal instruction on the H200 (CUDA 13.0), see the notes.
__device__ __forceinline__ void cp_async16(uint32_t d, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(src_bytes)
               : "memory");
}
// A contiguous run of global memory into L2 (a hint: nothing waits for it). bytes: a multiple of
// 16, src 16-byte aligned, the range inside one allocation.
__device__ __forceinline__ void prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// fp8 pair conversion: the hardware cvt (bit-identical to convert.hpp, which test_convert_gpu
// checks on every input class) unless GROUPMM_QUANT_SOFT_CVT is defined. The format is a
// template parameter (of the kernel): a runtime flag put every cvt in its own basic block behind
// a uniform branch, which serialized the conversions.
template <bool kE5m2>
__device__ __forceinline__ uint32_t fp8x2(float a, float b) {
#ifdef GROUPMM_QUANT_SOFT_CVT
  return qnum::to_fp8_soft(a, kE5m2) | (uint32_t(qnum::to_fp8_soft(b, kE5m2)) << 8);
#else
  uint16_t r;
  if constexpr (kE5m2) {
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %2, %1;" : "=h"(r) : "f"(a), "f"(b));
  } else {
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;" : "=h"(r) : "f"(a), "f"(b));
  }
  return r;
#endif
}
// Four elements -> one word of fp8 codes (element 0 in the low byte).
template <bool kE5m2>
__device__ __forceinline__ uint32_t fp8x4(float a, float b, float c, float d, float mul) {
  return fp8x2<kE5m2>(a * mul, b * mul) | (fp8x2<kE5m2>(c * mul, d * mul) << 16);
}
// Eight elements -> one word of e2m1 codes (element j in nibble j), with qnum::nvfp4_code's
// rules: a zero block scale encodes 0. A NaN multiplier (the block amax was NaN) makes every
// product NaN, i.e. code 7; otherwise no product can be NaN (every |x| is at most the finite
// block amax and the multiplier is finite and positive), so the NaN-free encoder applies.
__device__ __forceinline__ uint32_t fp4x8(const float (&e)[8], float mul, uint8_t s_b) {
  float p[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) p[j] = e[j] * mul;
  const uint32_t w = mul != mul ? 0x77777777u : qnum::e2m1x8_nonan(p);
  return (s_b & 0x7Fu) == 0 ? 0u : w;
}

// ---- nvfp4 with 16-bit inputs: the e2m1 sign bits straight from the input words --------------
// The multiplier is positive (finite, at most FLT_MAX) or NaN, and a NaN multiplier overrides the
// word with all 7s; otherwise sign(x * mul) = sign(x) for every x (zeros and underflows included:
// an IEEE product's sign is the XOR of its operands' signs), so nibble j's bit 3 is the sign bit
// of input element j. prmt with a selector nibble >= 8 replicates the sign of the selected byte.
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}
// P = sign bytes (0x00 / 0xFF) of elements 0, 2, 4, 6; Q = of elements 1, 3, 5, 7.
__device__ __forceinline__ uint32_t sign_nibbles(uint32_t P, uint32_t Q) {
  return (P & 0x08080808u) | (Q & 0x80808080u);
}
// Eight consecutive elements of a row: pair words w0..w3 (element 2i in the low half of wi).
__device__ __forceinline__ uint32_t row_signs8(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3) {
  const uint32_t a = prmt(w0, w1, 0xFBD9u);  // s0 s2 s1 s3
  const uint32_t b = prmt(w2, w3, 0xFBD9u);  // s4 s6 s5 s7
  return sign_nibbles(prmt(a, b, 0x5410u), prmt(a, b, 0x7632u));
}
// e2m1x8_nonan without the sign bits (the same operations, see quantize_numerics.hpp).
__device__ __forceinline__ uint32_t e2m1x8_mag(const float (&p)[8]) {
  uint32_t w = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float a = fminf(fabsf(p[j]), kE2M1Max);
    uint32_t e = __float_as_uint(a) & 0x7F800000u;
    e = e < 0x3F800000u ? 0x3F800000u : e;
    const uint32_t n = __float_as_uint(a + __uint_as_float(e + (22u << 23))) & 0x7FFFFFu;
    w += (n + (e >> 22)) << (4 * j);
  }
  return w - 254u * 0x11111111u;
}
// fp4x8 with the sign bits given (16-bit inputs).
__device__ __forceinline__ uint32_t fp4x8_signed(const float (&e)[8], float mul, uint8_t s_b,
                                                 uint32_t sign) {
  float p[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) p[j] = e[j] * mul;
  const uint32_t w = mul != mul ? 0x77777777u : (e2m1x8_mag(p) | sign);
  return (s_b & 0x7Fu) == 0 ? 0u : w;
}
// Eight consecutive elements of a row (4 pairs) -> one word of e2m1 codes.
template <class In>
__device__ __forceinline__ uint32_t fp4x8_pairs(const typename Elt<In>::Pair* v, float mul,
                                                uint8_t s_b) {
  float f[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 x2 = Elt<In>::f2(v[i]);
    f[2 * i] = x2.x;
    f[2 * i + 1] = x2.y;
  }
  if constexpr (sizeof(In) == 4) {
    return fp4x8(f, mul, s_b);
  } else {
    return fp4x8_signed(f, mul, s_b, row_signs8(v[0], v[1], v[2], v[3]));
  }
}

// ---- exact fp32 division without the slow path --------------------------------------------
// div.rn.f32 compiles to a fast path (MUFU.RCP, one Newton step on the reciprocal, the quotient and
// one residual correction: correctly rounded whenever the operands and the result are normal and
// far from overflow) plus FCHK and a branch to a slow-path subroutine for the other cases. In the
// block-scale code that branch and its reconvergence cost as much as the division, and the
// callers can keep the operands in range with power-of-two prescaling (exact), so they use the
// fast path alone. tests/cuda/test_block_scale_gpu.cu compares every caller with IEEE division
// over every input it can get.
__device__ __forceinline__ float rcp_approx(float b) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(b));
  return r;
}
// a / b rounded to nearest even, for b and 1 / b normal, a >= 2^-64 and a / b normal (the
// callers' ranges, tested exhaustively).
__device__ __forceinline__ float div_rn_inrange(float a, float b) {
  const float r = rcp_approx(b);
  const float y = __fmaf_rn(r, __fmaf_rn(-b, r, 1.0f), r);
  const float q = __fmul_rn(a, y);
  return __fmaf_rn(__fmaf_rn(-b, q, a), y, q);
}
// min(x, FLT_MAX) that keeps a NaN (fminf would return FLT_MAX).
__device__ __forceinline__ float min_nan(float x, float m) {
  float d;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(x), "f"(m));
  return d;
}

// Per-expert values, reloaded only when a CTA's item moves to another expert.
struct GroupInfo {
  qnum::Geom g;
  int64_t gi = -1;
  int64_t nb = 0;      // column blocks of the expert: ceil(rows / cb)
  float mul = 1.0f;    // fp8_current: the expert's scale
  float s_enc = 1.0f;  // nvfp4 S_enc and S_enc / 6
  float s_enc6 = 1.0f / 6.0f;
  // nvfp4: S_enc * 2^k and 2^-k (k = -64, 0, 64) so that the per-block S_enc / s_b
  // (s_b in [2^-9, 448]) runs in div_rn_inrange's range; S_enc is in [2^-117, FLT_MAX].
  float s_enc_scaled = 1.0f, s_enc_unscale = 1.0f;
};

// nvfp4: the expert's S_enc and what the block multipliers need of it.
__device__ __forceinline__ void nvfp4_expert_senc(GroupInfo& gr, float s_enc) {
  gr.s_enc = s_enc;
  gr.s_enc6 = gr.s_enc / kE2M1Max;  // the same fp32 operation as make_block_quant
  const float k = gr.s_enc >= 0x1p64f ? 0x1p-64f : (gr.s_enc < 0x1p-64f ? 0x1p64f : 1.0f);
  gr.s_enc_scaled = gr.s_enc * k;
  gr.s_enc_unscale = 1.0f / k;
}
__device__ __forceinline__ void nvfp4_expert(GroupInfo& gr, float amax) {
  nvfp4_expert_senc(gr, qnum::nvfp4_s_enc(amax));
}

// g: the expert's geometry (from the scheduler's plan copy); amax: its amax (fp8_current, nvfp4).
template <int R>
__device__ __forceinline__ void load_group(const TileParams& p, int64_t gi, const qnum::Geom& g,
                                           GroupInfo& gr, float amax = 0.0f) {
  gr.gi = gi;
  gr.g = g;
  gr.nb = (gr.g.rows + p.L.cb - 1) >> p.cb_shift;  // cb = 2^cb_shift: no 64-bit division
  if constexpr (R == qnum::kFp8Current) {
    gr.mul = qnum::fp8_current_scale(amax, p.L.e5m2, p.L.pow2).scale;
  } else if constexpr (R == qnum::kNvfp4) {
    nvfp4_expert(gr, amax);
  }
}

// e4m3 code -> fp32: the hardware cvt (e4m3 values are exact in f16; 0x7F gives a NaN, as
// e4m3_to_float does; its payload is irrelevant: a NaN multiplier only selects the NaN code).
__device__ __forceinline__ float e4m3_to_float_dev(uint8_t c) {
#ifdef GROUPMM_QUANT_SOFT_CVT
  return e4m3_to_float(c);
#else
  uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(static_cast<unsigned short>(c)));
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h2 & 0xFFFFu)));
#endif
}

// qnum::nvfp4_elem_scale(S_enc, fp32(s_b)) for s_b != 0 (see block_quant).
__device__ __forceinline__ float nvfp4_block_mul(const GroupInfo& gr, uint8_t s_b) {
  const float s = div_rn_inrange(gr.s_enc_scaled, e4m3_to_float_dev(s_b));
  return min_nan(__fmul_rn(s, gr.s_enc_unscale), 3.40282347e38f);
}

// Block quantization of a block with canonical amax bits `am` (the device half of
// qnum::make_block_quant, with the per-expert part hoisted into GroupInfo). The same operations as
// the qnum functions, written without their early returns: the compiler turned those into
// branches and reconvergence points that cost ~35 instructions per block (about 14% of all
// instructions of MXFP8 "both", 4 blocks per thread and tile).
template <int R>
__device__ __forceinline__ qnum::BlockQuant block_quant(uint32_t am, const GroupInfo& gr,
                                                        const qnum::Layout& L) {
  qnum::BlockQuant q;
  if constexpr (R == qnum::kFp8Current) {
    q.mul = gr.mul;
  } else if constexpr (R == qnum::kFp8Block) {
    // qnum::fp8_block_scale: {1, 1} unless 0 < amax < Inf and v = amax / fmax is normal. v by one
    // residual correction of amax * RN(1 / fmax) (Markstein: exact; a subnormal quotient stays
    // subnormal); fmax / amax by div_rn_inrange, amax >= 2^64 prescaled by 2^-64 (amax >= 2^-117
    // when v is normal, so 1 / amax stays normal).
    const float fmax = L.e5m2 ? kE5M2Max : kE4M3Max;
    const float rfmax = L.e5m2 ? (1.0f / kE5M2Max) : (1.0f / kE4M3Max);
    const float a = __uint_as_float(am);
    const float q0 = __fmul_rn(a, rfmax);
    const float v = __fmaf_rn(__fmaf_rn(-fmax, q0, a), rfmax, q0);
    const uint32_t vb = __float_as_uint(v);
    const bool ok = am != 0u && am < 0x7F800000u && (vb >> 23) != 0u;
    float mul, inv;
    if (L.pow2) {  // round v up to a power of two 2^(E - 127); 1 / it = 2^(127 - E) (E <= 247)
      const uint32_t E = (vb >> 23) + ((vb & 0x7FFFFFu) != 0u ? 1u : 0u);
      inv = __uint_as_float(E << 23);
      mul = __uint_as_float((254u - E) << 23);
    } else {
      inv = v;
      const float k = a >= 0x1p64f ? 0x1p-64f : 1.0f;
      mul = __fmul_rn(div_rn_inrange(fmax, __fmul_rn(a, k)), k);
    }
    q.mul = ok ? mul : 1.0f;
    q.scale_inv = ok ? inv : 1.0f;
  } else if constexpr (R == qnum::kMxfp8) {
    // qnum::mx_e8m0 (float_to_e8m0_roundup of amax / fmax) and qnum::mx_quant_mul.
    const float v = __uint_as_float(am) * (L.e5m2 ? (1.0f / kE5M2Max) : (1.0f / kE4M3Max));
    const uint32_t u = __float_as_uint(v) & 0x7FFFFFFFu;
    uint32_t e = min((u + 0x7FFFFFu) >> 23, 254u);  // exponent, +1 if any mantissa bit
    e = u > 0x7F800000u ? 255u : e;                 // NaN
    const uint32_t m = e >= 254u ? (e == 255u ? 0x7FC00000u : 0x00400000u) : (254u - e) << 23;
    q.code = static_cast<uint8_t>(e);
    q.mul = __uint_as_float(m);
  } else {
    // qnum::nvfp4_block_scale with the e4m3 encode done by the same cvt as the fp8 data
    // (bit-identical to float_to_e4m3; GROUPMM_QUANT_SOFT_CVT switches both back).
    // qnum::nvfp4_elem_scale = min(S_enc / fp32(s_b), FLT_MAX), NaN kept: the division on the
    // prescaled S_enc (GroupInfo), scaled back (exact, or Inf past FLT_MAX: clamped). A zero s_b
    // gives NaN instead of FLT_MAX here; its block encodes as 0 either way (fp4x8).
    q.code = static_cast<uint8_t>(fp8x2<false>(__fmul_rn(__uint_as_float(am), gr.s_enc6), 0.0f));
    q.mul = nvfp4_block_mul(gr, q.code);
  }
  return q;
}

// Scale indices of quantize.hpp "Layouts": qnum::row_scale_index / col_scale_index where they
// divide by nothing at runtime, else with those divisions hoisted into TileParams / GroupInfo.
__device__ __forceinline__ int64_t row_sidx(const TileParams& p, const qnum::Geom& g, int64_t lr,
                                            int64_t sc) {
  if (p.L.fp8_2d || p.L.mn_major) return qnum::row_scale_index(p.L, g, lr, sc);  // no division
  if (!p.L.swizzled) return (g.start + lr) * p.row_ncols + sc;
  return qnum::swizzle_128x4(g.tile_start * 128 + lr, sc, p.row_kp);
}
// row_sidx of row r (< 128) of the expert-local tile lt: the tile part is CTA-uniform 64-bit, the
// in-tile part 32-bit (it is on every rowwise thread's path).
__device__ __forceinline__ int64_t row_sidx_t(const TileParams& p, const qnum::Geom& g, int64_t lt,
                                              int r, int sc) {
  if (p.L.fp8_2d || p.L.mn_major) return qnum::row_scale_index(p.L, g, lt * 128 + r, sc);
  const unsigned ur = static_cast<unsigned>(r), us = static_cast<unsigned>(sc);
  if (!p.L.swizzled)
    return (g.start + lt * 128) * p.row_ncols + int64_t(ur * unsigned(p.row_ncols) + us);
  return (g.tile_start + lt) * 128 * p.row_kp +
         int64_t((us >> 2) * 512u + (ur & 31u) * 16u + (ur >> 5) * 4u + (us & 3u));
}
__device__ __forceinline__ int64_t col_sidx(const TileParams& p, const GroupInfo& gr, int64_t k,
                                            int64_t j) {
  if (p.L.mn_major) return qnum::col_scale_index(p.L, gr.g, k, j);  // no division
  if (p.L.fp8_2d) return p.row_ncols * gr.g.cb_start + k * gr.nb + j;
  if (!p.L.swizzled) return p.K * gr.g.cb_start + k * gr.nb + j;
  return p.col_k128 * gr.g.cs4_start + qnum::swizzle_128x4(k, j, qnum::round_up(gr.nb, 4));
}

// Item range [begin, end) of CTA b out of n CTAs (sizes differ by at most one).
__device__ __forceinline__ void item_range(int64_t n_items, int64_t b, int64_t n, int64_t& begin,
                                           int64_t& end) {
  begin = n_items * b / n;
  end = n_items * (b + 1) / n;
}

// ---- the item schedule (thread 0 of each CTA; state and results in shared memory) ---------------
// Static schedule (fp8_block, mxfp8, and fp8_current / nvfp4 after a separate amax pass): items in
// row-major order (row tile, column tile), dealt out dynamically: CTA b's first kSt items are b,
// b + grid, ..., the later ones come from an atomic ticket counter (taken after an item's barrier,
// for the item kSt later: see the loop's end). Fixed
// contiguous ranges per CTA were unbalanced although every CTA had the same item count: CTAs ran
// at very different speeds (H200 trace, mxfp8 both [32768, 2048]: CTA end times 57 to 91 us,
// [65536, 7168]: 369 to 589 us) and the slowest set the time. The fused schedule (fp8_current /
// nvfp4, TileParams::fused) makes each expert's amax in the same kernel: every tile is an amax item
// and later a quantize item, handed out by one atomic ticket counter in blocks: block k (k = 0 ..
// G - 1 + lag) = amax items of expert k merged with the quantize items of expert k - lag (the
// first `grid` amax items first, the rest spread evenly). So an expert is quantized while the
// experts `lag` ahead of it are read, and its tiles are re-read from L2 about `lag` experts' worth
// of traffic after their amax read (the host picks lag so that this fits in L2; lag 1 for experts
// of tens of MB, more for small experts, whose quantize items would otherwise wait for amax items
// still in flight). Each amax item stores its maximum into its own slot (one relaxed store: no
// atomics, no fence on the item's path); a CTA's first quantize item of an expert reduces the
// expert's slots, waiting for any still empty. Forward progress needs no co-residency: a quantize
// item waits only for amax items with smaller tickets, and the smallest unfinished ticket always
// belongs to a running CTA that can finish it. Block k starts at ticket S(k) + S(k - lag), S(k) =
// tile_start[k] * col_tiles (items before expert k, 0 for k < 0, all for k > G).
enum : int32_t { kItemNone = 0, kItemQuant = 1, kItemAmax = 2 };
enum : int32_t { kPadRow = 1, kPadCol = 2 };

struct ItemInfo {      // one 128x128 work item, CTA-uniform
  const uint8_t* src;  // input element (row0, col0) of the tile
  int64_t gi;          // expert
  int64_t t;           // global row tile (dbias partial row)
  int32_t lt, ct;      // expert-local row tile, column tile
  int32_t vr, vc;      // valid rows, valid columns
  int32_t kind;
  int32_t flags;         // kPadRow / kPadCol: the tile writes swizzle padding (rare)
  int64_t slot0, slot1;  // fused quantize item: the expert's amax slots [slot0, slot1)
  uint32_t amax;         // fused quantize item with ready set: the expert's amax (canonical bits)
  int32_t ready;         // kEarly: set by the last warp before the item runs (see the loop)
};

struct SchedState {
  int64_t gi;  // static: expert of the last item (tickets only grow); fused: block cursor
  // The plan the scheduler reads: its arrays point at the shared-memory copy when G <=
  // kPlanCacheG (in the order of plan_array).
  QuantPlan plan;
};
// The plan's five arrays by index (the order of the shared-memory copy).
__device__ __forceinline__ int64_t*& plan_array(QuantPlan& q, int a) {
  return a == 0   ? q.tile_start
         : a == 1 ? q.start
         : a == 2 ? q.rows
         : a == 3 ? q.cb_start
                  : q.cs4_start;
}

// The schedule's arithmetic is 32-bit: tickets < 2 * items < 2^31 (host check), and on
// thread 0's path before every item's barrier 64-bit integer and double-division chains cost
// ~650 cycles per item (H200, clock64 trace, fp8_current rowwise [32768, 2048]: the schedule took
// 2150 of ~4600 cycles per item, the CTA's barrier waiting on it).
__device__ __forceinline__ uint32_t items_before(const TileParams& p, const SchedState& s,
                                                 int64_t k) {  // S(k)
  if (k <= 0) return 0u;
  return static_cast<uint32_t>(s.plan.tile_start[k < p.plan.G ? k : p.plan.G]) *
         static_cast<uint32_t>(p.col_tiles);
}

// floor(a * b / c) for c > 0, a, b < 2^31: one double division (the quotient to within one;
// n < 2^62 need not be exact in a double), then an exact fix-up.
__device__ __forceinline__ uint32_t muldiv(uint32_t a, uint32_t b, uint32_t c) {
  const uint64_t n = uint64_t(a) * b;
  uint32_t q = static_cast<uint32_t>(static_cast<double>(n) / static_cast<double>(c));
  if (uint64_t(q) * c > n) {
    --q;
  } else if (uint64_t(q + 1) * c <= n) {
    ++q;
  }
  return q;
}

// floor(n / col_tiles) for any 32-bit n: one double product with TileParams::rcp_col_tiles, the
// reciprocal rounded up (an integer division is ~20 dependent instructions). Exact: with d =
// col_tiles <= 65535 (host check) and r in [1/d, (1 + 2^-51) / d], n * r rounds to at least
// n / d (to exactly q when n / d = q), and when n / d = q + f with 0 < f <= 1 - 1/d to at most
// q + 1 - 2^-16 + 2^-19 + 2^-21 < q + 1 (n / d * 2^-51 < 2^-19, a rounding step < 2^-21).
__device__ __forceinline__ uint32_t div_col_tiles(const TileParams& p, uint32_t n) {
  return static_cast<uint32_t>(static_cast<double>(n) * p.rcp_col_tiles);
}

template <class In>
__device__ void make_item(const TileParams& p, const SchedState& s, int32_t kind, int64_t gi,
                          int64_t t, int ct, ItemInfo& it) {
  const int64_t start = s.plan.start[gi], rows = s.plan.rows[gi], ts = s.plan.tile_start[gi];
  const int64_t row0 = (t - ts) * qnum::kTileRows, col0 = int64_t(ct) * TileConfig::kCols;
  it.src =
      reinterpret_cast<const uint8_t*>(static_cast<const In*>(p.x) + (start + row0) * p.K + col0);
  it.gi = gi;
  it.t = t;
  it.lt = static_cast<int32_t>(t - ts);
  it.ct = ct;
  it.vr = static_cast<int32_t>(min(int64_t(qnum::kTileRows), rows - row0));
  it.vc = static_cast<int32_t>(min(int64_t(TileConfig::kCols), p.K - col0));
  it.kind = kind;
  // Swizzled scales: does this tile write part of its expert's zero padding? Rowwise: rows past
  // the expert (a partial tile) or columns past K / B (the last column tile when Kp > K / B).
  // Columnwise: rows k past K (the last column tile when roundup(K, 128) > K) or block columns past
  // nb (the expert's last row tile when nb % 4 != 0). Decided here once per item: the kernel's
  // per-thread test cost three integer divisions per tile.
  it.flags = 0;
  it.ready = 0;
  if (p.L.swizzled) {
    const bool last_ct = ct == p.col_tiles - 1;
    if (it.vr < TileConfig::kRows || (last_ct && p.row_kp > p.row_ncols)) it.flags |= kPadRow;
    const int64_t nb = (rows + (int64_t(1) << p.cb_shift) - 1) >> p.cb_shift;
    if ((last_ct && p.col_k128 > p.K) || (row0 + TileConfig::kRows >= rows && (nb & 3) != 0))
      it.flags |= kPadCol;
  }
}

// The next item of this CTA for `ticket` (static: the item index; fused: the ticket).
template <class In, bool kFused>
__device__ void sched_next(const TileParams& p, SchedState& s, uint32_t ticket, ItemInfo& it) {
  const uint32_t ncol = static_cast<uint32_t>(p.col_tiles);
  if constexpr (!kFused) {
    // item count < 2^30 (host check): 32-bit arithmetic
    if (int64_t(ticket) >= s.plan.tile_start[p.plan.G] * p.col_tiles) {
      it.kind = kItemNone;
      return;
    }
    const uint32_t t = div_col_tiles(p, ticket);
    if (t >= s.plan.tile_start[s.gi + 1]) s.gi = find_group(s.plan.tile_start, p.plan.G, t);
    make_item<In>(p, s, kItemQuant, s.gi, t, static_cast<int>(ticket - t * ncol), it);
  } else {
    const int64_t G = p.plan.G, D = p.lag;
    const uint32_t T = ticket;
    if (T >= 2u * items_before(p, s, G)) {
      it.kind = kItemNone;
      return;
    }
    // Block k of tickets [B(k), B(k + 1)), B(k) = S(k) + S(k - D).
    int64_t k = s.gi;
    while (k < G + D - 1 && T >= items_before(p, s, k + 1) + items_before(p, s, k + 1 - D)) ++k;
    s.gi = k;
    const uint32_t sa0 = items_before(p, s, k), sa1 = items_before(p, s, k + 1);
    const uint32_t sq0 = items_before(p, s, k - D), sq1 = items_before(p, s, k + 1 - D);
    const uint32_t j = T - (sa0 + sq0), na = sa1 - sa0, nq = sq1 - sq0;
    const uint32_t F = min(na, gridDim.x);
    bool amax_item = j < F;
    uint32_t idx = j;
    if (!amax_item) {
      const uint32_t jj = j - F, r = na - F, tot = r + nq;
      const uint32_t before = muldiv(jj, r, tot);
      amax_item =
          uint64_t(jj + 1) * r >= uint64_t(before + 1) * tot;  // muldiv(jj + 1, ..) > before
      // Quantize items walk the expert backwards: the tiles read last by its amax items (most
      // likely still in L2) are quantized first.
      idx = amax_item ? F + before : nq - 1 - (jj - before);
    }
    const int64_t e = amax_item ? k : k - D;
    const uint32_t tl = div_col_tiles(p, idx);
    make_item<In>(p, s, amax_item ? kItemAmax : kItemQuant, e, s.plan.tile_start[e] + tl,
                  static_cast<int>(idx - tl * ncol), it);
    it.slot0 = amax_item ? sa0 : sq0;
    it.slot1 = amax_item ? sa1 : sq1;
  }
}

// The amax slots are data and flag in one word: relaxed (morally strong) accesses, no fences.
__device__ __forceinline__ uint32_t ld_relaxed_gpu(const uint32_t* a) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(a) : "memory");
  return v;
}
__device__ __forceinline__ void st_relaxed_gpu(uint32_t* a, uint32_t v) {
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(a), "r"(v) : "memory");
}

// Per-expert outputs of the fused recipes from the expert's final amax.
template <int R>
__device__ __forceinline__ void write_expert_scalars(const TileParams& p, int64_t g, float amax) {
  if constexpr (R == qnum::kFp8Current)
    p.scale_inv_g[g] = qnum::fp8_current_scale(amax, p.L.e5m2, p.L.pow2).scale_inv;
  if constexpr (R == qnum::kNvfp4) p.global_scale[g] = qnum::nvfp4_s_enc(amax);
}

// Fused: an expert's amax is reduced from its slots; its outputs, and the CTA's current expert.
// Every CTA that reduces the expert writes the same values.
template <int R>
__device__ __forceinline__ void install_expert(const TileParams& p, const SchedState& s, int64_t gi,
                                               uint32_t amax, GroupInfo& cur) {
  p.amax_bits[gi] = amax;
  write_expert_scalars<R>(p, gi, __uint_as_float(amax));
  load_group<R>(p, gi, s.plan.geom(gi), cur, __uint_as_float(amax));
}

}  // namespace tile_detail

// kFused: the fused amax schedule (fp8_current / nvfp4, see "item schedule"); kEarly: with the
// early expert-amax reduction (TileParams::early_amax; a template parameter because the dormant
// code alone, its pending loads held in registers across the loop, cost ~2% on [65536, 7168]).
template <class In, int R, bool kE5m2, bool kFused, bool kEarly>
__global__ void __launch_bounds__(TileConfig::kThreads,
                                  sizeof(In) == 4 ? 1 : TileConfig::kMinBlocks)
    quantize_tile_kernel(TileParams p) {
  using Cfg = TileConfig;
  using namespace tile_detail;
  using E = Elt<In>;
  using Pair = typename E::Pair;
  using S = TileSmem<In>;
  constexpr bool kFp4 = R == qnum::kNvfp4;
  extern __shared__ __align__(128) uint8_t smem[];  // [2] input tiles, then the plan cache
  __shared__ uint32_t blk2d[64];  // 2D block amax: [8][8] nvfp4 16x16, [16] fp8 128x128
  {
    // ---- before the wait: this CTA's first items, guessed, into L2 ----------------------------
    // The plan is not readable yet, but the first items are b + q * grid (static; fused: the
    // first tickets are expert 0's amax items in the same order), and row tile t lies at row
    // 128 t of the input when the experts are multiples of 128 rows (else a little earlier: a
    // partial guess). So the first loads after the wait find their lines in L2 (H200: mxfp8 both
    // 73.7 -> 74.2% of copy on [32768, 2048]). Only x is touched here, and only in L2, the point
    // of coherence: a line fetched before the kernel that writes x finishes takes its writes.
    const int q = static_cast<int>(threadIdx.x) / TileConfig::kRows;
    const int r = static_cast<int>(threadIdx.x) % TileConfig::kRows;
    if (q < TileConfig::kStages && (reinterpret_cast<uintptr_t>(p.x) & 15) == 0) {
      const int64_t item = blockIdx.x + int64_t(q) * gridDim.x;
      const int64_t t = div_col_tiles(p, static_cast<uint32_t>(item)), ct = item - t * p.col_tiles;
      const int64_t row = t * TileConfig::kRows + r;
      if (row < p.M) {
        const int64_t col0 = ct * TileConfig::kCols;
        const int64_t n = min(int64_t(TileConfig::kCols), p.K - col0);
        prefetch_l2(static_cast<const In*>(p.x) + row * p.K + col0,
                    static_cast<uint32_t>(n * sizeof(In)));
      }
    }
  }
  pdl_wait();  // the plan (or the amax pass): this kernel may start before they finish
  // The next kernel in the stream (e.g. the next call's plan) may launch now: it waits for this
  // grid in its own pdl_wait, and it only becomes resident as this kernel's CTAs retire (they
  // fill the SMs), so its launch latency overlaps this kernel's tail.
  pdl_launch_dependents();
  // Not const: laundered at every item (see the loop), so that nothing derived from it is hoisted.
  int tid = static_cast<int>(threadIdx.x);
  const qnum::Layout& L = p.L;
  const int64_t K = p.K;
  const int Ki = static_cast<int>(K);  // K <= 65535 * 128: in-tile offsets r * K fit in 32 bits
  const int64_t G = p.plan.G;
  constexpr bool kExpertAmax = R == qnum::kFp8Current || R == qnum::kNvfp4;
  static_assert(kExpertAmax || !kFused, "only fp8_current and nvfp4 have an expert amax");
  static_assert(kFused || !kEarly, "the early amax reduction belongs to the fused schedule");

  // Items, the scheduler state and the current expert live in shared memory, written by thread
  // 0 (CTA-uniform values held in registers across the loop pushed the 64-register budget into
  // spills, and recomputing them in every thread cost ~20% of all instructions). Item i uses
  // s_item[i % kRing] and buffer i % kStages: while item i is processed, items i + 1 .. i + kStages
  // - 1 load and thread 0 schedules item i + kStages.
  constexpr int kSt = Cfg::kStages, kRing = kSt + 1;
  __shared__ ItemInfo s_item[kRing];
  __shared__ SchedState s_sched;
  __shared__ __align__(16) unsigned char s_cur_raw[sizeof(GroupInfo)];
  __shared__ uint32_t s_amax;  // the current amax item's / expert's maximum (canonical bits)
  // kEarly: the last warp's early reduction (see the loop): the ring slot whose expert's slots
  // are in flight in pend (or -1), and the last expert it reduced.
  constexpr int kPendSlots = Cfg::kPendSlots;
  __shared__ int32_t s_pend_q;
  __shared__ int32_t s_retry_q;  // kEarly: the ring slot whose reduction found an empty slot
  __shared__ int64_t s_prep_gi;
  __shared__ uint32_t s_prep_amax;
  uint32_t pend[kPendSlots] = {};
  // kEarly, the last warp: the expert amax in pend when no slot is empty (then lane 0 marks ring
  // item q ready with it and remembers it as the last prepared expert); false otherwise.
  auto reduce_pend = [&](int q, int lane, uint32_t& m) {
    bool ok = true;
    m = 0;
#pragma unroll
    for (int k = 0; k < kPendSlots; ++k) {
      ok = ok && pend[k] != kSlotEmpty;
      m = max(m, pend[k]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
    const bool all_ok = __all_sync(0xFFFFFFFFu, ok);
    if (all_ok && lane == 0) {
      ItemInfo& it = s_item[q];
      it.amax = m;
      it.ready = 1;
      s_prep_gi = it.gi;
      s_prep_amax = m;
    }
    return all_ok;
  };
  GroupInfo& s_cur = *reinterpret_cast<GroupInfo*>(s_cur_raw);
  const bool cache_plan = G <= Cfg::kPlanCacheG;
  int64_t* const pc = reinterpret_cast<int64_t*>(smem + p.smem_plan);
  if (cache_plan) {
#pragma unroll
    for (int a = 0; a < Cfg::kPlanArrays; ++a)
      for (int i = tid; i <= G; i += Cfg::kThreads) pc[a * (G + 1) + i] = plan_array(p.plan, a)[i];
  }
  // Thread 0: the ticket of the next sched_next. Static: the first kSt items of CTA b are b + q *
  // grid, then the counter's tickets follow kSt * grid, each taken after an item's barrier for
  // the item kSt later (see the loop's end). Fused: all from the counter, fetched one item ahead:
  // taken when the item is scheduled, the atomic's latency sits on thread 0's path before the
  // barrier, which amax items (almost no work) cannot hide (H200, fp8_current rowwise 55.9 ->
  // 46.7% of copy on [32768, 2048]).
  uint32_t ticket = 0;
  const uint32_t ticket0 = kFused ? 0u : uint32_t(kSt) * gridDim.x;
  __syncthreads();
  if (tid == 0) {
    s_sched.plan = p.plan;
    if (cache_plan) {
#pragma unroll
      for (int a = 0; a < Cfg::kPlanArrays; ++a) plan_array(s_sched.plan, a) = pc + a * (G + 1);
    }
    s_sched.gi = 0;
    for (int q = 0; q < kSt; ++q) {
      ticket = kFused ? atomicAdd(p.plan.ticket, 1u) : blockIdx.x + uint32_t(q) * gridDim.x;
      sched_next<In, kFused>(p, s_sched, ticket, s_item[q]);
    }
    if (kFused) ticket = atomicAdd(p.plan.ticket, 1u);
    s_cur.gi = -1;
    s_amax = 0;
    s_pend_q = -1;
    s_retry_q = -1;
    s_prep_gi = -1;
  }
  // Per-expert scalars. Fused: only zero-row experts (no item; amax 0, zeroed by the plan); the
  // others are written where their amax is reduced. After an amax pass: all.
  if (kExpertAmax && blockIdx.x == 0) {
    for (int64_t g = tid; g < G; g += Cfg::kThreads) {
      if (kFused && p.plan.rows[g] == 0) write_expert_scalars<R>(p, g, 0.0f);
      if (!kFused) write_expert_scalars<R>(p, g, __uint_as_float(p.amax_bits[g]));
    }
  }
  __syncthreads();
  if (s_item[0].kind == kItemNone) return;

  // cp.async of item `it` into buf: 16-byte chunks, zero-filled past the expert / past K.
  // A thread loads chunk ch of rows r0 + j * kRowStep: one 64-bit source address per item, the
  // j-independent part of the swizzle once (this runs every item: see the loop's note on tid).
  auto issue_loads = [&](const uint8_t* buf, const ItemInfo& it) {
    constexpr int kRowStep = Cfg::kThreads / S::kChunksPerRow;
    static_assert(Cfg::kThreads % S::kChunksPerRow == 0 && kRowStep % 16 == 0, "load mapping");
    const int ch = tid % S::kChunksPerRow, r0 = tid / S::kChunksPerRow;
    const uint8_t* const src0 = it.src + (r0 * Ki + ch * S::kVec) * static_cast<int>(sizeof(In));
    const uint32_t d0 = static_cast<uint32_t>(__cvta_generic_to_shared(buf)) + r0 * S::kRowBytes;
    const int sw0 = ch ^ (r0 & 1) ^ ((ch >> 2) & 6);  // swz(r, ch) without its (r >> 4) term
    const bool ok_c = ch * S::kVec < it.vc;
    const int vr = it.vr;
#pragma unroll
    for (int j = 0; j < S::kLoads; ++j) {
      const int r = r0 + j * kRowStep;
      const bool ok = ok_c && r < vr;
      const uint8_t* src = src0 + int64_t(j * kRowStep) * Ki * static_cast<int>(sizeof(In));
      cp_async16(d0 + j * kRowStep * S::kRowBytes + ((sw0 ^ ((r >> 4) & 7)) << 4),
                 ok ? src : it.src, ok ? 16 : 0);
    }
  };

#pragma unroll
  for (int q = 0; q + 1 < kSt; ++q) {
    if (s_item[q].kind != kItemNone) issue_loads(smem + q * S::kBytes, s_item[q]);
    cp_async_commit();
  }
  int bi = 0;  // buffer of the current item
  for (int i = 0;; ++i) {
    // The per-thread addresses of every access pattern are loop invariant; hoisted out of the
    // loop they took ~30 registers for the whole kernel and forced spills under the 64-register
    // budget. Recomputing them costs a few integer operations per 128x128 tile.
    asm volatile("" : "+r"(tid));
    const int lane = tid % 32, warp = tid / 32;
    const ItemInfo& it = s_item[i % kRing];
    const bool has_next = s_item[(i + 1) % kRing].kind != kItemNone;
    const ItemInfo& nl = s_item[(i + kSt - 1) % kRing];  // loads now, into the buffer of i - 1
    const bool load_next = nl.kind != kItemNone;
    if (kFused && tid == 0) {
      // Fused: thread 0 schedules item i + kSt (the early reduction reads it) and takes the next
      // ticket before it issues its own loads, while the other warps issue theirs, rather than
      // after them (H200, fp8_current rowwise [32768, 2048]: 59.5 -> 60.0% of copy).
      ItemInfo& n2 = s_item[(i + kSt) % kRing];
      if (load_next) {
        sched_next<In, kFused>(p, s_sched, ticket, n2);
        ticket = atomicAdd(p.plan.ticket, 1u);  // used one item later
      } else {
        n2.kind = kItemNone;
      }
    }
    if (load_next) issue_loads(smem + (bi == 0 ? kSt - 1 : bi - 1) * S::kBytes, nl);
    cp_async_commit();
    if (!kFused && tid == 0 && it.gi != s_cur.gi) {  // static: the item's expert
      const float am = kExpertAmax ? __uint_as_float(p.amax_bits[it.gi]) : 0.0f;
      load_group<R>(p, it.gi, s_sched.plan.geom(it.gi), s_cur, am);
    }
    // Fused: the expert of a quantize item whose amax the early reduction made, installed by warp
    // 1 while thread 0 schedules (in series on thread 0 they were the barrier's critical path).
    if (kFused && tid == 32 && it.kind == kItemQuant && it.ready && it.gi != s_cur.gi)
      install_expert<R>(p, s_sched, it.gi, it.amax, s_cur);
    if (kEarly && warp == Cfg::kWarps - 1) {
      // ---- fused: the expert amax of upcoming quantize items, reduced ahead of time ----------
      // The last warp loads the slots of item i + kSt's expert after the barrier of item i
      // (kPendSlots per lane, if the expert has at most 32 * kPendSlots) and reduces them here,
      // one item later, for item i + kSt - 1 (thread 0 installs it before that item's barrier):
      // the loads' latency hides behind an item's work, and the item needs no blocking reduction
      // (two CTA barriers and an L2 round trip; on [32768, 2048] every quantize item paid one).
      // A still empty slot is loaded once more after this item's barrier (see the issue below);
      // if it is empty then too, the item takes the blocking reduction. Not warp 0: thread
      // 0's scheduling is on every item's critical path. s_retry_q is written here, before the
      // barrier, on every item (read after it): no write of it follows a read without a barrier.
      const int pq = s_pend_q;
      uint32_t m;
      const int rq = pq >= 0 && !reduce_pend(pq, lane, m) ? pq : -1;
      if (lane == 0) s_retry_q = rq;
      __syncwarp();
    }
    cp_async_wait<kSt - 1>();  // item i's group is complete
    __syncthreads();
    const uint8_t* const buf = smem + bi * S::kBytes;
    // Static: the ticket of item i + kSt, taken now and used at the item's end (the atomic's
    // latency hides behind the item).
    if (!kFused && tid == 0 && load_next) ticket = ticket0 + atomicAdd(p.plan.ticket, 1u);
    // columnwise mapping: column pair cp (columns c0, c0+1), rows [16 seg, 16 seg + 16)
    const int cp = lane + 32 * (warp & 1), seg = warp >> 1;
    // The last prepared expert, for the issue below: s_prep_*, or this item's second try. Read
    // by lane 0 only and broadcast, since lane 0 may write them below (no other lane may read
    // shared memory that lane 0 then writes without a barrier between). Volatile: a plain load
    // was speculated into every lane and discarded, and racecheck reported the pair.
    long long prep_gi = -1;
    uint32_t prep_amax = 0;
    if (kEarly && warp == Cfg::kWarps - 1) {
      if (lane == 0) {
        prep_gi = *static_cast<volatile int64_t*>(&s_prep_gi);
        prep_amax = *static_cast<volatile uint32_t*>(&s_prep_amax);
      }
      prep_gi = __shfl_sync(0xFFFFFFFFu, prep_gi, 0);
      prep_amax = __shfl_sync(0xFFFFFFFFu, prep_amax, 0);
    }
    if (kEarly && warp == Cfg::kWarps - 1 && s_retry_q >= 0) {
      // ---- the early reduction's second try: the slots still empty before the barrier --------
      // Loaded again now, an item later, and waited for here (the warp's share of this item
      // starts an L2 round trip late). The first try runs two items before the item does, and
      // often comes too early while the amax is there when the item runs (H200, [32768, 2048],
      // lag 4: ~19% of quantize items took the blocking reduction, which then rarely spun). With
      // this, lag 3 stops waiting: fp8_current rowwise 58.6 -> 61.8% of copy at lag 3. Item
      // i + kSt - 1 is still in the ring; what this sets is seen by warp 1 after this item's
      // closing barrier.
      const int rq = s_retry_q;
      const int64_t s0 = s_item[rq].slot0 + lane;
#pragma unroll
      for (int k = 0; k < kPendSlots; ++k)  // slots past the expert hold 0, never empty
        if (pend[k] == kSlotEmpty) pend[k] = ld_relaxed_gpu(p.slots + s0 + 32 * k);
      uint32_t m;
      if (reduce_pend(rq, lane, m)) {
        prep_gi = s_item[rq].gi;
        prep_amax = m;
      }
    }
    if (kEarly && warp == Cfg::kWarps - 1) {  // issue: the slots of item i + kSt's expert
      const int q2 = (i + kSt) % kRing;
      const ItemInfo& n2 = s_item[q2];
      int pq = -1;
      if (n2.kind == kItemQuant) {
        if (n2.gi == prep_gi) {  // same expert as the last prepared item
          if (lane == 0) {
            s_item[q2].amax = prep_amax;
            s_item[q2].ready = 1;
          }
        } else if (n2.slot1 - n2.slot0 <= 32 * kPendSlots) {
          const int64_t s0 = n2.slot0 + lane, s1 = n2.slot1;
#pragma unroll
          for (int k = 0; k < kPendSlots; ++k)
            pend[k] = s0 + 32 * k < s1 ? ld_relaxed_gpu(p.slots + s0 + 32 * k) : 0u;
          pq = q2;
        }
      }
      __syncwarp();
      if (lane == 0) s_pend_q = pq;
    }

    if (kFused && it.kind == kItemAmax) {  // ---- fused amax item: the tile's maximum ---------
      Pair m = E::zero();
#pragma unroll
      for (int j = 0; j < Cfg::kColSeg; ++j) m = E::absmax(m, S::pair(buf, seg * 16 + j, cp));
      uint32_t a = max(E::lo_bits(m), E::hi_bits(m));
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) a = max(a, __shfl_xor_sync(0xFFFFFFFFu, a, o));
      if (lane == 0 && a != 0) atomicMax(&s_amax, a);
      __syncthreads();
      if (tid == 0) {  // publish
        st_relaxed_gpu(p.slots + it.t * p.col_tiles + it.ct, s_amax);
        s_amax = 0;
      }
      if (!has_next) break;
      bi = bi + 1 == kSt ? 0 : bi + 1;
      continue;
    }
    if (kFused && it.gi != s_cur.gi) {  // ---- first quantize item of an expert: its amax -------
      uint32_t m = 0;
      for (int64_t j = it.slot0 + tid; j < it.slot1; j += Cfg::kThreads) {
        uint32_t v;
        while ((v = ld_relaxed_gpu(p.slots + j)) == kSlotEmpty) __nanosleep(32);
        m = max(m, v);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
      if (lane == 0 && m != 0) atomicMax(&s_amax, m);
      __syncthreads();
      if (tid == 0) {
        install_expert<R>(p, s_sched, it.gi, s_amax, s_cur);
        s_amax = 0;
      }
      __syncthreads();
    }

    const GroupInfo& cur = s_cur;
    const qnum::Geom& g = cur.g;
    const int64_t t = it.t;
    const int ct = it.ct;
    const int64_t lt = it.lt;
    const int64_t row0 = lt * Cfg::kRows;
    const int valid_rows = it.vr;
    const int64_t col0 = int64_t(ct) * Cfg::kCols;
    const int valid_cols = it.vc;

    // ---- 2D block amax (weights): 16x16 (nvfp4) or the whole 128x128 tile (fp8_block) -------
    if (L.block_2d) {
      Pair m0 = E::zero();
#pragma unroll
      for (int j = 0; j < Cfg::kColSeg; ++j) m0 = E::absmax(m0, S::pair(buf, seg * 16 + j, cp));
      uint32_t a0 = max(E::lo_bits(m0), E::hi_bits(m0));
      if constexpr (kFp4) {  // the 8 lanes of a 16-column block: lanes 8m .. 8m+7
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) a0 = max(a0, __shfl_xor_sync(0xFFFFFFFFu, a0, o));
        if (lane % 8 == 0) blk2d[seg * 8 + cp / 8] = a0;
      } else {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) a0 = max(a0, __shfl_xor_sync(0xFFFFFFFFu, a0, o));
        if (lane == 0) blk2d[warp] = a0;
      }
      __syncthreads();
    }
    auto tile_amax_2d = [&]() {
      uint32_t m = 0;
#pragma unroll
      for (int w = 0; w < Cfg::kWarps; ++w) m = max(m, blk2d[w]);
      return m;
    };

    // ---- rowwise: one 1x32 slab per thread, 4 lanes per row ------------------------------------
    if (p.rowwise) {
      {
        // Lane s of a row reads two 16-element runs: fp4 [32s, 32s + 32) (its two 1x16 blocks,
        // one 16-byte store of codes); fp8 [16s, 16s + 16) and [64 + 16s, 80 + 16s), so that each
        // of the two 16-byte stores of a warp writes 64 contiguous bytes of each of 8 rows (whole
        // sectors). mxfp8 blocks (1x32) then span two lanes: s / 2 and 2 + s / 2 (one shuffle).
        const int r = warp * 8 + lane / 4, s = lane % 4;
        const int e_run0 = kFp4 ? 32 * s : 16 * s, e_run1 = e_run0 + (kFp4 ? 16 : 64);
        Pair v[16];
        S::run16(buf, r, e_run0, v);
        S::run16(buf, r, e_run1, v + 8);
        uint32_t am0 = 0, am1 = 0;  // amax of run 0 / run 1 (or of their blocks)
        if constexpr (R != qnum::kFp8Current) {
          if (!L.block_2d) {
            Pair m0 = E::zero(), m1 = E::zero();
#pragma unroll
            for (int i = 0; i < 8; ++i) m0 = E::absmax(m0, v[i]);
#pragma unroll
            for (int i = 8; i < 16; ++i) m1 = E::absmax(m1, v[i]);
            am0 = max(E::lo_bits(m0), E::hi_bits(m0));
            am1 = max(E::lo_bits(m1), E::hi_bits(m1));
            if constexpr (R == qnum::kFp8Block) {  // 1x128: the 4 lanes of the row
              am0 = max(am0, am1);
              am0 = max(am0, __shfl_xor_sync(0xFFFFFFFFu, am0, 1));
              am0 = max(am0, __shfl_xor_sync(0xFFFFFFFFu, am0, 2));
            } else if constexpr (R == qnum::kMxfp8) {  // 1x32: lanes s, s ^ 1
              am0 = max(am0, __shfl_xor_sync(0xFFFFFFFFu, am0, 1));
              am1 = max(am1, __shfl_xor_sync(0xFFFFFFFFu, am1, 1));
            }
          } else if constexpr (kFp4) {
            am0 = blk2d[(r / 16) * 8 + 2 * s];
            am1 = blk2d[(r / 16) * 8 + 2 * s + 1];
          } else {
            am0 = tile_amax_2d();
          }
        }
        constexpr bool kTwoQ = kFp4 || R == qnum::kMxfp8;
        const qnum::BlockQuant q0 = block_quant<R>(am0, cur, L);
        const qnum::BlockQuant q1 = kTwoQ ? block_quant<R>(am1, cur, L) : q0;
        const bool row_ok = r < valid_rows;
        const int64_t e = (g.start + row0) * K + col0 + r * Ki;  // element index of row r, col0
        const bool ok0 = row_ok && e_run0 < valid_cols, ok1 = row_ok && e_run1 < valid_cols;
        if constexpr (kFp4) {
          uint32_t w[4];
#pragma unroll
          for (int h = 0; h < 4; ++h) {
            const qnum::BlockQuant& q = h < 2 ? q0 : q1;
            w[h] = fp4x8_pairs<In>(v + 4 * h, q.mul, q.code);
          }
          uint8_t* const dst = p.q_row + (e + e_run0) / 2;
          // K % 32 == 0: every row's 16-byte pieces are 16-byte aligned.
          const bool v16 = (reinterpret_cast<uintptr_t>(p.q_row) & 15) == 0 && (K & 31) == 0;
          if (v16 && ok1) {
            __stcs(reinterpret_cast<uint4*>(dst), make_uint4(w[0], w[1], w[2], w[3]));
          } else {
            if (ok0) __stcs(reinterpret_cast<uint2*>(dst), make_uint2(w[0], w[1]));
            if (ok1) __stcs(reinterpret_cast<uint2*>(dst + 8), make_uint2(w[2], w[3]));
          }
          const int64_t sc = (col0 + e_run0) / 16;  // even
          uint8_t* sr = static_cast<uint8_t*>(p.s_row);
          const int64_t si = row_sidx_t(p, g, lt, r, static_cast<int>(sc));
          // Scales sc, sc + 1 are adjacent in both layouts (sc even; plain: K / 16 even).
          if (ok1 && ((reinterpret_cast<uintptr_t>(sr) | uintptr_t(si)) & 1) == 0) {
            *reinterpret_cast<uint16_t*>(sr + si) =
                static_cast<uint16_t>(q0.code | (uint32_t(q1.code) << 8));
          } else {
            if (ok0) sr[si] = q0.code;
            if (ok1) sr[row_sidx_t(p, g, lt, r, static_cast<int>(sc) + 1)] = q1.code;
          }
        } else {
          uint32_t w[8];
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const float2 a = E::f2(v[2 * i]), b = E::f2(v[2 * i + 1]);
            w[i] = fp8x4<kE5m2>(a.x, a.y, b.x, b.y, i < 4 ? q0.mul : q1.mul);
          }
          if (ok0)
            __stcs(reinterpret_cast<uint4*>(p.q_row + e + e_run0),
                   make_uint4(w[0], w[1], w[2], w[3]));
          if (ok1)
            __stcs(reinterpret_cast<uint4*>(p.q_row + e + e_run1),
                   make_uint4(w[4], w[5], w[6], w[7]));
          if constexpr (R == qnum::kFp8Block) {
            float* sr = static_cast<float*>(p.s_row);
            if (!L.fp8_2d && row_ok && s == 0) sr[row_sidx_t(p, g, lt, r, ct)] = q0.scale_inv;
            if (L.fp8_2d && tid == 0) sr[row_sidx(p, g, row0, col0 / 128)] = q0.scale_inv;
          } else if constexpr (R == qnum::kMxfp8) {
            // Lane s stores block b = s / 2 (s even, run 0) or 2 + s / 2 (s odd, run 1).
            const int b = (s & 1) ? 2 + s / 2 : s / 2;
            if (row_ok && 32 * b < valid_cols)
              static_cast<uint8_t*>(p.s_row)[row_sidx_t(p, g, lt, r, 4 * ct + b)] =
                  (s & 1) ? q1.code : q0.code;
          }
        }
      }
      if (it.flags & kPadRow) {  // this tile's share of the expert's zero padding (swizzled)
        const int64_t ncols = p.row_ncols, Kp = p.row_kp;
        const int64_t c_begin = col0 / L.rb;
        const int64_t c_end = ct == p.col_tiles - 1 ? Kp : (col0 + Cfg::kCols) / L.rb;
        const int width = static_cast<int>(c_end - c_begin);
        for (int i = tid; i < Cfg::kRows * width; i += Cfg::kThreads) {
          const int r = i / width;
          const int64_t c = c_begin + i % width;
          if (r >= valid_rows || c >= ncols)
            static_cast<uint8_t*>(p.s_row)[row_sidx(p, g, row0 + r, c)] = 0;  // swizzled
        }
      }
    }

    // ---- columnwise (and the bias-gradient sums): a warp owns 8 whole columns ------------------
    // Lane (rg, pq) = (lane / 4, lane % 4) holds column pair 4 warp + pq (tile columns cc, cc + 1)
    // over rows [16 rg, 16 rg + 16). A column's 128 rows lie in one warp, so the 32x1 / 128x1
    // block amax and the bias-gradient sum merge by shuffles (no CTA barrier), and the 8 lanes of
    // a column write its codes as 8 pieces of one contiguous run of the expert's [K, m_g] block
    // straight from registers (16 / 8-byte stores when aligned; no transposed staging).
    const bool odd_fp4 = kFp4 && (g.rows & 1);  // packed nibbles would belong to two rows
    if (kFp4 && p.colwise && odd_fp4 && lt == 0 && ct == 0 && tid == 0)
      report_fault(p.status, kFaultSplitAlignment, OpId::group_quantize,
                   static_cast<int32_t>(cur.gi), g.rows);
    const bool do_col = p.colwise && !odd_fp4;
    const bool do_sum = p.dbias_partial != nullptr;
    if (do_col || do_sum) {
      const int pq = lane & 3, rg = lane >> 2;
      const int cpw = 4 * warp + pq;  // column pair
      const int cc = 2 * cpw;         // its first tile column
      Pair v[Cfg::kColSeg];
#pragma unroll
      for (int j = 0; j < Cfg::kColSeg; ++j) v[j] = S::pair(buf, rg * 16 + j, cpw);
      if (do_sum) {  // the documented order: per 16-row segment a sequential sum from +0, then
                     // the 8 segment sums in row order from +0
        float sx = 0.0f, sy = 0.0f;
#pragma unroll
        for (int j = 0; j < Cfg::kColSeg; ++j) {
          const float2 f = E::f2(v[j]);
          sx += f.x;
          sy += f.y;
        }
        float tx = 0.0f, ty = 0.0f;
#pragma unroll
        for (int rs = 0; rs < Cfg::kColSegs; ++rs) {
          tx += __shfl_sync(0xFFFFFFFFu, sx, pq + 4 * rs);
          ty += __shfl_sync(0xFFFFFFFFu, sy, pq + 4 * rs);
        }
        if (rg == 0) {
          float* const dp = p.dbias_partial + t * K + col0 + cc;
          if (cc < valid_cols) dp[0] = tx;
          if (cc + 1 < valid_cols) dp[1] = ty;
        }
      }
      if (do_col) {
        // Column block amax of columns cc, cc + 1: merged raw (canon(max) = max(canon)).
        uint32_t am[2] = {0, 0};
        if constexpr (R != qnum::kFp8Current) {
          if (!L.block_2d) {
            Pair mc = E::zero();
#pragma unroll
            for (int j = 0; j < Cfg::kColSeg; ++j) mc = E::absmax(mc, v[j]);
            if constexpr (R == qnum::kMxfp8) {  // 32x1: row groups 2b, 2b + 1
              mc = E::max2(mc, shfl_xor_pair(mc, 4));
            } else if constexpr (R == qnum::kFp8Block) {  // 128x1: all 8 row groups
              mc = E::max2(mc, shfl_xor_pair(mc, 4));
              mc = E::max2(mc, shfl_xor_pair(mc, 8));
              mc = E::max2(mc, shfl_xor_pair(mc, 16));
            }
            am[0] = E::lo_bits(mc);
            am[1] = E::hi_bits(mc);
          } else if constexpr (kFp4) {  // 16x16: row block rg, column block warp / 2
            am[0] = am[1] = blk2d[rg * 8 + warp / 2];
          } else {
            am[0] = am[1] = tile_amax_2d();
          }
        }
        const qnum::BlockQuant qk[2] = {block_quant<R>(am[0], cur, L),
                                        block_quant<R>(am[1], cur, L)};
        // Element (row row0, column col0 + cc) of the expert's [K, m_g] block: the start of the
        // column's run (store_col_run). fp4: every term is even (K even, m_g even here), so runs
        // start on a byte.
        const int64_t ebase = K * g.start + (col0 + cc) * g.rows + row0;
        if constexpr (kFp4) {
          uint32_t w[2][2];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float e0[8], e1[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) {
              const float2 x2 = E::f2(v[8 * h + j]);
              e0[j] = x2.x;
              e1[j] = x2.y;
            }
            if constexpr (sizeof(In) == 4) {
              w[0][h] = fp4x8(e0, qk[0].mul, qk[0].code);
              w[1][h] = fp4x8(e1, qk[1].mul, qk[1].code);
            } else {  // rows 8h + j; L / H: signs of column cc / cc + 1
              const Pair* u8 = v + 8 * h;
              const uint32_t a = prmt(u8[0], u8[2], 0xFBD9u);  // L0 L2 H0 H2
              const uint32_t b = prmt(u8[4], u8[6], 0xFBD9u);  // L4 L6 H4 H6
              const uint32_t c = prmt(u8[1], u8[3], 0xFBD9u);  // L1 L3 H1 H3
              const uint32_t d = prmt(u8[5], u8[7], 0xFBD9u);  // L5 L7 H5 H7
              w[0][h] = fp4x8_signed(e0, qk[0].mul, qk[0].code,
                                     sign_nibbles(prmt(a, b, 0x5410u), prmt(c, d, 0x5410u)));
              w[1][h] = fp4x8_signed(e1, qk[1].mul, qk[1].code,
                                     sign_nibbles(prmt(a, b, 0x7632u), prmt(c, d, 0x7632u)));
            }
          }
#pragma unroll
          for (int k = 0; k < 2; ++k)
            store_col_run<2>(p.q_col + (ebase + k * g.rows) / 2, valid_rows / 2,
                             cc + k < valid_cols, pq, rg, w[k]);
        } else {
          uint32_t w[2][4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float2 a = E::f2(v[4 * i]), b = E::f2(v[4 * i + 1]), c = E::f2(v[4 * i + 2]),
                         d = E::f2(v[4 * i + 3]);
            w[0][i] = fp8x4<kE5m2>(a.x, b.x, c.x, d.x, qk[0].mul);
            w[1][i] = fp8x4<kE5m2>(a.y, b.y, c.y, d.y, qk[1].mul);
          }
#pragma unroll
          for (int k = 0; k < 2; ++k)
            store_col_run<4>(p.q_col + ebase + k * g.rows, valid_rows, cc + k < valid_cols, pq, rg,
                             w[k]);
        }
        // Scales. Entries past K or past the expert's column blocks (swizzle padding) are
        // written by the padding loop below.
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          const int c = cc + k;
          if (c >= valid_cols) continue;
          if constexpr (R == qnum::kFp8Block) {
            float* sc = static_cast<float*>(p.s_col);
            if (!L.fp8_2d && rg == 0) sc[col_sidx(p, cur, col0 + c, lt)] = qk[k].scale_inv;
            if (L.fp8_2d && tid == 0 && k == 0)
              sc[col_sidx(p, cur, col0 / 128, lt)] = qk[0].scale_inv;
          } else if constexpr (R == qnum::kMxfp8) {  // block j = 4 lt + rg / 2
            const int64_t j = lt * 4 + rg / 2;
            if ((rg & 1) == 0 && j < cur.nb)
              static_cast<uint8_t*>(p.s_col)[col_sidx(p, cur, col0 + c, j)] = qk[k].code;
          } else if constexpr (kFp4) {  // block j = 8 lt + rg
            const int64_t j = lt * 8 + rg;
            if (j < cur.nb)
              static_cast<uint8_t*>(p.s_col)[col_sidx(p, cur, col0 + c, j)] = qk[k].code;
          }
        }
        if (it.flags & kPadCol) {  // swizzled padding: rows k >= K (last column tile), columns
                                   // j >= nb (last row tile)
          const int64_t nb = cur.nb, Jp = qnum::round_up(nb, 4);
          const int64_t per_tile = Cfg::kRows / L.cb;
          const int64_t j_begin = lt * per_tile;
          const bool last_tile = row0 + Cfg::kRows >= g.rows;
          const int64_t j_end = last_tile ? Jp : j_begin + per_tile;
          const int64_t k_end = ct == p.col_tiles - 1 ? p.col_k128 : col0 + Cfg::kCols;
          const int width = static_cast<int>(j_end - j_begin);
          const int height = static_cast<int>(k_end - col0);
          for (int i = tid; i < height * width; i += Cfg::kThreads) {
            const int64_t k = col0 + i / width, j = j_begin + i % width;
            if (k >= K || j >= nb)
              static_cast<uint8_t*>(p.s_col)[col_sidx(p, cur, k, j)] = 0;  // swizzled
          }
        }
      }
    }
    if (!kFused && tid == 0) {  // ---- static: schedule item i + kSt (its loads start next item)
      // Late on purpose: a CTA claims work only kSt items ahead of the one it runs. Claimed one
      // item earlier (the ticket fetched ahead, as the fused schedule does), a slow CTA held three
      // items when the counter ran out and the CTA ends spread by ~10 us (H200, mxfp8 both:
      // 74.4 -> 77.7% of copy on [32768, 2048], 80.7 -> 84.6% on [65536, 7168]).
      ItemInfo& n2 = s_item[(i + kSt) % kRing];
      if (load_next) {
        sched_next<In, kFused>(p, s_sched, ticket, n2);
      } else {
        n2.kind = kItemNone;
      }
    }
    __syncthreads();  // buf and blk2d are free for the next item
    if (!has_next) break;
    bi = bi + 1 == kSt ? 0 : bi + 1;
  }
}

template <class In, int R, bool kE5m2, bool kFused, bool kEarly>
void launch_quantize_tile_fmt(Context& ctx, const TileParams& p) {
  auto kernel = quantize_tile_kernel<In, R, kE5m2, kFused, kEarly>;
  static int configured = 0;  // the attribute is per function; set it once to the maximum
  if (configured == 0) {
    constexpr int kMax =
        TileConfig::kStages * tile_detail::TileSmem<In>::kBytes + TileConfig::kPlanCache;
    GROUPMM_CHECK_CUDA(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMax));
    configured = 1;
  }
  // After the plan kernel (or the amax pass): programmatic dependent launch, see pdl_wait.
  launch_pdl(kernel, dim3(p.grid), dim3(TileConfig::kThreads), p.smem_total, ctx.stream(), p);
}

// The fp8 data format (nvfp4 has none), the amax schedule and the early reduction are kernel
// template parameters.
template <class In, int R, bool kE5m2>
void launch_quantize_tile_sched(Context& ctx, const TileParams& p) {
  constexpr bool kExpertAmax = R == qnum::kFp8Current || R == qnum::kNvfp4;
  if (kExpertAmax && p.fused && p.early_amax) {
    launch_quantize_tile_fmt<In, R, kE5m2, kExpertAmax, kExpertAmax>(ctx, p);
  } else if (kExpertAmax && p.fused) {
    launch_quantize_tile_fmt<In, R, kE5m2, kExpertAmax, false>(ctx, p);
  } else {
    launch_quantize_tile_fmt<In, R, kE5m2, false, false>(ctx, p);
  }
}
template <class In, int R>
void launch_quantize_tile(Context& ctx, const TileParams& p) {
  constexpr bool kFp8 = R != qnum::kNvfp4;
  if (kFp8 && p.L.e5m2) {
    launch_quantize_tile_sched<In, R, kFp8>(ctx, p);
  } else {
    launch_quantize_tile_sched<In, R, false>(ctx, p);
  }
}

// Input-dtype dispatch used by the per-recipe translation units.
template <int R>
void launch_quantize_any(Context& ctx, const TileParams& p, DType in) {
  switch (in) {
    case DType::bf16:
      launch_quantize_tile<uint16_t, R>(ctx, p);
      return;
    case DType::fp16:
      launch_quantize_tile<__half, R>(ctx, p);
      return;
    case DType::fp32:
      launch_quantize_tile<float, R>(ctx, p);
      return;
    default:
      break;
  }
  GROUPMM_CHECK(false, "group_quantize: input.dtype=", dtype_name(in),
                " must be bf16, fp16 or fp32");
}

}  // namespace groupmm::cuda
