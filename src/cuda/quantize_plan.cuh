// The per-expert plan of the quantize family on the device: clamped row ranges and the tile /
// column-block / swizzle offsets of quantize.hpp "Layouts", built by one small kernel so that no
// host ever reads splits (graph safe). Arrays of G+1 int64 (entry G holds the total).
#pragma once

#include <utility>

#include "core/quantize_numerics.hpp"
#include "groupmm/core.hpp"

namespace groupmm::cuda {

// fp8_current's fused amax slots hold a tile maximum or this (above every canonical amax bits:
// NaN is 0x7FC00000); the plan kernel empties them.
constexpr uint32_t kSlotEmpty = 0xFFFFFFFFu;

struct QuantPlan {
  int64_t* start;       // clamped start row
  int64_t* rows;        // clamped rows
  int64_t* tile_start;  // prefix of ceil(rows/128)
  int64_t* cb_start;    // prefix of ceil(rows/cb)
  int64_t* cs4_start;   // prefix of roundup(ceil(rows/cb), 4)
  uint32_t* ticket;     // the tile kernel's next work ticket (zeroed by the plan)
  int64_t G;

  __device__ __forceinline__ qnum::Geom geom(int64_t g) const {
    return {start[g], rows[g], tile_start[g], cb_start[g], cs4_start[g]};
  }
};

// Carves the plan out of `ws` (plan_bytes(G) bytes).
QuantPlan plan_view(void* ws, int64_t G);

// Builds the plan. splits absent: G experts of rows_total / G rows (weights). Zeroes amax_bits[G]
// when given, and the tile kernel's ticket; sets the fused amax slots (tile_bound(rows_total, G)
// x col_tiles, the workspace's amax_slot_bytes) to 0xFFFFFFFF when given. Faults are reported
// against `op`. The plan kernel triggers programmatic dependent launch at its start: a kernel
// launched after it with launch_pdl (below) must execute pdl_wait() before it reads anything the
// plan wrote.
void launch_quant_plan(Context& ctx, const QuantPlan& plan, const TensorView& splits,
                       int64_t rows_total, int col_block, uint32_t* amax_bits, OpId op,
                       uint32_t* slots = nullptr, int64_t col_tiles = 0);

// Programmatic dependent launch: the kernel may start while the kernel before it in the stream
// finishes (its launch latency and prologue overlap that kernel's tail), and waits for it (and
// for its memory) in pdl_wait(). Stream capture records it as a programmatic graph edge.
template <class... KArgs, class... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  GROUPMM_CHECK_CUDA(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}
__device__ __forceinline__ void pdl_wait() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// The expert whose half-open range [prefix[g], prefix[g+1]) holds t (t < prefix[G]); empty
// experts are skipped because the last g with prefix[g] <= t is taken.
__device__ __forceinline__ int64_t find_group(const int64_t* prefix, int64_t G, int64_t t) {
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
