// Cases of the gathered ops' GPU tests (moe_gate_up_swiglu, moe_down_dgrad_swiglu): a routing of
// T tokens to k of E experts by pattern, the expert sizes, and a device pair read as floats.
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "base/cpu_util.hpp"
#include "common/moe_pair.hpp"
#include "common/test_util.hpp"

namespace groupmm::test {

struct GatheredCase {
  const char* name;
  int64_t T, k, E, H, F, align;
  int pattern;  // 0 random distinct, 1 all on expert E-1, 2 only even experts, 3 skewed
  DType dtype;
};

// The shapes both fused projections are tested on (each suite adds its own): Qwen3-like,
// skewed and sparse routings, padding, H off 64, one token, 256 experts, fp16.
inline std::vector<GatheredCase> common_gathered_cases() {
  return {GatheredCase{"qwen3_like", 512, 8, 128, 2048, 768, 1, 0, DType::bf16},
          GatheredCase{"skewed", 700, 4, 16, 512, 256, 1, 3, DType::bf16},
          GatheredCase{"even_experts_only", 300, 2, 8, 256, 128, 1, 2, DType::bf16},
          GatheredCase{"one_expert_takes_all", 257, 1, 4, 128, 64, 1, 1, DType::bf16},
          GatheredCase{"padded_128", 333, 2, 8, 256, 192, 128, 0, DType::bf16},
          GatheredCase{"padded_16_fp16", 200, 3, 6, 192, 64, 16, 0, DType::fp16},
          GatheredCase{"h_not_mult_64", 129, 2, 4, 200, 64, 1, 0, DType::bf16},
          GatheredCase{"t1_k1_e1", 1, 1, 1, 64, 64, 1, 0, DType::bf16},
          GatheredCase{"e256", 1024, 2, 256, 128, 128, 1, 0, DType::bf16},
          GatheredCase{"fp16", 400, 2, 8, 512, 128, 1, 0, DType::fp16}};
}
// common_gathered_cases() and `extra`.
inline std::vector<GatheredCase> gathered_cases_with(std::vector<GatheredCase> extra) {
  std::vector<GatheredCase> v = common_gathered_cases();
  v.insert(v.end(), extra.begin(), extra.end());
  return v;
}

// Expert ids [T, k] of a case's pattern.
inline std::vector<int32_t> routing(const GatheredCase& c, std::mt19937_64& g) {
  std::vector<int32_t> ids(size_t(c.T * c.k));
  std::vector<int32_t> pool;
  for (int64_t e = 0; e < c.E; ++e)
    if (c.pattern != 2 || e % 2 == 0) pool.push_back(int32_t(e));
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int64_t t = 0; t < c.T; ++t) {
    std::shuffle(pool.begin(), pool.end(), g);
    for (int64_t j = 0; j < c.k; ++j) {
      int32_t e = pool[size_t(j) % pool.size()];
      if (c.pattern == 1) e = int32_t(c.E - 1);
      if (c.pattern == 3)
        e = int32_t(std::min<double>(c.E - 1, std::floor(c.E * std::pow(u(g), 3))));
      ids[size_t(t * c.k + j)] = e;
    }
  }
  return ids;
}

// The device side of a pair, as floats.
inline std::vector<float> as_floats(const Pair& p) {
  auto b = p.dev_bytes();
  return cpu::to_floats(TensorView(b.data(), p.host.dtype, Device::CPU, {p.host.numel()}));
}

}  // namespace groupmm::test
