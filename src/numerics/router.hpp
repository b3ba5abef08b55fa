// Router numerics shared by the CPU reference and the CUDA kernels: every function here gives the
// same bits on the host and the device, so both backends select the same experts (ties and
// near-ties included) and produce the same weights and d_logits.
//
// How: only correctly rounded IEEE operations in a fixed order. On the device each add, multiply,
// divide and fma is an explicit _rn intrinsic (nvcc would otherwise contract a*b+c into an fma
// that the host does not perform); on the host plain float operators are used (x86-64 SSE, no FMA
// contraction in this build: no -march flags) and std::fma where the device uses fma. exp is our
// own (libm's and CUDA's expf differ in the last bit): Cody-Waite reduction and a degree-6
// polynomial, within 2 ulp of the true exp.
#pragma once

#include <cmath>
#include <cstdint>

#include "groupmm/convert.hpp"  // GROUPMM_HD, float_bits, bits_float

namespace groupmm::router {

GROUPMM_HD float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
GROUPMM_HD float sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
GROUPMM_HD float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
GROUPMM_HD float div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
GROUPMM_HD float fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// exp(x): NaN -> NaN, x > ln(FLT_MAX) -> +inf, x < -104 -> 0 (-inf included); subnormal results
// come from two exact power-of-two scalings, the last one rounding.
GROUPMM_HD float exp(float x) {
  if (!(x == x)) return x;
  if (x > 88.72283935546875f) return bits_float(0x7F800000u);
  if (x < -104.0f) return 0.0f;
#if defined(__CUDA_ARCH__)
  const float n = rintf(mul(x, 1.44269504088896341f));  // round to nearest even
#else
  const float n = std::rint(mul(x, 1.44269504088896341f));
#endif
  float r = fma(n, -0.693145751953125f, x);  // ln2 high part (exact product)
  r = fma(n, -1.42860682030941723e-6f, r);   // ln2 low part
  float p = 1.9875691500e-4f;
  p = fma(p, r, 1.3981999507e-3f);
  p = fma(p, r, 8.3334519073e-3f);
  p = fma(p, r, 4.1665795894e-2f);
  p = fma(p, r, 1.6666665459e-1f);
  p = fma(p, r, 5.0000001201e-1f);
  const float y = add(fma(p, mul(r, r), r), 1.0f);  // exp(r), |r| <= ln2 / 2
  // 2^n with n in [-151, 128] as two factors that are each a normal float.
  const int ni = static_cast<int>(n);
  const int a = ni / 2, b = ni - a;
  const float sa = bits_float(static_cast<uint32_t>(a + 127) << 23);
  const float sb = bits_float(static_cast<uint32_t>(b + 127) << 23);
  return mul(mul(y, sa), sb);
}

GROUPMM_HD float sigmoid(float x) {
  return div(1.0f, add(1.0f, exp(-x)));
}

// True when (va, ia) ranks before (vb, ib): the larger value first, then the lower index; NaN ranks
// after every number (-inf included), NaNs among themselves by index.
GROUPMM_HD bool better(float va, int ia, float vb, int ib) {
  const bool na = !(va == va), nb = !(vb == vb);
  if (na != nb) return nb;
  if (!na && va != vb) return va > vb;
  return ia < ib;
}

// The order in which every per-token sum over the E experts is taken (softmax denominator and the
// backward's dot products): the one-warp-per-token kernel's order. Lane l (0..31) adds experts
// l, l + 32, l + 64, ... in turn; then lanes combine in a butterfly (partner = lane ^ 16, ^ 8, ^ 4,
// ^ 2, ^ 1; each lane adds the partner's value to its own). The host replays it here; the device
// uses shuffles (router kernels), which the GPU tests check bit for bit.
template <class F>
GROUPMM_HD float lane_order_sum(int n, F&& value_of) {
  float lane[32];
  for (int l = 0; l < 32; ++l) {
    float s = 0.0f;
    for (int e = l; e < n; e += 32) s = add(s, value_of(e));
    lane[l] = s;
  }
  for (int step = 16; step >= 1; step /= 2) {
    float next[32];
    for (int l = 0; l < 32; ++l) next[l] = add(lane[l], lane[l ^ step]);
    for (int l = 0; l < 32; ++l) lane[l] = next[l];
  }
  return lane[0];
}

constexpr float kRenormEps =
    1e-20f;  // added to the top-k weight sum (and the aux loss's sigmoid sum)

}  // namespace groupmm::router
