// The 4-bit weight decode GEMM kernel (see decode_config.cuh for the work split, the K order and
// the ring of shared-memory slots the TMA unit fills).
#pragma once

#include "numerics/w4.hpp"
#include "kernels/common/launch.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/splits_scan.cuh"
#include "kernels/common/tma.cuh"
#include "kernels/common/warp_search.cuh"
#include "gemm/cuda/w4/decode.cuh"

namespace groupmm::cuda::w4 {

using Cfg = DecodeConfig;

// ---- items ------------------------------------------------------------------------------------
// Where item `id` sits: expert, pass, row group and K range (what its copies need).
struct ItemPlace {
  int g, row0, n0;  // expert, first activation row of the pass, first W row
  int tokens;       // rows of the pass, 1 .. kTokens
  int step0, nsteps;
};

template <class V>
__device__ __forceinline__ ItemPlace place_item(const DecodeParams& p, int id, int lane) {
  const DecodePlan& pl = p.plan;
  ItemPlace it;
  // On the critical path: the item's first copies wait for it (warp-parallel search).
  it.g = static_cast<int>(find_expert_warp(pl.item_start, p.G, id, lane));
  const int rows = static_cast<int>(pl.rows[it.g]);
  const int start = static_cast<int>(pl.start[it.g]);  // loaded with rows: one round trip
  const int passes = (rows + V::kTokens - 1) / V::kTokens;
  const int local = static_cast<int>(id - pl.item_start[it.g]);
  // No divisions where the usual case (one pass, no split-K) needs none (warp-uniform branches).
  int pass = 0, rest = local, ks = 0;
  if (passes > 1) {
    pass = local % passes;
    rest = local / passes;
  }
  if (p.ksplit > 1) {
    ks = rest % p.ksplit;
    rest /= p.ksplit;
  }
  it.n0 = rest * Cfg::kRows;
  it.row0 = start + pass * V::kTokens;
  it.tokens = min(V::kTokens, rows - pass * V::kTokens);
  it.step0 = ks * p.steps_per_split;
  it.nsteps = min(p.steps_per_split, p.steps - it.step0);
  return it;
}

// An item as the threads multiply it: its place, and the thread's scale address at the item's
// first step (a step and a sub-block only add the host's strides to it).
struct Item {
  ItemPlace pl;
  const uint8_t* sc;  // row gid of the warp (row gid + 8: DecodeParams::scale_row8 on)
  int kleft[2];       // rows gid, gid + 8: K left after the thread's first code (0 past N)
  uint32_t xoff;      // the thread's B fragment of chunk 0 and token gid in a slot's activations
};

template <class V>
__device__ __forceinline__ Item thread_item(const DecodeParams& p, int id, int warp, int lane) {
  const int gid = lane >> 2, t = lane & 3;
  Item it;
  it.pl = place_item<V>(p, id, lane);
  const int k0 = it.pl.step0 * Cfg::kStepK + t * Cfg::kThreadK;  // the thread's first code
  // Rows gid and gid + 8 share a 32-row group of the swizzled layout (16-row warp blocks).
  const int r = warp * Cfg::kWarpRows + gid;  // row in the item's 128-row tile
  const int64_t n = it.pl.n0 + r;
  const bool ok = n < p.N;         // then row gid + 8 is below N too if N - n > 8
  const int c0 = k0 / V::kBlockK;  // the thread's first scale column
  const int64_t in_tile =
      qnum::row_scale_row_in_tile(p.w.L, r) + qnum::row_scale_col_offset(p.w.L, c0);
  it.sc = ok ? p.w.scales + it.pl.g * p.scale_expert + (it.pl.n0 >> 7) * p.scale_tile + in_tile
             : p.w.scales;
  it.kleft[0] = ok ? static_cast<int>(p.K) - k0 : 0;
  it.kleft[1] = n + 8 < p.N ? it.kleft[0] : 0;
  // Token gid's row of the box is x row row0 + gid, its chunks rotated by that row (xp's layout).
  it.xoff = gid * Cfg::kXRowBytes + t * 16 + (((it.pl.row0 + gid) & 7) * Cfg::kChunkBytes);
  return it;
}

// ---- copies -----------------------------------------------------------------------------------
// The copies of one unit (item step) into its slot, issued by one thread; the slot's barrier
// counts their bytes (whole boxes: the zeros past K, M or the last weight row count too).
template <class V, class S>
__device__ __forceinline__ void fetch_unit(const DecodeTmaParams& P, const ItemPlace& it, int s,
                                           uint8_t* slot, uint64_t* full) {
  const int step = it.step0 + s;
  const int row = it.g * static_cast<int>(P.p.N) + it.n0;  // < 2^31 (host check)
  mbar_arrive_expect_tx(full, S::kSlotBytes);
#pragma unroll
  for (int i = 0; i < Cfg::kSubs; ++i)
    tma_load_2d(slot + i * S::kSubBytes, &P.codes, (step * Cfg::kStepK + i * Cfg::kSubK) / 2, row,
                full);
  tma_load_2d(slot + S::kCodeBytes, &P.x, 0, step * static_cast<int>(P.p.M) + it.row0, full);
}

// The producer's cursor, kDepth - 1 units ahead of the threads' (warp 0 keeps it).
template <class V, class S>
struct Fetcher {
  int id, s, total;
  ItemPlace it;
  __device__ __forceinline__ bool live() const { return id < total; }
  // Issues the current unit into `slot` and moves on; warp 0 only (the item search is warp-wide).
  __device__ __forceinline__ void issue(const DecodeTmaParams& P, uint8_t* slot, uint64_t* full,
                                        int lane) {
    if (lane == 0) fetch_unit<V, S>(P, it, s, slot, full);
    if (++s == it.nsteps) {
      s = 0;
      id += static_cast<int>(gridDim.x);
      if (id < total) it = place_item<V>(P.p, id, lane);
    }
  }
};

// The scale bytes of one unit for one thread: rows gid, gid + 8, sub-blocks i (nvfp4: the two
// scales of the thread's 32 codes as one 16-bit word, the low byte for codes 0..15; mxfp4: one
// byte); 0 past K. Loaded into registers one unit ahead (a few bytes per thread).
struct ScaleRegs {
  uint32_t s[2][Cfg::kSubs];
};

template <class V>
__device__ __forceinline__ void load_scales(const DecodeParams& p, const Item& it, int s,
                                            ScaleRegs& r) {
  const int k_step = s * Cfg::kStepK;
#pragma unroll
  for (int row = 0; row < 2; ++row) {
#pragma unroll
    for (int i = 0; i < Cfg::kSubs; ++i) {
      const bool ok = k_step + i * Cfg::kSubK < it.kleft[row];
      const uint8_t* sp = it.sc + (row ? p.scale_row8 : 0) + s * p.scale_step + i * p.scale_sub;
      uint32_t sv = 0;
      if (ok) sv = V::kNvfp4 ? __ldg(reinterpret_cast<const uint16_t*>(sp)) : __ldg(sp);
      r.s[row][i] = sv;
    }
  }
}

// ---- the multiply -----------------------------------------------------------------------------
// The weights of one unit for one thread: rows gid, gid + 8, sub-blocks i (16 bytes each, from
// the slot), and their scale bytes.
struct StepRegs {
  uint4 w[2][Cfg::kSubs];
  uint32_t s[2][Cfg::kSubs];
};

__device__ __forceinline__ uint32_t word_of(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

// acc += the unit's weights x activations. xa: the shared address of the thread's B fragment of
// chunk 0 and token gid in the slot (DecodeWorkspace::xp); chunk c's is xa ^ (c * 64), token
// gid + 8 k's 512 k bytes on. kTwo (mxfp4): scales past 2^1 need two multipliers.
template <class V, bool kTwo>
__device__ __forceinline__ void multiply(const StepRegs& r, uint32_t xa,
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
        const uint4 b =
            ld_shared_v4((xa ^ ((i * 4 + j) * Cfg::kChunkBytes)) + c * 8 * Cfg::kXRowBytes);
        mma_bf16_16816(acc[c], a0[0], a1[0], a0[1], a1[1], b.x, b.y);
        mma_bf16_16816(acc[c], a0[2], a1[2], a0[3], a1[3], b.z, b.w);
      }
    }
  }
}

// The item's outputs: y = bf16(acc * factor_g + bias) (ksplit 1) or the fp32 partial sums.
template <class V>
__device__ __forceinline__ void store_item(const DecodeParams& p, const Item& it, int warp, int gid,
                                           int t, float (&acc)[V::kTokenTiles][4]) {
  const float f = p.plan.factor[it.pl.g];
  const int ks = it.pl.step0 / p.steps_per_split;
#pragma unroll
  for (int c = 0; c < V::kTokenTiles; ++c) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int token = c * 8 + 2 * t + (q & 1);
      const int64_t n = it.pl.n0 + warp * Cfg::kWarpRows + gid + 8 * (q >> 1);
      if (token < it.pl.tokens && n < p.N) {
        const int64_t row = it.pl.row0 + token;  // < M
        if (p.ksplit == 1) {
          float v = acc[c][q] * f;
          if (p.bias != nullptr) v += bf16_bits_to_float(p.bias[int64_t(it.pl.g) * p.N + n]);
          p.out[row * p.N + n] = float_to_bf16_bits(v);
        } else {
          p.partial[(ks * p.M + row) * p.N + n] = acc[c][q];
        }
      }
      acc[c][q] = 0.0f;
    }
  }
}

// ---- the kernel -------------------------------------------------------------------------------
template <class V, class S>
__global__ void __launch_bounds__(Cfg::kThreads, S::kMinBlocks)
    w4_decode_kernel(const __grid_constant__ DecodeTmaParams P) {
  const DecodeParams& p = P.p;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int gid = lane >> 2, t = lane & 3;
  // 1024-byte aligned: the slots' activation boxes then start at multiples of 512 bytes, so a
  // chunk's XOR (multiply) stays inside the thread's 512-byte token row.
  extern __shared__ __align__(1024) uint8_t smem[];
  uint8_t* ring = smem;                                                // [kDepth] slots
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + S::kRingBytes);  // [kDepth] one a slot
  if (tid == 0) {
    tma_prefetch_map(&P.codes);
    tma_prefetch_map(&P.x);
#pragma unroll
    for (int d = 0; d < S::kDepth; ++d) mbar_init(&full[d], 1);
    mbar_init_fence();
  }
  pdl_wait();  // the plan kernel (plan arrays and the activations in fragment order)
  __syncthreads();
  const int total = static_cast<int>(p.plan.item_start[p.G]);
  int id = static_cast<int>(blockIdx.x);
  if (id >= total) return;
  auto slot = [&](uint32_t u) { return ring + (u % S::kDepth) * S::kSlotBytes; };

  // Unit u (the CTA's u-th item step) lives in slot u % kDepth, its barrier's phase u / kDepth.
  // Units 0 .. kDepth - 2 are in flight before the loop; unit u issues unit u + kDepth - 1 into
  // the slot the CTA barrier closing unit u - 1 freed.
  Fetcher<V, S> f{id, 0, total, {}};
  if (warp == 0) {
    f.it = place_item<V>(p, id, lane);
    for (uint32_t u = 0; u + 1 < S::kDepth && f.live(); ++u) f.issue(P, slot(u), &full[u], lane);
  }
  Item it = thread_item<V>(p, id, warp, lane);
  ScaleRegs ra, rb;
  load_scales<V>(p, it, 0, ra);

  float acc[V::kTokenTiles][4] = {};
  int s = 0;
  uint32_t u = 0;
  // One unit: refill the slot unit u - 1 freed, load the next unit's scales, wait for this unit's
  // bytes, multiply, one CTA barrier. False after the last.
  auto unit = [&](const ScaleRegs& cur, ScaleRegs& nxt) {
    if (warp == 0 && f.live()) {
      const uint32_t v = u + S::kDepth - 1;
      f.issue(P, slot(v), &full[v % S::kDepth], lane);
    }
    Item nit = it;
    int ns = s + 1, nid = id;
    if (ns == it.pl.nsteps) {
      nid = id + static_cast<int>(gridDim.x);
      ns = 0;
      if (nid < total) nit = thread_item<V>(p, nid, warp, lane);
    }
    const bool more = nid < total;
    if (more) load_scales<V>(p, nit, ns, nxt);
    mbar_wait(&full[u % S::kDepth], (u / S::kDepth) & 1);
    if (it.pl.n0 + warp * Cfg::kWarpRows < p.N) {  // warp-uniform: rows past N have no work
      const uint8_t* codes = slot(u) + (warp * Cfg::kWarpRows + gid) * S::kRowBytes + t * 16;
      StepRegs r;
#pragma unroll
      for (int i = 0; i < Cfg::kSubs; ++i) {
        r.w[0][i] = *reinterpret_cast<const uint4*>(codes + i * S::kSubBytes);
        r.w[1][i] = *reinterpret_cast<const uint4*>(codes + i * S::kSubBytes + 8 * S::kRowBytes);
        r.s[0][i] = cur.s[0][i];
        r.s[1][i] = cur.s[1][i];
      }
      const uint32_t xa = smem_addr(slot(u) + S::kCodeBytes) + it.xoff;
      if constexpr (V::kNvfp4) {
        multiply<V, false>(r, xa, acc);
      } else {
        bool two = false;
#pragma unroll
        for (int row = 0; row < 2; ++row)
#pragma unroll
          for (int i = 0; i < Cfg::kSubs; ++i)
            two = two || qnum::w4_mxfp4_needs_two(static_cast<uint8_t>(r.s[row][i]));
        if (__any_sync(0xFFFFFFFFu, two)) {  // rare: a block amax above 12
          multiply<V, true>(r, xa, acc);
        } else {
          multiply<V, false>(r, xa, acc);
        }
      }
      if (s + 1 == it.pl.nsteps) store_item<V>(p, it, warp, gid, t, acc);
    }
    __syncthreads();  // every warp done with the slot before unit u + 1 refills it
    it = nit;
    id = nid;
    s = ns;
    ++u;
    return more;
  };
  // Two scale register sets, alternating (unrolled so that they stay in registers).
  while (unit(ra, rb) && unit(rb, ra)) {
  }
}

template <class V>
void launch_w4_decode(Context& ctx, const DecodeTmaParams& p, int grid) {
  using S = DecodeShape<V>;
  auto kernel = w4_decode_kernel<V, S>;
  allow_dynamic_smem(ctx, kernel, S::kSmemBytes);
  launch_pdl(kernel, dim3(grid), dim3(Cfg::kThreads), S::kSmemBytes, ctx.stream(), p);
}

template <QuantRecipe kRecipe>
DecodeLaunch decode_launch(int token_tiles) {
  return token_tiles == 1   ? &launch_w4_decode<DecodeVariant<kRecipe, 1>>
         : token_tiles == 2 ? &launch_w4_decode<DecodeVariant<kRecipe, 2>>
                            : &launch_w4_decode<DecodeVariant<kRecipe, 4>>;
}

}  // namespace groupmm::cuda::w4
