// The block scales of the 4-bit RS kernel (w4_rs_gemm.cuh): its parameters, a row's scale word of
// a stage, the stage's block multipliers of a consumer thread's two rows (numerics/w4.hpp's exact
// bf16 factors), and with the scale warps (W4RsGemmConfig::kScaleWarps) the 16-byte records
// those warps write into each stage for the consumers to read. Templates take the kernel's
// config (kNv, kStages, kTileW, kXBytes, kCodeBytes, kStageBytes, kScaleThreads).
#pragma once

#include <cstdint>

#include "groupmm/core.hpp"
#include "kernels/common/ptx.cuh"
#include "kernels/common/tma.cuh"
#include "kernels/sm90/gathered_gemm.cuh"
#include "numerics/quantize_layout.hpp"
#include "numerics/w4.hpp"

namespace groupmm::cuda::sm90 {

struct W4RsParams {
  const uint16_t* bias;   // [G, N] bf16 or null
  uint16_t* out;          // [M, N] bf16
  const uint8_t* scales;  // block scales (plain: ld columns a row; swizzled 128x4: ld = kp)
  const float* s_enc;     // nvfp4: [G]
  const void* splits;
  bool splits64;
  bool splits_at_most;  // a sum of splits short of M is no fault (rows past it untouched)
  bool scale_swizzled;
  bool scale_words;  // a stage's scale bytes of a row are one aligned 2- (mxfp4) or 4-byte word
  float alpha;
  int32_t scale_ld, scale_tiles;  // scale columns a row (plain) or rounded to 4; 128-row tiles
  int64_t M, N, K, G;
  int32_t band_n;
  StatusBlock* status;
};

namespace w4rs {

// 16 bytes of shared memory at generic address `a` (ld_shared_v4).
__device__ __forceinline__ uint4 lds128(const void* a) {
  return ld_shared_v4(smem_addr(a));
}

// One row's scale bytes of a stage: mxfp4 two (blocks 2 kb, 2 kb + 1: slices 0-1, 2-3), nvfp4
// four (one a slice). Past K or N: a neutral byte (the codes there are zeros). A stage inside K
// takes one aligned 2- or 4-byte load (p.scale_words: both layouts keep a stage's bytes
// together): its value is first used a stage later, so the load's latency hides under this
// stage's MMAs, which byte loads combined on arrival did not.
template <class Config>
__device__ __forceinline__ uint32_t load_row_scales(const W4RsParams& p, const uint8_t* row_base,
                                                    int kb) {
  constexpr int kPer = Config::kNv ? 4 : 2;
  constexpr int kBlock = Config::kNv ? 16 : 32;
  constexpr uint32_t kNeutral = Config::kNv ? 0x38u : 127u;  // e4m3 1.0; e8m0 2^0
  const int64_t first = int64_t(kPer) * kb;                  // the stage's first scale column
  const int64_t at = p.scale_swizzled ? (first >> 2) * 512 + (first & 3) : first;
  if (row_base != nullptr && p.scale_words && (first + kPer) * kBlock <= p.K) {
    if constexpr (Config::kNv)
      return *reinterpret_cast<const uint32_t*>(row_base + at);
    else
      return *reinterpret_cast<const uint16_t*>(row_base + at);
  }
  uint32_t v = 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int64_t sc = first + i;
    uint32_t b = kNeutral;
    if (row_base != nullptr && sc * kBlock < p.K)
      b = row_base[p.scale_swizzled ? (sc >> 2) * 512 + (sc & 3) : sc];
    v |= b << (8 * i);
  }
  return v;
}

// A stage's block multipliers of the thread's two rows: m[h][b] for row r0 + 8 h and scale block b
// of the stage (mxfp4: b < 2, two slices each; nvfp4: b < 4, one slice each), the second mxfp4
// factor m2 (only for exponents past 128, see numerics/w4.hpp) and whether any block needs it.
template <class Config>
struct StageMultipliers {
  static constexpr int kBlocks = Config::kNv ? 4 : 2;
  uint32_t m[2][kBlocks];
  uint32_t m2[2][kBlocks];
  bool two;
  // From the scale words sc of the rows, or with kScaleWarps from their records in the stage's
  // multiplier area `mult` (rows r0 and r0 + 8): mxfp4 {m1 of blocks 0, 1; m2 of blocks 0, 1},
  // nvfp4 {m of blocks 0 .. 3}; m2 is 1 where a block needs no second factor.
  __device__ __forceinline__ StageMultipliers(const uint32_t (&sc)[2], const uint8_t* mult,
                                              int r0) {
    if constexpr (Config::kScaleWarps) {
      const uint4 rec[2] = {lds128(mult + 16 * r0), lds128(mult + 16 * (r0 + 8))};
      from_records(rec);
    } else {
      from_scales(sc);
    }
  }
  __device__ __forceinline__ void from_records(const uint4 (&rec)[2]) {
    two = false;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t w[4] = {rec[h].x, rec[h].y, rec[h].z, rec[h].w};
      if constexpr (Config::kNv) {
#pragma unroll
        for (int b = 0; b < kBlocks; ++b) m[h][b] = w[b];
      } else {
#pragma unroll
        for (int b = 0; b < kBlocks; ++b) {
          m[h][b] = w[b];
          m2[h][b] = w[2 + b];
          two |= w[2 + b] != kOne;
        }
      }
    }
  }
  static constexpr uint32_t kOne = 0x3F803F80u;  // bf16x2 (1, 1)
  __device__ __forceinline__ void from_scales(const uint32_t (&sc)[2]) {
    two = false;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if constexpr (Config::kNv) {
        uint32_t lo[2], hi[2];
        qnum::w4_nvfp4_multipliers(sc[h] & 0xFFFFu, lo);  // one cvt for two e4m3 scales
        qnum::w4_nvfp4_multipliers(sc[h] >> 16, hi);
        m[h][0] = lo[0], m[h][1] = lo[1], m[h][2] = hi[0], m[h][3] = hi[1];
      } else {
#pragma unroll
        for (int b = 0; b < kBlocks; ++b) {
          const uint8_t e = static_cast<uint8_t>(sc[h] >> (8 * b));
          m[h][b] = qnum::w4_mxfp4_multiplier1(e);
          m2[h][b] = qnum::w4_mxfp4_multiplier2(e);
          two |= qnum::w4_mxfp4_needs_two(e);
        }
      }
    }
  }
};

// A row's record of a stage (kScaleWarps) from its scale bytes `sc` (load_row_scales): the block
// multipliers StageMultipliers computes from them, in the order its record constructor reads.
template <class Config>
__device__ __forceinline__ uint4 row_record(uint32_t sc) {
  if constexpr (Config::kNv) {
    uint32_t lo[2], hi[2];
    qnum::w4_nvfp4_multipliers(sc & 0xFFFFu, lo);
    qnum::w4_nvfp4_multipliers(sc >> 16, hi);
    return make_uint4(lo[0], lo[1], hi[0], hi[1]);
  } else {
    const uint8_t e0 = static_cast<uint8_t>(sc), e1 = static_cast<uint8_t>(sc >> 8);
    return make_uint4(qnum::w4_mxfp4_multiplier1(e0), qnum::w4_mxfp4_multiplier1(e1),
                      qnum::w4_mxfp4_multiplier2(e0), qnum::w4_mxfp4_multiplier2(e1));
  }
}

// The scale rows' base pointer of tile row `r` (null past N): plain or swizzled 128x4.
__device__ __forceinline__ const uint8_t* scale_row(const W4RsParams& p, const TileCoord& c, int r,
                                                    int tile_w) {
  const int64_t n = int64_t(c.ct) * tile_w + r;
  const int64_t i = p.scale_swizzled
                        ? qnum::swizzle_128x4(int64_t(c.g) * p.scale_tiles * 128 + n, 0, p.scale_ld)
                        : (int64_t(c.g) * p.N + n) * p.scale_ld;
  return n < p.N ? p.scales + i : nullptr;
}

// The scale warps' part of a tile (kScaleWarps): for every stage of the tile, after the stage is
// free, the records of rows st and st + 96 (below kTileW) into the stage, then this thread's
// arrival on its full barrier. The scale words are loaded a stage ahead, as the consumers'
// own loads are without the scale warps.
template <class Config>
__device__ __forceinline__ void scale_tile(const W4RsParams& p, const TileCoord& c, uint8_t* stages,
                                           uint64_t* full, uint64_t* empty, int kb_count, int st,
                                           int& cnt) {
  constexpr int S = Config::kStages, R = Config::kScaleThreads;
  const uint8_t* srow[2] = {
      scale_row(p, c, st, Config::kTileW),
      st + R < Config::kTileW ? scale_row(p, c, st + R, Config::kTileW) : nullptr};
  const bool second = st + R < Config::kTileW;
  uint32_t sc[2] = {load_row_scales<Config>(p, srow[0], 0),
                    second ? load_row_scales<Config>(p, srow[1], 0) : 0u};
  for (int kb = 0; kb < kb_count; ++kb, ++cnt) {
    const int s = cnt % S;
    const uint32_t next0 = kb + 1 < kb_count ? load_row_scales<Config>(p, srow[0], kb + 1) : 0u;
    const uint32_t next1 =
        second && kb + 1 < kb_count ? load_row_scales<Config>(p, srow[1], kb + 1) : 0u;
    uint8_t* mult = stages + s * Config::kStageBytes + Config::kXBytes + Config::kCodeBytes;
    const uint4 r0 = row_record<Config>(sc[0]);
    const uint4 r1 = row_record<Config>(sc[1]);
    mbar_wait(&empty[s], ((cnt / S) & 1) ^ 1);
    *reinterpret_cast<uint4*>(mult + 16 * st) = r0;
    if (second) *reinterpret_cast<uint4*>(mult + 16 * (st + R)) = r1;
    detail::mbar_arrive(&full[s]);
    sc[0] = next0;
    sc[1] = next1;
  }
}

}  // namespace w4rs
}  // namespace groupmm::cuda::sm90
