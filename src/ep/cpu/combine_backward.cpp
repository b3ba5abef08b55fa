// Expert side of ep_combine_backward on the CPU backend (the reference): the weighted gradient of
// every grouped row and the d_weights dot product of every entry, in the fixed lane order that the
// CUDA kernel's warps use (groupmm/ep.hpp, ep_dot_order).
#include "ep/backends.hpp"
#include "base/cpu_util.hpp"

namespace groupmm::ep::cpu {

using groupmm::cpu::load_f;
using groupmm::cpu::store_f;

void ep_combine_backward_expert(Context&, const EpPlan& p, const void* dy_recv, const float* w_recv,
                                const TensorView& y_grouped, const TensorView& d_y_grouped,
                                float* dw_send) {
  const int64_t H = p.cfg.hidden, k = p.cfg.topk;
  const TensorView dy(const_cast<void*>(dy_recv), d_y_grouped.dtype, Device::CPU, {1, H});
  const int32_t* entry = p.grouped_entry.ptr<int32_t>();
  for (int64_t g = 0; g < p.rows; ++g) {
    const int64_t e = entry[g];
    for (int64_t h = 0; h < H; ++h) {
      const float d = e < 0 ? 0.0f : load_f(dy, e / k * H + h);
      store_f(d_y_grouped, g * H + h, e >= 0 && w_recv ? router::mul(w_recv[e], d) : d);
    }
  }
  if (dw_send == nullptr) return;  // unweighted: no d_weights
  const int32_t* back = p.back_grouped.ptr<int32_t>();
  std::vector<float> a(static_cast<size_t>(H)), b(static_cast<size_t>(H));
  for (int64_t i = 0; i < p.back_send_total; ++i) {
    const int64_t g = back[i];
    if (g < 0 || entry[g] < 0) continue;
    const int64_t r = entry[g] / k;
    for (int64_t h = 0; h < H; ++h) {
      a[size_t(h)] = load_f(dy, r * H + h);
      b[size_t(h)] = load_f(y_grouped, g * H + h);
    }
    dw_send[i] = ep_dot_order(a.data(), b.data(), H);
  }
}

}  // namespace groupmm::ep::cpu
