// Expert side of ep_combine_backward on the CPU backend (the reference): the weighted gradient of
// every grouped row and the d_weights dot product of every entry, in the fixed lane order that the
// CUDA kernel's warps use (groupmm/ep.hpp, ep_dot_order).
#include "ep/backends.hpp"
#include "base/cpu_util.hpp"

namespace groupmm::ep::cpu {

using groupmm::cpu::load_f;
using groupmm::cpu::store_f;

void ep_combine_backward_expert(Context&, const EpPlan& p, const RecvRows& dy_recv,
                                const float* w_recv, const TensorView& y_grouped,
                                const TensorView& d_y_grouped, float* dw_send, bool zero_tail) {
  const int64_t H = p.cfg.hidden, k = p.cfg.topk;
  const int32_t* entry = p.grouped_entry.ptr<int32_t>();
  // dy's receive row of entry e (null: none), as a view of one row
  const auto dy_row = [&](int64_t e) {
    const char* r = e >= 0 ? dy_recv.row(e / k) : nullptr;
    return TensorView(const_cast<char*>(r), d_y_grouped.dtype, Device::CPU, {1, H});
  };
  for (int64_t g = 0; g < p.rows; ++g) {
    const int64_t e = entry[g];
    const TensorView dy = dy_row(e);
    if (dy.data == nullptr && !zero_tail) continue;
    for (int64_t h = 0; h < H; ++h) {
      const float d = dy.data == nullptr ? 0.0f : load_f(dy, h);
      store_f(d_y_grouped, g * H + h, dy.data != nullptr && w_recv ? router::mul(w_recv[e], d) : d);
    }
  }
  if (dw_send == nullptr) return;  // unweighted: no d_weights
  const int32_t* back = p.back_grouped.ptr<int32_t>();
  std::vector<float> a(static_cast<size_t>(H)), b(static_cast<size_t>(H));
  for (int64_t i = 0; i < p.back_send_total; ++i) {
    const int64_t g = back[i];
    if (g < 0 || entry[g] < 0) continue;
    const TensorView dy = dy_row(entry[g]);
    for (int64_t h = 0; h < H; ++h) {
      a[size_t(h)] = load_f(dy, h);
      b[size_t(h)] = load_f(y_grouped, g * H + h);
    }
    dw_send[i] = ep_dot_order(a.data(), b.data(), H);
  }
}

}  // namespace groupmm::ep::cpu
