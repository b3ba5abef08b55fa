// swiglu_forward / swiglu_backward: validation and backend dispatch.
#include "moe/swiglu_backends.hpp"

namespace groupmm {

static DType check_float_dtype(const char* op, const TensorView& v, const char* arg) {
  GROUPMM_CHECK(v.present(), op, ": ", arg, " is required");
  GROUPMM_CHECK(v.dtype == DType::bf16 || v.dtype == DType::fp16 || v.dtype == DType::fp32, op,
                ": ", arg, ".dtype=", dtype_name(v.dtype), " must be bf16, fp16 or fp32");
  return v.dtype;
}

// gate_up [M, 2I] and a [M, I] partner; returns I.
int64_t check_swiglu_pair(const Context& ctx, const char* op, const TensorView& gate_up,
                          const TensorView& half, const char* half_arg) {
  const DType t = check_float_dtype(op, gate_up, "gate_up");
  check_view(op, "gate_up", gate_up, t, 2, ctx.device());
  GROUPMM_CHECK(gate_up.dim(1) % 2 == 0, op, ": gate_up.shape[1]=", gate_up.dim(1),
                " must be even (gate and up halves)");
  const int64_t I = gate_up.dim(1) / 2;
  check_view(op, half_arg, half, t, 2, ctx.device());
  check_dim(op, half_arg, half, 0, gate_up.dim(0));
  check_dim(op, half_arg, half, 1, I);
  return I;
}

void swiglu_forward(Context& ctx, const TensorView& gate_up, const TensorView& out) {
  const char* op = "swiglu_forward";
  check_swiglu_pair(ctx, op, gate_up, out, "out");
  GROUPMM_CHECK(!views_overlap(out, gate_up), op, ": out may not alias gate_up");
  if (ctx.device() == Device::CPU)
    cpu::swiglu_forward(ctx, gate_up, out);
  else
    cuda::swiglu_forward(ctx, gate_up, out);
  ctx.after_op();
}

void swiglu_backward(Context& ctx, const TensorView& dout, const TensorView& gate_up,
                     const TensorView& dgate_up) {
  const char* op = "swiglu_backward";
  check_swiglu_pair(ctx, op, gate_up, dout, "dout");
  check_view(op, "dgate_up", dgate_up, gate_up.dtype, 2, ctx.device());
  check_dim(op, "dgate_up", dgate_up, 0, gate_up.dim(0));
  check_dim(op, "dgate_up", dgate_up, 1, gate_up.dim(1));
  GROUPMM_CHECK(!views_overlap(dgate_up, gate_up) && !views_overlap(dgate_up, dout), op,
                ": dgate_up may not alias gate_up or dout");
  if (ctx.device() == Device::CPU)
    cpu::swiglu_backward(ctx, dout, gate_up, dgate_up);
  else
    cuda::swiglu_backward(ctx, dout, gate_up, dgate_up);
  ctx.after_op();
}

}  // namespace groupmm
