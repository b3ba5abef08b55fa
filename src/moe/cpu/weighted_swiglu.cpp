// CPU reference of the router-weighted SwiGLU: swiglu's element functions, the row's weight
// applied to the activation (forward) and to dout (backward), dprob summed in column order.
#include "moe/backends.hpp"
#include "moe/swiglu_backends.hpp"
#include "base/cpu_util.hpp"

namespace groupmm::cpu {

// Below this many elements a parallel region costs more to start than it saves.
constexpr int64_t kParallelWork = int64_t(1) << 16;

void weighted_swiglu_forward(Context&, const TensorView& gate_up, const TensorView& prob,
                             const TensorView& out) {
  const int64_t M = out.dim(0), I = out.dim(1);
#pragma omp parallel for if (M * I > kParallelWork)
  for (int64_t m = 0; m < M; ++m) {
    const float p = prob.ptr<float>()[m];
    for (int64_t i = 0; i < I; ++i) {
      const float g = load_f(gate_up, m * 2 * I + i), u = load_f(gate_up, m * 2 * I + I + i);
      store_f(out, m * I + i, swiglu_fwd_elem(g, u) * p);
    }
  }
}

void weighted_swiglu_backward(Context&, const TensorView& dout, const TensorView& gate_up,
                              const TensorView& prob, const TensorView& dgate_up,
                              const TensorView& dprob) {
  const int64_t M = dout.dim(0), I = dout.dim(1);
#pragma omp parallel for if (M * I > kParallelWork)
  for (int64_t m = 0; m < M; ++m) {
    const float p = prob.ptr<float>()[m];
    float dp = 0.0f;
    for (int64_t i = 0; i < I; ++i) {
      const float g = load_f(gate_up, m * 2 * I + i), u = load_f(gate_up, m * 2 * I + I + i);
      const float d = load_f(dout, m * I + i);
      float dg, du;
      swiglu_bwd_elem(d * p, g, u, dg, du);
      store_f(dgate_up, m * 2 * I + i, dg);
      store_f(dgate_up, m * 2 * I + I + i, du);
      dp += d * swiglu_fwd_elem(g, u);
    }
    dprob.ptr<float>()[m] = dp;
  }
}

}  // namespace groupmm::cpu
