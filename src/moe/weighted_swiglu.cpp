// weighted_swiglu_forward / weighted_swiglu_backward (plain and with a SwigluForm): validation and
// backend dispatch.
#include <cmath>
#include <limits>

#include "moe/backends.hpp"
#include "moe/swiglu_backends.hpp"

namespace groupmm {

static void check_prob(const Context& ctx, const char* op, const char* arg, const TensorView& v,
                       int64_t M) {
  check_view(op, arg, v, DType::fp32, 1, ctx.device());
  check_dim(op, arg, v, 0, M);
}

const char* swiglu_layout_name(SwigluLayout l) {
  return l == SwigluLayout::halves ? "halves" : "interleaved";
}

bool SwigluForm::plain() const {
  return alpha == 1.0f && limit == std::numeric_limits<float>::infinity() && up_offset == 0.0f &&
         layout == SwigluLayout::halves;
}

std::string SwigluForm::to_string() const {
  return detail::cat("SwigluForm{alpha=", alpha, ", limit=", limit, ", up_offset=", up_offset,
                     ", layout=", swiglu_layout_name(layout), "}");
}

static void check_form(const char* op, const SwigluForm& f) {
  GROUPMM_CHECK(std::isfinite(f.alpha), op, ": form.alpha=", f.alpha, " must be finite");
  GROUPMM_CHECK(f.limit > 0.0f, op, ": form.limit=", f.limit, " must be > 0 (infinity: no clamp)");
  GROUPMM_CHECK(std::isfinite(f.up_offset), op, ": form.up_offset=", f.up_offset,
                " must be finite");
  GROUPMM_CHECK(f.layout == SwigluLayout::halves || f.layout == SwigluLayout::interleaved, op,
                ": form.layout=", int(f.layout), " must be halves or interleaved");
}

void weighted_swiglu_forward(Context& ctx, const TensorView& gate_up, const TensorView& prob,
                             const TensorView& out) {
  weighted_swiglu_forward(ctx, gate_up, prob, out, SwigluForm{});
}

void weighted_swiglu_backward(Context& ctx, const TensorView& dout, const TensorView& gate_up,
                              const TensorView& prob, const TensorView& dgate_up,
                              const TensorView& dprob) {
  weighted_swiglu_backward(ctx, dout, gate_up, prob, dgate_up, dprob, SwigluForm{});
}

// The optional splits of the at-most mode: [G >= 1] int32|int64 on the context's device.
static void check_rows_splits(const Context& ctx, const char* op, const TensorView& splits) {
  if (!splits.present()) return;
  check_splits(op, splits, -1, ctx.device());
  GROUPMM_CHECK(splits.dim(0) >= 1, op, ": splits.shape[0]=", splits.dim(0), " must be >= 1");
}

void weighted_swiglu_forward(Context& ctx, const TensorView& gate_up, const TensorView& prob,
                             const TensorView& out, const SwigluForm& form,
                             const TensorView& splits) {
  const char* op = "weighted_swiglu_forward";
  check_form(op, form);
  check_rows_splits(ctx, op, splits);
  check_swiglu_pair(ctx, op, gate_up, out, "out");
  check_prob(ctx, op, "prob", prob, gate_up.dim(0));
  GROUPMM_CHECK(!views_overlap(out, gate_up) && !views_overlap(out, prob), op,
                ": out may not alias gate_up or prob");
  if (ctx.device() == Device::CPU)
    cpu::weighted_swiglu_forward(ctx, gate_up, prob, out, form, splits);
  else
    cuda::weighted_swiglu_forward(ctx, gate_up, prob, out, form, splits);
  ctx.after_op();
}

void weighted_swiglu_backward(Context& ctx, const TensorView& dout, const TensorView& gate_up,
                              const TensorView& prob, const TensorView& dgate_up,
                              const TensorView& dprob, const SwigluForm& form,
                              const TensorView& splits) {
  const char* op = "weighted_swiglu_backward";
  check_form(op, form);
  check_rows_splits(ctx, op, splits);
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
    cpu::weighted_swiglu_backward(ctx, dout, gate_up, prob, dgate_up, dprob, form, splits);
  else
    cuda::weighted_swiglu_backward(ctx, dout, gate_up, prob, dgate_up, dprob, form, splits);
  ctx.after_op();
}

}  // namespace groupmm
