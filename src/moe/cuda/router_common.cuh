// Warp-per-token pieces of the router kernels (forward and backward): a token's E scores live in
// registers, lane l owning experts l, l + 32, ... (kPer of them). Every sum over experts follows
// router::lane_order_sum's order and every comparison router::better, so the results equal the
// CPU reference bit for bit.
#pragma once

#include <climits>

#include "numerics/router.hpp"
#include "moe/cuda/moe_common.cuh"

namespace groupmm::cuda::moe {

namespace rn = groupmm::router;

struct RouterKernelConfig {
  static constexpr int kWarps = 8;  // tokens per CTA, one warp each
  static constexpr int kThreads = kWarps * 32;
  static_assert(kThreads <= 1024, "block size");
};

// Sum over the valid items of every lane in the router's order: each lane adds its items in turn,
// then a butterfly (each lane adds its partner's partial to its own; all lanes end equal).
template <int kPer>
__device__ __forceinline__ float warp_lane_sum(const float (&v)[kPer], int lane, int E) {
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < kPer; ++i)
    if (lane + 32 * i < E) s = rn::add(s, v[i]);
#pragma unroll
  for (int step = 16; step >= 1; step /= 2) s = rn::add(s, __shfl_xor_sync(kFullMask, s, step));
  return s;
}

// A candidate of a top-k round: ranking value v (sel), carried score s, expert (or group) id.
struct Cand {
  float v, s;
  int id;
};
// "No candidate": id INT_MAX, which every comparison below checks before ranking.
__device__ __forceinline__ Cand no_cand() {
  return {0.0f, 0.0f, INT_MAX};
}
// The best candidate of the warp (router::better is a strict total order: one winner, all lanes).
__device__ __forceinline__ Cand warp_best(Cand c) {
#pragma unroll
  for (int step = 16; step >= 1; step /= 2) {
    Cand o;
    o.v = __shfl_xor_sync(kFullMask, c.v, step);
    o.s = __shfl_xor_sync(kFullMask, c.s, step);
    o.id = __shfl_xor_sync(kFullMask, c.id, step);
    if (o.id != INT_MAX && (c.id == INT_MAX || rn::better(o.v, o.id, c.v, c.id))) c = o;
  }
  return c;
}
// The rank of item (v, id) as one integer: rank_key(a) > rank_key(b) exactly when
// router::better(a, b) (the larger value first, -0 equal to +0, NaN after every number, then the
// lower index). The high word orders the values (NaN: 0, below -inf's 0x007FFFFF), the low word is
// ~id. 0 is no item (it would be a NaN of id -1).
__device__ __forceinline__ uint64_t rank_key(float v, int id) {
  uint32_t hi = 0;  // NaN
  if (v == v) {
    const uint32_t b = __float_as_uint(v == 0.0f ? 0.0f : v);
    hi = (b & 0x80000000u) != 0 ? ~b : (b | 0x80000000u);
  }
  return (uint64_t(hi) << 32) | uint32_t(~static_cast<uint32_t>(id));
}
// True when candidate (v, id) ranks after the previous winner (the next round's eligibility).
__device__ __forceinline__ bool after(const Cand& prev, float v, int id) {
  return prev.id == INT_MAX || rn::better(prev.v, prev.id, v, id);
}
__device__ __forceinline__ bool beats(float v, int id, const Cand& best) {
  return best.id == INT_MAX || rn::better(v, id, best.v, best.id);
}

// One token's logits, softmax statistics and scores in a warp.
template <int kPer>
struct TokenScores {
  float l[kPer];  // logits
  float p[kPer];  // softmax(l) (when computed)
  float s[kPer];  // scores: p or sigmoid(l)
  float max = 0, sum = 1;

  __device__ __forceinline__ void load(const float* row, int lane, int E) {
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int e = lane + 32 * i;
      l[i] = e < E ? row[e] : 0.0f;
    }
  }
  // Softmax in the router's order: warp max, exp(l - max), lane-order sum, divide.
  __device__ __forceinline__ void softmax(int lane, int E) {
    float m = -bits_float(0x7F800000u);
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (lane + 32 * i < E) m = fmaxf(m, l[i]);
#pragma unroll
    for (int step = 16; step >= 1; step /= 2) m = fmaxf(m, __shfl_xor_sync(kFullMask, m, step));
    max = m;
#pragma unroll
    for (int i = 0; i < kPer; ++i) p[i] = rn::exp(rn::sub(l[i], m));
    sum = warp_lane_sum<kPer>(p, lane, E);
#pragma unroll
    for (int i = 0; i < kPer; ++i) p[i] = rn::div(p[i], sum);
  }
  // Scores; the softmax statistics are computed when `need_softmax` (softmax scores, z-loss).
  __device__ __forceinline__ void scores(bool softmax_score, bool need_softmax, int lane, int E) {
    if (softmax_score || need_softmax) softmax(lane, E);
#pragma unroll
    for (int i = 0; i < kPer; ++i) s[i] = softmax_score ? p[i] : rn::sigmoid(l[i]);
  }
  // logsumexp of the logits (z-loss; device logf, so not bit-equal to the host's log).
  __device__ __forceinline__ float lse() const {
    return max + logf(sum);
  }
};

// Value of item `id` (owned by lane id % 32, register id / 32) broadcast to the warp.
template <int kPer>
__device__ __forceinline__ float warp_item(const float (&v)[kPer], int id) {
  float mine = 0.0f;
#pragma unroll
  for (int i = 0; i < kPer; ++i)
    if (i == id / 32) mine = v[i];
  return __shfl_sync(kFullMask, mine, id % 32);
}

// Calls fn(std::integral_constant<int, kPer>{}) with kPer = ceil(E / 32) rounded up to 1, 2, 4, 8,
// 16 or 32 (E <= 1024).
template <class Fn>
void dispatch_per_lane(int64_t E, Fn&& fn) {
  if (E <= 32)
    fn(std::integral_constant<int, 1>{});
  else if (E <= 64)
    fn(std::integral_constant<int, 2>{});
  else if (E <= 128)
    fn(std::integral_constant<int, 4>{});
  else if (E <= 256)
    fn(std::integral_constant<int, 8>{});
  else if (E <= 512)
    fn(std::integral_constant<int, 16>{});
  else
    fn(std::integral_constant<int, 32>{});
}

}  // namespace groupmm::cuda::moe
