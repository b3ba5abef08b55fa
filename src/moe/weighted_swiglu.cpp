// weighted_swiglu_forward / weighted_swiglu_backward: validation and backend dispatch.
#include "moe/backends.hpp"
#include "moe/swiglu_backends.hpp"

namespace groupmm {

static void check_prob(const Context& ctx, const char* op, const char* arg, const TensorView& v,
                       int64_t M) {
  check_view(op, arg, v, DType::fp32, 1, ctx.device());
  check_dim(op, arg, v, 0, M);
}

void weighted_swiglu_forward(Context& ctx, const TensorView& gate_up, const TensorView& prob,
                             const TensorView& out) {
  const char* op = "weighted_swiglu_forward";
  check_swiglu_pair(ctx, op, gate_up, out, "out");
  check_prob(ctx, op, "prob", prob, gate_up.dim(0));
  GROUPMM_CHECK(!views_overlap(out, gate_up) && !views_overlap(out, prob), op,
                ": out may not alias gate_up or prob");
  if (ctx.device() == Device::CPU)
    cpu::weighted_swiglu_forward(ctx, gate_up, prob, out);
  else
    cuda::weighted_swiglu_forward(ctx, gate_up, prob, out);
  ctx.after_op();
}

void weighted_swiglu_backward(Context& ctx, const TensorView& dout, const TensorView& gate_up,
                              const TensorView& prob, const TensorView& dgate_up,
                              const TensorView& dprob) {
  const char* op = "weighted_swiglu_backward";
  check_swiglu_pair(ctx, op, gate_up, dout, "dout");
  check_prob(ctx, op, "prob", prob, gate_up.dim(0));
  check_prob(ctx, op, "dprob", dprob, gate_up.dim(0));
  check_view(op, "dgate_up", dgate_up, gate_up.dtype, 2, ctx.device());
  check_dim(op, "dgate_up", dgate_up, 0, gate_up.dim(0));
  check_dim(op, "dgate_up", dgate_up, 1, gate_up.dim(1));
  for (const TensorView* o : {&dgate_up, &dprob})
    GROUPMM_CHECK(
        !views_overlap(*o, gate_up) && !views_overlap(*o, dout) && !views_overlap(*o, prob), op,
        ": dgate_up and dprob may not alias gate_up, dout or prob");
  GROUPMM_CHECK(!views_overlap(dgate_up, dprob), op, ": dgate_up may not alias dprob");
  if (ctx.device() == Device::CPU)
    cpu::weighted_swiglu_backward(ctx, dout, gate_up, prob, dgate_up, dprob);
  else
    cuda::weighted_swiglu_backward(ctx, dout, gate_up, prob, dgate_up, dprob);
  ctx.after_op();
}

}  // namespace groupmm
