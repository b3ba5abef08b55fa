// CPU reference of SwiGLU forward / backward: one loop over rows and the I gate/up pairs.
#include "moe/swiglu_backends.hpp"
#include "base/cpu_util.hpp"

namespace groupmm::cpu {

void swiglu_forward(Context&, const TensorView& gate_up, const TensorView& out) {
  const int64_t M = out.dim(0), I = out.dim(1);
#pragma omp parallel for
  for (int64_t m = 0; m < M; ++m)
    for (int64_t i = 0; i < I; ++i) {
      const float g = load_f(gate_up, m * 2 * I + i), u = load_f(gate_up, m * 2 * I + I + i);
      store_f(out, m * I + i, swiglu_fwd_elem(g, u));
    }
}

void swiglu_backward(Context&, const TensorView& dout, const TensorView& gate_up,
                     const TensorView& dgate_up) {
  const int64_t M = dout.dim(0), I = dout.dim(1);
#pragma omp parallel for
  for (int64_t m = 0; m < M; ++m)
    for (int64_t i = 0; i < I; ++i) {
      const float g = load_f(gate_up, m * 2 * I + i), u = load_f(gate_up, m * 2 * I + I + i);
      float dg, du;
      swiglu_bwd_elem(load_f(dout, m * I + i), g, u, dg, du);
      store_f(dgate_up, m * 2 * I + i, dg);
      store_f(dgate_up, m * 2 * I + I + i, du);
    }
}

}  // namespace groupmm::cpu
