// The row gather of the CPU references of the gathered ops (moe_gate_up_swiglu,
// moe_down_dgrad_swiglu): what their CUDA kernels read through the row map, as a permuted copy.
#pragma once

#include <cstring>

#include "base/cpu_util.hpp"
#include "groupmm/core.hpp"

namespace groupmm::cpu {

// rows[r] = x[src_row[r]], a zero row for -1 (another value outside [0, T): a fault of `op`).
inline Tensor gather_rows(Context& ctx, const TensorView& x, const TensorView& src_row, OpId op) {
  const int64_t T = x.dim(0), H = x.dim(1), R = src_row.dim(0);
  const size_t row_bytes = size_t(H) * size_t(dtype_bits(x.dtype)) / 8;
  Tensor xp = Tensor::empty({R, H}, x.dtype, Device::CPU);
  const int32_t* src = src_row.ptr<int32_t>();
  for (int64_t r = 0; r < R; ++r) {
    uint8_t* dst = static_cast<uint8_t*>(xp.data()) + r * row_bytes;
    const int32_t s = src[r];
    if (s >= 0 && s < T) {
      std::memcpy(dst, static_cast<const uint8_t*>(x.data) + s * row_bytes, row_bytes);
    } else {
      if (s != -1) report_fault_host(ctx.status(), kFaultBadIndex, op, -1, s);
      std::memset(dst, 0, row_bytes);
    }
  }
  return xp;
}

}  // namespace groupmm::cpu
