// Zeroing a quantized scale buffer's slack (qnum::ScaleSlack, numerics/quantize_layout.hpp) from
// inside the kernels that write the buffer (the quantize tile kernel, swizzle_scales): every thread
// of the grid takes a share, so no extra launch and no host-side fill is needed.
#pragma once

#include <cstdint>

#include "numerics/quantize_layout.hpp"

namespace groupmm::cuda {

// `end`: the geometry after the last expert (the plan's entry G). Every thread of the grid runs
// this once, so a thread with no share must leave after a few instructions: one run (every layout
// but mn_major rowwise) takes 16-byte stores between its aligned edges and byte stores at the
// edges; several runs (mn_major rowwise: a few entries past the tokens in each of K/128 runs) are
// one flat byte range over all runs. The experts' blocks end where the slack starts, so these
// stores never meet the kernel's scale stores.
__device__ __forceinline__ void zero_scale_slack(void* base, const qnum::ScaleSlack& s,
                                                 const qnum::Geom& end, int64_t worker,
                                                 int64_t workers) {
  if (base == nullptr || s.lines == 0) return;
  const int64_t from = qnum::slack_start(s, end), per_line = s.line_bytes - from;
  if (per_line <= 0) return;
  uint8_t* const b = static_cast<uint8_t*>(base);
  if (s.lines > 1) {
#pragma unroll 1
    for (int64_t i = worker; i < s.lines * per_line; i += workers)
      b[i / per_line * s.line_bytes + from + i % per_line] = 0;
    return;
  }
  uint8_t* const a = b + from;
  uint8_t* const e = b + s.line_bytes;
  const auto up = (reinterpret_cast<uintptr_t>(a) + 15) & ~uintptr_t(15);
  const auto down = reinterpret_cast<uintptr_t>(e) & ~uintptr_t(15);
  // No whole 16 bytes inside: all of it is edge bytes.
  uint8_t* const a16 = up < down ? reinterpret_cast<uint8_t*>(up) : e;
  uint8_t* const e16 = up < down ? reinterpret_cast<uint8_t*>(down) : e;
  const int64_t head = a16 - a, edges = head + (e - e16);
  if (worker < edges) *(worker < head ? a + worker : e16 + (worker - head)) = 0;  // edges < 32
#pragma unroll 1
  for (int64_t i = worker; i < (e16 - a16) / 16; i += workers)
    reinterpret_cast<uint4*>(a16)[i] = make_uint4(0u, 0u, 0u, 0u);
}

}  // namespace groupmm::cuda
