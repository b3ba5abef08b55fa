// The 4-bit weight decode GEMM kernel (see decode_config.cuh for the work split and the K order).
#pragma once

#include "core/w4_numerics.hpp"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/splits_scan.cuh"
#include "cuda/common/warp_search.cuh"
#include "cuda/w4/decode.cuh"

namespace groupmm::cuda::w4 {

using Cfg = DecodeConfig;

// One item as a CTA runs it, with the thread's load addresses at the item's first step: per step
// and sub-block they only advance by constants, so the steps spend no instructions on index math
// (that math was a third of a step's instructions). 32-bit where the host checks bound the values
// (M, N, K, G and the item count below 2^31).
template <class V>
struct Item {
  int g, row0, n0;  // expert, first activation row of the pass, first W row
  int tokens;       // rows of the pass, 1 .. kTokens
  int ks, nsteps;
  const uint8_t* w;   // row gid of the warp: the thread's codes at (step 0, sub 0); row gid + 8
                      // is DecodeParams::w_row8 bytes on
  const uint8_t* sc;  // ... and its scale bytes (row gid + 8: DecodeParams::scale_row8 on)
  int kleft[2];       // rows gid, gid + 8: K left after the thread's first code (0 past N)
  const uint16_t* x;  // the thread's first activation piece at step 0 (piece q: 8 q rows on)
  int xleft;          // K left after the thread's pieces (their K offset is the same)
};

template <class V>
__device__ __forceinline__ Item<V> decode_item(const DecodeParams& p, int id, int warp, int lane,
                                               int tid) {
  const DecodePlan& pl = p.plan;
  const int gid = lane >> 2, t = lane & 3;
  Item<V> it;
  // On the critical path: the next item's weight loads wait for it (warp-parallel search).
  it.g = static_cast<int>(find_expert_warp(pl.item_start, p.G, id, lane));
  const int rows = static_cast<int>(pl.rows[it.g]);
  const int start = static_cast<int>(pl.start[it.g]);  // loaded with rows: one round trip
  const int passes = (rows + V::kTokens - 1) / V::kTokens;
  const int local = static_cast<int>(id - pl.item_start[it.g]);
  // Item switches cost a twelfth of the instructions: no divisions where the usual case (one
  // pass, no split-K) needs none (warp-uniform branches); the scale strides come from the host.
  int pass = 0, rest = local;
  if (passes > 1) {
    pass = local % passes;
    rest = local / passes;
  }
  it.ks = 0;
  if (p.ksplit > 1) {
    it.ks = rest % p.ksplit;
    rest /= p.ksplit;
  }
  it.n0 = rest * Cfg::kRows;
  it.row0 = start + pass * V::kTokens;
  it.tokens = min(V::kTokens, rows - pass * V::kTokens);
  const int step0 = it.ks * p.steps_per_split;
  it.nsteps = min(p.steps_per_split, p.steps - step0);
  const int k0 = step0 * Cfg::kStepK + t * Cfg::kThreadK;  // the thread's first code
  // Rows gid and gid + 8 share a 32-row group of the swizzled layout (16-row warp blocks).
  const int r = warp * Cfg::kWarpRows + gid;  // row in the item's 128-row tile
  const int64_t n = it.n0 + r;
  const bool ok = n < p.N;         // then row gid + 8 is below N too if N - n > 8
  const int c0 = k0 / V::kBlockK;  // the thread's first scale column
  const int64_t in_tile =
      qnum::row_scale_row_in_tile(p.w.L, r) + qnum::row_scale_col_offset(p.w.L, c0);
  it.w = ok ? p.w.codes_at(it.g, n, k0) : p.w.codes;
  it.sc =
      ok ? p.w.scales + it.g * p.scale_expert + (it.n0 >> 7) * p.scale_tile + in_tile : p.w.scales;
  it.kleft[0] = ok ? static_cast<int>(p.K) - k0 : 0;
  it.kleft[1] = n + 8 < p.N ? it.kleft[0] : 0;
  // The thread's pieces are (token warp + 8 q, the same K): one address and one bound for all
  // (per-piece copies cost the 16- and 32-token variants spills).
  static_assert(Cfg::kThreads == 8 * Cfg::kPiecesPerToken, "piece q is 8 tokens after q - 1");
  const int k = step0 * Cfg::kStepK + (tid % Cfg::kPiecesPerToken) * Cfg::kPieceK;
  const bool xok = warp < it.tokens;  // token of piece 0
  it.x = xok ? p.x + int64_t(it.row0 + warp) * p.K + k : p.x;
  it.xleft = xok ? static_cast<int>(p.K) - k : 0;
  return it;
}

// The weights of one step for one thread: rows gid, gid + 8, sub-blocks i (16 bytes each), and
// their scale bytes (nvfp4: two, the low one for codes 0..15; mxfp4: one).
struct StepRegs {
  uint4 w[2][Cfg::kSubs];
  uint32_t s[2][Cfg::kSubs];
};

template <class V>
__device__ __forceinline__ void load_weights(const DecodeParams& p, const Item<V>& it, int s,
                                             StepRegs& r) {
  const int k_step = s * Cfg::kStepK;
#pragma unroll
  for (int row = 0; row < 2; ++row) {
#pragma unroll
    for (int i = 0; i < Cfg::kSubs; ++i) {
      const int k = k_step + i * Cfg::kSubK;
      const bool ok = k < it.kleft[row];
      r.w[row][i] = ldg_stream16(it.w + (row ? p.w_row8 : 0) + k / 2, ok);
      const uint8_t* sp = it.sc + (row ? p.scale_row8 : 0) + s * p.scale_step + i * p.scale_sub;
      uint32_t sv = 0;
      if (ok) sv = V::kNvfp4 ? __ldg(reinterpret_cast<const uint16_t*>(sp)) : __ldg(sp);
      r.s[row][i] = sv;
    }
  }
}

// The step's activations: 16-byte pieces (token, 8 consecutive K) copied asynchronously into
// the raw buffer (zeros past the pass or K); each thread later permutes its own pieces (no
// barrier: a thread reads back only what it copied).
template <class V>
__device__ __forceinline__ void copy_x_async(const DecodeParams& p, const Item<V>& it, int s,
                                             int tid, uint4* raw) {
  const int k_step = s * Cfg::kStepK;
#pragma unroll
  for (int q = 0; q < V::kPiecesPerThread; ++q) {
    // Piece q's token is (tid / 32) + 8 q; it.xleft is 0 when piece 0's token is past the pass.
    const bool ok = k_step < it.xleft && (tid >> 5) + 8 * q < it.tokens;
    cp_async16(static_cast<uint32_t>(__cvta_generic_to_shared(raw + tid + q * Cfg::kThreads)),
               ok ? it.x + 8 * q * p.K + k_step : p.x, ok ? 16 : 0);
  }
  cp_async_commit();
}
// Piece (token, K offset 128 i + 32 t + 8 j) goes to B fragment ((i * 4 + j) * kTokens + token) *
// 4 + t of the stage, permuted like the weights' raw words.
template <class V>
__device__ __forceinline__ void stage_x(uint4* stage, const uint4* raw, int tid) {
  cp_async_wait<0>();
#pragma unroll
  for (int q = 0; q < V::kPiecesPerThread; ++q) {
    const int piece = tid + q * Cfg::kThreads;
    const int token = piece / Cfg::kPiecesPerToken, k8 = piece % Cfg::kPiecesPerToken;
    const int i = k8 >> 4, t = (k8 >> 2) & 3, j = k8 & 3;
    const uint4 v = raw[piece];
    uint32_t o[4];
    qnum::w4_x_pairs(v.x, v.y, v.z, v.w, o);
    stage[((i * 4 + j) * V::kTokens + token) * 4 + t] = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

// acc += the step's weights x activations. kTwo (mxfp4): scales past 2^1 need two multipliers.
template <class V, bool kTwo>
__device__ __forceinline__ void multiply(const StepRegs& r, const uint4* stage, int lane,
                                         float (&acc)[V::kTokenTiles][4]) {
#pragma unroll
  for (int i = 0; i < Cfg::kSubs; ++i) {
    uint32_t m[2][2], m2[2];  // [row][half of the 32 codes], second mxfp4 factor [row]
#pragma unroll
    for (int row = 0; row < 2; ++row) {
      const uint32_t sv = r.s[row][i];
      if constexpr (V::kNvfp4) {
        qnum::w4_nvfp4_multipliers(sv, m[row]);
      } else {
        m[row][0] = m[row][1] = qnum::w4_mxfp4_multiplier1(static_cast<uint8_t>(sv));
        m2[row] = qnum::w4_mxfp4_multiplier2(static_cast<uint8_t>(sv));
      }
    }
#pragma unroll
    for (int j = 0; j < Cfg::kWords; ++j) {
      uint32_t a0[4], a1[4];  // rows gid, gid + 8
      if constexpr (kTwo) {
        qnum::w4_weights8(word_of(r.w[0][i], j), m[0][j / 2], m2[0], a0);
        qnum::w4_weights8(word_of(r.w[1][i], j), m[1][j / 2], m2[1], a1);
      } else {
        qnum::w4_weights8(word_of(r.w[0][i], j), m[0][j / 2], a0);
        qnum::w4_weights8(word_of(r.w[1][i], j), m[1][j / 2], a1);
      }
#pragma unroll
      for (int c = 0; c < V::kTokenTiles; ++c) {
        const uint4 b = stage[((i * 4 + j) * V::kTokens + c * 8) * 4 + lane];
        mma_bf16_16816(acc[c], a0[0], a1[0], a0[1], a1[1], b.x, b.y);
        mma_bf16_16816(acc[c], a0[2], a1[2], a0[3], a1[3], b.z, b.w);
      }
    }
  }
}

// The item's outputs: y = bf16(acc * factor_g + bias) (ksplit 1) or the fp32 partial sums.
template <class V>
__device__ __forceinline__ void store_item(const DecodeParams& p, const Item<V>& it, int warp,
                                           int gid, int t, float (&acc)[V::kTokenTiles][4]) {
  const float f = p.plan.factor[it.g];
#pragma unroll
  for (int c = 0; c < V::kTokenTiles; ++c) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int token = c * 8 + 2 * t + (q & 1);
      const int64_t n = it.n0 + warp * Cfg::kWarpRows + gid + 8 * (q >> 1);
      if (token < it.tokens && n < p.N) {
        const int64_t row = it.row0 + token;  // < M
        if (p.ksplit == 1) {
          float v = acc[c][q] * f;
          if (p.bias != nullptr) v += bf16_bits_to_float(p.bias[int64_t(it.g) * p.N + n]);
          p.out[row * p.N + n] = float_to_bf16_bits(v);
        } else {
          p.partial[(it.ks * p.M + row) * p.N + n] = acc[c][q];
        }
      }
      acc[c][q] = 0.0f;
    }
  }
}

// The loop's state and one iteration: load the next unit (item step) into `nxt` while `cur`, the
// current one, is multiplied; store the next activations; one CTA barrier. False after the last.
template <class V>
struct DecodeLoop {
  const DecodeParams& p;
  uint4* stage;  // [2][kStage16] permuted activations, then [kStage16] raw copies
  int total;
  int tid, lane, warp, gid, t;
  Item<V> it;
  int id;
  int s = 0, buf = 0;
  float acc[V::kTokenTiles][4] = {};
  static constexpr int kStage16 = V::kStageBytes / 16;

  __device__ __forceinline__ bool step(const StepRegs& cur, StepRegs& nxt) {
    Item<V> nit = it;
    int ns = s + 1;
    int nid = id;
    if (ns == it.nsteps) {
      nid = id + static_cast<int>(gridDim.x);
      ns = 0;
      if (nid < total) nit = decode_item<V>(p, nid, warp, lane, tid);
    }
    const bool more = nid < total;
    if (more) {
      load_weights<V>(p, nit, ns, nxt);
      copy_x_async<V>(p, nit, ns, tid, stage + 2 * kStage16);
    }
    if (it.n0 + warp * Cfg::kWarpRows < p.N) {  // warp-uniform: rows past N have no work
      const uint4* st = stage + buf * kStage16;
      if constexpr (V::kNvfp4) {
        multiply<V, false>(cur, st, lane, acc);
      } else {
        bool two = false;
#pragma unroll
        for (int row = 0; row < 2; ++row)
#pragma unroll
          for (int i = 0; i < Cfg::kSubs; ++i)
            two = two || qnum::w4_mxfp4_needs_two(static_cast<uint8_t>(cur.s[row][i]));
        if (__any_sync(0xFFFFFFFFu, two)) {  // rare: a block amax above 12
          multiply<V, true>(cur, st, lane, acc);
        } else {
          multiply<V, false>(cur, st, lane, acc);
        }
      }
      if (s + 1 == it.nsteps) store_item<V>(p, it, warp, gid, t, acc);
    }
    if (more) stage_x<V>(stage + (buf ^ 1) * kStage16, stage + 2 * kStage16, tid);
    __syncthreads();
    it = nit;
    id = nid;
    s = ns;
    buf ^= 1;
    return more;
  }
};

template <class V>
__global__ void __launch_bounds__(Cfg::kThreads, V::kMinBlocks) w4_decode_kernel(DecodeParams p) {
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31;
  pdl_wait();                       // the plan kernel
  extern __shared__ uint4 stage[];  // DecodeLoop::stage
  DecodeLoop<V> L{p,         stage,   static_cast<int>(p.plan.item_start[p.G]), tid, lane, tid >> 5,
                  lane >> 2, lane & 3};
  L.id = static_cast<int>(blockIdx.x);
  if (L.id >= L.total) return;
  L.it = decode_item<V>(p, L.id, L.warp, lane, tid);
  StepRegs ra, rb;
  load_weights<V>(p, L.it, 0, ra);
  copy_x_async<V>(p, L.it, 0, tid, stage + 2 * L.kStage16);
  stage_x<V>(stage, stage + 2 * L.kStage16, tid);
  __syncthreads();
  // Two register sets, alternating (unrolled so that they stay in registers).
  while (L.step(ra, rb) && L.step(rb, ra)) {
  }
}

template <class V>
void launch_w4_decode(Context& ctx, const DecodeParams& p, int grid) {
  auto kernel = w4_decode_kernel<V>;
  allow_dynamic_smem(ctx, kernel, V::kSmemBytes);
  launch_pdl(kernel, dim3(grid), dim3(Cfg::kThreads), V::kSmemBytes, ctx.stream(), p);
}

template <QuantRecipe kRecipe>
DecodeLaunch decode_launch(int token_tiles) {
  return token_tiles == 1   ? &launch_w4_decode<DecodeVariant<kRecipe, 1>>
         : token_tiles == 2 ? &launch_w4_decode<DecodeVariant<kRecipe, 2>>
                            : &launch_w4_decode<DecodeVariant<kRecipe, 4>>;
}

}  // namespace groupmm::cuda::w4
