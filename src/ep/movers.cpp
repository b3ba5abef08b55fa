// The expert-parallel movers (groupmm/ep.hpp: the four of every step and the FP8 dispatch),
// backend-neutral: validate, pack with the backend's gather, exchange through the transport, unpack
// or sum. Either mode: a capacity plan
// brings its staging buffers and fixed per-peer blocks, a throughput plan exact counts (staging is
// allocated here, stream-ordered).
#include <algorithm>

#include "ep/movers.hpp"

namespace groupmm::ep {

using namespace movers;

namespace {

// The send and receive buffers of one mover: the plan's (capacity mode: sized for the largest
// use at creation) or fresh ones.
Stage stage(Context& ctx, const Tensor& plan_send, const Tensor& plan_recv, int64_t send_bytes,
            int64_t recv_bytes) {
  Stage s;
  if (plan_send.view().present()) {  // capacity mode: sized for the largest use at creation
    s.send = plan_send.data();
    s.recv = plan_recv.data();
    return s;
  }
  s.own_send = detail::byte_buffer(ctx, send_bytes);
  s.own_recv = detail::byte_buffer(ctx, recv_bytes);
  s.send = s.own_send.data();
  s.recv = s.own_recv.data();
  return s;
}

}  // namespace

namespace movers {

Stage row_stage(Context& ctx, const EpPlan& p, int64_t send_rows, int64_t recv_rows,
                int64_t row_bytes) {
  return stage(ctx, p.stage_send, p.stage_recv, send_rows * row_bytes, recv_rows * row_bytes);
}

void exchange(Context& ctx, Transport& tr, const void* send, const std::vector<int64_t>& sc,
              const std::vector<int64_t>& so, void* recv, const std::vector<int64_t>& rc,
              const std::vector<int64_t>& ro, int64_t unit) {
  const size_t R = sc.size();
  std::vector<int64_t> b(4 * R);
  for (size_t q = 0; q < R; ++q) {
    b[q] = sc[q] * unit;
    b[R + q] = so[q] * unit;
    b[2 * R + q] = rc[q] * unit;
    b[3 * R + q] = ro[q] * unit;
  }
  tr.all_to_all_v(send, b.data(), b.data() + R, recv, b.data() + 2 * R, b.data() + 3 * R,
                  ctx.stream());
}

Route forward_route(const EpPlan& p) {
  return {p.send_rows, p.send_offsets, p.recv_rows, p.recv_offsets};
}
Route back_route(const EpPlan& p) {
  return {p.back_send, p.back_send_offsets, p.back_recv, p.back_recv_offsets};
}

RecvRows own_rows(const Route& r, int me, const void* recv, int64_t unit, const void* src,
                  int64_t src_stride, const int32_t* idx) {
  RecvRows rows = RecvRows::plain(recv, unit);
  rows.own_src = src;
  rows.own_stride = src_stride;
  rows.own_idx = idx + r.send_offset[size_t(me)];
  rows.own_lo = r.recv_offset[size_t(me)];
  rows.own_n = r.send_count[size_t(me)];
  return rows;
}

namespace {
// The plain gather as a pack: send rows [first, first + n) are src rows idx[first ..].
auto gather_pack(Context& ctx, const void* src, const int32_t* idx, int64_t unit) {
  return [&ctx, src, idx, unit](void* dst, int64_t first, int64_t n) {
    GROUPMM_EP_CALL(ctx, ep_gather_rows, ctx, dst, src, idx + first, n, 1, unit, false);
  };
}
}  // namespace

void gather_and_exchange(Context& ctx, Transport& tr, const Route& r, const void* src,
                         const int32_t* idx, void* send, void* recv, int64_t unit) {
  pack_and_exchange(ctx, tr, r, send, recv, unit, gather_pack(ctx, src, idx, unit));
}

RecvRows gather_others_and_exchange(Context& ctx, Transport& tr, const Route& r, const void* src,
                                    const int32_t* idx, void* send, void* recv, int64_t unit) {
  pack_others_and_exchange(ctx, tr, r, send, recv, unit, gather_pack(ctx, src, idx, unit));
  return own_rows(r, tr.rank(), recv, unit, src, unit, idx);
}

DType check_mover(const char* op, const Context& ctx, const EpPlan& p, const Transport& tr,
                  const char* arg, const TensorView& first) {
  check::plan(op, ctx, p, tr);
  const DType t = check::row_dtype(op, arg, first);
  check::staging_fits(op, p, arg, t);
  return t;
}

void check_floats(const Context& ctx, const char* op, const char* arg, const TensorView& v,
                  int64_t n, int64_t cols) {
  check_view(op, arg, v, DType::fp32, cols > 0 ? 2 : 1, ctx.device());
  check_dim(op, arg, v, 0, n);
  if (cols > 0) check_dim(op, arg, v, 1, cols);
}

void check_no_alias(const char* op, const char* out, const TensorView& o,
                    std::initializer_list<std::pair<const char*, const TensorView*>> ins) {
  for (const auto& [name, v] : ins)
    GROUPMM_CHECK(!v->present() || !o.present() || !views_overlap(o, *v), op, ": ", out,
                  " may not alias ", name);
}

Stage route_stage(Context& ctx, const EpPlan& p, const Route& r, int me, int64_t row_bytes,
                  bool with_recv) {
  return row_stage(ctx, p, others_rows(r.send_count, me),
                   with_recv ? others_rows(r.recv_count, me) : 0, row_bytes);
}

Stage aux_stage(Context& ctx, const EpPlan& p) {
  const int64_t k = p.cfg.topk;
  return stage(ctx, p.stage_aux_send, p.stage_aux_recv,
               std::max(p.send_total * k, p.back_send_total) * 4,
               std::max(p.recv_total * k, p.back_recv_total) * 4);
}

}  // namespace movers

namespace {

// The receive rows into the grouped rows [p.rows, row_bytes]: a scatter (each receive row read
// once for its up to k grouped rows) where the rows no entry names may stay as they were
// (throughput plans have none; capacity plans without zero_tail leave their tail), else the
// gather over every grouped row, which zeroes the tail.
void unpack_rows(Context& ctx, const EpPlan& p, void* grouped, const RecvRows& recv,
                 int64_t row_bytes) {
  if (p.mode == EpMode::throughput || !p.cap.zero_tail)
    GROUPMM_EP_CALL(ctx, ep_scatter_rows, ctx, grouped, row_bytes, recv,
                    p.entry_grouped.ptr<int32_t>(), p.recv_total, p.cfg.topk, row_bytes);
  else
    GROUPMM_EP_CALL(ctx, ep_gather_rows_strided, ctx, grouped, row_bytes, recv,
                    p.grouped_entry.ptr<int32_t>(), p.rows, p.cfg.topk, row_bytes, true);
}

void exchange_back(Context& ctx, Transport& tr, const EpPlan& p, const void* send, void* recv,
                   int64_t unit) {
  exchange(ctx, tr, send, p.back_send, p.back_send_offsets, recv, p.back_recv, p.back_recv_offsets,
           unit);
}

// An optional pair of fp32 tensors, given together or not at all, shaped [rows] (cols 0) or
// [rows, cols]; true when given.
struct FloatArg {
  const char* name;
  const TensorView& v;
  int64_t rows, cols;
};
bool check_float_pair(const Context& ctx, const char* op, const FloatArg& a, const FloatArg& b) {
  GROUPMM_CHECK(a.v.present() == b.v.present(), op, ": ", a.name, " and ", b.name,
                " must be given together (", a.name, a.v.present() ? " given, " : " absent, ",
                b.name, b.v.present() ? " given)" : " absent)");
  if (!a.v.present()) return false;
  for (const FloatArg* f : {&a, &b}) check_floats(ctx, op, f->name, f->v, f->rows, f->cols);
  return true;
}

// weights [T, k] -> aux.recv: the k weights of every received row, along the dispatch's route.
void weights_forward(Context& ctx, Transport& tr, const EpPlan& p, const TensorView& weights,
                     const Stage& aux) {
  const int64_t wb = p.cfg.topk * int64_t(sizeof(float));
  gather_and_exchange(ctx, tr, forward_route(p), weights.data, p.send_token.ptr<int32_t>(),
                      aux.send, aux.recv, wb);
}

// One value per back entry home -> d_weights [T, k] (0 where no entry came back): the values
// of d_probs [rows] (one per grouped row) gathered along the way back, or, with d_probs null, the
// values already in aux.send.
void values_home(Context& ctx, Transport& tr, const EpPlan& p, const Stage& aux,
                 const TensorView& d_weights, const void* d_probs) {
  if (d_probs != nullptr)
    gather_and_exchange(ctx, tr, back_route(p), d_probs, p.back_grouped.ptr<int32_t>(), aux.send,
                        aux.recv, int64_t(sizeof(float)));
  else
    exchange_back(ctx, tr, p, aux.send, aux.recv, int64_t(sizeof(float)));
  GROUPMM_EP_CALL(ctx, ep_gather_rows, ctx, d_weights.data, aux.recv, p.slot_entry.ptr<int32_t>(),
                  p.tokens * p.cfg.topk, 1, int64_t(sizeof(float)), true);
}

// The way back shared by ep_combine and ep_dispatch_backward: every entry's row goes home, which
// sums the k rows of each token in slot order (weighted when w is given).
void back_and_sum(Context& ctx, Transport& tr, const EpPlan& p, const TensorView& rows,
                  const float* w, const TensorView& out, const TensorView& add) {
  const int64_t rb = dtype_storage_bytes(rows.dtype, p.cfg.hidden);
  Stage st = route_stage(ctx, p, back_route(p), tr.rank(), rb);
  const RecvRows back = gather_others_and_exchange(
      ctx, tr, back_route(p), rows.data, p.back_grouped.ptr<int32_t>(), st.send, st.recv, rb);
  GROUPMM_EP_CALL(ctx, ep_weighted_sum, ctx, out, back, p.slot_entry.ptr<int32_t>(), w, p.cfg.topk,
                  add.present() ? add.data : nullptr);
}

}  // namespace

void ep_dispatch(Context& ctx, Transport& tr, const EpPlan& p, const TensorView& x,
                 const TensorView& x_grouped, const TensorView& weights, const TensorView& probs) {
  const char* op = "ep_dispatch";
  const DType t = check_mover(op, ctx, p, tr, "x", x);
  check::rows(ctx, op, "x", x, p.tokens, p.cfg.hidden, t);
  check::rows(ctx, op, "x_grouped", x_grouped, p.rows, p.cfg.hidden, t);
  const bool with_probs = check_float_pair(ctx, op, {"weights", weights, p.tokens, p.cfg.topk},
                                           {"probs", probs, p.rows, 0});
  check_no_alias(op, "x_grouped", x_grouped, {{"x", &x}, {"weights", &weights}});
  check_no_alias(op, "probs", probs, {{"x", &x}, {"weights", &weights}, {"x_grouped", &x_grouped}});
  const int64_t rb = dtype_storage_bytes(t, p.cfg.hidden);
  Stage st = route_stage(ctx, p, forward_route(p), tr.rank(), rb);
  const RecvRows recv = gather_others_and_exchange(
      ctx, tr, forward_route(p), x.data, p.send_token.ptr<int32_t>(), st.send, st.recv, rb);
  // A row two local experts need was received once; it is copied into both groups here.
  const int32_t* entry = p.grouped_entry.ptr<int32_t>();
  unpack_rows(ctx, p, x_grouped.data, recv, rb);
  if (with_probs) {  // each grouped row's weight: its entry (row * k + slot) in the received k-rows
    Stage aux = aux_stage(ctx, p);
    weights_forward(ctx, tr, p, weights, aux);
    GROUPMM_EP_CALL(ctx, ep_gather_rows, ctx, probs.data, aux.recv, entry, p.rows, 1,
                    int64_t(sizeof(float)), p.cap.zero_tail);
  }
  ctx.after_op();
}

void ep_combine(Context& ctx, Transport& tr, const EpPlan& p, const TensorView& y_grouped,
                const TensorView& weights, const TensorView& out, const TensorView& add) {
  const char* op = "ep_combine";
  const DType t = check_mover(op, ctx, p, tr, "y_grouped", y_grouped);
  check::rows(ctx, op, "y_grouped", y_grouped, p.rows, p.cfg.hidden, t);
  if (weights.present()) check_floats(ctx, op, "weights", weights, p.tokens, p.cfg.topk);
  check::rows(ctx, op, "out", out, p.tokens, p.cfg.hidden, t);
  if (add.present()) check::rows(ctx, op, "add", add, p.tokens, p.cfg.hidden, t);
  check_no_alias(op, "out", out, {{"y_grouped", &y_grouped}, {"weights", &weights}, {"add", &add}});
  back_and_sum(ctx, tr, p, y_grouped, weights.present() ? weights.ptr<float>() : nullptr, out, add);
  ctx.after_op();
}

void ep_dispatch_backward(Context& ctx, Transport& tr, const EpPlan& p,
                          const TensorView& d_x_grouped, const TensorView& dx,
                          const TensorView& d_probs, const TensorView& d_weights,
                          const TensorView& add) {
  const char* op = "ep_dispatch_backward";
  const DType t = check_mover(op, ctx, p, tr, "d_x_grouped", d_x_grouped);
  check::rows(ctx, op, "d_x_grouped", d_x_grouped, p.rows, p.cfg.hidden, t);
  check::rows(ctx, op, "dx", dx, p.tokens, p.cfg.hidden, t);
  if (add.present()) check::rows(ctx, op, "add", add, p.tokens, p.cfg.hidden, t);
  const bool with_probs = check_float_pair(ctx, op, {"d_probs", d_probs, p.rows, 0},
                                           {"d_weights", d_weights, p.tokens, p.cfg.topk});
  check_no_alias(op, "dx", dx,
                 {{"d_x_grouped", &d_x_grouped}, {"d_probs", &d_probs}, {"add", &add}});
  check_no_alias(op, "d_weights", d_weights,
                 {{"d_x_grouped", &d_x_grouped}, {"d_probs", &d_probs}, {"dx", &dx}});
  back_and_sum(ctx, tr, p, d_x_grouped, nullptr, dx, add);
  if (with_probs)  // each entry's d_prob goes home like its gradient row
    values_home(ctx, tr, p, aux_stage(ctx, p), d_weights, d_probs.data);
  ctx.after_op();
}

void ep_combine_backward(Context& ctx, Transport& tr, const EpPlan& p, const TensorView& dy,
                         const TensorView& weights, const TensorView& y_grouped,
                         const TensorView& d_y_grouped, const TensorView& d_weights) {
  const char* op = "ep_combine_backward";
  const DType t = check_mover(op, ctx, p, tr, "dy", dy);
  const int64_t H = p.cfg.hidden, k = p.cfg.topk;
  check::rows(ctx, op, "dy", dy, p.tokens, H, t);
  const bool weighted = check_float_pair(ctx, op, {"weights", weights, p.tokens, k},
                                         {"d_weights", d_weights, p.tokens, k});
  if (weighted) check::rows(ctx, op, "y_grouped", y_grouped, p.rows, H, t);
  check::rows(ctx, op, "d_y_grouped", d_y_grouped, p.rows, H, t);
  check_no_alias(op, "d_y_grouped", d_y_grouped,
                 {{"dy", &dy}, {"weights", &weights}, {"y_grouped", &y_grouped}});
  check_no_alias(op, "d_weights", d_weights,
                 {{"dy", &dy},
                  {"weights", &weights},
                  {"y_grouped", &y_grouped},
                  {"d_y_grouped", &d_y_grouped}});
  // dy (and the k weights) of each token go to its expert ranks along the dispatch's route.
  const int64_t rb = dtype_storage_bytes(t, H);
  Stage st = route_stage(ctx, p, forward_route(p), tr.rank(), rb);
  const RecvRows recv = gather_others_and_exchange(
      ctx, tr, forward_route(p), dy.data, p.send_token.ptr<int32_t>(), st.send, st.recv, rb);
  if (!weighted) {  // the dispatch's unpack of dy
    unpack_rows(ctx, p, d_y_grouped.data, recv, rb);
    ctx.after_op();
    return;
  }
  // Expert side: d_y_grouped, and one d_weight per entry (written over the sent weights), which
  // go home (dropped slots get 0).
  const Stage aux = aux_stage(ctx, p);
  weights_forward(ctx, tr, p, weights, aux);
  GROUPMM_EP_CALL(ctx, ep_combine_backward_expert, ctx, p, recv,
                  static_cast<const float*>(aux.recv), y_grouped, d_y_grouped,
                  static_cast<float*>(aux.send), p.cap.zero_tail);
  values_home(ctx, tr, p, aux, d_weights, nullptr);
  ctx.after_op();
}

// ---- FP8 dispatch -------------------------------------------------------------------------------

namespace {

// One quantized operand of ep_dispatch_fp8: fp8_block rowwise 1x128, plain fp32 scales, [n, H].
void check_fp8_rows(const Context& ctx, const char* op, const char* arg, const GroupedTensor& q,
                    int64_t n, int64_t H, DType data_dtype) {
  GROUPMM_CHECK(q.recipe == QuantRecipe::fp8_block && !q.block_2d, op, ": ", arg,
                ".recipe=", recipe_name(q.recipe), q.block_2d ? " (block_2d)" : "",
                " must be fp8_block with 1x128 blocks (ep_fp8_dispatch_config())");
  GROUPMM_CHECK(q.scale_layout == ScaleLayout::plain, op, ": ", arg,
                ".scale_layout=", scale_layout_name(q.scale_layout),
                " must be plain (the layout the FP8 block GEMM reads)");
  const std::string d = groupmm::detail::cat(arg, ".data");
  const std::string sc = groupmm::detail::cat(arg, ".scale_inv");
  check_view(op, d.c_str(), q.data, data_dtype, 2, ctx.device());
  check_dim(op, d.c_str(), q.data, 0, n);
  check_dim(op, d.c_str(), q.data, 1, H);
  check_view(op, sc.c_str(), q.scale_inv, DType::fp32, 2, ctx.device());
  check_dim(op, sc.c_str(), q.scale_inv, 0, n);
  check_dim(op, sc.c_str(), q.scale_inv, 1, H / 128);
}

}  // namespace

QuantizeConfig ep_fp8_dispatch_config(bool pow2_scales) {
  QuantizeConfig c;
  c.recipe = QuantRecipe::fp8_block;
  c.fp8_dtype = DType::fp8e4m3;
  c.pow2_scales = pow2_scales;
  c.direction = QuantDirection::rowwise;
  c.scale_layout = ScaleLayout::plain;
  return c;
}

int64_t ep_fp8_wire_row_bytes(int64_t hidden) {
  return (hidden + hidden / 128 * int64_t(sizeof(float)) + 15) / 16 * 16;
}

GroupedTensor ep_dispatch_fp8(Context& ctx, Transport& tr, const EpPlan& p,
                              const GroupedTensor& x_q, const GroupedTensor& x_grouped,
                              const TensorView& weights, const TensorView& probs) {
  const char* op = "ep_dispatch_fp8";
  check::plan(op, ctx, p, tr);
  const int64_t H = p.cfg.hidden, k = p.cfg.topk;
  GROUPMM_CHECK(H % 128 == 0, op, ": cfg.hidden=", H,
                " must be a multiple of 128 (the fp8_block rowwise block)");
  GROUPMM_CHECK(x_q.data.present(), op, ": x_q.data is required (the rowwise copy of x)");
  const DType dt = x_q.data.dtype;
  GROUPMM_CHECK(dt == DType::fp8e4m3 || dt == DType::fp8e5m2, op,
                ": x_q.data.dtype=", dtype_name(dt), " must be fp8e4m3 or fp8e5m2");
  check_fp8_rows(ctx, op, "x_q", x_q, p.tokens, H, dt);
  check_fp8_rows(ctx, op, "x_grouped", x_grouped, p.rows, H, dt);
  const int64_t wire = ep_fp8_wire_row_bytes(H), sb = H / 128 * int64_t(sizeof(float));
  GROUPMM_CHECK(p.mode != EpMode::capacity || wire <= p.stage_row_bytes, op,
                ": an FP8 row of H=", H, " needs ", wire,
                " wire bytes but the capacity plan was made for ", p.stage_row_bytes,
                " (ep_capacity_plan_create's row_dtype)");
  const bool with_probs =
      check_float_pair(ctx, op, {"weights", weights, p.tokens, k}, {"probs", probs, p.rows, 0});
  check_no_alias(op, "x_grouped.data", x_grouped.data,
                 {{"x_q.data", &x_q.data},
                  {"x_q.scale_inv", &x_q.scale_inv},
                  {"weights", &weights},
                  {"x_grouped.scale_inv", &x_grouped.scale_inv}});
  check_no_alias(
      op, "x_grouped.scale_inv", x_grouped.scale_inv,
      {{"x_q.data", &x_q.data}, {"x_q.scale_inv", &x_q.scale_inv}, {"weights", &weights}});
  check_no_alias(op, "probs", probs,
                 {{"x_q.data", &x_q.data},
                  {"x_q.scale_inv", &x_q.scale_inv},
                  {"weights", &weights},
                  {"x_grouped.data", &x_grouped.data},
                  {"x_grouped.scale_inv", &x_grouped.scale_inv}});
  // Pack: one wire row per sent token, the H fp8 bytes then its H / 128 fp32 scales (padded to 16
  // bytes), so data and scales travel in one exchange.
  const Route fwd = forward_route(p);
  Stage st = route_stage(ctx, p, fwd, tr.rank(), wire);
  const char* recv = static_cast<const char*>(st.recv);
  const int32_t* tok = p.send_token.ptr<int32_t>();
  pack_others_and_exchange(
      ctx, tr, fwd, st.send, st.recv, wire, [&](void* dst, int64_t first, int64_t n) {
        char* d = static_cast<char*>(dst);
        const int32_t* t = tok + first;
        GROUPMM_EP_CALL(ctx, ep_gather_rows_strided, ctx, d, wire,
                        RecvRows::plain(x_q.data.data, H), t, n, 1, H, false);
        GROUPMM_EP_CALL(ctx, ep_gather_rows_strided, ctx, d + H, wire,
                        RecvRows::plain(x_q.scale_inv.data, sb), t, n, 1, sb, false);
      });
  // Unpack straight into the GEMM's operand: rows and scales grouped by local expert (the own
  // block's read in place from x_q).
  const int32_t* entry = p.grouped_entry.ptr<int32_t>();
  const int me = tr.rank();
  GROUPMM_EP_CALL(ctx, ep_gather_rows_strided, ctx, x_grouped.data.data, H,
                  own_rows(fwd, me, recv, wire, x_q.data.data, H, tok), entry, p.rows, k, H,
                  p.cap.zero_tail);
  GROUPMM_EP_CALL(ctx, ep_gather_rows_strided, ctx, x_grouped.scale_inv.data, sb,
                  own_rows(fwd, me, recv + H, wire, x_q.scale_inv.data, sb, tok), entry, p.rows, k,
                  sb, p.cap.zero_tail);
  if (with_probs) {
    Stage aux = aux_stage(ctx, p);
    weights_forward(ctx, tr, p, weights, aux);
    GROUPMM_EP_CALL(ctx, ep_gather_rows, ctx, probs.data, aux.recv, entry, p.rows, 1,
                    int64_t(sizeof(float)), p.cap.zero_tail);
  }
  ctx.after_op();
  GroupedTensor out = x_grouped;
  out.num_groups = p.local_experts;
  out.splits = p.splits.view();
  out.recipe = QuantRecipe::fp8_block;
  out.scale_layout = ScaleLayout::plain;
  out.block_2d = false;
  return out;
}

}  // namespace groupmm::ep
