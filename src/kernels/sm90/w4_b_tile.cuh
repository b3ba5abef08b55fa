// The 4-bit B operand of the gathered grouped GEMM (GatheredGemmConfig::kBCodes, nvfp4 or
// mxfp4): the block scales a producer thread loads for a stage, and its conversion of a raw slot
// of codes (kTileN rows of 32 bytes, as the TMA unit wrote them) into the stage's bf16 B tile
// (K-major, 128-byte swizzle), with numerics/w4.hpp's exact weights: e2m1(c) * the block's
// multiplier, a bf16 value; nvfp4's 2^-10 and 1 / S_enc stay in the expert's fp32 factor, which the
// epilogue applies (qnum::w4_expert_factor).
//
// Work split: the 128 producer threads convert the tile in passes of 64 rows; thread t takes half
// h = t % 2 (codes 32 h .. 32 h + 31 of the stage's 64, 16 bytes) of row t / 2 + 64 j of pass j.
// A quarter warp then reads 128 contiguous bytes of the slot (4 rows x 32 bytes) and writes 8
// distinct 16-byte columns of the swizzle (chunk 4 h + i of row n lands at (4 h + i) ^ (n % 8)):
// both without bank conflicts.
#pragma once

#include <cstdint>

#include "kernels/common/tma.cuh"
#include "kernels/sm90/gathered_gemm_config.cuh"
#include "numerics/quantize_layout.hpp"
#include "numerics/w4.hpp"

namespace groupmm::cuda::sm90 {

template <class Config>
struct W4BTile {
  static constexpr bool kNv = Config::kBCodes == QuantRecipe::nvfp4;
  static constexpr int kPasses = Config::kTileN / 64;
  static constexpr int kRowBytes = Config::kTileK / 2;  // a row's codes in a raw slot
  static_assert(kRowBytes == 32, "two 16-byte halves a row");
  static_assert(!Config::kB4 || Config::kGatherThreads == 128, "all four producer warps convert");

  // The scale row of each pass's row in the tile (null past N), for one tile.
  struct Rows {
    const uint8_t* base[kPasses];
  };
  // A stage's scales of the thread's rows: mxfp4 the e8m0 byte of its 32 codes; nvfp4 the two
  // e4m3 bytes of its two 16-code blocks as one 16-bit word (low byte first).
  struct Scales {
    uint32_t v[kPasses];
  };

  __device__ __forceinline__ static Rows rows(const GatheredGemmParams& p, int g, int ct, int tid) {
    Rows r;
#pragma unroll
    for (int j = 0; j < kPasses; ++j) {
      const int64_t n = int64_t(ct) * Config::kTileN + tid / 2 + 64 * j;
      // qnum::row_scale_index of (expert g, row n, column 0) for the plain and swizzled layouts
      const int64_t i =
          p.b_scale_swizzled
              ? qnum::swizzle_128x4((int64_t(g) * p.b_scale_tiles) * 128 + n, 0, p.b_scale_ld)
              : (int64_t(g) * p.b_rows + n) * p.b_scale_ld;
      r.base[j] = n < p.b_rows ? p.b_scales + i : nullptr;
    }
    return r;
  }

  // K block kb's scales. Past N or K (the codes there are the copy's zero fill) a neutral
  // multiplier's byte, so that no out-of-range scale is read.
  __device__ __forceinline__ static Scales load(const GatheredGemmParams& p, const Rows& r, int kb,
                                                int tid) {
    const int h = tid & 1;
    const bool in_k = int64_t(kb) * Config::kTileK + 32 * h < p.K;
    const int sc = kNv ? 4 * kb + 2 * h : 2 * kb + h;
    // qnum::row_scale_col_offset, in 32-bit arithmetic (sc < 2^16)
    const int64_t off = p.b_scale_swizzled ? (sc >> 2) * 512 + (sc & 3) : sc;
    Scales s;
#pragma unroll
    for (int j = 0; j < kPasses; ++j) {
      if (in_k && r.base[j] != nullptr)
        s.v[j] = kNv ? uint32_t(*reinterpret_cast<const uint16_t*>(r.base[j] + off))
                     : uint32_t(r.base[j][off]);
      else
        s.v[j] = kNv ? 0x3838u : 127u;  // e4m3 1.0 twice; e8m0 2^0
    }
    return s;
  }

  // The raw slot's codes times their multipliers into the bf16 B tile `b`.
  __device__ __forceinline__ static void convert(const uint8_t* raw, uint8_t* b, const Scales& s,
                                                 int tid) {
    const int h = tid & 1;
    const uint32_t b_addr = smem_addr(b), raw_addr = smem_addr(raw);
#pragma unroll
    for (int j = 0; j < kPasses; ++j) {
      const int n = tid / 2 + 64 * j;
      uint32_t q[4];
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(q[0]), "=r"(q[1]), "=r"(q[2]), "=r"(q[3])
                   : "r"(raw_addr + n * kRowBytes + h * 16)
                   : "memory");
      uint32_t m[2];
      uint32_t m2 = 0;
      bool two = false;
      if constexpr (kNv) {
        qnum::w4_nvfp4_multipliers(s.v[j], m);  // codes 0..15: m[0], 16..31: m[1]
      } else {
        const uint8_t e = static_cast<uint8_t>(s.v[j]);
        m[0] = m[1] = qnum::w4_mxfp4_multiplier1(e);
        two = qnum::w4_mxfp4_needs_two(e);
        m2 = qnum::w4_mxfp4_multiplier2(e);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint32_t w[4], out[4];
        if (!kNv && two)
          qnum::w4_weights8(q[i], m[0], m2, w);
        else
          qnum::w4_weights8(q[i], m[i / 2], w);
        qnum::w4_natural_pairs(w, out);  // K order: codes 8 i .. 8 i + 7 of the half
        const uint32_t dst = b_addr + n * 128 + (((4 * h + i) ^ (n & 7)) * 16);
        asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(dst), "r"(out[0]),
                     "r"(out[1]), "r"(out[2]), "r"(out[3])
                     : "memory");
      }
    }
  }
};

}  // namespace groupmm::cuda::sm90
