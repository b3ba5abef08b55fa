// groupmm's own sm_90a grouped GEMM with a gathered A operand: a persistent, warp-specialized
// kernel that reads the per-expert row counts on the device and runs an epilogue functor on every
// output tile, under the other consumer warpgroup's MMAs (ping-pong) or under the producer's loads
// of the next tile (cooperative).
//
//   C[r, :] = A[src_row[r], :] B_g^T      for every row r of expert g (rows from the splits)
//
// A is row-major [A_rows, K] (x or dy, never permuted); src_row [R] int32 names the row of A
// behind each of the R rows (-1: a zero row, the padding of a permuted buffer). B holds the
// experts' weights, read by TMA with a 128-byte swizzle: K-major [G * N, K] row-major (a forward
// projection's [G, N, K] weight), or with kBMajorMN N-major [G, K, N] (the same weight read by a
// dgrad, whose N is the forward's K), through a 3-D tensor map that zero-fills past an expert's K
// and N. The epilogue functor receives the fp32 accumulator tile in registers with its
// coordinates; it owns the output (the kernel writes nothing itself), so an epilogue may round,
// activate, weight, quantize or scatter. An epilogue keeps per-thread state across tiles
// (Epilogue::State); with kRowOwner a CTA takes all column tiles of a row tile in order, so that
// state can carry a row reduction across the columns without atomics.
//
// Warp roles (3 warpgroups, one CTA per SM):
//   producer   warpgroup 0: 128 threads gather A rows with 16-byte cp.async into the stage's
//              swizzled buffer (zero-filled past K, for -1 rows and past the expert's end);
//              thread 0 also issues the B tile's TMA copies. Both are counted on the stage's
//              full barrier: 128 cp.async arrivals (noinc) + one arrive with the TMA byte count.
//   consumers  warpgroups 1 and 2. Ping-pong: they take alternate tiles of the CTA's sequence;
//              each runs its tile's mainloop (wgmma from shared memory, one batch in flight) and
//              then its epilogue, which overlaps the other warpgroup's mainloop. Cooperative: both
//              run every tile, 64 rows each, and their epilogues overlap the producer's loads of
//              the next tile.
// Stages are used in the CTA's tile order by both consumers, so a consumer knows its tile's
// first stage from the tile's position alone (every tile has the same number of K blocks).
//
// Scheduling: every CTA scans the splits itself (scan_splits: clamped ranges, faults reported
// once by CTA 0) into shared-memory tables; work units (kCluster row tiles by one column tile)
// are numbered expert by expert, and within an expert in bands of `band_n` column tiles: band by
// band, unit row by unit row within a band, column tile fastest. Consecutive units share their
// gathered A rows, and the units in flight at once (one per cluster) cover about
// clusters / band_n unit rows by band_n column tiles, so that the A rows and B columns they read
// stay in L2 however wide the expert (the host picks band_n; band_n >= the column tiles is plain
// row-major order). Cluster c takes units c, c + clusters, ...; CTA r of the cluster takes row tile
// r of its unit (none past the expert's rows: it then only loads and multicasts its half of B,
// keeping the stage protocol).
//
// 4-bit B (Config::kBCodes, gathered_gemm_w4_kernel): A is grouped by expert (output row r reads A
// row r; src_row unused) and copied by TMA; thread 0 copies each stage's codes into a ring of raw
// slots ahead of time, and the producer threads convert them into the stage's bf16 B tile
// (w4_b_tile.cuh) under the consumers' MMAs of the stages before.
//
// Invariants (checked by the host wrapper): K % 8 == 0 (16-byte rows), A and B 16-byte aligned,
// G <= kMaxGroups; K-major 16-bit B: N % kTileN == 0 (a column tile never straddles two experts);
// N-major B and 4-bit B (3-D tensor maps: zeros past an expert's N and K): N % 8 == 0, the
// epilogue skipping columns past N; 4-bit B: K % 32 == 0 (whole scale blocks, 16-byte code rows).
#pragma once

#include <cstdint>

#include "cute/arch/copy_sm90_desc.hpp"
#include "cute/atom/mma_traits_sm90_gmma.hpp"
#include "cute/tensor.hpp"
#include "cutlass/arch/reg_reconfig.h"
#include "groupmm/core.hpp"
#include "kernels/common/ptx.cuh"
#include "kernels/common/splits_scan.cuh"
#include "kernels/common/status.cuh"
#include "kernels/common/tma.cuh"
#include "kernels/sm90/cta_sync.cuh"
#include "kernels/sm90/gathered_gemm_config.cuh"
#include "kernels/sm90/quad_transpose.cuh"
#include "kernels/sm90/w4_b_tile.cuh"

namespace groupmm::cuda::sm90 {

// The kernel. Epilogue: a functor with a default-constructible State and
//   template <class Accum, class Coords>
//   __device__ void operator()(const Accum& acc, const Coords& coords, const TileCoord& t,
//                              int row_off, State& state) const;
// called by all 128 threads of a consumer warpgroup after the tile's last MMA; row_off +
// get<0>(coords(i)) and get<1>(coords(i)) are the row and column within the tile of acc(i);
// `state` is the thread's, kept from its previous tile (a cluster's spare row tiles skip the
// call). And
//   __device__ void prefetch(const TileCoord& t, int tid, int threads) const;
// called by the producer's gathering threads (tid 0 .. threads - 1) before they load the tile's
// first stage: an
// epilogue that reads global memory (not just the accumulators) prefetches it into L2 there, so
// that its loads do not wait on HBM after the mainloop. With kEpilogueWarps, instead of
// operator():
//   __device__ uint32_t pack(float lo, float hi) const;   // two accumulators as 16-bit values
//   __device__ void from_tile(const uint8_t* tile, const TileCoord& t, int tid,
//                             State& state) const;
// pack by the consumers (lo at the lower column); from_tile by the 64 epilogue threads (tid
// 0..63), the tile's rows and columns read through epi_tile_chunk(); `state` kept from their
// previous tile.
//
// The body of both kernels below: tma_a (4-bit B only: A by TMA) and tma_b point to the kernel's
// __grid_constant__ tensor maps.
template <class Config, class Epilogue>
__device__ __forceinline__ void gathered_gemm_body(const GatheredGemmParams& p,
                                                   const CUtensorMap* tma_a,
                                                   const CUtensorMap* tma_b, const Epilogue& epi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  using Element = typename Config::Element;
  constexpr int BM = Config::kTileM, BN = Config::kTileN, BK = Config::kTileK, S = Config::kStages;
  extern __shared__ uint8_t smem_raw[];
  GatheredGemmSmem<Config> sm(smem_raw);
  const int G = static_cast<int>(p.G);
  const int tiles_n = static_cast<int>((p.b_rows + BN - 1) / BN);

  // ---- prologue: the tile tables from the device splits (faults reported by CTA 0 only) ------
  SplitsScanArgs sa;
  sa.splits = p.splits;
  sa.splits64 = p.splits64;
  sa.G = p.G;
  sa.row_bound = p.R;
  sa.expected_total = p.R;
  sa.status = blockIdx.x == 0 ? p.status : nullptr;
  sa.op = p.op;
  const auto totals = scan_splits<Config::kThreads, 1>(
      sa,
      [&](int64_t rows) {
        const int64_t row_tiles = (rows + BM - 1) / BM;
        return Counts<1>{{(row_tiles + Config::kCluster - 1) / Config::kCluster * tiles_n}};
      },
      [&](const ExpertSpan<1>& e) {
        sm.tile_prefix[e.g] = static_cast<int32_t>(e.before.v[0]);
        sm.row_start[e.g] = static_cast<int32_t>(e.start);
        sm.rows[e.g] = static_cast<int32_t>(e.rows);
      });
  const int32_t total_tiles = static_cast<int32_t>(totals.derived.v[0]);
  if (threadIdx.x == 0) {
    sm.tile_prefix[G] = total_tiles;
    for (int s = 0; s < S; ++s) {
      // the gathering threads' cp.async arrivals and thread 0's with the TMA bytes of B; with 4-bit
      // B thread 0's with the TMA bytes of A and every producer thread's after its conversion
      mbar_init(&sm.full[s], Config::kGatherThreads + 1);
      // one arrival per consumer warpgroup that reads the stage, in every CTA it is written to
      mbar_init(&sm.empty[s], (Config::kCooperative ? 2 : 1) * Config::kCluster);
    }
    mbar_init(&sm.turn[0], 1);
    mbar_init(&sm.turn[1], 1);
    mbar_init(sm.epi_full, 2 * 128);
    mbar_init(sm.epi_empty, Config::kEpilogueThreads > 0 ? Config::kEpilogueThreads : 1);
    for (int r = 0; r < Config::kRawSlots; ++r) mbar_init(&sm.raw_full[r], 1);
    mbar_init_fence();
  }
  __syncthreads();
  if constexpr (Config::kCluster > 1) detail::cluster_sync();  // the peer's barriers exist
  const int rank = Config::kCluster > 1 ? static_cast<int>(blockIdx.x % Config::kCluster) : 0;
  const int32_t first_unit = static_cast<int32_t>(blockIdx.x / Config::kCluster);
  const int32_t unit_step = static_cast<int32_t>(gridDim.x / Config::kCluster);

  // A row owner's units run column tile fastest (a band as wide as the expert).
  const int band_n = Config::kRowOwner ? tiles_n : max(1, min(static_cast<int>(p.band_n), tiles_n));
  // The CTA's tile sequence: unit first_unit, then every unit_step-th; a row owner takes runs of
  // tiles_n consecutive tiles (a whole row of column tiles), every expert's tile count being a
  // multiple of tiles_n.
  const int32_t run = Config::kRowOwner ? tiles_n : 1;
  const int32_t first_tile = first_unit * run;
  auto next_tile = [&](int32_t t) {
    return (t + 1) % run != 0 ? t + 1 : t + 1 + (unit_step - 1) * run;
  };
  auto tile_at = [&](int32_t t) {
    const int g = detail::find_tile_group(sm.tile_prefix, G, t);
    const int32_t local = t - sm.tile_prefix[g];
    const int32_t unit_rows = (sm.tile_prefix[g + 1] - sm.tile_prefix[g]) / tiles_n;
    const int32_t per_band = unit_rows * band_n;  // units of a full band
    const int band = local / per_band;
    const int32_t in_band = local - band * per_band;
    const int width = min(band_n, tiles_n - band * band_n);  // the last band may be narrower
    const int unit_row = in_band / width;
    const int rt = unit_row * Config::kCluster + rank;
    TileCoord c;
    c.g = g;
    c.ct = band * band_n + (in_band - unit_row * width);
    c.row0 = int64_t(sm.row_start[g]) + int64_t(rt) * BM;
    c.rows = max(0, min(BM, sm.rows[g] - rt * BM));
    return c;
  };
  const int kb_count = static_cast<int>((p.K + BK - 1) / BK);
  // warp-uniform by construction (a shuffle from lane 0), so that the compiler sees the role
  // branches as uniform and keeps the wgmma batches asynchronous
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);

  if (wg == 0) cutlass::arch::warpgroup_reg_dealloc<Config::kProducerRegs>();  // all 4 warps
  if (wg == 0 && Config::kEpilogueWarps && threadIdx.x >= Config::kGatherThreads) {
    // ---- the producer warpgroup's epilogue warps
    // -------------------------------------------------
    if constexpr (Config::kEpilogueWarps) {
      const int etid = threadIdx.x - Config::kGatherThreads;
      typename Epilogue::State state{};
      int i = 0;  // position of the tile in this CTA's sequence
      for (int32_t t = first_tile; t < total_tiles; t = next_tile(t), ++i) {
        const TileCoord c = tile_at(t);
        mbar_wait(sm.epi_full, i & 1);
        epi.from_tile(sm.epi, c, etid, state);
        detail::mbar_arrive(sm.epi_empty);  // this thread's reads of the tile are done
      }
    }
  } else if (wg == 0 && !Config::kB4) {
    // ---- producer ------------------------------------------------------------------------------
    // Each gathering thread copies kCw consecutive 16-byte chunks (of the 8 of a 128-byte K
    // row) of rows row_in + 16 i, i < 8.
    constexpr int kCw = 128 / Config::kGatherThreads;
    const int tid = threadIdx.x;  // 0 .. kGatherThreads - 1
    const int chunk = (tid % (8 / kCw)) * kCw;
    const int row_in = tid / (8 / kCw);
    const Element* a = static_cast<const Element*>(p.a);
    if (tid == 0) tma_prefetch_map(tma_b);
    int cnt = 0;
    // The last K block is partial when K % kTileK != 0: its chunks past K are zero-filled.
    const bool k_tail = p.K % BK != 0;
    for (int32_t t = first_tile; t < total_tiles; t = next_tile(t)) {
      const TileCoord c = tile_at(t);
      // What the tile's epilogue will read besides the accumulators, into L2 under its mainloop.
      epi.prefetch(c, tid, Config::kGatherThreads);
      // Each copied row's source, advanced in place by one K block per stage, so that every
      // cp.async reads its own address registers: a temporary reused across the copies would
      // make each one wait for the previous copy to read it. Rows that are zero-filled (-1,
      // past the expert's end, a faulty index) read nothing: they walk A's first row, an address
      // in bounds in every full K block.
      const char* src[BM / 16];
      uint32_t live = 0;  // bit i: row row_in + 16 i is copied
#pragma unroll
      for (int i = 0; i < BM / 16; ++i) {
        const int r = row_in + 16 * i;
        int64_t row_off = 0;
        if (r < c.rows) {
          const int32_t s = p.src_row[c.row0 + r];
          if (s >= 0 && s < p.a_rows) {
            row_off = int64_t(s) * p.lda;
            live |= 1u << i;
          } else if (s != -1 && chunk == 0) {
            report_fault(p.status, kFaultBadIndex, p.op, c.g, s);
          }
        }
        src[i] = reinterpret_cast<const char*>(a + chunk * 8 + row_off);
      }
      const int64_t b_row0 = int64_t(c.g) * p.b_rows + int64_t(c.ct) * (BN / Config::kBHalves);
      for (int kb = 0; kb < kb_count; ++kb, ++cnt) {
        const int s = cnt % S;
        mbar_wait(&sm.empty[s], ((cnt / S) & 1) ^ 1);
        if (tid == 0) {
          mbar_arrive_expect_tx(&sm.full[s], Config::kStageBytesB);  // from every CTA's loads
          if constexpr (Config::kBMajorMN) {
            // box j: columns [64 j, 64 j + 64) of the tile, K rows [kb BK, + BK) of expert g
#pragma unroll
            for (int j = 0; j < BN / 64; ++j)
              tma_load_3d(sm.b(s) + j * (64 * BK * 2), tma_b, c.ct * BN + 64 * j, kb * BK, c.g,
                          &sm.full[s]);
          }
#pragma unroll
          for (int h = 0; h < (Config::kBMajorMN ? 0 : Config::kBHalves); ++h) {
            uint8_t* dst = sm.b(s) + h * (Config::kStageBytesB / Config::kBHalves);
            const int row = static_cast<int>(b_row0 + h * (p.b_rows / Config::kBHalves));
            if constexpr (Config::kCluster == 1)
              tma_load_2d(dst, tma_b, kb * BK, row, &sm.full[s]);
            else if (h % Config::kCluster == rank)
              detail::tma_load_2d_multicast(dst, tma_b, kb * BK, row, &sm.full[s],
                                            uint16_t((1u << Config::kCluster) - 1));
          }
        }
        // the 128-byte swizzle: 16-byte chunk c of row r lands at chunk c ^ (r % 8); r % 8 is
        // the same for every row of this thread (rows 16 apart)
        const uint32_t row_dst = smem_addr(sm.a(s)) + row_in * 128;
        uint32_t dst[kCw];
#pragma unroll
        for (int w = 0; w < kCw; ++w) dst[w] = row_dst + (((chunk + w) ^ (row_in % 8)) * 16);
        if (k_tail && kb == kb_count - 1) {
#pragma unroll
          for (int w = 0; w < kCw; ++w) {
            const bool in_k = int64_t(kb) * BK + (chunk + w) * 8 < p.K;
#pragma unroll
            for (int i = 0; i < BM / 16; ++i) {
              const bool valid = in_k && ((live >> i) & 1u) != 0;
              cp_async16(dst[w] + i * 16 * 128, valid ? src[i] + w * 16 : p.a, valid ? 16 : 0);
            }
          }
        } else {
#pragma unroll
          for (int i = 0; i < BM / 16; ++i) {
#pragma unroll
            for (int w = 0; w < kCw; ++w)
              cp_async16(dst[w] + i * 16 * 128, src[i] + w * 16, ((live >> i) & 1u) != 0 ? 16 : 0);
          }
#pragma unroll
          for (int i = 0; i < BM / 16; ++i) {
            src[i] += BK * sizeof(Element);
          }
        }
        detail::cp_async_arrive_noinc(&sm.full[s]);
      }
    }
  } else if (wg == 0) {
    // ---- producer, 4-bit B -------------------------------------------------------------------
    // Thread 0 copies A tiles (TMA, on the stage's full barrier) and runs a cursor of code copies
    // up to kRawSlots - 1 stages ahead of the conversion, across tiles, so that the codes of a
    // stage have landed long before it is converted. Every thread converts its part of each
    // stage (scales loaded one stage ahead), then arrives on the stage's full barrier.
    if constexpr (Config::kB4) {
      using B4 = W4BTile<Config>;
      constexpr int R = Config::kRawSlots;
      const int tid = threadIdx.x;
      if (tid == 0) {
        tma_prefetch_map(tma_a);
        tma_prefetch_map(tma_b);
      }
      // thread 0's cursor: the next stage whose codes are copied
      int32_t ft = first_tile;
      int fkb = 0, fcnt = 0;
      TileCoord fc{};
      if (tid == 0 && ft < total_tiles) fc = tile_at(ft);
      int cnt = 0;
      for (int32_t t = first_tile; t < total_tiles; t = next_tile(t)) {
        const TileCoord c = tile_at(t);
        const typename B4::Rows rows = B4::rows(p, c.g, c.ct, tid);
        typename B4::Scales sc = B4::load(p, rows, 0, tid);
        for (int kb = 0; kb < kb_count; ++kb, ++cnt) {
          const int s = cnt % S;
          if (tid == 0) {
            // stages < cnt are converted (producer_sync), so their slots are free: codes of
            // stages up to cnt + R - 1
            for (; fcnt < cnt + R && ft < total_tiles; ++fcnt) {
              uint64_t* rf = &sm.raw_full[fcnt % R];
              mbar_arrive_expect_tx(rf, Config::kRawSlotBytes);
              tma_load_3d(sm.raw_slots + (fcnt % R) * Config::kRawSlotBytes, tma_b, fkb * (BK / 2),
                          fc.ct * BN, fc.g, rf);
              if (++fkb == kb_count) {
                fkb = 0;
                ft = next_tile(ft);
                if (ft < total_tiles) fc = tile_at(ft);
              }
            }
          }
          mbar_wait(&sm.empty[s], ((cnt / S) & 1) ^ 1);
          if (tid == 0) {
            // rows [row0, row0 + 128) of A (past the expert's rows: the next expert's, whose
            // outputs are not stored; past A's rows and K: zeros)
            mbar_arrive_expect_tx(&sm.full[s], Config::kStageBytesA);
            tma_load_2d(sm.a(s), tma_a, kb * BK, static_cast<int>(c.row0), &sm.full[s]);
          }
          typename B4::Scales next{};
          if (kb + 1 < kb_count) next = B4::load(p, rows, kb + 1, tid);  // under the conversion
          mbar_wait(&sm.raw_full[cnt % R], (cnt / R) & 1);
          B4::convert(sm.raw_slots + (cnt % R) * Config::kRawSlotBytes, sm.b(s), sc, tid);
          detail::fence_proxy_async_smem();  // the tile's generic writes before the wgmma's reads
          detail::mbar_arrive(&sm.full[s]);
          detail::producer_sync();  // every thread is done with slot cnt % R
          sc = next;
        }
      }
    }
  } else {
    // ---- consumers -----------------------------------------------------------------------------
    cutlass::arch::warpgroup_reg_alloc<Config::kConsumerRegs>();
    const int cw = wg - 1;  // consumer 0 or 1
    const int ctid = threadIdx.x % 128;
    constexpr int WM = Config::kWarpgroupM;
    using SmemLayoutA = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{},
                                               make_shape(Int<WM>{}, Int<BK>{})));
    // N-major: 8-row atoms of 64 columns stacked along K first, so that each 64-column box of
    // the TMA (BK rows of 128 bytes) is one contiguous 128-byte-swizzled block
    using SmemLayoutB =
        std::conditional_t<Config::kBMajorMN,
                           decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<Element>{},
                                                  make_shape(Int<BN>{}, Int<BK>{}),
                                                  Step<_2, _1>{})),
                           decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{},
                                                  make_shape(Int<BN>{}, Int<BK>{})))>;
    constexpr GMMA::Major kMajorB = Config::kBMajorMN ? GMMA::Major::MN : GMMA::Major::K;
    using MmaOp = decltype(GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<BN>, _64>,
                                                GMMA::Major::K, kMajorB>());
    auto tiled_mma = make_tiled_mma(MmaOp{});
    auto thr_mma = tiled_mma.get_thread_slice(ctid);
    auto accum = partition_fragment_C(tiled_mma, make_shape(Int<WM>{}, Int<BN>{}));
    const auto coords = thr_mma.partition_C(make_identity_tensor(make_shape(Int<WM>{}, Int<BN>{})));
    // A cooperative consumer reads its 64 rows of the A tile: whole 8-row swizzle atoms of 1 KiB.
    const int a_off = Config::kCooperative ? cw * WM * BK * 2 : 0;
    const int row_off = Config::kCooperative ? cw * WM : 0;
    typename Epilogue::State state{};  // the epilogue's own, across this consumer's tiles
    int i = 0;                         // position of the tile in this CTA's sequence
    for (int32_t t = first_tile; t < total_tiles; t = next_tile(t), ++i) {
      if (!Config::kCooperative && (i & 1) != cw) continue;
      const TileCoord c = tile_at(t);
      int cnt = i * kb_count;
      // Ping-pong mainloops run in tile order: wait until the other consumer has issued the
      // previous tile's. Besides keeping the two MMA streams from competing, this bounds how far
      // ahead a consumer waits on a stage: every fill before this tile's has completed, so a
      // stage's barrier is at most one phase behind and its parity wait cannot alias an older
      // phase. (Cooperative consumers wait on every stage in order, so the bound holds anyway.)
      if (!Config::kCooperative) mbar_wait(&sm.turn[cw], ((i >> 1) & 1) ^ (cw == 0 ? 1 : 0));
      tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
      auto mma_stage = [&](int s) {
        auto sA =
            make_tensor(make_smem_ptr(reinterpret_cast<Element*>(sm.a(s) + a_off)), SmemLayoutA{});
        auto sB = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(sm.b(s))), SmemLayoutB{});
        auto tA = thr_mma.make_fragment_A(thr_mma.partition_A(sA));
        auto tB = thr_mma.make_fragment_B(thr_mma.partition_B(sB));
        warpgroup_fence_operand(accum);
        warpgroup_arrive();
        CUTE_UNROLL
        for (int k = 0; k < size<2>(tA); ++k) {
          cute::gemm(tiled_mma, tA(_, _, k), tB(_, _, k), accum);
          tiled_mma.accumulate_ = GMMA::ScaleOut::One;
        }
        warpgroup_commit_batch();
        warpgroup_fence_operand(accum);
      };
      // warp-uniform (see wg): a cluster's spare row tile issues no MMAs
      const bool has_rows = __shfl_sync(0xffffffffu, c.rows > 0 ? 1 : 0, 0) != 0;
      // A stage is free once its readers in every CTA it was multicast to are done.
      auto release = [&](int st) {
        detail::mbar_arrive(&sm.empty[st]);
        if constexpr (Config::kCluster > 1)
          for (int r = 1; r < Config::kCluster; ++r)
            detail::mbar_arrive_cluster(
                detail::peer_smem_addr(&sm.empty[st], uint32_t((rank + r) % Config::kCluster)));
      };
      int prev = -1;
      for (int kb = 0; kb < kb_count; ++kb, ++cnt) {
        const int s = cnt % S;
        mbar_wait(&sm.full[s], (cnt / S) & 1);
        detail::fence_proxy_async_smem();
        if (has_rows) mma_stage(s);  // a cluster's spare row tile keeps only the protocol
        warpgroup_wait<1>();         // the previous stage's MMAs are done: hand it back
        if (prev >= 0 && ctid == 0) release(prev);
        prev = s;
      }
      if (!Config::kCooperative && ctid == 0) detail::mbar_arrive(&sm.turn[cw ^ 1]);
      warpgroup_wait<0>();
      if (ctid == 0) release(prev);
      if constexpr (Config::kEpilogueWarps) {
        // Hand the tile to the epilogue warps: rounded to 16 bits, four 8-column groups
        // transposed across the quad (each lane then holds 8 consecutive columns: one 16-byte
        // store), into the tile buffer once the previous tile has been read from it.
        mbar_wait(sm.epi_empty, (i & 1) ^ 1);
        const int q = ctid % 4;
        CUTE_UNROLL
        for (int mi = 0; mi < size<1>(accum); ++mi) {
          CUTE_UNROLL
          for (int v1 = 0; v1 < 2; ++v1) {
            const int r = row_off + get<0>(coords(make_coord(0, v1, 0), mi, 0));
            CUTE_UNROLL
            for (int g0 = 0; g0 < BN / 8; g0 += 4) {
              uint32_t v[4];
              CUTE_UNROLL
              for (int j = 0; j < 4; ++j)
                v[j] = epi.pack(accum(make_coord(0, v1, g0 + j), mi, 0),
                                accum(make_coord(1, v1, g0 + j), mi, 0));
              quad_transpose(v, q);
              // this lane's 8 columns: group g0 + q
              store16(epi_tile_chunk<BN>(sm.epi, r, g0 + q), v);
            }
          }
        }
        detail::mbar_arrive(sm.epi_full);
      } else if (has_rows) {
        epi(accum, coords, c, row_off, state);
      }
    }
  }
  // No CTA leaves while its peer may still arrive on its barriers.
  if constexpr (Config::kCluster > 1) detail::cluster_sync();
#endif
}

// 16-bit B (tma_b over B); A gathered through src_row.
template <class Config, class Epilogue>
__global__ void __launch_bounds__(Config::kThreads, 1)
    gathered_gemm_kernel(const GatheredGemmParams p, const __grid_constant__ CUtensorMap tma_b,
                         const Epilogue epi) {
  static_assert(!Config::kB4, "4-bit B: gathered_gemm_w4_kernel");
  gathered_gemm_body<Config>(p, nullptr, &tma_b, epi);
}

// 4-bit B (Config::kB4; tma_b over the codes [G, N, K / 2] bytes, boxes of kTileK / 2 bytes by
// kTileN rows of one expert); A grouped by expert, read by TMA (tma_a over A [a_rows, K], boxes of
// kTileK by kTileM with the 128-byte swizzle).
template <class Config, class Epilogue>
__global__ void __launch_bounds__(Config::kThreads, 1)
    gathered_gemm_w4_kernel(const GatheredGemmParams p, const __grid_constant__ CUtensorMap tma_a,
                            const __grid_constant__ CUtensorMap tma_b, const Epilogue epi) {
  static_assert(Config::kB4, "16-bit B: gathered_gemm_kernel");
  gathered_gemm_body<Config>(p, &tma_a, &tma_b, epi);
}

}  // namespace groupmm::cuda::sm90
