// The tile kernel's item schedule: which 128x128 tile each CTA runs next. Thread 0 of each CTA
// runs it; its state and its results (ItemInfo) live in shared memory.
//
// Static schedule (TileSchedule::tiles): items in row-major order (row tile, column tile), dealt
// out dynamically: CTA b's first kStages items are b, b + grid, ..., the later ones come from an
// atomic ticket counter, each taken after an item's barrier for the item kStages later (so a CTA
// claims work only kStages items ahead of the one it runs). Fixed contiguous ranges per CTA were
// unbalanced although every CTA had the same item count: CTAs run at different speeds, and the
// slowest set the time.
//
// Fused schedule (fp8_current / nvfp4): each expert's amax is made in the same kernel. Every tile
// is an amax item and later a quantize item, handed out by one atomic ticket counter in blocks:
// block k (k = 0 .. G - 1 + lag) = the amax items of expert k merged with the quantize items of
// expert k - lag (the first `grid` amax items first, the rest spread evenly). So an expert is
// quantized while the experts `lag` ahead of it are read, and its tiles are re-read from L2 about
// `lag` experts' worth of traffic after their amax read (the host picks the lag). Each amax item
// stores its maximum into its own slot (tile_amax.cuh); a CTA's first quantize item of an expert
// reduces the expert's slots, waiting for any still empty. Forward progress needs no
// co-residency: a quantize item waits only for amax items with smaller tickets, and the smallest
// unfinished ticket always belongs to a running CTA that can finish it. Block k starts at ticket
// S(k) + S(k - lag), S(k) = tile_start[k] * col_tiles (the items before expert k; 0 for k < 0,
// all for k > G).
//
// The arithmetic is 32-bit (tickets < 2 * items < 2^31: host check) and avoids 64-bit and
// double-division chains: it is on thread 0's path before every item's barrier.
#pragma once

#include "kernels/common/launch.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/splits_scan.cuh"
#include "quantize/cuda/tile_config.cuh"

namespace groupmm::cuda::tile {

enum : int32_t { kItemNone = 0, kItemQuant = 1, kItemAmax = 2 };
enum : int32_t { kPadRow = 1, kPadCol = 2 };  // ItemInfo::flags

struct ItemInfo {       // one 128x128 work item, CTA-uniform
  const uint8_t* src;   // input element (row0, col0) of the tile; gathered: (row 0, col0)
  const int32_t* rows;  // gathered: the row map's entry of the tile's row 0
  int64_t gi;           // expert
  int64_t t;            // global row tile (dbias partial row)
  int32_t lt, ct;       // expert-local row tile, column tile
  int32_t vr, vc;       // valid rows, valid columns
  int32_t kind;
  int32_t flags;         // kPadRow / kPadCol: the tile writes swizzle padding (rare)
  int64_t slot0, slot1;  // fused quantize item: the expert's amax slots [slot0, slot1)
  uint32_t amax;         // fused quantize item with ready set: the expert's amax (canonical bits)
  int32_t ready;         // early reduction: set by the last warp before the item runs
};

// The current item's coordinates, read once from its ItemInfo.
struct TileCoords {
  int64_t t;     // global row tile
  int ct;        // column tile
  int64_t lt;    // expert-local row tile
  int64_t row0;  // expert-local first row
  int valid_rows;
  int64_t col0;  // first column
  int valid_cols;
};

struct SchedState {
  int64_t gi;  // static: expert of the last item (tickets only grow); fused: block cursor
  // The plan the scheduler reads: its arrays point at the shared-memory copy when G <=
  // kPlanCacheG (in the order of plan_array).
  QuantPlan plan;
};
// The plan's five arrays by index (the order of the shared-memory copy).
__device__ __forceinline__ int64_t*& plan_array(QuantPlan& q, int a) {
  return a == 0   ? q.tile_start
         : a == 1 ? q.start
         : a == 2 ? q.rows
         : a == 3 ? q.cb_start
                  : q.cs4_start;
}

// S(k): the items before expert k.
__device__ __forceinline__ uint32_t items_before(const TileParams& p, const SchedState& s,
                                                 int64_t k) {
  if (k <= 0) return 0u;
  return static_cast<uint32_t>(s.plan.tile_start[k < p.plan.G ? k : p.plan.G]) *
         static_cast<uint32_t>(p.col_tiles);
}

// floor(a * b / c) for c > 0, a, b < 2^31: one double division (the quotient to within one;
// n < 2^62 need not be exact in a double), then an exact fix-up.
__device__ __forceinline__ uint32_t muldiv(uint32_t a, uint32_t b, uint32_t c) {
  const uint64_t n = uint64_t(a) * b;
  uint32_t q = static_cast<uint32_t>(static_cast<double>(n) / static_cast<double>(c));
  if (uint64_t(q) * c > n) {
    --q;
  } else if (uint64_t(q + 1) * c <= n) {
    ++q;
  }
  return q;
}

// floor(n / col_tiles) for any 32-bit n: one double product with TileParams::rcp_col_tiles, the
// reciprocal rounded up (an integer division is ~20 dependent instructions). Exact: with d =
// col_tiles <= 65535 (host check) and r in [1/d, (1 + 2^-51) / d], n * r rounds to at least
// n / d (to exactly q when n / d = q), and when n / d = q + f with 0 < f <= 1 - 1/d to at most
// q + 1 - 2^-16 + 2^-19 + 2^-21 < q + 1 (n / d * 2^-51 < 2^-19, a rounding step < 2^-21).
__device__ __forceinline__ uint32_t div_col_tiles(const TileParams& p, uint32_t n) {
  return static_cast<uint32_t>(static_cast<double>(n) * p.rcp_col_tiles);
}

template <class E>
__device__ void make_item(const TileParams& p, const SchedState& s, int32_t kind, int64_t gi,
                          int64_t t, int ct, ItemInfo& it) {
  const int64_t start = s.plan.start[gi], rows = s.plan.rows[gi], ts = s.plan.tile_start[gi];
  const int64_t row0 = (t - ts) * qnum::kTileRows, col0 = int64_t(ct) * TileConfig::kCols;
  const int64_t first = p.row_map != nullptr ? 0 : start + row0;
  it.src = reinterpret_cast<const uint8_t*>(static_cast<const typename E::Storage*>(p.x) +
                                            first * p.K + col0);
  it.rows = p.row_map != nullptr ? p.row_map + start + row0 : nullptr;
  it.gi = gi;
  it.t = t;
  it.lt = static_cast<int32_t>(t - ts);
  it.ct = ct;
  it.vr = static_cast<int32_t>(min(int64_t(qnum::kTileRows), rows - row0));
  it.vc = static_cast<int32_t>(min(int64_t(TileConfig::kCols), p.K - col0));
  it.kind = kind;
  // Swizzled scales: does this tile write part of its expert's zero padding? Rowwise: rows past
  // the expert (a partial tile) or columns past K / B (the last column tile when Kp > K / B).
  // Columnwise: rows k past K (the last column tile when roundup(K, 128) > K) or block columns past
  // nb (the expert's last row tile when nb % 4 != 0). Decided here once per item rather than by
  // every thread.
  it.flags = 0;
  it.ready = 0;
  if (p.L.swizzled) {
    const bool last_ct = ct == p.col_tiles - 1;
    if (it.vr < TileConfig::kRows || (last_ct && p.L.row_kp > p.L.row_ncols)) it.flags |= kPadRow;
    const int64_t nb = qnum::col_blocks(p.L, rows);
    if ((last_ct && p.L.col_k128 > p.K) || (row0 + TileConfig::kRows >= rows && (nb & 3) != 0))
      it.flags |= kPadCol;
  }
}

// The next item of this CTA for `ticket` (static: the item index; fused: the ticket).
template <class E, bool kFused>
__device__ void schedule_item(const TileParams& p, SchedState& s, uint32_t ticket, ItemInfo& it) {
  const uint32_t ncol = static_cast<uint32_t>(p.col_tiles);
  if constexpr (!kFused) {
    // item count < 2^30 (host check): 32-bit arithmetic
    if (int64_t(ticket) >= s.plan.tile_start[p.plan.G] * p.col_tiles) {
      it.kind = kItemNone;
      return;
    }
    const uint32_t t = div_col_tiles(p, ticket);
    if (t >= s.plan.tile_start[s.gi + 1]) s.gi = find_expert(s.plan.tile_start, p.plan.G, t);
    make_item<E>(p, s, kItemQuant, s.gi, t, static_cast<int>(ticket - t * ncol), it);
  } else {
    const int64_t G = p.plan.G, lag = p.lag;
    if (ticket >= 2u * items_before(p, s, G)) {
      it.kind = kItemNone;
      return;
    }
    // Block k of tickets [B(k), B(k + 1)), B(k) = S(k) + S(k - lag).
    int64_t k = s.gi;
    while (k < G + lag - 1 && ticket >= items_before(p, s, k + 1) + items_before(p, s, k + 1 - lag))
      ++k;
    s.gi = k;
    const uint32_t sa0 = items_before(p, s, k), sa1 = items_before(p, s, k + 1);
    const uint32_t sq0 = items_before(p, s, k - lag), sq1 = items_before(p, s, k + 1 - lag);
    const uint32_t j = ticket - (sa0 + sq0), na = sa1 - sa0, nq = sq1 - sq0;
    const uint32_t first_amax = min(na, gridDim.x);
    bool amax_item = j < first_amax;
    uint32_t idx = j;
    if (!amax_item) {
      const uint32_t jj = j - first_amax, r = na - first_amax, tot = r + nq;
      const uint32_t before = muldiv(jj, r, tot);
      amax_item =
          uint64_t(jj + 1) * r >= uint64_t(before + 1) * tot;  // muldiv(jj + 1, ..) > before
      // Quantize items walk the expert backwards: the tiles read last by its amax items (most
      // likely still in L2) are quantized first.
      idx = amax_item ? first_amax + before : nq - 1 - (jj - before);
    }
    const int64_t e = amax_item ? k : k - lag;
    const uint32_t row_tile = div_col_tiles(p, idx);
    make_item<E>(p, s, amax_item ? kItemAmax : kItemQuant, e, s.plan.tile_start[e] + row_tile,
                 static_cast<int>(idx - row_tile * ncol), it);
    it.slot0 = amax_item ? sa0 : sq0;
    it.slot1 = amax_item ? sa1 : sq1;
  }
}

// Before pdl_wait: this CTA's first items, guessed, into L2. The plan is not readable yet, but
// the first items are b + q * grid (static; fused: the first tickets are expert 0's amax items in
// the same order), and row tile t lies at row 128 t of the input when the experts are multiples
// of 128 rows (else a little earlier: a partial guess). So the first loads after the wait find
// their lines in L2. Only x is touched, and only in L2, the point of coherence: a line fetched
// before the kernel that writes x finishes takes its writes.
template <class E>
__device__ __forceinline__ void prefetch_first_items(const TileParams& p) {
  const int q = static_cast<int>(threadIdx.x) / TileConfig::kRows;
  const int r = static_cast<int>(threadIdx.x) % TileConfig::kRows;
  if (q < TileConfig::kStages && (reinterpret_cast<uintptr_t>(p.x) & 15) == 0) {
    const int64_t item = blockIdx.x + int64_t(q) * gridDim.x;
    const int64_t t = div_col_tiles(p, static_cast<uint32_t>(item)), ct = item - t * p.col_tiles;
    const int64_t row = t * TileConfig::kRows + r;
    if (row < p.M) {
      const int64_t col0 = ct * TileConfig::kCols;
      const int64_t n = min(int64_t(TileConfig::kCols), p.K - col0);
      prefetch_l2(static_cast<const typename E::Storage*>(p.x) + row * p.K + col0,
                  static_cast<uint32_t>(n * sizeof(typename E::Storage)));
    }
  }
}

}  // namespace groupmm::cuda::tile
