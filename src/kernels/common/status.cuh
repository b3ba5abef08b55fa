// Device-side fault reporting into the Context's status block (core.hpp, "Device status word").
// Kernels never write out of bounds on bad device data: they clamp, skip, and report here.
#pragma once

#include "groupmm/core.hpp"

namespace groupmm::cuda {

// The first reporter records op, group and value; every reporter ORs its bit. A null block (no
// Context status) drops the report.
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

}  // namespace groupmm::cuda
