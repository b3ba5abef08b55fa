// Device pieces shared by the expert-parallel kernels (src/ep/cuda/): the row geometry of the
// memory-bound movers (short rows share a CTA, long rows loop) and the element traits.
#pragma once

#include <algorithm>
#include <cstdint>

#include "ep/backends.hpp"
#include "numerics/quantize_layout.hpp"  // qnum::ceil_div
#include "kernels/common/element.cuh"
#include "kernels/common/occupancy.cuh"
#include "kernels/common/status.cuh"

namespace groupmm::ep::cuda {

using groupmm::cuda::Bf16;
using groupmm::cuda::dispatch_element;
using groupmm::cuda::ElementVec;
using groupmm::cuda::Fp16;
using groupmm::cuda::Fp32;
using groupmm::cuda::report_fault;

constexpr unsigned kFullMask = 0xFFFFFFFFu;

struct MoverConfig {
  static constexpr int kThreads = 256;
  static constexpr int kCtasPerSm = 8;  // grid cap (and residency); the kernels loop over the rest
  // Rows a CTA moves at once, at least: a row's copy waits on its dependent index loads (the
  // grouped row's entry, then its source row), so the rows in flight per SM bound the bandwidth;
  // long rows are moved by threads_per_row = kThreads / kMinRowsPerCta threads looping over them.
  static constexpr int kMinRowsPerCta = 4;
  static_assert(kThreads % 32 == 0, "whole warps");
  static_assert(kThreads % kMinRowsPerCta == 0 && kThreads / kMinRowsPerCta >= 32,
                "whole warps a row");
};

// n rows of `vecs` vectors: rows_per_cta rows of threads_per_row threads per CTA, a grid-stride
// loop over the rows.
struct RowGeometry {
  int64_t rows = 0, vecs = 0;
  int rows_per_cta = 1, threads_per_row = MoverConfig::kThreads;
  unsigned grid = 0;  // 0: nothing to launch

  RowGeometry(const Context& ctx, int64_t n, int64_t v) : rows(n), vecs(v) {
    rows_per_cta = int(std::max<int64_t>(MoverConfig::kMinRowsPerCta,
                                         MoverConfig::kThreads / std::max<int64_t>(v, 1)));
    threads_per_row = MoverConfig::kThreads / rows_per_cta;
    const int64_t cap = int64_t(std::max(ctx.sm_count(), 1)) * MoverConfig::kCtasPerSm;
    grid = n > 0 ? unsigned(std::min(qnum::ceil_div(n, int64_t(rows_per_cta)), cap)) : 0u;
  }
  // Caps the grid at the CTAs of `kernel` resident at once (occupancy.cuh: 8 CTAs of 256 threads
  // per SM fit only kernels of at most 32 registers; the rest would run as a second wave at low
  // occupancy). Host only, before the launch.
  template <class... KArgs>
  void fit(const Context& ctx, void (*kernel)(KArgs...)) {
    if (grid > 0)
      grid = groupmm::cuda::resident_grid(ctx, kernel, MoverConfig::kThreads, grid,
                                          MoverConfig::kCtasPerSm);
  }
  // Calls f(row, lane) for this thread's rows (lane: its place within the row, 0 ..
  // threads_per_row - 1); the spare threads of a CTA do nothing.
  template <class F>
  __device__ void for_each_row(F&& f) const {
    const int slot = int(threadIdx.x) / threads_per_row;
    if (slot >= rows_per_cta) return;
    const int lane = int(threadIdx.x) % threads_per_row;
    const int64_t stride = int64_t(gridDim.x) * rows_per_cta;
    for (int64_t r = int64_t(blockIdx.x) * rows_per_cta + slot; r < rows; r += stride) f(r, lane);
  }
};

// The plan kernels (capacity and throughput): kThreads a CTA, grid-stride loops over a grid of at
// most kCtasPerSm CTAs a SM.
struct PlanLaunch {
  static constexpr int kThreads = 256;
  static_assert(kThreads % 32 == 0, "whole warps");
  static unsigned grid(const Context& ctx, int64_t n) {
    const int64_t cap = int64_t(std::max(ctx.sm_count(), 1)) * MoverConfig::kCtasPerSm;
    return unsigned(std::max<int64_t>(1, std::min(qnum::ceil_div(n, int64_t(kThreads)), cap)));
  }
};
__device__ inline int64_t grid_stride_start() {
  return int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline int64_t grid_stride() {
  return int64_t(gridDim.x) * blockDim.x;
}

inline bool aligned_to(const void* p, size_t n) {
  return reinterpret_cast<uintptr_t>(p) % n == 0;
}
// The receive rows can be read as vectors of v bytes: both places and both strides aligned to v.
inline bool recv_rows_aligned(const RecvRows& src, size_t v) {
  const auto vv = int64_t(v);
  return src.stride % vv == 0 && aligned_to(src.staged, v) &&
         (src.own_n == 0 || (src.own_stride % vv == 0 && aligned_to(src.own_src, v)));
}

// Elements of type E per 16-byte vector.
template <class E>
constexpr int kVec16 = 16 / int(sizeof(typename E::Storage));

}  // namespace groupmm::ep::cuda
