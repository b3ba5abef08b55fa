// CPU reference of group_dbias: fp32 column sums over each expert's rows in the order of
// dbias.hpp (the same function as the bias gradient of bgrad_group_quantize).
#include <vector>

#include "quantize/dbias_backends.hpp"
#include "base/cpu_util.hpp"

namespace groupmm::cpu {

void group_dbias(Context& ctx, const TensorView& dy, const TensorView& splits, const TensorView& db,
                 bool accumulate, SplitsTotal total) {
  const int64_t M = dy.dim(0), N = dy.dim(1), G = db.dim(0);
  const auto ranges =
      expert_rows(ctx, splits, M, OpId::group_dbias, M, total == SplitsTotal::at_most);
  std::vector<float> sums(static_cast<size_t>(N));
  for (int64_t g = 0; g < G; ++g) {
    const RowRange r = ranges[static_cast<size_t>(g)];
    if (accumulate && r.rows == 0) continue;  // zero-row expert: unchanged
    expert_column_sums(
        r.rows, N, [&](int64_t row, int64_t n) { return load_f(dy, (r.start + row) * N + n); },
        sums.data());
    for (int64_t n = 0; n < N; ++n) {
      float v = sums[static_cast<size_t>(n)];
      if (accumulate) v = qnum::canon_nan(v + load_f(db, g * N + n));
      store_f(db, g * N + n, v);
    }
  }
}

}  // namespace groupmm::cpu
