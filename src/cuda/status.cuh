// Device-side fault reporting into the Context's status block (see core.hpp).
#pragma once

#include "groupmm/core.hpp"

namespace groupmm::cuda {

// The first reporter records op, group and value; every reporter ORs its bit.
__device__ __forceinline__ void report_fault(StatusBlock* s, uint32_t bit, OpId op, int32_t group,
                                             int64_t value) {
  if (s == nullptr) return;
  const uint32_t old = atomicOr(&s->bits, bit);
  if (old == 0) {
    s->op = static_cast<uint32_t>(op);
    s->group = group;
    s->value = value;
  }
}

// Reads split g as int64 from an int32 or int64 array.
__device__ __forceinline__ int64_t load_split(const void* splits, bool is64, int64_t g) {
  return is64 ? static_cast<const int64_t*>(splits)[g]
              : static_cast<int64_t>(static_cast<const int32_t*>(splits)[g]);
}

}  // namespace groupmm::cuda
