// The expert-parallel movers of a chunked step (groupmm/ep.hpp: ep_combine_chunk / _finish,
// ep_dispatch_backward_chunk / _finish): each chunk's rows go home into its part of the chunked
// plan's buffers, then one fixed-order sum over every chunk.
#include "ep/movers.hpp"

namespace groupmm::ep {

using namespace movers;

namespace {

const EpPlan& chunk_plan(const char* op, const EpChunkedPlan& cp, int64_t c) {
  GROUPMM_CHECK(cp.chunks >= 1 && cp.plans.size() == size_t(cp.chunks) &&
                    cp.back_base.size() == size_t(cp.chunks + 1),
                op, ": plan is not a chunked plan (", cp.to_string(),
                "); build it with ep_dispatch_plan_chunked or ep_capacity_plan_chunked_create");
  GROUPMM_CHECK(c >= 0 && c < cp.chunks, op, ": chunk=", c, " must be in [0, chunks=", cp.chunks,
                ")");
  return cp.plans[size_t(c)];
}

// The back buffers hold rows of the widest dtype the plan was made for.
void check_back_fits(const char* op, const EpChunkedPlan& cp, const char* arg, DType t) {
  const int64_t need = dtype_storage_bytes(t, cp.plans[0].cfg.hidden);
  GROUPMM_CHECK(need <= cp.back_row_bytes, op, ": ", arg, ".dtype=", dtype_name(t), " needs ", need,
                " bytes a row but the chunked plan was made for ", cp.back_row_bytes,
                " (its row_dtype)");
}

// Chunk c's rows [p.rows, H] home, into its part of cp.back_rows (rows of t's width).
void chunk_rows_home(Context& ctx, Transport& tr, const EpChunkedPlan& cp, int64_t c,
                     const TensorView& rows, DType t) {
  const EpPlan& p = cp.plans[size_t(c)];
  const int64_t rb = dtype_storage_bytes(t, p.cfg.hidden);
  Stage st =
      route_stage(ctx, p, back_route(p), tr.rank(), rb, false);  // received into cp.back_rows
  char* recv = static_cast<char*>(cp.back_rows.data()) + cp.back_base[size_t(c)] * rb;
  gather_and_exchange(ctx, tr, back_route(p), rows.data, p.back_grouped.ptr<int32_t>(), st.send,
                      recv, rb);
}

// The checks of a finish op (no exchange: the plan's device is the Context's) and of its output
// `out` [T, H]; returns out's dtype.
DType check_finish(const char* op, const Context& ctx, const EpChunkedPlan& cp, const char* arg,
                   const TensorView& out) {
  (void)chunk_plan(op, cp, 0);
  GROUPMM_CHECK(cp.slot_entry.view().device == ctx.device(), op,
                ": plan was built for another Context (", cp.to_string(), ")");
  const DType t = check::row_dtype(op, arg, out);
  check::rows(ctx, op, arg, out, cp.tokens(), cp.plans[0].cfg.hidden, t);
  check_back_fits(op, cp, arg, t);
  return t;
}

// The finish ops' sum: out[t] = every chunk's rows of token t from the way back, in slot order
// (weighted by w when given), + add[t].
void sum_home(Context& ctx, const EpChunkedPlan& cp, const TensorView& out, const float* w,
              const TensorView& add) {
  const EpConfig& cfg = cp.plans[0].cfg;
  const int64_t rb = dtype_storage_bytes(out.dtype, cfg.hidden);
  GROUPMM_EP_CALL(ctx, ep_weighted_sum, ctx, out, RecvRows::plain(cp.back_rows.data(), rb),
                  cp.slot_entry.ptr<int32_t>(), w, cfg.topk, add.present() ? add.data : nullptr);
}

}  // namespace

void ep_combine_chunk(Context& ctx, Transport& tr, EpChunkedPlan& cp, int64_t c,
                      const TensorView& y_grouped) {
  const char* op = "ep_combine_chunk";
  const EpPlan& p = chunk_plan(op, cp, c);
  const DType t = check_mover(op, ctx, p, tr, "y_grouped", y_grouped);
  check::rows(ctx, op, "y_grouped", y_grouped, p.rows, p.cfg.hidden, t);
  check_back_fits(op, cp, "y_grouped", t);
  chunk_rows_home(ctx, tr, cp, c, y_grouped, t);
  ctx.after_op();
}

void ep_combine_finish(Context& ctx, const EpChunkedPlan& cp, const TensorView& weights,
                       const TensorView& out, const TensorView& add) {
  const char* op = "ep_combine_finish";
  const DType t = check_finish(op, ctx, cp, "out", out);
  const EpConfig& cfg = cp.plans[0].cfg;
  if (weights.present()) check_floats(ctx, op, "weights", weights, cp.tokens(), cfg.topk);
  if (add.present()) check::rows(ctx, op, "add", add, cp.tokens(), cfg.hidden, t);
  check_no_alias(op, "out", out, {{"weights", &weights}, {"add", &add}});
  sum_home(ctx, cp, out, weights.present() ? weights.ptr<float>() : nullptr, add);
  ctx.after_op();
}

void ep_dispatch_backward_chunk(Context& ctx, Transport& tr, EpChunkedPlan& cp, int64_t c,
                                const TensorView& d_x_grouped, const TensorView& d_probs) {
  const char* op = "ep_dispatch_backward_chunk";
  const EpPlan& p = chunk_plan(op, cp, c);
  const DType t = check_mover(op, ctx, p, tr, "d_x_grouped", d_x_grouped);
  check::rows(ctx, op, "d_x_grouped", d_x_grouped, p.rows, p.cfg.hidden, t);
  check_back_fits(op, cp, "d_x_grouped", t);
  if (d_probs.present()) check_floats(ctx, op, "d_probs", d_probs, p.rows, 0);
  chunk_rows_home(ctx, tr, cp, c, d_x_grouped, t);
  if (d_probs.present()) {  // each entry's d_prob goes home like its gradient row
    Stage aux = aux_stage(ctx, p);
    float* recv = static_cast<float*>(cp.back_values.data()) + cp.back_base[size_t(c)];
    gather_and_exchange(ctx, tr, back_route(p), d_probs.data, p.back_grouped.ptr<int32_t>(),
                        aux.send, recv, int64_t(sizeof(float)));
  }
  ctx.after_op();
}

void ep_dispatch_backward_finish(Context& ctx, const EpChunkedPlan& cp, const TensorView& dx,
                                 const TensorView& d_weights, const TensorView& add) {
  const char* op = "ep_dispatch_backward_finish";
  const DType t = check_finish(op, ctx, cp, "dx", dx);
  const EpConfig& cfg = cp.plans[0].cfg;
  if (add.present()) check::rows(ctx, op, "add", add, cp.tokens(), cfg.hidden, t);
  if (d_weights.present()) check_floats(ctx, op, "d_weights", d_weights, cp.tokens(), cfg.topk);
  check_no_alias(op, "dx", dx, {{"add", &add}, {"d_weights", &d_weights}});
  sum_home(ctx, cp, dx, nullptr, add);
  if (d_weights.present())  // dropped or absent slots get 0
    GROUPMM_EP_CALL(ctx, ep_gather_rows, ctx, d_weights.data, cp.back_values.data(),
                    cp.slot_entry.ptr<int32_t>(), cp.tokens() * cfg.topk, 1, int64_t(sizeof(float)),
                    true);
  ctx.after_op();
}

}  // namespace groupmm::ep
