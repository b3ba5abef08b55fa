// Device pieces shared by the MoE kernels (src/moe/cuda/): 16-byte vector widths, launch sizes,
// warp helpers. Element formats and the dtype dispatch are common/element.cuh's.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/common/element.cuh"
#include "kernels/common/status.cuh"
#include "groupmm/convert.hpp"
#include "groupmm/core.hpp"

namespace groupmm::cuda::moe {

// Elements of activation type E (common/element.cuh: Bf16, Fp16, Fp32) per 16-byte vector.
template <class E>
constexpr int kVec16 = 16 / int(sizeof(typename E::Storage));

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

inline unsigned grid_size(int64_t blocks) {
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

constexpr unsigned kFullMask = 0xFFFFFFFFu;

}  // namespace groupmm::cuda::moe
