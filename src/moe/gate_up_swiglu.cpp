// moe_gate_up_swiglu and moe_permute_sources: validation and backend dispatch.
#include "moe/backends.hpp"
#include "moe/swiglu_backends.hpp"

namespace groupmm {

namespace {

struct GateUpDims {
  int64_t T, H, R, E, F;
};

GateUpDims check_gate_up(const Context& ctx, const MoeGateUpArgs& a) {
  const char* op = "moe_gate_up_swiglu";
  GROUPMM_CHECK(a.x.present(), op, ": x is required");
  GROUPMM_CHECK(a.x.dtype == DType::bf16 || a.x.dtype == DType::fp16 ||
                    (a.x.dtype == DType::fp32 && ctx.device() == Device::CPU),
                op, ": x.dtype=", dtype_name(a.x.dtype),
                " must be bf16 or fp16 (fp32 only on a CPU context: gradient checks)");
  const DType t = a.x.dtype;
  check_view(op, "x", a.x, t, 2, ctx.device());
  check_view(op, "w", a.w, t, 3, ctx.device());
  check_view(op, "src_row", a.src_row, DType::int32, 1, ctx.device());
  GateUpDims d{a.x.dim(0), a.x.dim(1), a.src_row.dim(0), a.w.dim(0), a.w.dim(1) / 2};
  GROUPMM_CHECK(a.w.dim(1) % 2 == 0 && a.w.dim(1) > 0, op, ": w.shape[1]=", a.w.dim(1),
                " must be 2F (gate and up rows), even and > 0");
  check_dim(op, "w", a.w, 2, d.H);
  check_splits(op, a.splits, d.E, ctx.device());
  check_view(op, "prob", a.prob, DType::fp32, 1, ctx.device());
  check_dim(op, "prob", a.prob, 0, d.R);
  check_view(op, "out", a.out, t, 2, ctx.device());
  check_dim(op, "out", a.out, 0, d.R);
  check_dim(op, "out", a.out, 1, d.F);
  if (a.gate_up.present()) {
    check_view(op, "gate_up", a.gate_up, t, 2, ctx.device());
    check_dim(op, "gate_up", a.gate_up, 0, d.R);
    check_dim(op, "gate_up", a.gate_up, 1, 2 * d.F);
  }
  GROUPMM_CHECK(d.R <= INT32_MAX && d.T <= INT32_MAX, op, ": src_row.shape[0]=", d.R,
                " and x.shape[0]=", d.T, " must fit int32");
  for (const TensorView* o : {&a.out, &a.gate_up}) {
    if (!o->present()) continue;
    for (const TensorView* in : {&a.x, &a.w, &a.src_row, &a.splits, &a.prob})
      GROUPMM_CHECK(!views_overlap(*o, *in), op, ": out and gate_up may not alias an input");
  }
  GROUPMM_CHECK(!a.gate_up.present() || !views_overlap(a.out, a.gate_up), op,
                ": out may not alias gate_up");
  if (ctx.device() == Device::CUDA) {
    GROUPMM_CHECK(d.H % 8 == 0, op, ": x.shape[1]=", d.H,
                  " (H) must be a multiple of 8 on CUDA (16-byte rows)");
    GROUPMM_CHECK(d.F % 64 == 0, op, ": w.shape[1]=", 2 * d.F,
                  " must be 2F with F a multiple of 64 on CUDA (a column tile per half)");
    GROUPMM_CHECK(d.E <= 1024, op, ": w.shape[0]=", d.E, " (experts) must be <= 1024 on CUDA");
    // the kernel's int32 weight rows and tile numbers (tiles of 128 rows by 128 columns at most)
    GROUPMM_CHECK(d.E * 2 * d.F <= INT32_MAX, op, ": w has ", d.E * 2 * d.F,
                  " rows (E * 2F); at most 2^31 - 1 on CUDA");
    GROUPMM_CHECK((d.R / 128 + d.E) * (2 * d.F / 128 + 1) <= INT32_MAX, op, ": R=", d.R,
                  " and F=", d.F, " make more than 2^31 - 1 output tiles");
    GROUPMM_CHECK(
        a.config.empty() || a.config == "pingpong_128x128" ||
            ((a.config == "coop_128x256" || a.config == "coop_128x256_c2") && d.F % 128 == 0),
        op, ": config=\"", a.config,
        "\" must be empty, pingpong_128x128, coop_128x256 or coop_128x256_c2 (the "
        "coop ones with F % 128 == 0; F=",
        d.F, ")");
    // x and w: 16-byte loads; out and gate_up: 16-byte stores of 8 columns
    const std::pair<const TensorView*, const char*> aligned[] = {
        {&a.x, "x"}, {&a.w, "w"}, {&a.out, "out"}, {&a.gate_up, "gate_up"}};
    for (const auto& [v, name] : aligned)
      GROUPMM_CHECK(!v->present() || reinterpret_cast<uintptr_t>(v->data) % 16 == 0, op, ": ", name,
                    " must be 16-byte aligned on CUDA");
  }
  return d;
}

}  // namespace

bool moe_gate_up_swiglu_supported(const Context& ctx, DType dtype, int64_t H, int64_t F,
                                  int64_t E) {
  if (ctx.device() == Device::CPU)
    return dtype == DType::bf16 || dtype == DType::fp16 || dtype == DType::fp32;
  if (dtype != DType::bf16 && dtype != DType::fp16) return false;
  return cuda_kernels_built() && H % 8 == 0 && F % 64 == 0 && F > 0 && E >= 1 && E <= 1024;
}

void moe_gate_up_swiglu(Context& ctx, const MoeGateUpArgs& args) {
  check_gate_up(ctx, args);
  if (ctx.device() == Device::CPU)
    cpu::moe_gate_up_swiglu(ctx, args);
  else
    cuda::moe_gate_up_swiglu(ctx, args);
  ctx.after_op();
}

void moe_permute_sources(Context& ctx, const PermuteMap& map, const TensorView& src_row,
                         const TensorView& weights, const TensorView& probs) {
  const char* op = "moe_permute_sources";
  check_permute_map(ctx, op, map);
  check_view(op, "src_row", src_row, DType::int32, 1, ctx.device());
  check_dim(op, "src_row", src_row, 0, map.rows);
  GROUPMM_CHECK(weights.present() == probs.present(), op,
                ": weights and probs must be given together (weights",
                weights.present() ? " given" : " absent", ")");
  if (weights.present()) {
    check_view(op, "weights", weights, DType::fp32, 2, ctx.device());
    check_dim(op, "weights", weights, 0, map.tokens);
    check_dim(op, "weights", weights, 1, map.topk);
    check_view(op, "probs", probs, DType::fp32, 1, ctx.device());
    check_dim(op, "probs", probs, 0, map.rows);
    GROUPMM_CHECK(!views_overlap(probs, weights) && !views_overlap(probs, src_row) &&
                      !views_overlap(src_row, weights),
                  op, ": src_row, weights and probs may not alias");
  }
  GROUPMM_CHECK(!views_overlap(src_row, map.dest_row), op, ": src_row may not alias map.dest_row");
  if (ctx.device() == Device::CPU)
    cpu::moe_permute_sources(ctx, map, src_row, weights, probs);
  else
    cuda::moe_permute_sources(ctx, map, src_row, weights, probs);
  ctx.after_op();
}

}  // namespace groupmm
