// Expert-parallel combine on the CPU backend: every (token, slot) output row goes back to its home
// rank, which sums them weighted in slot order (fp32, one rounding), as a one-rank layer does.
#include <cstring>

#include "core/ep_impl.hpp"
#include "cpu/cpu_util.hpp"

namespace groupmm::cpu {

void ep_combine(Context&, ep::Transport& tr, const ep::EpPlan& p, const TensorView& y_grouped,
                const TensorView& weights, const TensorView& out) {
  const int R = tr.size();
  const int64_t H = p.cfg.hidden, k = p.cfg.topk;
  const int64_t row_bytes = dtype_storage_bytes(y_grouped.dtype, H);
  // Expert side: entries in (source rank, received row, slot) order, the order the home rank
  // expects (EpPlan::back_slot). Not pre-summed here: that would reorder the home rank's fp32 sum.
  const char* ys = static_cast<const char*>(y_grouped.data);
  std::vector<char> send(size_t(p.rows * row_bytes));
  for (int64_t i = 0; i < p.rows; ++i)
    std::memcpy(send.data() + i * row_bytes, ys + p.back_grouped[size_t(i)] * row_bytes,
                size_t(row_bytes));
  const int64_t n_back = int64_t(p.back_slot.size());
  std::vector<char> recv(size_t(n_back * row_bytes));
  std::vector<int64_t> sc(static_cast<size_t>(R)), so(static_cast<size_t>(R)),
      rc(static_cast<size_t>(R)), ro(static_cast<size_t>(R));
  int64_t s = 0, r = 0;
  for (int q = 0; q < R; ++q) {
    sc[size_t(q)] = p.back_send_entries[size_t(q)] * row_bytes;
    so[size_t(q)] = s;
    s += (sc[size_t(q)]);
    rc[size_t(q)] = p.back_recv_entries[size_t(q)] * row_bytes;
    ro[size_t(q)] = r;
    r += (rc[size_t(q)]);
  }
  tr.all_to_all_v(send.data(), sc.data(), so.data(), recv.data(), rc.data(), ro.data());

  // Home side: slot (t, j) -> its returned row, then the fixed-order weighted sum.
  std::vector<int64_t> slot_row(size_t(p.tokens * k), -1);
  for (int64_t i = 0; i < n_back; ++i) slot_row[size_t(p.back_slot[size_t(i)])] = i;
  const TensorView rows(recv.data(), y_grouped.dtype, Device::CPU,
                        {std::max<int64_t>(n_back, 1), H});
  const float* w = weights.ptr<float>();
  std::vector<float> acc(static_cast<size_t>(H));
  for (int64_t t = 0; t < p.tokens; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = slot_row[size_t(t * k + j)];
      if (r < 0) continue;
      const float wj = w[t * k + j];
      for (int64_t h = 0; h < H; ++h) {
        const float v = wj * load_f(rows, r * H + h);
        acc[size_t(h)] += v;
      }
    }
    for (int64_t h = 0; h < H; ++h) store_f(out, t * H + h, acc[size_t(h)]);
  }
}

}  // namespace groupmm::cpu
