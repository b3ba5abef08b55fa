// groupmm's grouped GEMM over 4-bit weights with the weights as the register operand of wgmma (the
// RS form): y[r, :] = x[r, :] W_g^T for the rows r of expert g, computed as y^T = W_g x^T so that
// each consumer warpgroup dequantizes its own 64 weight rows straight into the A fragment of its
// MMAs (no bf16 copy of the weights in shared memory) while the tensor cores run the previous
// stage's MMAs.
//
//   x      [M, K] bf16, rows grouped by expert (the splits on the device), read by TMA as the
//          wgmma B operand (up to kTileT tokens by kTileK in boxes of 64 tokens, 128-byte
//          swizzle, K-major);
//   codes  [G, N, K / 2] e2m1 (element 2j in the low nibble), read by TMA per expert (a 3-D map:
//          zeros past N and K) into a kTileW x 32-byte slot of the stage;
//   scales block scales of the rowwise layout (plain or swizzled 128x4; w4_rs_scales.cuh), loaded
//          by the consumers one stage ahead; numerics/w4.hpp gives the exact bf16 weights. With
//          kScaleWarps, warps 1-3 of warpgroup 0 load them instead and write each stage's per-row
//          block multipliers into the stage (16 bytes a row), which the consumers read with one
//          shared-memory load a row: the multiplier arithmetic and the scale addressing leave the
//          consumers' stage loop, which issues the dequantization and the MMAs.
//
// Tiles: kTileW = 128 weight rows (output columns; consumer c takes rows 64 c .. 64 c + 63) by
// up to kTileT tokens (output rows; the wgmma N, narrowed to 128 or 64 for a tile of fewer rows:
// tile_width) of one expert, scheduled as the kernel layer's gathered GEMM schedules its tiles
// (device splits scanned by every CTA into shared tables, bands of column tiles). Warp roles:
// warpgroup 0's thread 0 issues a stage's copies on its full barrier; warpgroups 1 and 2
// (cooperative) wait, dequantize and issue a stage as two batches of two wgmma, keeping one
// batch in flight (so only two slices of A registers are live besides the accumulators: with
// four, ptxas serializes the wgmma), and release a stage when the batch after its last is issued.
//
// The A fragment (m64n*k16, 16-bit A from registers): lane l of warp w holds rows R0 = 16 w + l / 4
// and R1 = R0 + 8, K columns 2t, 2t + 1 (registers a0: R0, a1: R1) and 2t + 8, 2t + 9 (a2, a3),
// t = l % 4. With K-contiguous codes, byte 8 s + t of a row is a0 (or a1) of slice s and byte
// 8 s + t + 4 is a2 (a3): one byte a bf16x2 register. A byte b becomes its raw bf16x2 as
// e2m1_raw_pair(b * 0x01001000) (b << 12 | b << 24: the low nibble at bits 12-15, the high one at
// 28-31), then the block multiplier (qnum::w4_*_multiplier*).
//
// Epilogue: the fp32 tile is y^T (weight rows x tokens); each consumer writes its 64 columns of
// the tile, times the expert's factor plus the bias, as bf16 into its half of a shared buffer
// (token rows, up to 128 a pass), then stores 16-byte chunks of the rows below the tile's count.
#pragma once

#include <cstdint>

#include "cute/arch/copy_sm90_desc.hpp"
#include "cute/arch/mma_sm90.hpp"
#include "cute/atom/mma_traits_sm90_gmma.hpp"
#include "cute/tensor.hpp"
#include "cutlass/arch/reg_reconfig.h"
#include "groupmm/core.hpp"
#include "kernels/common/element.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/splits_scan.cuh"
#include "kernels/common/status.cuh"
#include "kernels/common/tma.cuh"
#include "kernels/sm90/gathered_gemm.cuh"
#include "kernels/sm90/w4_rs_scales.cuh"
#include "numerics/quantize_layout.hpp"
#include "numerics/w4.hpp"

namespace groupmm::cuda::sm90 {

template <QuantRecipe kRecipe_, int kTileT_, int kStages_, bool kScaleWarps_ = false>
struct W4RsGemmConfig {
  static constexpr QuantRecipe kRecipe = kRecipe_;
  static constexpr bool kScaleWarps = kScaleWarps_;
  // the scale warps: warps 1-3 of warpgroup 0 (warp 0's thread 0 issues the copies)
  static constexpr int kScaleThreads = kScaleWarps ? 96 : 0;
  static constexpr bool kNv = kRecipe == QuantRecipe::nvfp4;
  static constexpr int kTileW = 128;  // weight rows of a tile: two consumers of 64
  static constexpr int kTileT = kTileT_;
  static constexpr int kTileK = 64;
  static constexpr int kSlices = kTileK / 16;
  static constexpr int kStages = kStages_;
  static constexpr int kThreads = 384;
  static constexpr int kMaxGroups = 1024;
  // the scale warps' loop needs more than the copy issue alone; the consumers' loop without the
  // multiplier arithmetic fits the rest
  static constexpr int kProducerRegs = kScaleWarps ? 56 : 40;
  static constexpr int kConsumerRegs = kScaleWarps ? 224 : 232;
  static constexpr int kXBytes = kTileT * kTileK * 2;
  static constexpr int kCodeBytes = kTileW * kTileK / 2;
  // a stage's multipliers with kScaleWarps: one 16-byte record a weight row (w4rs::RowRecord)
  static constexpr int kMultBytes = kScaleWarps ? kTileW * 16 : 0;
  static constexpr int kStageBytes = kXBytes + kCodeBytes + kMultBytes;
  // a consumer's epilogue rows: 64 bf16 columns of one token, padded by 16 bytes so that the
  // 2-byte writes of the 4 lanes of a quad (tokens 2t, 2t + 1) fall in different banks
  static constexpr int kEpiRowBytes = 64 * 2 + 16;
  // the epilogue goes through the buffer in passes of up to 128 tokens (a fourth stage fits)
  static constexpr int kEpiRows = kTileT < 128 ? kTileT : 128;
  static constexpr int kEpiBytes = 2 * kEpiRows * kEpiRowBytes;
  // x comes in boxes of 64 tokens: a tile loads only the boxes of its wgmma N
  static constexpr int kXBoxRows = 64;
  static constexpr int kXBoxBytes = kXBoxRows * kTileK * 2;
  static constexpr int kTableBytes = (3 * kMaxGroups + 1) * 4;
  static constexpr int kSmemBytes =
      1024 + kStages * kStageBytes + kEpiBytes + kTableBytes + 2 * kStages * 8 + 8;
  static_assert(kRecipe == QuantRecipe::nvfp4 || kRecipe == QuantRecipe::mxfp4, "4-bit weights");
  static_assert(kTileT % 64 == 0 && kTileT <= 256, "a wgmma N of 64 .. 256, whole TMA boxes");
  static_assert(kXBytes % 1024 == 0 && kStageBytes % 1024 == 0, "1024-byte aligned stages");
  static_assert(!kScaleWarps || kTileW <= 2 * kScaleThreads, "two rows a scale thread at most");
  static_assert(kXBoxBytes % 1024 == 0 && kTileT % kEpiRows == 0, "whole boxes and passes");
  static_assert(kStages >= 2, "one stage read, one filled");
  static_assert(kSlices % 2 == 0, "a stage in two batches of slices");
  static_assert(kProducerRegs + 2 * kConsumerRegs <= 504, "registers of a 384-thread CTA");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one sm_90 CTA");
};

namespace w4rs {

// The raw bf16x2 of byte `t` of word `w` (t a per-lane constant: PRMT's selector 0x444t).
__device__ __forceinline__ uint32_t byte_raw_pair(uint32_t w, uint32_t sel) {
  uint32_t b;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(b) : "r"(w), "r"(sel));
  return qnum::e2m1_byte_raw_pair(b);
}

// The 4 A registers of slice s from the slice's code words of rows R0 (w0: bytes 8 s .. 8 s + 7)
// and R1 (w1): a0 = R0 byte 8 s + t, a1 = R1, a2 = R0 byte 8 s + t + 4, a3 = R1; times the rows'
// multipliers of the slice's block.
template <class Config>
__device__ __forceinline__ void slice_a(uint2 w0, uint2 w1, int s, uint32_t sel,
                                        const StageMultipliers<Config>& mul, uint32_t (&a)[4]) {
  const int b = Config::kNv ? s : s / 2;
  const uint32_t r[4] = {byte_raw_pair(w0.x, sel), byte_raw_pair(w1.x, sel),
                         byte_raw_pair(w0.y, sel), byte_raw_pair(w1.y, sel)};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    a[i] = qnum::bf16x2_mul(r[i], mul.m[i & 1][b]);
    if constexpr (!Config::kNv) {
      if (mul.two) a[i] = qnum::bf16x2_mul(a[i], mul.m2[i & 1][b]);
    }
  }
}

// What a consumer needs across tiles.
template <class Config>
struct ConsumerCtx {
  const W4RsParams& p;
  uint8_t* stages;
  uint8_t* epi_buf;
  uint64_t* full;
  uint64_t* empty;
  int kb_count;
  int cw;  // the consumer: 0 or 1
};

// One tile on a consumer, with a wgmma N of TN tokens (TN <= kTileT; the tile's rows <= TN): the
// token tile's stage buffers hold kTileT rows whose first TN the MMAs read (the 8-row swizzle
// atoms of the K-major layout make the first TN rows a TN-row layout of their own).
template <class Config, int TN>
__device__ __forceinline__ void consumer_tile(const ConsumerCtx<Config>& cc, const TileCoord& c,
                                              int& cnt) {
  using namespace cute;
  using E = cutlass::bfloat16_t;
  constexpr int BW = Config::kTileW, BK = Config::kTileK, S = Config::kStages;
  static_assert(TN % 64 == 0 && TN <= Config::kTileT, "a wgmma N within the token tile");
  const W4RsParams& p = cc.p;
  const int kb_count = cc.kb_count, cw = cc.cw;
  auto x_stage = [&](int s) { return cc.stages + s * Config::kStageBytes; };
  auto code_stage = [&](int s) { return cc.stages + s * Config::kStageBytes + Config::kXBytes; };
  const int ctid = threadIdx.x % 128;
  const int warp = ctid / 32, lane = ctid % 32, gq = lane / 4, tq = lane % 4;
  const int r0 = 64 * cw + 16 * warp + gq;  // rows r0 and r0 + 8 of the tile's 128 weight rows
  const uint32_t sel = 0x4440u | uint32_t(tq);
  using SmemLayoutX =
      decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<E>{}, make_shape(Int<TN>{}, Int<BK>{})));
  using SmemLayoutA =
      decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<E>{}, make_shape(Int<64>{}, Int<BK>{})));
  using MmaOp = decltype(GMMA::rs_op_selector<E, E, float, Shape<_64, Int<TN>, _16>, GMMA::Major::K,
                                              GMMA::Major::K>());
  auto tiled_mma = make_tiled_mma(MmaOp{});
  auto thr_mma = tiled_mma.get_thread_slice(ctid);
  auto accum = partition_fragment_C(tiled_mma, make_shape(Int<64>{}, Int<TN>{}));
  const auto coords = thr_mma.partition_C(make_identity_tensor(make_shape(Int<64>{}, Int<TN>{})));
  // the register A fragments: set 0 holds a stage's first half of the slices, set 1 the second
  auto sA_shape = make_tensor(make_smem_ptr(reinterpret_cast<E*>(cc.stages)), SmemLayoutA{});
  auto frag0 = thr_mma.partition_fragment_A(sA_shape);
  auto frag1 = thr_mma.partition_fragment_A(sA_shape);
  static_assert(decltype(size(frag0))::value == 8 * Config::kSlices,
                "8 bf16 of A a lane and k16 slice");
  // the scale rows of r0 and r0 + 8 (null past N; with the scale warps the loads below are dead
  // code: the stage multipliers read the records instead)
  const uint8_t* srow[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t n = int64_t(c.ct) * BW + r0 + 8 * h;
    const int64_t i = p.scale_swizzled ? qnum::swizzle_128x4(int64_t(c.g) * p.scale_tiles * 128 + n,
                                                             0, p.scale_ld)
                                       : (int64_t(c.g) * p.N + n) * p.scale_ld;
    srow[h] = n < p.N ? p.scales + i : nullptr;
  }
  uint32_t sc[2] = {w4rs::load_row_scales<Config>(p, srow[0], 0),
                    w4rs::load_row_scales<Config>(p, srow[1], 0)};
  tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
  int prev = -1;
  // One stage in two batches of kSlices / 2 slices: batch h dequantizes its slices into set h
  // (only those registers of the set live) and issues them; the wait after a batch leaves it
  // alone in flight, so the batch before it, and the set and stage that batch read, are done.
  auto stage = [&](int kb) {
    const int s = cnt % S;
    mbar_wait(&cc.full[s], (cnt / S) & 1);
    const uint8_t* codes = code_stage(s);
    // the next stage's scales, under this stage's MMAs
    const uint32_t next0 =
        kb + 1 < kb_count ? w4rs::load_row_scales<Config>(p, srow[0], kb + 1) : 0;
    const uint32_t next1 =
        kb + 1 < kb_count ? w4rs::load_row_scales<Config>(p, srow[1], kb + 1) : 0;
    const w4rs::StageMultipliers<Config> mul(sc, codes + Config::kCodeBytes, r0);
    sc[0] = next0;
    sc[1] = next1;
    auto sX = make_tensor(make_smem_ptr(reinterpret_cast<E*>(x_stage(s))), SmemLayoutX{});
    auto tB = thr_mma.make_fragment_B(thr_mma.partition_B(sX));
    auto batch = [&](auto& frag, auto h_) {
      constexpr int kPer = Config::kSlices / 2;
      constexpr int kFirst = decltype(h_)::value * kPer;
      uint32_t* fa = reinterpret_cast<uint32_t*>(frag.data());
      if constexpr (Config::kScaleWarps) {
        // the batch's two slices of rows r0 and r0 + 8: 16 bytes each, one ld.shared a row
        static_assert(kPer == 2, "two slices a batch");
        const uint4 q0 = w4rs::lds128(codes + r0 * 32 + 8 * kFirst);
        const uint4 q1 = w4rs::lds128(codes + (r0 + 8) * 32 + 8 * kFirst);
        const uint2 w[2][2] = {{make_uint2(q0.x, q0.y), make_uint2(q1.x, q1.y)},
                               {make_uint2(q0.z, q0.w), make_uint2(q1.z, q1.w)}};
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          uint32_t a[4];
          w4rs::slice_a<Config>(w[j][0], w[j][1], kFirst + j, sel, mul, a);
#pragma unroll
          for (int i = 0; i < 4; ++i) fa[4 * (kFirst + j) + i] = a[i];
        }
      } else {
#pragma unroll
        for (int sl = kFirst; sl < kFirst + kPer; ++sl) {
          uint32_t a[4];
          const uint2 w0 = *reinterpret_cast<const uint2*>(codes + r0 * 32 + 8 * sl);
          const uint2 w1 = *reinterpret_cast<const uint2*>(codes + (r0 + 8) * 32 + 8 * sl);
          w4rs::slice_a<Config>(w0, w1, sl, sel, mul, a);
#pragma unroll
          for (int i = 0; i < 4; ++i) fa[4 * sl + i] = a[i];
        }
      }
      // fence only the batch's registers: the set's other slices stay dead
      auto fence_a = [&] {
#pragma unroll
        for (int i = 4 * kFirst; i < 4 * (kFirst + kPer); ++i)
          asm volatile("" : "+r"(fa[i])::"memory");
      };
      warpgroup_fence_operand(accum);
      fence_a();
      warpgroup_arrive();
      CUTE_UNROLL
      for (int k = kFirst; k < kFirst + kPer; ++k) {
        cute::gemm(tiled_mma, frag(_, _, k), tB(_, _, k), accum);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_fence_operand(accum);
      warpgroup_wait<1>();
      fence_a();
    };
    batch(frag0, Int<0>{});
    if (prev >= 0 && ctid == 0) detail::mbar_arrive(&cc.empty[prev]);  // its last batch is done
    batch(frag1, Int<1>{});
    prev = s;
    ++cnt;
  };
  for (int kb = 0; kb < kb_count; ++kb) stage(kb);
  warpgroup_wait<0>();
  if (ctid == 0) detail::mbar_arrive(&cc.empty[prev]);

  // ---- epilogue: y^T tile -> this consumer's half of the token-row buffer -> global
  const float f =
      qnum::w4_expert_factor(Config::kRecipe, p.alpha, p.s_enc != nullptr ? p.s_enc[c.g] : 1.0f);
  uint8_t* half = cc.epi_buf + cw * Config::kEpiRows * Config::kEpiRowBytes;
  float bias_r[2] = {0.0f, 0.0f};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t n = int64_t(c.ct) * BW + r0 + 8 * h;
    if (p.bias != nullptr && n < p.N)
      bias_r[h] = __uint_as_float(uint32_t(p.bias[int64_t(c.g) * p.N + n]) << 16);
  }
  constexpr int kPassRows = TN < Config::kEpiRows ? TN : Config::kEpiRows;
  // 8 chunks of 16 bytes a token row; 16 rows a pass of the 128 threads
  const int chunk = ctid % 8;
  const int64_t col = int64_t(c.ct) * BW + 64 * cw + 8 * chunk;
#pragma unroll
  for (int pass = 0; pass < TN / kPassRows; ++pass) {
    asm volatile("bar.sync %0, 128;" ::"r"(2 + cw) : "memory");  // the buffer's last readers
    CUTE_UNROLL
    for (int i = 0; i < size(accum); ++i) {
      const int wr = get<0>(coords(i));      // weight row within the consumer's 64
      const int tk = get<1>(coords(i));      // token within the tile
      if (tk / kPassRows != pass) continue;  // resolved at compile time
      const float v = accum(i) * f + bias_r[(wr - (r0 - 64 * cw)) >> 3];
      const uint16_t b = static_cast<uint16_t>(Bf16::pair_from_floats(v, 0.0f) & 0xFFFFu);
      *reinterpret_cast<uint16_t*>(half + (tk - pass * kPassRows) * Config::kEpiRowBytes + wr * 2) =
          b;
    }
    asm volatile("bar.sync %0, 128;" ::"r"(2 + cw) : "memory");
    const int rows = min(kPassRows, c.rows - pass * kPassRows);
    for (int tk = ctid / 8; tk < rows; tk += 16) {
      if (col < p.N) {
        const uint4 v =
            *reinterpret_cast<const uint4*>(half + tk * Config::kEpiRowBytes + 16 * chunk);
        *reinterpret_cast<uint4*>(p.out + (c.row0 + pass * kPassRows + tk) * p.N + col) = v;
      }
    }
  }
}

// A tile's wgmma N: the narrowest of kTileT, kTileT / 2, .. (multiples of 64) that covers its
// rows. An expert's last token tile often holds a few rows: its MMAs then cost a quarter or less,
// and the producer loads only that many tokens of x (the rule is shared by both roles).
template <class Config>
__device__ __forceinline__ int tile_width(int rows) {
  int tn = Config::kTileT;
  while (tn / 2 >= 64 && (tn / 2) % 64 == 0 && rows <= tn / 2) tn /= 2;
  return tn;
}

template <class Config, int TN>
__device__ __forceinline__ void consumer_tile_narrowest(const ConsumerCtx<Config>& cc,
                                                        const TileCoord& c, int& cnt) {
  if constexpr (TN / 2 >= 64 && (TN / 2) % 64 == 0) {
    if (c.rows <= TN / 2) return consumer_tile_narrowest<Config, TN / 2>(cc, c, cnt);
  }
  consumer_tile<Config, TN>(cc, c, cnt);
}

}  // namespace w4rs

template <class Config>
__global__ void __launch_bounds__(Config::kThreads, 1)
    w4_rs_gemm_kernel(const W4RsParams p, const __grid_constant__ CUtensorMap tma_x,
                      const __grid_constant__ CUtensorMap tma_codes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int T = Config::kTileT, BW = Config::kTileW, BK = Config::kTileK, S = Config::kStages;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* stages =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* epi_buf = stages + S * Config::kStageBytes;
  int32_t* tile_prefix = reinterpret_cast<int32_t*>(epi_buf + Config::kEpiBytes);
  int32_t* row_start = tile_prefix + Config::kMaxGroups + 1;
  int32_t* row_count = row_start + Config::kMaxGroups;
  uint64_t* full = reinterpret_cast<uint64_t*>(
      (reinterpret_cast<uintptr_t>(row_count + Config::kMaxGroups) + 7) & ~uintptr_t(7));
  uint64_t* empty = full + S;
  auto x_stage = [&](int s) { return stages + s * Config::kStageBytes; };
  auto code_stage = [&](int s) { return stages + s * Config::kStageBytes + Config::kXBytes; };

  const int G = static_cast<int>(p.G);
  const int tiles_n = static_cast<int>((p.N + BW - 1) / BW);
  SplitsScanArgs sa;
  sa.splits = p.splits;
  sa.splits64 = p.splits64;
  sa.G = p.G;
  sa.row_bound = p.M;
  sa.expected_total = p.M;
  sa.total_at_most = p.splits_at_most;
  sa.status = blockIdx.x == 0 ? p.status : nullptr;
  sa.op = OpId::grouped_gemm;
  const auto totals = scan_splits<Config::kThreads, 1>(
      sa, [&](int64_t rows) { return Counts<1>{{(rows + T - 1) / T * tiles_n}}; },
      [&](const ExpertSpan<1>& e) {
        tile_prefix[e.g] = static_cast<int32_t>(e.before.v[0]);
        row_start[e.g] = static_cast<int32_t>(e.start);
        row_count[e.g] = static_cast<int32_t>(e.rows);
      });
  const int32_t total_tiles = static_cast<int32_t>(totals.derived.v[0]);
  if (threadIdx.x == 0) {
    tile_prefix[G] = total_tiles;
    for (int s = 0; s < S; ++s) {
      // thread 0's arrival with both copies' bytes (and each scale thread's, with its records)
      mbar_init(&full[s], 1 + Config::kScaleThreads);
      mbar_init(&empty[s], 2);  // both consumers
    }
    mbar_init_fence();
  }
  __syncthreads();
  const int band_n = max(1, min(static_cast<int>(p.band_n), tiles_n));
  // The same tile order as the gathered GEMM (units expert by expert, bands of column tiles).
  auto tile_at = [&](int32_t t) {
    const int g = detail::find_tile_group(tile_prefix, G, t);
    const int32_t local = t - tile_prefix[g];
    const int32_t unit_rows = (tile_prefix[g + 1] - tile_prefix[g]) / tiles_n;
    const int32_t per_band = unit_rows * band_n;
    const int band = local / per_band;
    const int32_t in_band = local - band * per_band;
    const int width = min(band_n, tiles_n - band * band_n);
    const int unit_row = in_band / width;
    TileCoord c;
    c.g = g;
    c.ct = band * band_n + (in_band - unit_row * width);
    c.row0 = int64_t(row_start[g]) + int64_t(unit_row) * T;
    c.rows = max(0, min(T, row_count[g] - unit_row * T));
    return c;
  };
  const int kb_count = static_cast<int>((p.K + BK - 1) / BK);
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);

  if (wg == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Config::kProducerRegs>();
    if (threadIdx.x == 0) {
      tma_prefetch_map(&tma_x);
      tma_prefetch_map(&tma_codes);
      int cnt = 0;
      for (int32_t t = blockIdx.x; t < total_tiles; t += gridDim.x) {
        const TileCoord c = tile_at(t);
        for (int kb = 0; kb < kb_count; ++kb, ++cnt) {
          const int s = cnt % S;
          mbar_wait(&empty[s], ((cnt / S) & 1) ^ 1);
          const int boxes = w4rs::tile_width<Config>(c.rows) / Config::kXBoxRows;
          mbar_arrive_expect_tx(&full[s], boxes * Config::kXBoxBytes + Config::kCodeBytes);
          for (int j = 0; j < boxes; ++j)
            tma_load_2d(x_stage(s) + j * Config::kXBoxBytes, &tma_x, kb * BK,
                        static_cast<int>(c.row0) + j * Config::kXBoxRows, &full[s]);
          tma_load_3d(code_stage(s), &tma_codes, kb * (BK / 2), c.ct * BW, c.g, &full[s]);
        }
      }
    }
    if constexpr (Config::kScaleWarps) {
      if (threadIdx.x >= 32) {
        int cnt = 0;
        for (int32_t t = blockIdx.x; t < total_tiles; t += gridDim.x)
          w4rs::scale_tile<Config>(p, tile_at(t), stages, full, empty, kb_count,
                                   static_cast<int>(threadIdx.x) - 32, cnt);
      }
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Config::kConsumerRegs>();
    w4rs::ConsumerCtx<Config> cc{p, stages, epi_buf, full, empty, kb_count, wg - 1};
    int cnt = 0;
    for (int32_t t = blockIdx.x; t < total_tiles; t += gridDim.x)
      w4rs::consumer_tile_narrowest<Config, T>(cc, tile_at(t), cnt);
  }
#endif
}

}  // namespace groupmm::cuda::sm90
