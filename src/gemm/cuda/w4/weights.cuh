// The 4-bit weights [G, N, K] as the W4 kernels (decode, dequantize) address them: codes, block
// scales in their layout, and the scale row of (expert, row).
#pragma once

#include <cstdint>

#include "gemm/w4_backends.hpp"
#include "numerics/quantize_layout.hpp"

namespace groupmm::cuda::w4 {

struct W4Weights {
  const uint8_t* codes;   // [G * N, K / 2] e2m1, element 2j in the low nibble
  const uint8_t* scales;  // e4m3 (nvfp4) or e8m0 (mxfp4), rowwise layout L
  qnum::Layout L;
  int64_t G, N, K;
  int64_t tiles_per_expert;  // 128-row tiles of an expert (the swizzled layout's blocks)

  static W4Weights of(const W4Launch& l) {
    return {static_cast<const uint8_t*>(l.w),
            static_cast<const uint8_t*>(l.scales),
            l.L,
            l.dims.G,
            l.dims.N,
            l.dims.K,
            qnum::ceil_div(l.dims.N, qnum::kTileRows)};
  }
  // The 16 bytes of codes (g, n, k .. k + 31).
  __device__ __forceinline__ const uint8_t* codes_at(int64_t g, int64_t n, int64_t k) const {
    return codes + ((g * N + n) * K + k) / 2;
  }
  // The scale index of (g, n, scale column 0); column c adds qnum::row_scale_col_offset(L, c).
  __device__ __forceinline__ int64_t scale_row(int64_t g, int64_t n) const {
    const qnum::Geom geom{g * N, N, g * tiles_per_expert, 0, 0};
    return qnum::row_scale_index(L, geom, n, 0);
  }
};

}  // namespace groupmm::cuda::w4
