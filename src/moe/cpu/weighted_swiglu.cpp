// CPU reference of the router-weighted SwiGLU: swiglu's element functions (or the SwigluForm's,
// for a non-plain form), the row's weight applied to the activation (forward) and to dout
// (backward), dprob summed in column order.
#include "moe/backends.hpp"
#include "moe/swiglu_backends.hpp"
#include "base/cpu_util.hpp"

namespace groupmm::cpu {

// Below this many elements a parallel region costs more to start than it saves.
constexpr int64_t kParallelWork = int64_t(1) << 16;

namespace {

// Flat indices of pair i's gate and up in row m of gate_up [M, 2I].
struct PairIndex {
  int64_t I;
  bool interleaved;
  int64_t gate(int64_t m, int64_t i) const { return m * 2 * I + (interleaved ? 2 * i : i); }
  int64_t up(int64_t m, int64_t i) const { return m * 2 * I + (interleaved ? 2 * i + 1 : I + i); }
};

// The element functions of a form: swiglu's own for the plain one (so that the plain op's results
// do not change), the parameterized ones otherwise.
struct Elem {
  SwigluFormElem f;
  bool plain;
  float fwd(float g, float u) const {
    return plain ? swiglu_fwd_elem(g, u) : swiglu_form_fwd(g, u, f, SwigluSigmoidExact{});
  }
  void bwd(float d, float g, float u, float& dg, float& du) const {
    if (plain)
      swiglu_bwd_elem(d, g, u, dg, du);
    else
      swiglu_form_bwd(d, g, u, f, SwigluSigmoidExact{}, dg, du);
  }
};

Elem elem_of(const SwigluForm& form) {
  return {{form.alpha, form.limit, form.up_offset}, form.plain()};
}

// The rows computed: all M, or with splits the rows the experts own, [0, min(sum, M)), by the
// splits rule at most M (a sum above M is reported, a short one is not).
int64_t rows_of(Context& ctx, const TensorView& splits, int64_t M) {
  if (!splits.present()) return M;
  const auto r = expert_rows(ctx, splits, M, OpId::weighted_swiglu, M, /*total_at_most=*/true);
  return r.back().start + r.back().rows;
}

}  // namespace

void weighted_swiglu_forward(Context& ctx, const TensorView& gate_up, const TensorView& prob,
                             const TensorView& out, const SwigluForm& form,
                             const TensorView& splits) {
  const int64_t M = rows_of(ctx, splits, out.dim(0)), I = out.dim(1);
  const PairIndex at{I, form.layout == SwigluLayout::interleaved};
  const Elem e = elem_of(form);
#pragma omp parallel for if (M * I > kParallelWork)
  for (int64_t m = 0; m < M; ++m) {
    const float p = prob.ptr<float>()[m];
    for (int64_t i = 0; i < I; ++i) {
      const float g = load_f(gate_up, at.gate(m, i)), u = load_f(gate_up, at.up(m, i));
      store_f(out, m * I + i, e.fwd(g, u) * p);
    }
  }
}

void weighted_swiglu_backward(Context& ctx, const TensorView& dout, const TensorView& gate_up,
                              const TensorView& prob, const TensorView& dgate_up,
                              const TensorView& dprob, const SwigluForm& form,
                              const TensorView& splits) {
  const int64_t M = rows_of(ctx, splits, dout.dim(0)), I = dout.dim(1);
  const PairIndex at{I, form.layout == SwigluLayout::interleaved};
  const Elem e = elem_of(form);
#pragma omp parallel for if (M * I > kParallelWork)
  for (int64_t m = 0; m < M; ++m) {
    const float p = prob.ptr<float>()[m];
    float dp = 0.0f;
    for (int64_t i = 0; i < I; ++i) {
      const float g = load_f(gate_up, at.gate(m, i)), u = load_f(gate_up, at.up(m, i));
      const float d = load_f(dout, m * I + i);
      float dg, du;
      e.bwd(d * p, g, u, dg, du);
      store_f(dgate_up, at.gate(m, i), dg);
      store_f(dgate_up, at.up(m, i), du);
      dp += d * e.fwd(g, u);
    }
    dprob.ptr<float>()[m] = dp;
  }
}

}  // namespace groupmm::cpu
