// The per-expert reduction of the bias-gradient tile sums (dbias_reduce.cuh).
#include "kernels/common/element.cuh"
#include "quantize/cuda/dbias_reduce.cuh"

namespace groupmm::cuda {
namespace {

using ReduceConfig = BlockConfig<256>;

struct ReduceParams {
  const float* partial;
  int64_t K;
  const int64_t* tile_start;  // [G + 1]
  void* db;
  bool accumulate;
};

// blockIdx.x: expert; blockIdx.y: a strip of kThreads columns. E: db's element type.
template <class E, class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) dbias_reduce_kernel(ReduceParams p) {
  const int64_t g = blockIdx.x;
  const int64_t k = int64_t(blockIdx.y) * Cfg::kThreads + threadIdx.x;
  if (k >= p.K) return;
  const int64_t t0 = p.tile_start[g], t1 = p.tile_start[g + 1];
  if (p.accumulate && t0 == t1) return;  // a zero-row expert keeps its db
  float d = 0.0f;
  for (int64_t t = t0; t < t1; ++t) d += p.partial[t * p.K + k];
  d = qnum::canon_nan(d);
  typename E::Storage* const db = static_cast<typename E::Storage*>(p.db) + g * p.K + k;
  if (p.accumulate) d = qnum::canon_nan(d + E::to_float(*db));
  *db = E::from_float(d);
}

}  // namespace

void launch_dbias_reduce(Context& ctx, const DbiasReduceArgs& a) {
  const int64_t strips = qnum::ceil_div(a.K, ReduceConfig::kThreads);
  if (strips == 0) return;
  GROUPMM_CHECK(strips <= 65535, "dbias: K=", a.K, " must be <= ", 65535 * ReduceConfig::kThreads);
  const ReduceParams p{a.partial, a.K, a.plan.tile_start, a.db.data, a.accumulate};
  const dim3 grid(static_cast<unsigned>(a.plan.G), static_cast<unsigned>(strips));
  dispatch_element(a.db.dtype, "dbias.dtype", [&](auto e) {
    dbias_reduce_kernel<decltype(e), ReduceConfig>
        <<<grid, ReduceConfig::kThreads, 0, ctx.stream()>>>(p);
  });
  GROUPMM_CHECK_LAUNCH();
}

}  // namespace groupmm::cuda
