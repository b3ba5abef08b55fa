// CUDA moe_gate_up_swiglu: the kernel layer's gathered grouped GEMM
// (kernels/sm90/gathered_gemm.cuh) with the weighted-SwiGLU epilogue; and moe_permute_sources
// (fill, then one thread per entry).
//
// The B tile (N = kTileN) holds the gate rows [ct * N/2, (ct + 1) * N/2) and the up rows
// F + [same) of an expert (kBHalves = 2), so a thread's accumulator holds gate column n and up
// column n + N/2 of the same rows: the SwiGLU needs no data exchange. The epilogue rounds both to
// the output dtype first (the unfused GEMM's output rounding), applies weighted_swiglu's device
// element math and stores pairs of columns (and the rounded pre-activation when asked) straight
// from registers.
#include <algorithm>
#include <cmath>
#include <atomic>
#include <string>

#include "kernels/common/element.cuh"
#include "kernels/common/occupancy.cuh"
#include "kernels/common/launch.cuh"
#include "kernels/sm90/gathered_gemm.cuh"
#include "kernels/sm90/quad_transpose.cuh"
#include "moe/backends.hpp"
#include "moe/cuda/moe_common.cuh"
#include "moe/swiglu_backends.hpp"

namespace groupmm::cuda {
namespace {

using namespace cute;

// The configurations of the fused gate_up projection (named once here): cooperative 128 x 256
// tiles (128 activation columns; 4 stages of 48 KiB) where F % 128 == 0, else ping-pong 128 x 128
// tiles (64 activation columns; 6 stages of 32 KiB).
template <class Element>
using GateUpCoop = sm90::GatheredGemmConfig<Element, 256, 4, 2, true>;
template <class Element>
using GateUpPingPong = sm90::GatheredGemmConfig<Element, 128, 6, 2, false>;
// The cooperative tile on a 2-CTA cluster: each CTA loads one weight half and multicasts it.
template <class Element>
using GateUpCoopPair = sm90::GatheredGemmConfig<Element, 256, 4, 2, true, 2>;

// The default where F % 128 == 0 (wide) and otherwise.
// (measured: docs/decisions.md, "Kernel layer: gate_up projection schedules").
const std::string kGateUpDefaultWide = "coop_128x256", kGateUpDefaultNarrow = "pingpong_128x128";

template <class E, int kTileN>
struct WeightedSwigluEpilogue {
  using S = typename E::Storage;
  struct State {};  // nothing carried across tiles
  S* out;           // [R, F], 16-byte aligned
  S* gate_up;       // [R, 2F] or null, 16-byte aligned
  const float* prob;
  int64_t F;

  __device__ __forceinline__ void prefetch(const sm90::TileCoord&, int, int) const {
  }  // stores only

  // The m64nNk16 accumulator: lane q of a quad holds columns 8 v2 + 2q, + 1 of its rows. Four
  // consecutive 8-column groups are transposed across the quad, so that each lane stores 8
  // consecutive columns (one 16-byte store instead of four 4-byte ones: the stores, not the
  // math, bound this epilogue).
  template <class Accum, class Coords>
  __device__ __forceinline__ void operator()(const Accum& acc, const Coords& coords,
                                             const sm90::TileCoord& t, int row_off, State&) const {
    constexpr int kHalf = kTileN / 16;  // 8-column groups per half
    static_assert(size<0, 2>(Accum{}) == 2 * kHalf, "m64nNk16 accumulator: N/8 column groups");
    static_assert(size<2>(Accum{}) == 1, "one wgmma N block per tile");
    static_assert(kHalf % 4 == 0, "whole quads of 8-column groups per half");
    const int q = static_cast<int>(threadIdx.x % 4);
    const int64_t col0 = int64_t(t.ct) * (kTileN / 2);
    CUTE_UNROLL
    for (int mi = 0; mi < size<1>(Accum{}); ++mi) {
      CUTE_UNROLL
      for (int v1 = 0; v1 < 2; ++v1) {
        const int m = row_off + get<0>(coords(make_coord(0, v1, 0), mi, 0));
        // warp-uniform loop, divergent stores: every lane takes part in the shuffles
        const bool live = m < t.rows;
        const int64_t row = t.row0 + m;
        const float w = live ? prob[row] : 0.0f;
        CUTE_UNROLL
        for (int c = 0; c < kHalf; c += 4) {
          uint32_t g[4], u[4], h[4];
          CUTE_UNROLL
          for (int j = 0; j < 4; ++j) {
            // the GEMM's output rounding, by the hardware conversion (see element.cuh: integer
            // arithmetic on accumulator bits would serialize the wgmma pipeline)
            g[j] = E::pair_from_floats(acc(make_coord(0, v1, c + j), mi, 0),
                                       acc(make_coord(1, v1, c + j), mi, 0));
            u[j] = E::pair_from_floats(acc(make_coord(0, v1, c + j + kHalf), mi, 0),
                                       acc(make_coord(1, v1, c + j + kHalf), mi, 0));
            S hv[2];
            CUTE_UNROLL
            for (int v0 = 0; v0 < 2; ++v0) {
              const float gf = E::to_float(static_cast<S>(g[j] >> (16 * v0)));
              const float uf = E::to_float(static_cast<S>(u[j] >> (16 * v0)));
              hv[v0] = E::from_float(weighted_swiglu_fwd_elem(gf, uf) * w);
            }
            h[j] = uint32_t(hv[0]) | (uint32_t(hv[1]) << 16);
          }
          sm90::quad_transpose(h, q);
          // this lane's 8 columns: group c + q of the half (column 8 (c + q) of the tile's half)
          const int64_t col = col0 + get<1>(coords(make_coord(0, v1, c + q), mi, 0)) - 2 * q;
          if (live) sm90::store16(out + row * F + col, h);
          if (gate_up != nullptr) {
            sm90::quad_transpose(g, q);
            sm90::quad_transpose(u, q);
            if (live) {
              sm90::store16(gate_up + row * 2 * F + col, g);
              sm90::store16(gate_up + row * 2 * F + F + col, u);
            }
          }
        }
      }
    }
  }
};

template <class E, class Config>
void launch_gate_up(Context& ctx, const MoeGateUpArgs& a) {
  using Epi = WeightedSwigluEpilogue<E, Config::kTileN>;
  const int64_t H = a.x.dim(1), R = a.src_row.dim(0), G = a.w.dim(0), F = a.w.dim(1) / 2;
  sm90::GatheredGemmParams p = sm90::gathered_gemm_params(a.x, a.src_row, a.splits, G, 2 * F,
                                                          ctx.status(), OpId::moe_gate_up);
  const CUtensorMap tma_b =
      make_tensor_map_2d("moe_gate_up_swiglu", a.w.data, 2, H, G * 2 * F, H * 2, Config::kTileK,
                         Config::kTileN / Config::kBHalves, /*swizzle128=*/true);
  Epi epi{static_cast<typename E::Storage*>(a.out.data),
          a.gate_up.present() ? static_cast<typename E::Storage*>(a.gate_up.data) : nullptr,
          a.prob.ptr<float>(), F};
  auto kernel = sm90::gathered_gemm_kernel<Config, Epi>;
  allow_dynamic_smem(ctx, kernel, Config::kSmemBytes);
  // Units are at most (R / 128 + G) row tiles times the column tiles (a host-known bound); the
  // grid is the clusters resident at once (a GPC with an odd SM count leaves one SM idle), at most
  // one CTA per unit row tile.
  constexpr int C = Config::kCluster;
  const int64_t tiles = (R / Config::kTileM + G) * (2 * F / Config::kTileN);
  cudaLaunchConfig_t cfg = {};
  cfg.blockDim = dim3(Config::kThreads);
  cfg.dynamicSmemBytes = Config::kSmemBytes;
  cfg.stream = ctx.stream();
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = C;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int64_t resident = ctx.sm_count() / C;
  if constexpr (C > 1) {
    // resident clusters per device (a property of the device and the kernel), found once
    static std::atomic<int> per_device[64] = {};
    GROUPMM_CHECK(ctx.device_index() < 64, "moe_gate_up_swiglu: device index ", ctx.device_index(),
                  " past 63");
    std::atomic<int>& clusters = per_device[ctx.device_index()];
    if (clusters.load() == 0) {
      cfg.gridDim = dim3(unsigned(ctx.sm_count() / C * C));
      int n = 0;
      GROUPMM_CHECK_CUDA(cudaOccupancyMaxActiveClusters(&n, kernel, &cfg));
      clusters.store(std::max(n, 1));
    }
    resident = clusters.load();
  }
  // A GEMM SM limit (Context::gemm_sm_count) leaves SMs to other streams' kernels.
  resident = std::min<int64_t>(resident, std::max(ctx.gemm_sm_count() / C, 1));
  const int64_t clusters = std::max<int64_t>(1, std::min<int64_t>(tiles, resident));
  cfg.gridDim = dim3(static_cast<unsigned>(clusters * C));
  // The raster band: the units in flight (one per cluster) cover clusters / band unit rows of A
  // (C * 128 rows each) by band column tiles of B (kTileN rows each); an expert too large for L2
  // is then read from memory about (A bytes) * (column tiles / band) + (B bytes) * (unit rows /
  // (clusters / band)), least at band = sqrt(clusters * C * 128 / kTileN).
  p.band_n = static_cast<int32_t>(
      std::max(1.0, std::round(std::sqrt(double(clusters) * C * Config::kTileM / Config::kTileN))));
  GROUPMM_CHECK_CUDA(cudaLaunchKernelEx(&cfg, kernel, p, tma_b, epi));
}

__global__ void permute_sources_fill(int32_t* src_row, float* probs, int64_t rows) {
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
       r += int64_t(gridDim.x) * blockDim.x) {
    src_row[r] = -1;
    if (probs != nullptr) probs[r] = 0.0f;
  }
}

__global__ void permute_sources_scatter(const int32_t* dest_row, const float* weights,
                                        int32_t* src_row, float* probs, int64_t entries, int64_t k,
                                        int64_t rows) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < entries;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int32_t d = dest_row[i];
    if (d < 0 || d >= rows) continue;
    src_row[d] = static_cast<int32_t>(i / k);
    if (probs != nullptr) probs[d] = weights[i];
  }
}

}  // namespace

void moe_gate_up_swiglu(Context& ctx, const MoeGateUpArgs& a) {
  const bool wide = (a.w.dim(1) / 2) % (GateUpCoop<cutlass::half_t>::kTileN / 2) == 0;
  const std::string& name =
      a.config.empty() ? (wide ? kGateUpDefaultWide : kGateUpDefaultNarrow) : a.config;
  auto run = [&](auto e, auto cute_elem) {
    using E = decltype(e);
    using CE = decltype(cute_elem);
    if (name == "coop_128x256")
      launch_gate_up<E, GateUpCoop<CE>>(ctx, a);
    else if (name == "coop_128x256_c2")
      launch_gate_up<E, GateUpCoopPair<CE>>(ctx, a);
    else
      launch_gate_up<E, GateUpPingPong<CE>>(ctx, a);
  };
  if (a.x.dtype == DType::bf16)
    run(Bf16{}, cutlass::bfloat16_t{});
  else
    run(Fp16{}, cutlass::half_t{});
}

void moe_permute_sources(Context& ctx, const PermuteMap& m, const TensorView& src_row,
                         const TensorView& weights, const TensorView& probs) {
  constexpr int kT = 256;
  float* pr = probs.present() ? probs.ptr<float>() : nullptr;
  if (m.rows > 0) {
    const unsigned grid =
        resident_grid(ctx, permute_sources_fill, kT, qnum::ceil_div(m.rows, kT), 8);
    permute_sources_fill<<<grid, kT, 0, ctx.stream()>>>(src_row.ptr<int32_t>(), pr, m.rows);
    GROUPMM_CHECK_LAUNCH();
  }
  const int64_t entries = m.tokens * m.topk;
  if (entries > 0) {
    const unsigned grid =
        resident_grid(ctx, permute_sources_scatter, kT, qnum::ceil_div(entries, kT), 8);
    permute_sources_scatter<<<grid, kT, 0, ctx.stream()>>>(
        m.dest_row.ptr<int32_t>(), weights.present() ? weights.ptr<float>() : nullptr,
        src_row.ptr<int32_t>(), pr, entries, m.topk, m.rows);
    GROUPMM_CHECK_LAUNCH();
  }
}

}  // namespace groupmm::cuda
