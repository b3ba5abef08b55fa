// CUDA group_offsets: one block scans all G splits in tiles of kThreads * kItems, carrying the
// running prefix between tiles, so any G works in a single launch (graph safe, no host reads).
#include <climits>

#include <cub/block/block_scan.cuh>

#include "core/offsets_impl.hpp"
#include "cuda/status.cuh"

namespace groupmm::cuda {
namespace {

struct OffsetsConfig {
  static constexpr int kThreads = 512;
  static constexpr int kItems = 4;
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "block size");
};

// A destination array of int32 or int64 (null = not requested).
struct IndexOut {
  void* p = nullptr;
  bool is64 = true;
};

struct OffsetsParams {
  const void* splits;
  bool splits64;
  int64_t G;
  int64_t expected_total;
  IndexOut start, end, scale_row_start, total;
  int64_t* element_start;
  int num_strides;
  int64_t row_strides[4];
  int64_t pad_rows;
  StatusBlock* status;
};

__device__ __forceinline__ void store(IndexOut o, int64_t i, int64_t v, StatusBlock* st,
                                      int64_t g) {
  if (o.p == nullptr) return;
  if (o.is64) {
    static_cast<int64_t*>(o.p)[i] = v;
    return;
  }
  if (v > INT32_MAX) {
    report_fault(st, kFaultSplitsOverflow, OpId::group_offsets, static_cast<int32_t>(g), v);
    v = INT32_MAX;
  }
  static_cast<int32_t*>(o.p)[i] = static_cast<int32_t>(v);
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) group_offsets_kernel(OffsetsParams p) {
  // Two scans (rows and padded scale rows) share one pair of int64 values per item.
  struct Pair {
    int64_t rows, padded;
  };
  struct PairSum {
    __device__ Pair operator()(const Pair& a, const Pair& b) const {
      return {a.rows + b.rows, a.padded + b.padded};
    }
  };
  using Scan = cub::BlockScan<Pair, Cfg::kThreads>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ Pair carry;
  if (threadIdx.x == 0) carry = {0, 0};
  __syncthreads();

  constexpr int64_t kTile = int64_t(Cfg::kThreads) * Cfg::kItems;
  for (int64_t base = 0; base < p.G; base += kTile) {
    Pair items[Cfg::kItems];
    int64_t gidx[Cfg::kItems];
#pragma unroll
    for (int i = 0; i < Cfg::kItems; ++i) {
      const int64_t g = base + int64_t(threadIdx.x) * Cfg::kItems + i;  // blocked arrangement
      gidx[i] = g;
      int64_t m = 0;
      if (g < p.G) {
        m = load_split(p.splits, p.splits64, g);
        if (m < 0) {
          report_fault(p.status, kFaultNegativeSplit, OpId::group_offsets, static_cast<int32_t>(g),
                       m);
          m = 0;
        }
      }
      items[i] = {m, (m + p.pad_rows - 1) / p.pad_rows * p.pad_rows};
    }
    Pair incl[Cfg::kItems];
    Pair tile_total;
    Scan(tmp).InclusiveScan(items, incl, PairSum{}, tile_total);
    const Pair c = carry;
#pragma unroll
    for (int i = 0; i < Cfg::kItems; ++i) {
      const int64_t g = gidx[i];
      if (g >= p.G) continue;
      const int64_t end = c.rows + incl[i].rows;
      const int64_t start = end - items[i].rows;
      const int64_t pstart = c.padded + incl[i].padded - items[i].padded;
      store(p.start, g, start, p.status, g);
      store(p.end, g, end, p.status, g);
      store(p.scale_row_start, g, pstart, p.status, g);
      for (int s = 0; s < p.num_strides; ++s)
        p.element_start[s * p.G + g] = start * p.row_strides[s];
    }
    __syncthreads();  // everyone has read carry and tmp
    if (threadIdx.x == 0) carry = {c.rows + tile_total.rows, c.padded + tile_total.padded};
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    store(p.total, 0, carry.rows, p.status, p.G - 1);
    if (p.expected_total >= 0 && carry.rows != p.expected_total)
      report_fault(p.status, kFaultSplitsTotalMismatch, OpId::group_offsets, -1, carry.rows);
  }
}

IndexOut out_of(const TensorView& v) {
  return v.present() ? IndexOut{v.data, v.dtype == DType::int64} : IndexOut{};
}

}  // namespace

void group_offsets(Context& ctx, const OffsetsArgs& a) {
  OffsetsParams p{};
  p.splits = a.splits.data;
  p.splits64 = a.splits.dtype == DType::int64;
  p.G = a.splits.dim(0);
  p.expected_total = a.expected_total;
  p.start = out_of(a.start);
  p.end = out_of(a.end);
  p.scale_row_start = out_of(a.scale_row_start);
  p.total = out_of(a.total);
  p.element_start = a.element_start.present() ? a.element_start.ptr<int64_t>() : nullptr;
  p.num_strides = a.element_start.present() ? static_cast<int>(a.element_start.dim(0)) : 0;
  for (int s = 0; s < 4; ++s) p.row_strides[s] = a.row_strides[static_cast<size_t>(s)];
  p.pad_rows = a.pad_rows;
  p.status = ctx.status();
  group_offsets_kernel<OffsetsConfig><<<1, OffsetsConfig::kThreads, 0, ctx.stream()>>>(p);
  GROUPMM_CHECK_LAUNCH();
}

}  // namespace groupmm::cuda
