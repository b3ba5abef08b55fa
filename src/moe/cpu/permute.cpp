// CPU reference of the permute plan and the four row movers: plain loops in (token, choice) order.
// Sums are fp32 in choice order (then the addend), like the CUDA kernels, so results agree bit for
// bit.
#include <cmath>
#include <vector>

#include "moe/backends.hpp"
#include "base/cpu_util.hpp"

namespace groupmm::cpu {

void moe_permute_plan(Context& ctx, const TensorView& ids, const PermuteMap& m) {
  const int64_t T = m.tokens, k = m.topk, E = m.experts;
  const int32_t* id = ids.ptr<int32_t>();
  std::vector<int64_t> count(size_t(E), 0);
  for (int64_t i = 0; i < T * k; ++i) {
    if (id[i] >= 0 && id[i] < E)
      ++count[size_t(id[i])];
    else
      report_fault_host(ctx.status(), kFaultBadIndex, OpId::moe_permute, int32_t(i / k), id[i]);
  }
  int32_t* start = m.row_start.ptr<int32_t>();
  int32_t* kept = m.kept.ptr<int32_t>();
  int32_t* splits = m.splits.ptr<int32_t>();
  int64_t row = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t c = m.capacity > 0 ? std::min(count[size_t(e)], m.capacity) : count[size_t(e)];
    start[e] = int32_t(row);
    kept[e] = int32_t(c);
    splits[e] = int32_t(qnum::round_up(c, m.align));
    row += splits[e];
  }
  splits[E - 1] += int32_t(m.rows - row);  // the zero tail (moe_permuted_rows bounds row)
  std::vector<int64_t> rank(size_t(E), 0);
  int32_t* dest = m.dest_row.ptr<int32_t>();
  for (int64_t i = 0; i < T * k; ++i) {  // stable: (token, choice) order
    dest[i] = -1;
    if (id[i] < 0 || id[i] >= E) continue;
    const int64_t r = rank[size_t(id[i])]++;
    if (m.capacity == 0 || r < m.capacity) dest[i] = int32_t(start[id[i]] + r);
  }
}

// dst[dest_row[t, j]] = src[t] for every kept (t, j); every other dst row 0. probs likewise.
void moe_scatter_rows(Context&, const TensorView& src, const PermuteMap& m, const TensorView& dst,
                      const TensorView& weights, const TensorView& probs) {
  const int64_t H = src.dim(1);
  for (int64_t i = 0; i < m.rows * H; ++i) store_f(dst, i, 0.0f);
  if (probs.present())
    for (int64_t r = 0; r < m.rows; ++r) probs.ptr<float>()[r] = 0.0f;
  const int32_t* dest = m.dest_row.ptr<int32_t>();
  for (int64_t t = 0; t < m.tokens; ++t)
    for (int64_t j = 0; j < m.topk; ++j) {
      const int64_t d = dest[t * m.topk + j];
      if (d < 0) continue;
      for (int64_t h = 0; h < H; ++h) store_f(dst, d * H + h, load_f(src, t * H + h));
      if (probs.present()) probs.ptr<float>()[d] = weights.ptr<float>()[t * m.topk + j];
    }
}

// dst[t] = sum_j src[dest_row[t, j]] (+ sum_j w_tj bias[e_tj], fma) (+ add[t]); d_weights[t, j] =
// d_probs[dest_row[t, j]] or 0.
void moe_gather_rows(Context& ctx, const TensorView& src, const PermuteMap& m,
                     const TensorView& dst, const TensorView& add, const TensorView& d_probs,
                     const TensorView& d_weights, const RoutedBias& routed) {
  const int64_t H = src.dim(1);
  const int32_t* dest = m.dest_row.ptr<int32_t>();
  const int32_t* ids = routed.present() ? routed.expert_ids.ptr<int32_t>() : nullptr;
  if (ids != nullptr)
    for (int64_t i = 0; i < m.tokens * m.topk; ++i)
      if (dest[i] >= 0 && (ids[i] < 0 || ids[i] >= m.experts))
        report_fault_host(ctx.status(), kFaultBadIndex, OpId::moe_unpermute, int32_t(i / m.topk),
                          ids[i]);
  for (int64_t t = 0; t < m.tokens; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      float acc = 0.0f;
      for (int64_t j = 0; j < m.topk; ++j) {
        const int64_t d = dest[t * m.topk + j];
        if (d >= 0) acc += load_f(src, d * H + h);
      }
      if (ids != nullptr)
        for (int64_t j = 0; j < m.topk; ++j) {
          const int64_t i = t * m.topk + j, e = ids[i];
          if (dest[i] >= 0 && e >= 0 && e < m.experts)
            acc = std::fma(routed.weights.ptr<float>()[i], load_f(routed.bias, e * H + h), acc);
        }
      if (add.present()) acc += load_f(add, t * H + h);
      store_f(dst, t * H + h, acc);
    }
    if (d_probs.present())
      for (int64_t j = 0; j < m.topk; ++j) {
        const int64_t d = dest[t * m.topk + j];
        d_weights.ptr<float>()[t * m.topk + j] = d >= 0 ? d_probs.ptr<float>()[d] : 0.0f;
      }
  }
}

}  // namespace groupmm::cpu
