// CUDA group_offsets: the common splits scan (one CTA, any G, graph safe) with no row bound, and
// the padded scale rows as its one derived count.
#include <climits>

#include "offsets/backends.hpp"
#include "kernels/common/launch.cuh"
#include "kernels/common/splits_scan.cuh"

namespace groupmm::cuda {
namespace {

using OffsetsConfig = BlockConfig<512>;

// A destination array of int32 or int64 (null = not requested).
struct IndexOut {
  void* p = nullptr;
  bool is64 = true;
};

struct OffsetsParams {
  SplitsScanArgs splits;
  IndexOut start, end, scale_row_start, total;
  int64_t* element_start;
  int num_strides;
  int64_t row_strides[4];
  int64_t pad_rows;
};

// An int32 destination that cannot hold v gets INT32_MAX and kFaultSplitsOverflow.
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
  StatusBlock* const st = p.splits.status;
  auto padded = [&](int64_t rows) {
    return Counts<1>{{(rows + p.pad_rows - 1) / p.pad_rows * p.pad_rows}};
  };
  const SplitsTotals<1> total =
      scan_splits<Cfg::kThreads, 1>(p.splits, padded, [&](const ExpertSpan<1>& e) {
        store(p.start, e.g, e.start, st, e.g);
        store(p.end, e.g, e.start + e.rows, st, e.g);
        store(p.scale_row_start, e.g, e.before.v[0], st, e.g);
        for (int s = 0; s < p.num_strides; ++s)
          p.element_start[s * p.splits.G + e.g] = e.start * p.row_strides[s];
      });
  if (threadIdx.x == 0) store(p.total, 0, total.rows, st, p.splits.G - 1);
}

IndexOut out_of(const TensorView& v) {
  return v.present() ? IndexOut{v.data, v.dtype == DType::int64} : IndexOut{};
}

}  // namespace

void group_offsets(Context& ctx, const OffsetsArgs& a) {
  OffsetsParams p{};
  p.splits.splits = a.splits.data;
  p.splits.splits64 = a.splits.dtype == DType::int64;
  p.splits.G = a.splits.dim(0);
  p.splits.row_bound = kNoRowBound;
  p.splits.expected_total = a.expected_total;
  p.splits.status = ctx.status();
  p.splits.op = OpId::group_offsets;
  p.start = out_of(a.start);
  p.end = out_of(a.end);
  p.scale_row_start = out_of(a.scale_row_start);
  p.total = out_of(a.total);
  p.element_start = a.element_start.present() ? a.element_start.ptr<int64_t>() : nullptr;
  p.num_strides = a.element_start.present() ? static_cast<int>(a.element_start.dim(0)) : 0;
  for (int s = 0; s < 4; ++s) p.row_strides[s] = a.row_strides[static_cast<size_t>(s)];
  p.pad_rows = a.pad_rows;
  group_offsets_kernel<OffsetsConfig><<<1, OffsetsConfig::kThreads, 0, ctx.stream()>>>(p);
  GROUPMM_CHECK_LAUNCH();
}

}  // namespace groupmm::cuda
