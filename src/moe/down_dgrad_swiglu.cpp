// moe_down_dgrad_swiglu: validation and backend dispatch.
#include "moe/backends.hpp"

namespace groupmm {

namespace {

void check_down_dgrad(const Context& ctx, const MoeDownDgradArgs& a) {
  const char* op = "moe_down_dgrad_swiglu";
  GROUPMM_CHECK(a.dy.present(), op, ": dy is required");
  GROUPMM_CHECK(a.dy.dtype == DType::bf16 || a.dy.dtype == DType::fp16 ||
                    (a.dy.dtype == DType::fp32 && ctx.device() == Device::CPU),
                op, ": dy.dtype=", dtype_name(a.dy.dtype),
                " must be bf16 or fp16 (fp32 only on a CPU context: gradient checks)");
  const DType t = a.dy.dtype;
  check_view(op, "dy", a.dy, t, 2, ctx.device());
  check_view(op, "w", a.w, t, 3, ctx.device());
  check_view(op, "src_row", a.src_row, DType::int32, 1, ctx.device());
  const int64_t T = a.dy.dim(0), H = a.dy.dim(1), R = a.src_row.dim(0), E = a.w.dim(0),
                F = a.w.dim(2);
  check_dim(op, "w", a.w, 1, H);
  GROUPMM_CHECK(F > 0, op, ": w.shape[2]=", F, " (F) must be > 0");
  check_splits(op, a.splits, E, ctx.device());
  check_view(op, "gate_up", a.gate_up, t, 2, ctx.device());
  check_dim(op, "gate_up", a.gate_up, 0, R);
  check_dim(op, "gate_up", a.gate_up, 1, 2 * F);
  check_view(op, "prob", a.prob, DType::fp32, 1, ctx.device());
  check_dim(op, "prob", a.prob, 0, R);
  check_view(op, "dgate_up", a.dgate_up, t, 2, ctx.device());
  check_dim(op, "dgate_up", a.dgate_up, 0, R);
  check_dim(op, "dgate_up", a.dgate_up, 1, 2 * F);
  check_view(op, "dprob", a.dprob, DType::fp32, 1, ctx.device());
  check_dim(op, "dprob", a.dprob, 0, R);
  GROUPMM_CHECK(R <= INT32_MAX && T <= INT32_MAX, op, ": src_row.shape[0]=", R,
                " and dy.shape[0]=", T, " must fit int32");
  for (const TensorView* o : {&a.dgate_up, &a.dprob})
    for (const TensorView* in : {&a.dy, &a.w, &a.src_row, &a.splits, &a.gate_up, &a.prob})
      GROUPMM_CHECK(!views_overlap(*o, *in), op, ": dgate_up and dprob may not alias an input");
  GROUPMM_CHECK(!views_overlap(a.dgate_up, a.dprob), op, ": dgate_up may not alias dprob");
  if (ctx.device() == Device::CUDA) {
    GROUPMM_CHECK(H % 8 == 0, op, ": dy.shape[1]=", H,
                  " (H) must be a multiple of 8 on CUDA (16-byte rows)");
    GROUPMM_CHECK(F % 8 == 0, op, ": w.shape[2]=", F,
                  " (F) must be a multiple of 8 on CUDA (16-byte rows of 8 columns)");
    GROUPMM_CHECK(E <= 1024, op, ": w.shape[0]=", E, " (experts) must be <= 1024 on CUDA");
    GROUPMM_CHECK(a.config.empty() || a.config == "coop_128x256" || a.config == "epi_warps", op,
                  ": config=\"", a.config, "\" must be empty, coop_128x256 or epi_warps");
    // the kernel's int32 tile numbers (row tiles of 128 by column tiles of 256)
    GROUPMM_CHECK((R / 128 + E) * (F / 256 + 1) <= INT32_MAX, op, ": R=", R, " and F=", F,
                  " make more than 2^31 - 1 output tiles");
    const std::pair<const TensorView*, const char*> aligned[] = {
        {&a.dy, "dy"}, {&a.w, "w"}, {&a.gate_up, "gate_up"}, {&a.dgate_up, "dgate_up"}};
    for (const auto& [v, name] : aligned)
      GROUPMM_CHECK(reinterpret_cast<uintptr_t>(v->data) % 16 == 0, op, ": ", name,
                    " must be 16-byte aligned on CUDA");
  }
}

}  // namespace

bool moe_down_dgrad_swiglu_supported(const Context& ctx, DType dtype, int64_t H, int64_t F,
                                     int64_t E) {
  if (ctx.device() == Device::CPU)
    return dtype == DType::bf16 || dtype == DType::fp16 || dtype == DType::fp32;
  if (dtype != DType::bf16 && dtype != DType::fp16) return false;
  return cuda_kernels_built() && H % 8 == 0 && F % 8 == 0 && F > 0 && E >= 1 && E <= 1024;
}

void moe_down_dgrad_swiglu(Context& ctx, const MoeDownDgradArgs& args) {
  check_down_dgrad(ctx, args);
  if (ctx.device() == Device::CPU)
    cpu::moe_down_dgrad_swiglu(ctx, args);
  else
    cuda::moe_down_dgrad_swiglu(ctx, args);
  ctx.after_op();
}

}  // namespace groupmm
