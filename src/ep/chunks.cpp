// The chunked plans (groupmm/ep.hpp, EpChunkedPlan): one ordinary plan per chunk of local experts,
// built from the ids with the other chunks' experts set to -1 and the chunk's renumbered from 0,
// then every chunk's slots merged into one map of the concatenated way back. The chunk movers are
// movers.cpp's.
#include <algorithm>

#include "ep/check.hpp"

namespace groupmm::ep {

#define GROUPMM_EP_CALL(ctx, fn, ...) \
  ((ctx).device() == Device::CPU ? cpu::fn(__VA_ARGS__) : cuda::fn(__VA_ARGS__))

namespace {

void check_chunks(const char* op, const EpConfig& cfg, int64_t n) {
  const int64_t El = cfg.experts / cfg.ranks;
  GROUPMM_CHECK(n >= 1 && n <= El, op, ": chunks=", n, " must be in [1, E / R=", El,
                "] (every chunk holds at least one local expert)");
}

void check_row_dtype(const char* op, DType t) {
  GROUPMM_CHECK(t == DType::bf16 || t == DType::fp16 || t == DType::fp32, op,
                ": row_dtype=", dtype_name(t), " must be bf16, fp16 or fp32");
}

// The chunk bounds and the ids scratch; plans come later.
EpChunkedPlan skeleton(Context& ctx, const EpConfig& cfg, int64_t n, int64_t T, DType row_dtype) {
  EpChunkedPlan cp;
  const int64_t El = cfg.experts / cfg.ranks;
  cp.chunks = n;
  for (int64_t c = 0; c <= n; ++c) cp.first_local.push_back(c * El / n);
  cp.ids = Tensor::empty({T, cfg.topk}, DType::int32, ctx.device(), ctx.stream());
  cp.slot_entry = Tensor::empty({T, cfg.topk}, DType::int32, ctx.device(), ctx.stream());
  cp.back_row_bytes = dtype_storage_bytes(row_dtype, cfg.hidden);
  return cp;
}

// Chunk c's ids into the scratch; returns its view.
TensorView chunk_ids(Context& ctx, EpChunkedPlan& cp, const EpConfig& cfg,
                     const TensorView& expert_ids, int64_t c) {
  const int64_t El = cfg.experts / cfg.ranks;
  GROUPMM_EP_CALL(ctx, ep_chunk_ids, ctx, cp.ids.ptr<int32_t>(), expert_ids, cfg.experts, El,
                  cp.first_local[size_t(c)], cp.first_local[size_t(c + 1)]);
  return cp.ids.view();
}

// Row and way-back bases from the plans, and the way back's buffers (allocated here: throughput
// plans are not graph safe anyway, capacity plans are made once).
void finish_layout(Context& ctx, EpChunkedPlan& cp) {
  cp.row_base.assign(1, 0);
  cp.back_base.assign(1, 0);
  for (const EpPlan& p : cp.plans) {
    cp.row_base.push_back(cp.row_base.back() + p.rows);
    cp.back_base.push_back(cp.back_base.back() + p.back_recv_total);
  }
  const int64_t back = cp.back_base.back();
  cp.back_rows = detail::byte_buffer(ctx, back * cp.back_row_bytes);
  cp.back_values = detail::byte_buffer(ctx, back * int64_t(sizeof(float)));
}

// slot_entry: every chunk's slots into the concatenated way back (a slot names one chunk's expert
// at most, so the merge order does not matter).
void merge_slots(Context& ctx, EpChunkedPlan& cp) {
  const int64_t n = cp.slot_entry.numel();
  for (int64_t c = 0; c < cp.chunks; ++c)
    GROUPMM_EP_CALL(ctx, ep_merge_slots, ctx, cp.slot_entry.ptr<int32_t>(),
                    cp.plans[size_t(c)].slot_entry.ptr<int32_t>(), n, cp.back_base[size_t(c)],
                    c == 0);
}

}  // namespace

TensorView EpChunkedPlan::splits(int64_t c) const {
  const Tensor& s = plans[size_t(c)].splits;
  return TensorView(s.data(), DType::int32, s.view().device, {experts_of(c)});
}

TensorView EpChunkedPlan::entry_splits(int64_t c) const {
  const TensorView s = plans[size_t(c)].entry_splits();
  return TensorView(s.data, DType::int32, s.device, {experts_of(c)});
}

std::string EpChunkedPlan::to_string() const {
  return groupmm::detail::cat("EpChunkedPlan(chunks=", chunks, ", rows=", rows(),
                              plans.empty() ? std::string() : ", " + plans[0].to_string(), ")");
}

EpChunkedPlan ep_dispatch_plan_chunked(Context& ctx, Transport& tr, const EpConfig& cfg,
                                       const TensorView& expert_ids, int64_t chunks,
                                       DType row_dtype) {
  const char* op = "ep_dispatch_plan_chunked";
  check::device(op, ctx, tr);
  check::cfg(op, cfg, tr);
  check::expert_ids(ctx, op, expert_ids, -1, cfg.topk, true);
  check_chunks(op, cfg, chunks);
  check_row_dtype(op, row_dtype);
  EpChunkedPlan cp = skeleton(ctx, cfg, chunks, expert_ids.dim(0), row_dtype);
  for (int64_t c = 0; c < chunks; ++c)
    cp.plans.push_back(ep_dispatch_plan(ctx, tr, cfg, chunk_ids(ctx, cp, cfg, expert_ids, c)));
  finish_layout(ctx, cp);
  merge_slots(ctx, cp);
  ctx.after_op();
  return cp;
}

EpChunkedPlan ep_capacity_plan_chunked_create(Context& ctx, const Transport& tr,
                                              const EpConfig& cfg, const EpCapacity& cap,
                                              int64_t chunks, int64_t tokens, DType row_dtype) {
  const char* op = "ep_capacity_plan_chunked_create";
  check::device(op, ctx, tr);
  check::cfg(op, cfg, tr);
  check_chunks(op, cfg, chunks);
  check_row_dtype(op, row_dtype);
  GROUPMM_CHECK(tokens >= 0, op, ": tokens=", tokens, " must be >= 0");
  EpChunkedPlan cp = skeleton(ctx, cfg, chunks, tokens, row_dtype);
  for (int64_t c = 0; c < chunks; ++c)
    cp.plans.push_back(ep_capacity_plan_create(ctx, tr, cfg, cap, tokens, row_dtype));
  finish_layout(ctx, cp);
  return cp;
}

void ep_capacity_plan_chunked(Context& ctx, Transport& tr, const TensorView& expert_ids,
                              EpChunkedPlan& cp) {
  const char* op = "ep_capacity_plan_chunked";
  GROUPMM_CHECK(cp.chunks >= 1 && cp.plans.size() == size_t(cp.chunks) &&
                    cp.plans[0].mode == EpMode::capacity,
                op, ": plan is not a capacity plan (", cp.to_string(),
                "); make it with ep_capacity_plan_chunked_create");
  const EpConfig& cfg = cp.plans[0].cfg;
  check::expert_ids(ctx, op, expert_ids, cp.tokens(), cfg.topk, false);
  for (int64_t c = 0; c < cp.chunks; ++c)
    ep_capacity_plan(ctx, tr, chunk_ids(ctx, cp, cfg, expert_ids, c), cp.plans[size_t(c)]);
  merge_slots(ctx, cp);
  ctx.after_op();
}

}  // namespace groupmm::ep
