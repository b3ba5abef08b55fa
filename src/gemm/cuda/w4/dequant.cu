// The prefill path's dequantization: 4-bit weights -> the bf16 weights of the GEMM form
// (numerics/w4.hpp), for the experts that have rows, plus every expert's fp32 accumulator
// factor. A bandwidth kernel: one CTA per chunk of kRunsPerCta 16-byte runs (32 codes each) of
// one expert, so an expert without rows costs its CTAs one split read; each thread issues the
// loads of its kUnroll runs before converting any, and finds a run's row with one 32-bit division
// (a grid-stride loop with 64-bit divisions per run ran at 47% of DRAM bandwidth,
// bench/RESULTS.md). Graph safe: the splits are read on the device (a split <= 0 skips its expert;
// clamping is the GEMM's business).
#include <algorithm>

#include "gemm/w4_backends.hpp"
#include "numerics/w4.hpp"
#include "kernels/common/launch.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/splits_scan.cuh"
#include "gemm/cuda/w4/weights.cuh"

namespace groupmm::cuda {
namespace {

struct DequantConfig {
  static constexpr int kThreads = 256;
  static constexpr int kRunK = 32;   // codes per run: one 16-byte load, four 16-byte stores
  static constexpr int kUnroll = 4;  // runs per thread, loads in flight together
  static constexpr int kRunsPerCta = kThreads * kUnroll;
  static_assert(kRunK == 32, "one 16-byte load per run");
  static_assert(kThreads % 32 == 0 && kUnroll >= 1, "whole warps");
};

struct DequantParams {
  w4::W4Weights w;
  const void* splits;
  bool splits64;
  float alpha;
  const float* s_enc;
  uint16_t* wide;         // [G * N, K] bf16
  float* factor;          // [G]
  unsigned expert_runs;   // N * K / 32 (< 2^31, checked on the host)
  unsigned runs_per_row;  // K / 32
  unsigned chunks;        // CTAs per expert
};

// Shared-memory slot of piece i (16 bytes) of a warp's run r: rotated so that neither the
// per-run writes nor the per-piece reads of a quarter warp pile onto a few banks.
__device__ __forceinline__ int slot(int r, int i) {
  return r * 4 + ((i + r) & 3);
}

template <class Cfg, QuantRecipe kRecipe>
__global__ void __launch_bounds__(Cfg::kThreads) w4_dequant_kernel(DequantParams p) {
  __shared__ uint4 stage_all[Cfg::kThreads / 32][32 * 4];  // per warp: 32 runs x 64 bytes
  const w4::W4Weights& w = p.w;
  const int64_t g = blockIdx.x / p.chunks;
  const unsigned chunk = blockIdx.x % p.chunks;
  if (chunk == 0 && threadIdx.x == 0)
    p.factor[g] = qnum::w4_expert_factor(kRecipe, p.alpha, p.s_enc ? p.s_enc[g] : 1.0f);
  if (load_split(p.splits, p.splits64, g) <= 0) return;  // never read (the same for the CTA)
  uint4 q[Cfg::kUnroll];
  uint32_t sv[Cfg::kUnroll];
  unsigned n, k;
  // All loads first: kUnroll 16-byte code runs and their scale bytes per thread in flight.
#pragma unroll
  for (int u = 0; u < Cfg::kUnroll; ++u) {
    const unsigned j = chunk * Cfg::kRunsPerCta + u * Cfg::kThreads + threadIdx.x;
    const bool ok = j < p.expert_runs;
    n = j / p.runs_per_row;
    k = (j - n * p.runs_per_row) * Cfg::kRunK;
    q[u] = ldg_stream16(w.codes_at(g, n, k), ok);
    sv[u] = 0;
    if (ok) {
      const uint8_t* srow = w.scales + w.scale_row(g, n);
      if constexpr (kRecipe == QuantRecipe::nvfp4)
        sv[u] = __ldg(
            reinterpret_cast<const uint16_t*>(srow + qnum::row_scale_col_offset(w.L, k / 16)));
      else
        sv[u] = __ldg(srow + qnum::row_scale_col_offset(w.L, k / 32));
    }
  }
  // Convert, then store through shared memory so that each warp store instruction writes 512
  // contiguous bytes: the warp's 32 runs are 2 KiB of contiguous output (run j of an expert starts
  // at element 32 j of its [N, K] block), and a thread's own 64 bytes stored directly left every
  // store instruction writing half of 32 sectors.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint4* stage = stage_all[warp];
#pragma unroll
  for (int u = 0; u < Cfg::kUnroll; ++u) {
    const unsigned j = chunk * Cfg::kRunsPerCta + u * Cfg::kThreads + threadIdx.x;
    uint32_t m[2], m2 = 0;  // the multipliers of codes 0..15 and 16..31
    if constexpr (kRecipe == QuantRecipe::nvfp4) {
      qnum::w4_nvfp4_multipliers(sv[u], m);
    } else {
      m[0] = m[1] = qnum::w4_mxfp4_multiplier1(static_cast<uint8_t>(sv[u]));
      m2 = qnum::w4_mxfp4_multiplier2(static_cast<uint8_t>(sv[u]));
    }
    const uint32_t words[4] = {q[u].x, q[u].y, q[u].z, q[u].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t r[4], o[4];
      if constexpr (kRecipe == QuantRecipe::nvfp4) {
        qnum::w4_weights8(words[i], m[i / 2], r);
      } else {
        qnum::w4_weights8(words[i], m[i / 2], m2, r);
      }
      qnum::w4_natural_pairs(r, o);
      stage[slot(lane, i)] = make_uint4(o[0], o[1], o[2], o[3]);  // piece i of run `lane`
    }
    __syncwarp();
    const unsigned jw = j - lane;  // the warp's first run
    uint4* dst = reinterpret_cast<uint4*>(p.wide + (g * w.N * w.K + int64_t(jw) * Cfg::kRunK));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int e = i * 32 + lane, owner = e / 4;
      if (jw + owner < p.expert_runs) dst[e] = stage[slot(owner, e % 4)];
    }
    __syncwarp();  // the stage is rewritten by the next run
  }
}

}  // namespace

void w4_dequantize_weights(Context& ctx, const W4Launch& l, void* wide, float* factor) {
  using Cfg = DequantConfig;
  const GemmDims& d = l.dims;
  DequantParams p{};
  p.w = w4::W4Weights::of(l);
  p.splits = l.splits.data;
  p.splits64 = l.splits.dtype == DType::int64;
  p.alpha = l.alpha;
  p.s_enc = l.s_enc;
  p.wide = static_cast<uint16_t*>(wide);
  p.factor = factor;
  const int64_t expert_runs = d.N * (d.K / Cfg::kRunK);
  const int64_t chunks = std::max<int64_t>(1, qnum::ceil_div(expert_runs, Cfg::kRunsPerCta));
  GROUPMM_CHECK(expert_runs < (int64_t(1) << 31) && d.G * chunks < (int64_t(1) << 31),
                "grouped_mm_w4 (prefill): N=", d.N, ", K=", d.K, ", G=", d.G,
                " is too large for the dequantization grid (N*K/32 and G*N*K/8192 below 2^31)");
  p.expert_runs = static_cast<unsigned>(expert_runs);
  p.runs_per_row = static_cast<unsigned>(d.K / Cfg::kRunK);
  p.chunks = static_cast<unsigned>(chunks);
  const int64_t blocks = d.G * chunks;
  if (blocks == 0) return;  // no experts
  const auto kernel = l.recipe == QuantRecipe::nvfp4 ? w4_dequant_kernel<Cfg, QuantRecipe::nvfp4>
                                                     : w4_dequant_kernel<Cfg, QuantRecipe::mxfp4>;
  kernel<<<static_cast<unsigned>(blocks), Cfg::kThreads, 0, ctx.stream()>>>(p);
  GROUPMM_CHECK_LAUNCH();
}

}  // namespace groupmm::cuda
