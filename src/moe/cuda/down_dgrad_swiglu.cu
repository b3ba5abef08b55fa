// CUDA moe_down_dgrad_swiglu: the kernel layer's gathered grouped GEMM
// (kernels/sm90/gathered_gemm.cuh) reading the down weight N-major (the dgrad's B is the forward
// weight [E, H, F] itself) with the weighted-SwiGLU backward in the epilogue.
//
// A CTA owns a row tile: it runs the tile's column tiles in order (kRowOwner), so each consumer
// thread carries its rows' dprob partial sums from one column tile to the next in registers and
// writes dprob once, after the last one: a fixed order, no atomics, no workspace. The epilogue
// rounds the accumulators to the output dtype (the unfused dgrad's rounding), transposes four
// 8-column groups across the quad so that each lane holds 8 consecutive columns, loads the gate
// and up values of those columns with one 16-byte load each, applies weighted_swiglu_backward's
// device element math and stores 16 bytes of each gradient half. The gate and up values are
// prefetched into L2 by the producer warpgroup while the tile's mainloop runs, and loaded four
// quad steps at a time: an epilogue that waited on memory per step took longer than the MMAs.
#include <algorithm>
#include <cmath>

#include "kernels/common/element.cuh"
#include "kernels/common/launch.cuh"
#include "kernels/sm90/gathered_gemm.cuh"
#include "kernels/sm90/quad_transpose.cuh"
#include "moe/backends.hpp"
#include "moe/swiglu_backends.hpp"

namespace groupmm::cuda {
namespace {

using namespace cute;

// The configurations (named once here): cooperative 128 x 256 tiles of da (64 rows per
// consumer), N-major B, row-owning CTAs; the epilogue by the consumers after each mainloop (4
// stages of 48 KiB), or by two epilogue warps under the next tile's mainloop (3 stages: the
// 64 KiB tile buffer takes the fourth).
template <class Element>
using DownDgradCoop = sm90::GatheredGemmConfig<Element, 256, 4, 1, true, 1, true, true>;
template <class Element>
using DownDgradEpiWarps = sm90::GatheredGemmConfig<Element, 256, 3, 1, true, 1, true, true, true>;

template <class E, int kTileN>
struct SwigluBackwardEpilogue {
  using S = typename E::Storage;
  // dprob partial sums carried across the column tiles of a row tile: in the consumers, of the
  // thread's two rows (of the m64 accumulator: rows r and r + 8 of its warp's 16); in the
  // epilogue warps, dp[v] of row w + 2 (lane + 32 v) (warp w)
  struct State {
    float dp[2];
  };
  const S* gate_up;  // [R, 2F], 16-byte aligned
  S* dgate_up;       // [R, 2F], 16-byte aligned
  const float* prob;
  float* dprob;
  int64_t F;
  int tiles_n;

  // Under the tile's mainloop, from the producer warpgroup: the gate and up values of the tile's
  // columns of its rows (one row per thread), and the rows' router weights, into L2.
  __device__ __forceinline__ void prefetch(const sm90::TileCoord& t, int tid, int threads) const {
    const int64_t col0 = int64_t(t.ct) * kTileN;
    const int64_t bytes = (min(int64_t(kTileN), F - col0)) * int64_t(sizeof(S));
    for (int r = tid; r < t.rows; r += threads) {
      const int64_t row = t.row0 + r;
      for (int half = 0; half < 2; ++half) {
        const char* p = reinterpret_cast<const char*>(gate_up + row * 2 * F + half * F + col0);
        for (int64_t b = 0; b < bytes; b += 128) prefetch_l2(p + b);
        prefetch_l2(p + bytes - 1);  // the last line of an unaligned run
      }
      if (r % 32 == 0) prefetch_l2(prob + row);
    }
  }
  static __device__ __forceinline__ void prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
  }

  template <class Accum, class Coords>
  __device__ __forceinline__ void operator()(const Accum& acc, const Coords& coords,
                                             const sm90::TileCoord& t, int row_off,
                                             State& st) const {
    constexpr int kGroups = kTileN / 8;  // 8-column groups of the tile
    constexpr int kBatch = 4;            // quad steps (4 groups each) whose loads fly together
    static_assert(size<0, 2>(Accum{}) == kGroups, "m64nNk16 accumulator: N/8 column groups");
    static_assert(size<1>(Accum{}) == 1 && size<2>(Accum{}) == 1, "one m64 block per consumer");
    static_assert(kGroups % (4 * kBatch) == 0, "whole batches of quads of 8-column groups");
    const int q = static_cast<int>(threadIdx.x % 4);
    const int64_t col0 = int64_t(t.ct) * kTileN;
    if (t.ct == 0) st.dp[0] = st.dp[1] = 0.0f;
    CUTE_UNROLL
    for (int v1 = 0; v1 < 2; ++v1) {
      const int m = row_off + get<0>(coords(make_coord(0, v1, 0), 0, 0));
      // warp-uniform loops, divergent loads and stores: every lane takes part in the shuffles
      const bool live = m < t.rows;
      const int64_t row = t.row0 + m;
      const float w = live ? prob[row] : 0.0f;
      float dp = st.dp[v1];
      CUTE_UNROLL
      for (int c0 = 0; c0 < kGroups; c0 += 4 * kBatch) {
        // the gate and up values of this lane's columns in kBatch quad steps, loaded together
        // (one wait on memory per batch, not per step)
        uint32_t g[kBatch][4], u[kBatch][4];
        int64_t col[kBatch];
        bool in[kBatch];
        CUTE_UNROLL
        for (int b = 0; b < kBatch; ++b) {
          // this lane's 8 columns in step b: group c0 + 4 b + q of the tile
          col[b] = col0 + get<1>(coords(make_coord(0, v1, c0 + 4 * b + q), 0, 0)) - 2 * q;
          in[b] = live && col[b] < F;
          if (in[b]) {
            sm90::load16(gate_up + row * 2 * F + col[b], g[b]);
            sm90::load16(gate_up + row * 2 * F + F + col[b], u[b]);
          }
        }
        CUTE_UNROLL
        for (int b = 0; b < kBatch; ++b) {
          const int c = c0 + 4 * b;
          uint32_t d[4];
          CUTE_UNROLL
          for (int j = 0; j < 4; ++j)  // the dgrad's output rounding, by the hardware conversion
            d[j] = E::pair_from_floats(acc(make_coord(0, v1, c + j), 0, 0),
                                       acc(make_coord(1, v1, c + j), 0, 0));
          sm90::quad_transpose(d, q);
          if (!in[b]) continue;
          uint32_t dg[4], du[4];
          CUTE_UNROLL
          for (int j = 0; j < 4; ++j) {
            S x2[2], y2[2];
            CUTE_UNROLL
            for (int h = 0; h < 2; ++h) {
              const float df = E::to_float(static_cast<S>(d[j] >> (16 * h)));
              const float gf = E::to_float(static_cast<S>(g[b][j] >> (16 * h)));
              const float uf = E::to_float(static_cast<S>(u[b][j] >> (16 * h)));
              float x, y;
              weighted_swiglu_bwd_elem(df * w, gf, uf, x, y);
              x2[h] = E::from_float(x);
              y2[h] = E::from_float(y);
              dp += df * weighted_swiglu_fwd_elem(gf, uf);
            }
            dg[j] = uint32_t(x2[0]) | (uint32_t(x2[1]) << 16);
            du[j] = uint32_t(y2[0]) | (uint32_t(y2[1]) << 16);
          }
          sm90::store16(dgate_up + row * 2 * F + col[b], dg);
          sm90::store16(dgate_up + row * 2 * F + F + col[b], du);
        }
      }
      st.dp[v1] = dp;
      if (t.ct == tiles_n - 1) {  // the row's last column tile: the quad's sum, in a fixed order
        dp += __shfl_xor_sync(0xffffffffu, dp, 1);
        dp += __shfl_xor_sync(0xffffffffu, dp, 2);
        if (live && q == 0) dprob[row] = dp;
      }
    }
  }

  // ---- the epilogue warps' form -----------------------------------------------------------------
  __device__ __forceinline__ uint32_t pack(float lo, float hi) const {
    return E::pair_from_floats(lo, hi);  // the dgrad's output rounding
  }
  // Warp w (of 2) takes rows w, w + 2, ..., lane l columns 8 l .. 8 l + 7 of each: a row's gate
  // and up values are one 512-byte run a warp, and its dprob partial one butterfly over the warp
  // (every lane gets the same bits) that lane ((row - w) / 2) % 32 adds to its state.
  __device__ __forceinline__ void from_tile(const uint8_t* tile, const sm90::TileCoord& t, int tid,
                                            State& st) const {
    static_assert(kTileN == 256, "one 8-column group a lane");
    constexpr int kWarps = 2, kRowsPerWarp = 128 / kWarps, kBatch = 2;  // rows loaded together
    const int warp = tid / 32, lane = tid % 32;
    const int64_t col = int64_t(t.ct) * kTileN + 8 * lane;
    const bool in_col = col < F;
    if (t.ct == 0) st.dp[0] = st.dp[1] = 0.0f;
#pragma unroll 1
    for (int i0 = 0; i0 < kRowsPerWarp; i0 += kBatch) {
      uint32_t d[kBatch][4], g[kBatch][4], u[kBatch][4];
      float w[kBatch];
      bool in[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int r = warp + kWarps * (i0 + b);
        const int64_t row = t.row0 + r;
        const bool live = r < t.rows;
        in[b] = live && in_col;
        w[b] = live ? prob[row] : 0.0f;
        if (in[b]) {
          sm90::load16(gate_up + row * 2 * F + col, g[b]);
          sm90::load16(gate_up + row * 2 * F + F + col, u[b]);
        }
        sm90::load16(sm90::epi_tile_chunk<kTileN>(tile, r, lane), d[b]);
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int64_t row = t.row0 + warp + kWarps * (i0 + b);
        float dp = 0.0f;
        if (in[b]) {
          uint32_t dg[4], du[4];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            S x2[2], y2[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const float df = E::to_float(static_cast<S>(d[b][j] >> (16 * h)));
              const float gf = E::to_float(static_cast<S>(g[b][j] >> (16 * h)));
              const float uf = E::to_float(static_cast<S>(u[b][j] >> (16 * h)));
              float x, y;
              weighted_swiglu_bwd_elem(df * w[b], gf, uf, x, y);
              x2[h] = E::from_float(x);
              y2[h] = E::from_float(y);
              dp += df * weighted_swiglu_fwd_elem(gf, uf);
            }
            dg[j] = uint32_t(x2[0]) | (uint32_t(x2[1]) << 16);
            du[j] = uint32_t(y2[0]) | (uint32_t(y2[1]) << 16);
          }
          sm90::store16(dgate_up + row * 2 * F + col, dg);
          sm90::store16(dgate_up + row * 2 * F + F + col, du);
        }
#pragma unroll
        for (int m = 16; m >= 1; m >>= 1) dp += __shfl_xor_sync(0xffffffffu, dp, m);
        // row index i0 + b of the warp's: lane (i0 + b) % 32 keeps it, in dp[(i0 + b) / 32]
        if (lane == (i0 + b) % 32) {  // (selects, not a dynamic index into the state)
          if (i0 + b < 32)
            st.dp[0] += dp;
          else
            st.dp[1] += dp;
        }
      }
    }
    if (t.ct == tiles_n - 1) {  // the rows' last column tile
#pragma unroll
      for (int v = 0; v < 2; ++v) {
        const int r = warp + kWarps * (lane + 32 * v);
        if (r < t.rows) dprob[t.row0 + r] = st.dp[v];
      }
    }
  }
};

template <class E, class Config>
void launch_down_dgrad(Context& ctx, const MoeDownDgradArgs& a) {
  using Epi = SwigluBackwardEpilogue<E, Config::kTileN>;
  const int64_t H = a.dy.dim(1), R = a.src_row.dim(0), G = a.w.dim(0), F = a.w.dim(2);
  // (a row owner's band is the whole expert: band_n is not read)
  const sm90::GatheredGemmParams p = sm90::gathered_gemm_params(a.dy, a.src_row, a.splits, G, F,
                                                                ctx.status(), OpId::moe_down_dgrad);
  // w [E, H, F] as (F, H, E): boxes of 64 columns by kTileK rows of one expert, zero past F and H
  const CUtensorMap tma_b = make_tensor_map_3d("moe_down_dgrad_swiglu", a.w.data, 2, F, H, G, F * 2,
                                               H * F * 2, 64, Config::kTileK, true);
  const int tiles_n = static_cast<int>((F + Config::kTileN - 1) / Config::kTileN);
  Epi epi{static_cast<const typename E::Storage*>(a.gate_up.data),
          static_cast<typename E::Storage*>(a.dgate_up.data),
          a.prob.ptr<float>(),
          a.dprob.ptr<float>(),
          F,
          tiles_n};
  auto kernel = sm90::gathered_gemm_kernel<Config, Epi>;
  allow_dynamic_smem(ctx, kernel, Config::kSmemBytes);
  // Row units are at most R / 128 + G (a host-known bound); the grid is at most one CTA per SM
  // (and per unit), fewer under a GEMM SM limit (Context::gemm_sm_count).
  const int64_t units = R / Config::kTileM + G;
  const int64_t ctas = std::max<int64_t>(
      1, std::min<int64_t>(units, std::min<int64_t>(ctx.sm_count(), ctx.gemm_sm_count())));
  sm90::gathered_gemm_kernel<Config, Epi>
      <<<static_cast<unsigned>(ctas), Config::kThreads, Config::kSmemBytes, ctx.stream()>>>(
          p, tma_b, epi);
  GROUPMM_CHECK_LAUNCH();
}

}  // namespace

void moe_down_dgrad_swiglu(Context& ctx, const MoeDownDgradArgs& a) {
  const bool epi_warps = a.config == "epi_warps";
  auto run = [&](auto e, auto cute_elem) {
    using E = decltype(e);
    using CE = decltype(cute_elem);
    if (epi_warps)
      launch_down_dgrad<E, DownDgradEpiWarps<CE>>(ctx, a);
    else
      launch_down_dgrad<E, DownDgradCoop<CE>>(ctx, a);
  };
  if (a.dy.dtype == DType::bf16)
    run(Bf16{}, cutlass::bfloat16_t{});
  else
    run(Fp16{}, cutlass::half_t{});
}

}  // namespace groupmm::cuda
