// A warp-parallel expert lookup, for kernels that look an expert up on the critical path of their
// loads (find_expert in splits_scan.cuh is the one-thread version).
#pragma once

#include <cstdint>

namespace groupmm::cuda {

// The last g in [0, G) with prefix[g] <= t (prefix non-decreasing, prefix[0] = 0 <= t): the
// expert whose range holds t, as find_expert returns it. Every lane of the warp calls it with
// the same arguments, all 32 active. Each round the lanes read 32 evenly spaced entries at once
// and keep the last one <= t, so the chain of dependent loads is ceil(log32 G) long instead of
// ceil(log2 G) (2 instead of 7 for 128 experts).
__device__ __forceinline__ int64_t find_expert_warp(const int64_t* prefix, int64_t G, int64_t t,
                                                    int lane) {
  int64_t lo = 0, hi = G - 1;  // prefix[lo] <= t; the answer is in [lo, hi]
  while (lo < hi) {
    const int64_t step = (hi - lo + 32) / 32;  // ceil((hi - lo + 1) / 32)
    const int64_t idx = lo + lane * step;
    const bool le = idx <= hi && prefix[idx] <= t;
    const unsigned below = __ballot_sync(0xFFFFFFFFu, le);  // lane 0 always (idx = lo)
    lo += (31 - __clz(static_cast<int>(below))) * step;
    hi = hi < lo + step - 1 ? hi : lo + step - 1;
  }
  return lo;
}

}  // namespace groupmm::cuda
