// Epilogue helper of the kernel layer: the m64nNk16 accumulator gives lane q of a quad columns
// 8 j + 2q and 8 j + 2q + 1 of each 8-column group j of its rows. After rounding to 16-bit pairs,
// a transpose of four consecutive groups across the quad gives each lane 8 consecutive columns:
// one 16-byte load or store per lane instead of four 4-byte ones (the store queue, not the math,
// bounds an epilogue of 4-byte stores).
#pragma once

#include <cstdint>

namespace groupmm::cuda::sm90 {

// A 4 x 4 transpose of 32-bit words across the 4 lanes of a quad (lanes 4i .. 4i + 3): lane q's
// v[j] becomes lane j's v[q]. Two exchange rounds (lane distance 2, then 1), each swapping the
// off-diagonal halves of 2 x 2 blocks. Every lane of the warp must take part.
__device__ __forceinline__ void quad_transpose(uint32_t (&v)[4], int q) {
#pragma unroll
  for (int m = 2; m >= 1; m >>= 1) {
    const bool upper = (q & m) != 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (j & m) continue;
      const uint32_t send = upper ? v[j] : v[j | m];
      const uint32_t recv = __shfl_xor_sync(0xffffffffu, send, m);
      if (upper)
        v[j] = recv;
      else
        v[j | m] = recv;
    }
  }
}

__device__ __forceinline__ void store16(void* p, const uint32_t (&v)[4]) {
  *reinterpret_cast<uint4*>(p) = make_uint4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void load16(const void* p, uint32_t (&v)[4]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  v[0] = u.x;
  v[1] = u.y;
  v[2] = u.z;
  v[3] = u.w;
}

}  // namespace groupmm::cuda::sm90
