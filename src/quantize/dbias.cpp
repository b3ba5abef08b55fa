// group_dbias: validation and backend dispatch.
#include "quantize/dbias_backends.hpp"

namespace groupmm {

static void validate_dbias(const Context& ctx, const TensorView& dy, const TensorView& splits,
                           const TensorView& db, bool accumulate) {
  const char* op = "group_dbias";
  GROUPMM_CHECK(dy.present(), op, ": dy is required");
  const DType t = dy.dtype;
  GROUPMM_CHECK(t == DType::bf16 || t == DType::fp16 || t == DType::fp32, op,
                ": dy.dtype=", dtype_name(t), " must be bf16, fp16 or fp32");
  check_view(op, "dy", dy, t, 2, ctx.device());
  GROUPMM_CHECK(db.present(), op, ": db is required");
  GROUPMM_CHECK(db.dtype == DType::fp32 || db.dtype == t, op, ": db.dtype=", dtype_name(db.dtype),
                " must be fp32 or dy's dtype ", dtype_name(t));
  check_view(op, "db", db, db.dtype, 2, ctx.device());
  const int64_t G = db.dim(0);
  GROUPMM_CHECK(G >= 1, op, ": number of groups G=db.shape[0]=", G, " must be >= 1");
  check_dim(op, "db", db, 1, dy.dim(1));
  check_splits(op, splits, G, ctx.device());
  GROUPMM_CHECK(!accumulate || db.dtype == DType::fp32, op,
                ": accumulate=true needs an fp32 db, got ", dtype_name(db.dtype));
}

size_t group_dbias_workspace_size(const Context& ctx, int64_t M, int64_t N, int64_t G) {
  GROUPMM_CHECK(M >= 0 && N >= 0 && G >= 1, "group_dbias_workspace_size: M=", M, ", N=", N,
                ", G=", G, " must be >= 0, >= 0, >= 1");
  return ctx.device() == Device::CUDA ? cuda::group_dbias_workspace_size(M, N, G) : 0;
}

void group_dbias(Context& ctx, const TensorView& dy, const TensorView& splits, const TensorView& db,
                 bool accumulate, void* workspace, size_t ws_bytes) {
  group_dbias(ctx, dy, splits, db, accumulate, SplitsTotal::exact, workspace, ws_bytes);
}

void group_dbias(Context& ctx, const TensorView& dy, const TensorView& splits, const TensorView& db,
                 bool accumulate, SplitsTotal total, void* workspace, size_t ws_bytes) {
  validate_dbias(ctx, dy, splits, db, accumulate);
  if (ctx.device() == Device::CPU) {
    cpu::group_dbias(ctx, dy, splits, db, accumulate, total);
  } else {
    const size_t need = cuda::group_dbias_workspace_size(dy.dim(0), dy.dim(1), db.dim(0));
    if (workspace == nullptr) {
      workspace = ctx.workspace(need);
      ws_bytes = ctx.workspace_size();
    }
    GROUPMM_CHECK(ws_bytes >= need, "group_dbias: workspace_bytes=", ws_bytes, " must be >= ", need,
                  " (group_dbias_workspace_size)");
    cuda::group_dbias(ctx, dy, splits, db, accumulate, total, workspace, ws_bytes);
  }
  ctx.after_op();
}

}  // namespace groupmm
