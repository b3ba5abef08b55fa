// The chunked plans' two index primitives on CUDA (the CPU reference: src/ep/cpu/chunks.cpp;
// groupmm/ep.hpp, EpChunkedPlan): a chunk's ids, and one chunk's slots merged into the chunks'
// concatenated way back. Elementwise over T k slots; graph safe (no sync, no allocation).
#include <climits>

#include "ep/cuda/ep_common.cuh"

namespace groupmm::ep::cuda {
namespace {

template <class Id>
__global__ void __launch_bounds__(PlanLaunch::kThreads)
    chunk_ids_kernel(int32_t* out, const Id* ids, int64_t n, int64_t E, int64_t El, int64_t lo,
                     int64_t hi) {
  for (int64_t i = grid_stride_start(); i < n; i += grid_stride()) {
    const int64_t e = int64_t(ids[i]);
    if (e >= 0 && e < E) {
      const int64_t le = e % El;
      out[i] = le >= lo && le < hi ? int32_t(e - lo) : -1;
    } else {  // -1 stays; a bad id stays out of range for the plan to report
      out[i] = e >= INT32_MIN && e <= INT32_MAX ? int32_t(e) : INT32_MAX;
    }
  }
}

__global__ void __launch_bounds__(PlanLaunch::kThreads)
    merge_slots_kernel(int32_t* merged, const int32_t* part, int64_t n, int64_t base, bool first) {
  for (int64_t i = grid_stride_start(); i < n; i += grid_stride()) {
    const int32_t s = part[i];
    if (s >= 0)
      merged[i] = int32_t(base + s);
    else if (first)
      merged[i] = -1;
  }
}

}  // namespace

void ep_chunk_ids(Context& ctx, int32_t* out, const TensorView& ids, int64_t E, int64_t El,
                  int64_t lo, int64_t hi) {
  const int64_t n = ids.numel();
  if (n == 0) return;
  const unsigned grid = PlanLaunch::grid(ctx, n);
  if (ids.dtype == DType::int64)
    chunk_ids_kernel<<<grid, PlanLaunch::kThreads, 0, ctx.stream()>>>(out, ids.ptr<int64_t>(), n, E,
                                                                      El, lo, hi);
  else
    chunk_ids_kernel<<<grid, PlanLaunch::kThreads, 0, ctx.stream()>>>(out, ids.ptr<int32_t>(), n, E,
                                                                      El, lo, hi);
  GROUPMM_CHECK_LAUNCH();
}

void ep_merge_slots(Context& ctx, int32_t* merged, const int32_t* part, int64_t n, int64_t base,
                    bool first) {
  if (n == 0) return;
  merge_slots_kernel<<<PlanLaunch::grid(ctx, n), PlanLaunch::kThreads, 0, ctx.stream()>>>(
      merged, part, n, base, first);
  GROUPMM_CHECK_LAUNCH();
}

}  // namespace groupmm::ep::cuda
