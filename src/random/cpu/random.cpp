// CPU reference of fill_uniform: element i gets lo + (hi - lo) * uniform01(seed, i).
#include "base/cpu_util.hpp"
#include "random/backends.hpp"

namespace groupmm::cpu {

void fill_uniform(Context&, const TensorView& v, float lo, float hi, uint64_t seed) {
  const int64_t n = v.numel();
  for (int64_t i = 0; i < n; ++i)
    store_f(v, i, lo + (hi - lo) * uniform01(seed, static_cast<uint64_t>(i)));
}

}  // namespace groupmm::cpu
