// The grouped quantize kernel, templated on the input dtype and the recipe; quantize_fp8.cu,
// quantize_mx.cu and quantize_nvfp4.cu instantiate it.
//
// One CTA owns a tile of 128 expert-local rows x 128 columns (tile t of the expert's
// ceil(m_g/128) tiles; the grid covers the host-known bound M/128 + G row tiles and CTAs past the
// device-side total exit). Because tiles start at multiples of 128 inside an expert, every 1x16 /
// 1x32 / 1x128 row block, every 16/32/128-row column block, every 16x16 / 128x128 2D block and
// every 128-row swizzle block lies inside one tile, so a CTA computes all its scales locally and
// writes the swizzle padding of its own block. Phases:
//   load    16-byte coalesced loads of the tile into shared memory (rows past the expert and
//           columns past K are zero, which never changes an amax or a bias sum)
//   amax    per 16-element row segment (rseg) and per 16-row column segment (cseg)
//   rowwise each thread quantizes 16-element row segments and stores them as one 16-/8-byte store
//   colwise each thread quantizes 16-row column segments into a transposed staging tile, which
//           warps then copy out as contiguous runs of the expert's [K, m_g] block
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "core/quantize_impl.hpp"
#include "cuda/quantize_plan.cuh"
#include "cuda/status.cuh"

namespace groupmm::cuda {

struct TileConfig {
  static constexpr int kThreads = 256;
  static constexpr int kRows = qnum::kTileRows;
  static constexpr int kCols = 128;
  static constexpr int kSeg = 16;  // elements per thread work item (one 16x1 or 1x16 segment)
  static constexpr int kSegsPerRow = kCols / kSeg;
  static constexpr int kSegsPerCol = kRows / kSeg;
  static constexpr int kItems = kRows * kSegsPerRow / kThreads;  // segments per thread
  static constexpr int kStagePitch = kRows + 16;  // bytes; keeps 16-byte alignment, spreads banks
  static_assert(kRows == 128 && kCols == 128, "layouts assume 128x128 tiles (swizzle, 2D blocks)");
  static_assert(kRows * kSegsPerRow == kItems * kThreads, "row segments split evenly");
  static_assert(kCols * kSegsPerCol == kItems * kThreads, "column segments split evenly");
  static_assert(kThreads % 32 == 0 && kCols / 32 * 8 >= 1, "warps");
};

struct TileParams {
  const void* x;
  int64_t M, K;
  QuantPlan plan;
  qnum::Layout L;
  bool rowwise, colwise;
  uint8_t* q_row;
  uint8_t* q_col;
  void* s_row;
  void* s_col;
  const float* amax;     // per-expert amax (fp8_current, nvfp4), complete before this kernel
  float* scale_inv_g;    // fp8_current [G]
  float* global_scale;   // nvfp4 [G]
  float* dbias_partial;  // [tile bound, K] or null
  int64_t col_tiles;
  StatusBlock* status;
  // dynamic shared memory carve-up (bytes)
  int smem_rseg, smem_cseg, smem_csum, smem_stage, smem_total;
};

// Host: fills the shared-memory offsets for an input element size and launches.
template <class In, int R>
void launch_quantize_tile(Context& ctx, TileParams p);

// Per-recipe launchers (one translation unit each), dispatching on the input dtype.
void launch_quantize_fp8(Context& ctx, const TileParams& p, DType in);
void launch_quantize_mx(Context& ctx, const TileParams& p, DType in);
void launch_quantize_nvfp4(Context& ctx, const TileParams& p, DType in);

namespace tile_detail {

template <class In>
__device__ __forceinline__ float to_f(In v);
template <>
__device__ __forceinline__ float to_f<uint16_t>(uint16_t v) {  // bf16 bits
  return __uint_as_float(static_cast<uint32_t>(v) << 16);
}
template <>
__device__ __forceinline__ float to_f<__half>(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float to_f<float>(float v) {
  return v;
}

// fp8 pair conversion: the hardware cvt (bit-identical to convert.hpp, which test_convert_gpu
// checks on every input class) unless GROUPMM_QUANT_SOFT_CVT is defined.
__device__ __forceinline__ uint32_t fp8x2(float a, float b, bool e5m2) {
#ifdef GROUPMM_QUANT_SOFT_CVT
  return qnum::to_fp8_soft(a, e5m2) | (uint32_t(qnum::to_fp8_soft(b, e5m2)) << 8);
#else
  return static_cast<uint32_t>(
      __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3));
#endif
}

// 16 quantized elements: fp8 -> 4 words (16 bytes), nvfp4 -> 2 words (8 bytes).
template <int R>
__device__ __forceinline__ void quantize16(const float (&v)[16], const qnum::BlockQuant& q,
                                           bool e5m2, uint32_t (&w)[4]) {
  if constexpr (R == qnum::kNvfp4) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      uint32_t word = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j)
        word |= uint32_t(qnum::nvfp4_code(v[i * 8 + j], q.s_enc, q.code, q.sbf)) << (4 * j);
      w[i] = word;
    }
    w[2] = w[3] = 0;
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i)
      w[i] = fp8x2(v[4 * i] * q.mul, v[4 * i + 1] * q.mul, e5m2) |
             (fp8x2(v[4 * i + 2] * q.mul, v[4 * i + 3] * q.mul, e5m2) << 16);
  }
}

__device__ __forceinline__ uint32_t amax16(const float (&v)[16]) {
  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) m = qnum::amax_merge(m, qnum::abs_bits(v[i]));
  return m;
}

}  // namespace tile_detail

template <class In, int R>
__global__ void __launch_bounds__(TileConfig::kThreads) quantize_tile_kernel(TileParams p) {
  using Cfg = TileConfig;
  using namespace tile_detail;
  constexpr bool kFp4 = R == qnum::kNvfp4;
  constexpr int kVec = 16 / static_cast<int>(sizeof(In));
  constexpr int kChunksPerRow = Cfg::kCols / kVec;
  constexpr int kLoadIters = Cfg::kRows * kChunksPerRow / Cfg::kThreads;
  constexpr int kPitch = Cfg::kCols * static_cast<int>(sizeof(In)) + 16;  // bytes per tile row
  static_assert(kLoadIters * Cfg::kThreads == Cfg::kRows * kChunksPerRow, "load split");
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ uint32_t tile_amax_s;
  const int tid = threadIdx.x;
  const qnum::Layout& L = p.L;
  const int64_t K = p.K;
  const int64_t G = p.plan.G;

  // Per-expert scalars, once per launch (also covers zero-row experts, which own no tile).
  if (blockIdx.x == 0 && blockIdx.y == 0) {
    for (int64_t g = tid; g < G; g += Cfg::kThreads) {
      if constexpr (R == qnum::kFp8Current)
        p.scale_inv_g[g] = qnum::fp8_current_scale(p.amax[g], L.e5m2, L.pow2).scale_inv;
      if constexpr (R == qnum::kNvfp4) p.global_scale[g] = qnum::nvfp4_s_enc(p.amax[g]);
    }
  }
  const int64_t t = blockIdx.x;
  if (t >= p.plan.tile_start[G]) return;
  const int64_t gi = find_group(p.plan.tile_start, G, t);
  const qnum::Geom g = p.plan.geom(gi);
  const int64_t lt = t - g.tile_start;
  const int64_t row0 = lt * Cfg::kRows;
  const int valid_rows = static_cast<int>(min(int64_t(Cfg::kRows), g.rows - row0));
  const int64_t ct = blockIdx.y;
  const int64_t col0 = ct * Cfg::kCols;
  const int valid_cols = static_cast<int>(min(int64_t(Cfg::kCols), K - col0));
  const float ea = (R == qnum::kFp8Current || kFp4) ? p.amax[gi] : 0.0f;

  // ---- load: all loads in flight before the first shared store ----------------------------
  {
    const In* xg = static_cast<const In*>(p.x) + (g.start + row0) * K + col0;
    uint4 buf[kLoadIters];
#pragma unroll
    for (int it = 0; it < kLoadIters; ++it) {
      const int i = tid + it * Cfg::kThreads;
      const int r = i / kChunksPerRow, ch = i % kChunksPerRow;
      buf[it] = make_uint4(0, 0, 0, 0);
      if (r < valid_rows && ch * kVec < valid_cols)
        buf[it] = __ldcs(reinterpret_cast<const uint4*>(xg + r * K + ch * kVec));
    }
#pragma unroll
    for (int it = 0; it < kLoadIters; ++it) {
      const int i = tid + it * Cfg::kThreads;
      const int r = i / kChunksPerRow, ch = i % kChunksPerRow;
      *reinterpret_cast<uint4*>(smem + r * kPitch + ch * 16) = buf[it];
    }
  }
  __syncthreads();
  auto elem = [&](int r, int c) -> float {
    return to_f<In>(reinterpret_cast<const In*>(smem + r * kPitch)[c]);
  };
  auto row16 = [&](int r, int c0, float(&v)[16]) {  // 16-byte shared loads
    const uint8_t* base = smem + r * kPitch + c0 * static_cast<int>(sizeof(In));
#pragma unroll
    for (int ch = 0; ch < 16 / kVec; ++ch) {
      const uint4 u = *reinterpret_cast<const uint4*>(base + ch * 16);
      const In* e = reinterpret_cast<const In*>(&u);
#pragma unroll
      for (int j = 0; j < kVec; ++j) v[ch * kVec + j] = to_f<In>(e[j]);
    }
  };
  auto col16 = [&](int c, int r0, float(&v)[16]) {
#pragma unroll
    for (int j = 0; j < 16; ++j) v[j] = elem(r0 + j, c);
  };
  uint32_t* rseg = reinterpret_cast<uint32_t*>(smem + p.smem_rseg);  // [128][8]
  uint32_t* cseg = reinterpret_cast<uint32_t*>(smem + p.smem_cseg);  // [8][128]
  float* csum = reinterpret_cast<float*>(smem + p.smem_csum);        // [8][128]
  uint8_t* stage = smem + p.smem_stage;                              // [128][kStagePitch]

  // ---- segment amax (and bias segment sums) ------------------------------------------------
  const bool need_rseg = R != qnum::kFp8Current && (p.rowwise || L.block_2d);
  const bool need_cseg = R != qnum::kFp8Current && p.colwise && !L.block_2d;
  const bool need_csum = p.dbias_partial != nullptr;
  if (need_rseg) {
#pragma unroll
    for (int it = 0; it < Cfg::kItems; ++it) {
      const int i = tid + it * Cfg::kThreads;
      float v[16];
      row16(i / Cfg::kSegsPerRow, (i % Cfg::kSegsPerRow) * 16, v);
      rseg[i] = amax16(v);
    }
  }
  if (need_cseg || need_csum) {
#pragma unroll
    for (int it = 0; it < Cfg::kItems; ++it) {
      const int i = tid + it * Cfg::kThreads;  // i = rs * 128 + c
      float v[16];
      col16(i % Cfg::kCols, (i / Cfg::kCols) * 16, v);
      if (need_cseg) cseg[i] = amax16(v);
      if (need_csum) {
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < 16; ++j) s += v[j];
        csum[i] = s;
      }
    }
  }
  __syncthreads();
  if (L.fp8_2d) {
    if (tid < 32) {
      uint32_t m = 0;
      for (int j = tid; j < Cfg::kRows * Cfg::kSegsPerRow; j += 32)
        m = qnum::amax_merge(m, rseg[j]);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) m = qnum::amax_merge(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
      if (tid == 0) tile_amax_s = m;
    }
    __syncthreads();
  }
  if (need_csum && tid < Cfg::kCols && tid < valid_cols) {
    float s = 0.0f;
    for (int rs = 0; rs < Cfg::kSegsPerCol; ++rs) s += csum[rs * Cfg::kCols + tid];
    p.dbias_partial[t * K + col0 + tid] = s;
  }

  // ---- rowwise --------------------------------------------------------------------------------
  if (p.rowwise) {
#pragma unroll
    for (int it = 0; it < Cfg::kItems; ++it) {
      const int i = tid + it * Cfg::kThreads;
      const int r = i / Cfg::kSegsPerRow, s = i % Cfg::kSegsPerRow;
      if (r >= valid_rows || s * 16 >= valid_cols) continue;
      uint32_t am = 0;
      if constexpr (R == qnum::kFp8Block) {
        if (L.fp8_2d) {
          am = tile_amax_s;
        } else {
          for (int j = 0; j < 8; ++j) am = qnum::amax_merge(am, rseg[r * 8 + j]);
        }
      } else if constexpr (R == qnum::kMxfp8) {
        am = qnum::amax_merge(rseg[r * 8 + (s & ~1)], rseg[r * 8 + (s | 1)]);
      } else if constexpr (R == qnum::kNvfp4) {
        if (L.block_2d) {
          for (int rr = r & ~15; rr < (r & ~15) + 16; ++rr)
            am = qnum::amax_merge(am, rseg[rr * 8 + s]);
        } else {
          am = rseg[i];
        }
      }
      const qnum::BlockQuant q = qnum::make_block_quant(R, L.e5m2, L.pow2, am, ea);
      float v[16];
      row16(r, s * 16, v);
      uint32_t w[4];
      quantize16<R>(v, q, L.e5m2, w);
      const int64_t e = (g.start + row0 + r) * K + col0 + s * 16;  // element index
      if constexpr (kFp4) {
        *reinterpret_cast<uint2*>(p.q_row + e / 2) = make_uint2(w[0], w[1]);
      } else {
        *reinterpret_cast<uint4*>(p.q_row + e) = make_uint4(w[0], w[1], w[2], w[3]);
      }
      if constexpr (R == qnum::kFp8Block) {
        if (!L.fp8_2d && s == 0)
          static_cast<float*>(p.s_row)[qnum::row_scale_index(L, g, row0 + r, col0 / 128)] =
              q.scale_inv;
        if (L.fp8_2d && r == 0 && s == 0)
          static_cast<float*>(p.s_row)[qnum::row_scale_index(L, g, row0, col0 / 128)] = q.scale_inv;
      } else if constexpr (R == qnum::kMxfp8) {
        if ((s & 1) == 0)
          static_cast<uint8_t*>(
              p.s_row)[qnum::row_scale_index(L, g, row0 + r, (col0 + s * 16) / 32)] = q.code;
      } else if constexpr (R == qnum::kNvfp4) {
        static_cast<uint8_t*>(
            p.s_row)[qnum::row_scale_index(L, g, row0 + r, (col0 + s * 16) / 16)] = q.code;
      }
    }
    if (L.swizzled) {  // this tile's share of the expert's zero padding
      const int64_t ncols = K / L.rb, Kp = qnum::round_up(ncols, 4);
      const int64_t c_begin = col0 / L.rb;
      const int64_t c_end = ct == p.col_tiles - 1 ? Kp : (col0 + Cfg::kCols) / L.rb;
      const int width = static_cast<int>(c_end - c_begin);
      for (int i = tid; i < Cfg::kRows * width; i += Cfg::kThreads) {
        const int r = i / width;
        const int64_t c = c_begin + i % width;
        if (r >= valid_rows || c >= ncols)
          static_cast<uint8_t*>(p.s_row)[qnum::row_scale_index(L, g, row0 + r, c)] = 0;
      }
    }
  }

  // ---- columnwise -----------------------------------------------------------------------------
  if (!p.colwise) return;
  if (kFp4 && (g.rows & 1)) {  // packed nibbles of one byte would belong to two rows of [K, m_g]
    if (lt == 0 && ct == 0 && tid == 0)
      report_fault(p.status, kFaultSplitAlignment, OpId::group_quantize, static_cast<int32_t>(gi),
                   g.rows);
    return;
  }
#pragma unroll
  for (int it = 0; it < Cfg::kItems; ++it) {
    const int i = tid + it * Cfg::kThreads;
    const int c = i % Cfg::kCols, rs = i / Cfg::kCols;
    if (c >= valid_cols || rs * 16 >= valid_rows) continue;
    uint32_t am = 0;
    if constexpr (R == qnum::kFp8Block) {
      if (L.fp8_2d) {
        am = tile_amax_s;
      } else {
        for (int j = 0; j < 8; ++j) am = qnum::amax_merge(am, cseg[j * Cfg::kCols + c]);
      }
    } else if constexpr (R == qnum::kMxfp8) {
      am = qnum::amax_merge(cseg[(rs & ~1) * Cfg::kCols + c], cseg[(rs | 1) * Cfg::kCols + c]);
    } else if constexpr (R == qnum::kNvfp4) {
      if (L.block_2d) {
        for (int rr = rs * 16; rr < rs * 16 + 16; ++rr)
          am = qnum::amax_merge(am, rseg[rr * 8 + c / 16]);
      } else {
        am = cseg[i];
      }
    }
    const qnum::BlockQuant q = qnum::make_block_quant(R, L.e5m2, L.pow2, am, ea);
    float v[16];
    col16(c, rs * 16, v);
    uint32_t w[4];
    quantize16<R>(v, q, L.e5m2, w);
    if constexpr (kFp4) {
      *reinterpret_cast<uint2*>(stage + c * Cfg::kStagePitch + rs * 8) = make_uint2(w[0], w[1]);
    } else {
      *reinterpret_cast<uint4*>(stage + c * Cfg::kStagePitch + rs * 16) =
          make_uint4(w[0], w[1], w[2], w[3]);
    }
    if constexpr (R == qnum::kFp8Block) {
      if (!L.fp8_2d && rs == 0)
        static_cast<float*>(p.s_col)[qnum::col_scale_index(L, g, col0 + c, lt)] = q.scale_inv;
      if (L.fp8_2d && c == 0 && rs == 0)
        static_cast<float*>(p.s_col)[qnum::col_scale_index(L, g, col0 / 128, lt)] = q.scale_inv;
    } else if constexpr (R == qnum::kMxfp8) {
      if ((rs & 1) == 0)
        static_cast<uint8_t*>(p.s_col)[qnum::col_scale_index(L, g, col0 + c, lt * 4 + rs / 2)] =
            q.code;
    } else if constexpr (R == qnum::kNvfp4) {
      static_cast<uint8_t*>(p.s_col)[qnum::col_scale_index(L, g, col0 + c, lt * 8 + rs)] = q.code;
    }
  }
  if (L.swizzled) {  // padding rows k >= K (last column tile) and columns j >= nb_g (last tile)
    const int64_t nb = qnum::ceil_div(g.rows, L.cb), Jp = qnum::round_up(nb, 4);
    const int64_t per_tile = Cfg::kRows / L.cb;
    const int64_t j_begin = lt * per_tile;
    const bool last_tile = row0 + Cfg::kRows >= g.rows;
    const int64_t j_end = last_tile ? Jp : j_begin + per_tile;
    const int64_t k_end = ct == p.col_tiles - 1 ? qnum::round_up(K, 128) : col0 + Cfg::kCols;
    const int width = static_cast<int>(j_end - j_begin);
    const int height = static_cast<int>(k_end - col0);
    for (int i = tid; i < height * width; i += Cfg::kThreads) {
      const int64_t k = col0 + i / width, j = j_begin + i % width;
      if (k >= K || j >= nb) static_cast<uint8_t*>(p.s_col)[qnum::col_scale_index(L, g, k, j)] = 0;
    }
  }
  __syncthreads();
  // Copy the staged transposed tile out: row k of the expert's [K, m_g] block, bytes
  // [row0, row0 + valid_rows) (halved for fp4; m_g even so every run starts on a byte).
  const int run_bytes = kFp4 ? valid_rows / 2 : valid_rows;
  const int lane = tid % 32, warp = tid / 32;
  for (int k = warp; k < valid_cols; k += Cfg::kThreads / 32) {
    const int64_t e = K * g.start + (col0 + k) * g.rows + row0;  // element index
    uint8_t* dst = p.q_col + (kFp4 ? e / 2 : e);
    const uint8_t* src = stage + k * Cfg::kStagePitch;
    const int b0 = lane * 4;
    if (b0 >= run_bytes) continue;
    if (b0 + 4 <= run_bytes && (reinterpret_cast<uintptr_t>(dst + b0) & 3) == 0) {
      *reinterpret_cast<uint32_t*>(dst + b0) = *reinterpret_cast<const uint32_t*>(src + b0);
    } else {
      for (int b = b0; b < b0 + 4 && b < run_bytes; ++b) dst[b] = src[b];
    }
  }
}

template <class In, int R>
void launch_quantize_tile(Context& ctx, TileParams p) {
  using Cfg = TileConfig;
  constexpr int kPitch = Cfg::kCols * static_cast<int>(sizeof(In)) + 16;
  int off = Cfg::kRows * kPitch;
  p.smem_rseg = off;
  off += Cfg::kRows * Cfg::kSegsPerRow * 4;
  p.smem_cseg = off;
  off += Cfg::kCols * Cfg::kSegsPerCol * 4;
  p.smem_csum = off;
  if (p.dbias_partial) off += Cfg::kCols * Cfg::kSegsPerCol * 4;
  p.smem_stage = off;
  if (p.colwise) off += Cfg::kCols * Cfg::kStagePitch;
  p.smem_total = off;
  auto kernel = quantize_tile_kernel<In, R>;
  static int configured = 0;  // the attribute is per function; set it once to the maximum
  if (configured == 0) {
    constexpr int kMax =
        Cfg::kRows * kPitch + 3 * Cfg::kCols * Cfg::kSegsPerCol * 4 + Cfg::kCols * Cfg::kStagePitch;
    GROUPMM_CHECK_CUDA(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMax));
    configured = 1;
  }
  const dim3 grid(static_cast<unsigned>(tile_bound(p.M, p.plan.G)),
                  static_cast<unsigned>(p.col_tiles));
  kernel<<<grid, Cfg::kThreads, p.smem_total, ctx.stream()>>>(p);
  GROUPMM_CHECK_LAUNCH();
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
