// Validation shared by the expert-parallel ops (src/ep/*.cpp): each message names the op, the
// argument and the value (groupmm/ep.hpp).
#pragma once

#include "ep/backends.hpp"

namespace groupmm::ep::check {

// E, R (== the transport's size), H, k.
void cfg(const char* op, const EpConfig& c, const Transport& tr);
// The transport's buffers live where the Context runs.
void device(const char* op, const Context& ctx, const Transport& tr);
// v is [n, H] of dtype t on ctx's device.
void rows(const Context& ctx, const char* op, const char* arg, const TensorView& v, int64_t n,
          int64_t H, DType t);
// v is present and bf16, fp16 or fp32; returns its dtype.
DType row_dtype(const char* op, const char* arg, const TensorView& v);
// expert_ids [T, k] int32 (or int64 when int64_ok) on ctx's device; T < 0: any.
void expert_ids(const Context& ctx, const char* op, const TensorView& ids, int64_t T, int64_t k,
                bool int64_ok);
// The plan a caller passes back is this rank's, built for this Context's device.
void plan(const char* op, const Context& ctx, const EpPlan& p, const Transport& tr);
// A capacity plan's staging rows hold rows of dtype t.
void staging_fits(const char* op, const EpPlan& p, const char* arg, DType t);

}  // namespace groupmm::ep::check
