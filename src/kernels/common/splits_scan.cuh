// The splits rule of offsets.hpp ("The splits rule") on the device, for every op that takes
// device splits: one CTA turns the G per-expert row counts into clamped row ranges plus any
// per-expert prefix sums the op derives from them, and reports faults. group_offsets, the
// quantize plan (quantize, dequantize, swizzle, dbias) and the grouped GEMM setup kernels are
// built on it. No host ever reads the splits (graph safe).
#pragma once

#include <cstdint>

#include <cub/block/block_scan.cuh>

#include "kernels/common/status.cuh"

namespace groupmm::cuda {

// Row bound of an op without a row buffer (group_offsets): nothing is clamped.
constexpr int64_t kNoRowBound = INT64_MAX;

// Split g as int64 from an int32 or int64 array.
__device__ __forceinline__ int64_t load_split(const void* splits, bool is64, int64_t g) {
  return is64 ? static_cast<const int64_t*>(splits)[g]
              : static_cast<int64_t>(static_cast<const int32_t*>(splits)[g]);
}

struct SplitsScanArgs {
  const void* splits = nullptr;  // [G] int32 / int64 (device); null: every expert uniform_rows
  bool splits64 = false;
  int64_t G = 0;
  int64_t uniform_rows = 0;
  int64_t row_bound = kNoRowBound;  // the rows that exist (M): ranges are clamped to them
  int64_t expected_total = -1;      // the sum the splits must have (-1: not checked)
  bool total_at_most = false;     // only a sum past expected_total is a fault (a short one is not)
  StatusBlock* status = nullptr;  // faults are reported here against `op`
  OpId op = OpId::none;
};

// N per-expert counts added element-wise (Counts<0> is empty).
template <int N>
struct Counts {
  int64_t v[N];
  __device__ __forceinline__ Counts operator+(const Counts& o) const {
    Counts r;
#pragma unroll
    for (int i = 0; i < N; ++i) r.v[i] = v[i] + o.v[i];
    return r;
  }
};
template <>
struct Counts<0> {
  __device__ __forceinline__ Counts operator+(const Counts&) const { return {}; }
};

// What the scan hands the thread that owns expert g.
template <int kDerived>
struct ExpertSpan {
  int64_t g;
  int64_t start, rows;      // the clamped range: rows [start, start + rows) of the buffer
  Counts<kDerived> before;  // sum over the experts j < g of derive(rows_j)
};
template <int kDerived>
struct SplitsTotals {
  int64_t rows;              // sum of the splits (negative ones as 0), not clamped
  Counts<kDerived> derived;  // sum over all experts of derive(rows_g)
};

namespace splits_detail {
template <int kDerived>
struct Item {
  int64_t rows;
  Counts<kDerived> derived;
};
struct ItemSum {
  template <class T>
  __device__ __forceinline__ T operator()(const T& a, const T& b) const {
    return {a.rows + b.rows, a.derived + b.derived};
  }
};
}  // namespace splits_detail

// The rule, per expert g (m_g = its split, or 0 when negative: kFaultNegativeSplit):
//   start_g = min(sum_{j<g} m_j, row_bound),  rows_g = min(m_g, row_bound - start_g)
// (an expert cut short: kFaultSplitsOverflow, reported by that expert), and a sum of the m_g
// other than expected_total (above it, with total_at_most): kFaultSplitsTotalMismatch. derive(rows)
// -> Counts<kDerived> gives the per-expert counts to prefix-sum (tiles, column blocks, padded rows,
// ...) from the clamped rows. visit(ExpertSpan) runs once per expert, in the thread that owns it;
// every thread of the CTA must call scan_splits. Returns the totals (in every thread).
//
// One chunk of kThreads experts at a time, running sums carried between chunks. A chunk whose
// running sum stays within row_bound (always, for valid splits) is finished by one scan of the
// unclamped counts; a chunk that crosses it takes a second scan of the clamped ones.
template <int kThreads, int kDerived, class Derive, class Visit>
__device__ __forceinline__ SplitsTotals<kDerived> scan_splits(const SplitsScanArgs& a,
                                                              Derive derive, Visit visit) {
  using Item = splits_detail::Item<kDerived>;
  using Scan = cub::BlockScan<Item, kThreads, cub::BLOCK_SCAN_WARP_SCANS>;
  __shared__ typename Scan::TempStorage scratch;
  __shared__ Item carry;  // the sums over the chunks before this one
  if (threadIdx.x == 0) carry = Item{0, Counts<kDerived>{}};
  __syncthreads();
  const Item zero{0, Counts<kDerived>{}};
  for (int64_t base = 0; base < a.G; base += kThreads) {
    const int64_t g = base + threadIdx.x;
    int64_t m = 0;
    if (g < a.G) {
      m = a.splits == nullptr ? a.uniform_rows : load_split(a.splits, a.splits64, g);
      if (m < 0) {
        report_fault(a.status, kFaultNegativeSplit, a.op, static_cast<int32_t>(g), m);
        m = 0;
      }
    }
    const Item before_chunk = carry;
    Item before, chunk;
    Scan(scratch).ExclusiveScan(Item{m, derive(m)}, before, zero, splits_detail::ItemSum{}, chunk);
    int64_t start = before_chunk.rows + before.rows, rows = m;
    if (before_chunk.rows + chunk.rows > a.row_bound) {  // CTA-uniform: a fault in this chunk
      start = min(start, a.row_bound);
      if (g < a.G && rows > a.row_bound - start) {
        report_fault(a.status, kFaultSplitsOverflow, a.op, static_cast<int32_t>(g), m);
        rows = a.row_bound - start;
      }
      __syncthreads();  // the scratch is reused
      Item clamped_before, clamped_chunk;
      Scan(scratch).ExclusiveScan(Item{0, derive(rows)}, clamped_before, zero,
                                  splits_detail::ItemSum{}, clamped_chunk);
      before.derived = clamped_before.derived;
      chunk.derived = clamped_chunk.derived;  // chunk.rows stays the unclamped sum
    }
    if (g < a.G) visit(ExpertSpan<kDerived>{g, start, rows, before_chunk.derived + before.derived});
    __syncthreads();  // every thread has read carry and the scratch
    if (threadIdx.x == 0) carry = splits_detail::ItemSum{}(before_chunk, chunk);
    __syncthreads();
  }
  const Item total = carry;
  const bool bad_total =
      a.total_at_most ? total.rows > a.expected_total : total.rows != a.expected_total;
  if (threadIdx.x == 0 && a.expected_total >= 0 && bad_total)
    report_fault(a.status, kFaultSplitsTotalMismatch, a.op, -1, total.rows);
  return {total.rows, total.derived};
}

// The expert whose half-open range [prefix[g], prefix[g + 1]) holds t, for t < prefix[G]
// (prefix: a non-decreasing array of G + 1 prefix sums). Empty experts are skipped: the last g
// with prefix[g] <= t is taken.
__device__ __forceinline__ int64_t find_expert(const int64_t* prefix, int64_t G, int64_t t) {
  int64_t lo = 0, hi = G - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) >> 1;
    if (prefix[mid] <= t) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

}  // namespace groupmm::cuda
