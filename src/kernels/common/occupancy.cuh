// The grid of grid-stride kernels: capped at the CTAs resident at once (occupancy.cu).
#pragma once

#include <algorithm>
#include <cstdint>

#include "groupmm/core.hpp"

namespace groupmm::cuda {

// CTAs of a kernel resident at once per SM of the current device (block threads, dynamic shared
// memory), from the occupancy calculator, once per (kernel, device, threads, smem).
int resident_ctas_per_sm(const void* kernel, int threads, size_t smem);

// The grid of a grid-stride kernel: `want` CTAs, at most max_per_sm per SM and never more than
// are resident at once. A cap above residency is a trap: the CTAs that do not fit wait for a
// second wave that then runs at low occupancy (bench/RESULTS.md, "SwiGLU grids capped at
// residency").
template <class... KArgs>
unsigned resident_grid(const Context& ctx, void (*kernel)(KArgs...), int threads, int64_t want,
                       int max_per_sm, size_t smem = 0) {
  const int fit = resident_ctas_per_sm(reinterpret_cast<const void*>(kernel), threads, smem);
  const int64_t per_sm = std::max(1, std::min(max_per_sm, fit));
  const int64_t cap = int64_t(std::max(ctx.sm_count(), 1)) * per_sm;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(want, cap)));
}

}  // namespace groupmm::cuda
