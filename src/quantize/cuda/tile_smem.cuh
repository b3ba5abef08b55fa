// The tile kernel's shared-memory input tile: 128 rows of 128 elements with no padding, its
// 16-byte chunks XOR-swizzled so that every access pattern of the kernel is free of bank
// conflicts, and the cp.async that fills it.
#pragma once

#include "kernels/common/element.cuh"
#include "kernels/common/ptx.cuh"
#include "quantize/cuda/tile_config.cuh"

namespace groupmm::cuda::tile {

// Chunk ch of row r sits at ch ^ (r & 1) ^ ((ch >> 2) & 6) ^ ((r >> 4) & 7); a bank group is the
// stored chunk mod 8. Each access pattern meets 8 groups per phase: the cp.async writes and the
// fused / 2D amax reads (8 consecutive chunks of one row; the XOR terms are constant over an
// aligned group of 8 chunks), the rowwise reads (chunk k of the 4 slabs, ch = 2s + k / 4s + k, of
// two adjacent rows of one 16-row group), and the columnwise reads (one chunk, at rows
// 16 rg + j of the 8 row groups rg: the last term; 2-way for fp32 rows of 32 chunks).
__device__ __forceinline__ int swizzled_chunk(int r, int ch) {
  return ch ^ (r & 1) ^ ((ch >> 2) & 6) ^ ((r >> 4) & 7);
}

template <class E>
struct TileSmem {
  using Pair = typename E::Pair;
  static constexpr int kElemBytes = static_cast<int>(sizeof(typename E::Storage));
  static constexpr int kVec = 16 / kElemBytes;                    // elements per chunk
  static constexpr int kChunksPerRow = TileConfig::kCols / kVec;  // 16 or 32
  static constexpr int kRowBytes = TileConfig::kCols * kElemBytes;
  static constexpr int kBytes = TileConfig::kRows * kRowBytes;  // one buffer
  static constexpr int kLoads = TileConfig::kRows * kChunksPerRow / TileConfig::kThreads;
  static_assert(kLoads * TileConfig::kThreads == TileConfig::kRows * kChunksPerRow, "load split");

  static __device__ __forceinline__ const uint8_t* chunk(const uint8_t* buf, int r, int ch) {
    return buf + r * kRowBytes + (swizzled_chunk(r, ch) << 4);
  }
  // Columns (2 cp, 2 cp + 1) of row r.
  static __device__ __forceinline__ Pair pair(const uint8_t* buf, int r, int cp) {
    constexpr int kPairsPerChunk = 16 / (2 * kElemBytes);
    const uint8_t* c = chunk(buf, r, cp / kPairsPerChunk);
    return *reinterpret_cast<const Pair*>(c + (cp % kPairsPerChunk) * 2 * kElemBytes);
  }
  // The 16 elements [e0, e0 + 16) of row r (e0 a multiple of 16) as 8 pairs.
  static __device__ __forceinline__ void run16(const uint8_t* buf, int r, int e0, Pair* v) {
    constexpr int kChunks = 16 / kVec;  // 2 or 4
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const uint4 u = *reinterpret_cast<const uint4*>(chunk(buf, r, e0 / kVec + k));
      if constexpr (kElemBytes == 4) {
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

  // cp.async of one tile into buf: 16-byte chunks, zero-filled past the item's valid rows
  // (it.vr) and columns (it.vc); it.src: element (row 0, col 0) of the tile; row_elems: K
  // (< 2^24: in-tile offsets fit in 32 bits). A thread loads chunk ch of rows r0 + j * kRowStep:
  // one 64-bit source address per tile, the j-independent part of the swizzle once.
  template <class Item>
  static __device__ __forceinline__ void load_async(const uint8_t* buf, const Item& it, int tid,
                                                    int row_elems) {
    constexpr int kRowStep = TileConfig::kThreads / kChunksPerRow;
    static_assert(TileConfig::kThreads % kChunksPerRow == 0 && kRowStep % 16 == 0, "load mapping");
    const int ch = tid % kChunksPerRow, r0 = tid / kChunksPerRow;
    const uint8_t* const src0 = it.src + (r0 * row_elems + ch * kVec) * kElemBytes;
    const uint32_t d0 = static_cast<uint32_t>(__cvta_generic_to_shared(buf)) + r0 * kRowBytes;
    const int sw0 = ch ^ (r0 & 1) ^ ((ch >> 2) & 6);  // swizzled_chunk without its (r >> 4) term
    const bool ok_c = ch * kVec < it.vc;
    const int vr = it.vr;
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int r = r0 + j * kRowStep;
      const bool ok = ok_c && r < vr;
      const uint8_t* src = src0 + int64_t(j * kRowStep) * row_elems * kElemBytes;
      cp_async16(d0 + j * kRowStep * kRowBytes + ((sw0 ^ ((r >> 4) & 7)) << 4), ok ? src : it.src,
                 ok ? 16 : 0);
    }
  }

  // load_async with the tile's rows gathered: row r is input row it.rows[r] (it.src: the input's
  // row 0 at the tile's first column), -1 a zero row; an entry outside [-1, x_rows) reads as a
  // zero row and is reported (kFaultBadIndex, the item's expert). The row-map entries of a
  // thread's rows are loaded together before its copies are issued (one latency, not kLoads).
  template <class Item>
  static __device__ __forceinline__ void load_async_gathered(const uint8_t* buf, const Item& it,
                                                             int tid, int row_elems, int64_t x_rows,
                                                             StatusBlock* status) {
    constexpr int kRowStep = TileConfig::kThreads / kChunksPerRow;
    const int ch = tid % kChunksPerRow, r0 = tid / kChunksPerRow;
    const uint32_t d0 = static_cast<uint32_t>(__cvta_generic_to_shared(buf)) + r0 * kRowBytes;
    const int sw0 = ch ^ (r0 & 1) ^ ((ch >> 2) & 6);
    const bool ok_c = ch * kVec < it.vc;
    const int vr = it.vr;
    int32_t src_row[kLoads];
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int r = r0 + j * kRowStep;
      src_row[j] = ok_c && r < vr ? __ldg(it.rows + r) : -1;
    }
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int r = r0 + j * kRowStep;
      const int32_t s = src_row[j];
      const bool ok = s >= 0 && s < x_rows;
      if (!ok && s != -1 && ch == 0)
        report_fault(status, kFaultBadIndex, OpId::group_quantize, static_cast<int32_t>(it.gi), s);
      const uint8_t* src = it.src + (int64_t(ok ? s : 0) * row_elems + ch * kVec) * kElemBytes;
      cp_async16(d0 + j * kRowStep * kRowBytes + ((sw0 ^ ((r >> 4) & 7)) << 4), src, ok ? 16 : 0);
    }
  }
};

}  // namespace groupmm::cuda::tile
