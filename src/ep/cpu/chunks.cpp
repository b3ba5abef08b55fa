// The chunked plans' two index primitives on the CPU backend (the reference of
// src/ep/cuda/chunks.cu; groupmm/ep.hpp, EpChunkedPlan): a chunk's ids, and one chunk's slots
// merged into the chunks' concatenated way back.
#include <climits>

#include "ep/backends.hpp"

namespace groupmm::ep::cpu {

void ep_chunk_ids(Context&, int32_t* out, const TensorView& ids, int64_t E, int64_t El, int64_t lo,
                  int64_t hi) {
  const int64_t n = ids.numel();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t e = ids.dtype == DType::int64 ? ids.ptr<int64_t>()[i] : ids.ptr<int32_t>()[i];
    if (e >= 0 && e < E) {
      const int64_t le = e % El;
      out[i] = le >= lo && le < hi ? int32_t(e - lo) : -1;
    } else {  // -1 stays; a bad id stays out of range for the plan to report
      out[i] = e >= INT32_MIN && e <= INT32_MAX ? int32_t(e) : INT32_MAX;
    }
  }
}

void ep_merge_slots(Context&, int32_t* merged, const int32_t* part, int64_t n, int64_t base,
                    bool first) {
  for (int64_t i = 0; i < n; ++i) {
    if (part[i] >= 0)
      merged[i] = int32_t(base + part[i]);
    else if (first)
      merged[i] = -1;
  }
}

}  // namespace groupmm::ep::cpu
