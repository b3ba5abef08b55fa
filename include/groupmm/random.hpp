// groupmm/random.hpp: counter-based random fill (benchmarks, demos, layer initialization).
//
// Element i gets lo + (hi - lo) * u(seed, i), u in [0, 1) from a SplitMix64 hash of (seed, i), so
// the CPU and CUDA backends produce the same values (after rounding to the view's dtype).
// dtypes: bf16, fp16, fp32. Graph safe (one kernel, no allocation).
#pragma once

#include "groupmm/convert.hpp"
#include "groupmm/core.hpp"

namespace groupmm {

void fill_uniform(Context& ctx, const TensorView& v, float lo, float hi, uint64_t seed);

// The uniform variate of element i (shared by both backends).
GROUPMM_HD float uniform01(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);  // 24 random bits
}

}  // namespace groupmm
