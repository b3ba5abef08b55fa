// Expert-parallel ops: descriptors, validation, the capacity plan's buffers, backend dispatch
// (groupmm/ep.hpp). The throughput plan is ep_plan.cpp's, the movers ep_movers.cpp's.
#include <algorithm>

#include "ep/check.hpp"

namespace groupmm::ep {

std::string EpConfig::to_string() const {
  return groupmm::detail::cat("EpConfig(E=", experts, ", R=", ranks, ", H=", hidden, ", k=", topk,
                              ")");
}

std::string EpCapacity::to_string() const {
  return groupmm::detail::cat("EpCapacity(rows_per_peer=", rows_per_peer,
                              ", entries_per_peer=", entries_per_peer,
                              zero_tail ? "" : ", zero_tail=false", ")");
}

const char* ep_mode_name(EpMode m) {
  return m == EpMode::throughput ? "throughput" : "capacity";
}

std::string EpPlan::to_string() const {
  return groupmm::detail::cat("EpPlan(", ep_mode_name(mode), ", ", cfg.to_string(),
                              mode == EpMode::capacity ? ", " + cap.to_string() : std::string(),
                              ", rank=", rank, ", T=", tokens, ", local_experts=", local_experts,
                              ", rows=", rows, ")");
}

TensorView EpPlan::entry_splits() const {
  return mode == EpMode::capacity ? splits_at_most.view() : splits.view();
}

float ep_dot_order(const float* a, const float* b, int64_t n) {
  float part[detail::kDotLanes];
  const auto av = [a](int64_t h) { return a[h]; };
  const auto bv = [b](int64_t h) { return b[h]; };
  for (int l = 0; l < detail::kDotLanes; ++l) part[l] = detail::dot_lane_partial(l, n, av, bv);
  for (int m = detail::kDotLanes / 2; m >= 1; m /= 2) {
    float next[detail::kDotLanes];
    for (int l = 0; l < detail::kDotLanes; ++l) next[l] = router::add(part[l], part[l ^ m]);
    std::copy(next, next + detail::kDotLanes, part);
  }
  return part[0];
}

namespace check {

void cfg(const char* op, const EpConfig& c, const Transport& tr) {
  GROUPMM_CHECK(c.ranks >= 1 && c.ranks == tr.size(), op, ": cfg.ranks=", c.ranks,
                " must equal the transport's size ", tr.size());
  GROUPMM_CHECK(c.experts >= 1 && c.experts % c.ranks == 0, op, ": cfg.experts=", c.experts,
                " must be >= 1 and divisible by cfg.ranks=", c.ranks);
  GROUPMM_CHECK(c.hidden >= 1, op, ": cfg.hidden=", c.hidden, " must be >= 1");
  GROUPMM_CHECK(c.topk >= 1 && c.topk <= std::min<int64_t>(c.experts, 32), op,
                ": cfg.topk=", c.topk, " must be in 1..min(E=", c.experts, ", 32)");
}

void device(const char* op, const Context& ctx, const Transport& tr) {
  GROUPMM_CHECK(tr.device() == ctx.device(), op, ": the transport's buffers live on ",
                device_name(tr.device()), " but the Context is ", device_name(ctx.device()),
                " (a CUDA Context needs a device transport: NcclTransport or "
                "make_in_process_group(R, Device::CUDA, stream))");
}

void rows(const Context& ctx, const char* op, const char* arg, const TensorView& v, int64_t n,
          int64_t H, DType t) {
  check_view(op, arg, v, t, 2, ctx.device());
  check_dim(op, arg, v, 0, n);
  check_dim(op, arg, v, 1, H);
}

DType row_dtype(const char* op, const char* arg, const TensorView& v) {
  const DType t = v.dtype;
  GROUPMM_CHECK(v.present() && (t == DType::bf16 || t == DType::fp16 || t == DType::fp32), op, ": ",
                arg, ".dtype=", v.present() ? dtype_name(t) : "absent",
                " must be bf16, fp16 or fp32");
  return t;
}

void expert_ids(const Context& ctx, const char* op, const TensorView& ids, int64_t T, int64_t k,
                bool int64_ok) {
  GROUPMM_CHECK(ids.present(), op, ": expert_ids is required");
  GROUPMM_CHECK(ids.dtype == DType::int32 || (int64_ok && ids.dtype == DType::int64), op,
                ": expert_ids.dtype=", dtype_name(ids.dtype), " must be int32",
                int64_ok ? " or int64" : "");
  check_view(op, "expert_ids", ids, ids.dtype, 2, ctx.device());
  if (T >= 0) check_dim(op, "expert_ids", ids, 0, T);
  check_dim(op, "expert_ids", ids, 1, k);
}

void plan(const char* op, const Context& ctx, const EpPlan& p, const Transport& tr) {
  device(op, ctx, tr);
  cfg(op, p.cfg, tr);
  GROUPMM_CHECK(p.rank == tr.rank(), op, ": plan.rank=", p.rank,
                " must equal the transport's rank ", tr.rank());
  const size_t R = size_t(p.cfg.ranks);
  bool ok = p.send_rows.size() == R && p.recv_rows.size() == R && p.back_send.size() == R &&
            p.back_recv.size() == R && p.splits.view().device == ctx.device() &&
            p.splits.numel() == p.local_experts && p.grouped_entry.numel() == p.rows &&
            p.entry_grouped.numel() == std::max<int64_t>(p.recv_total * p.cfg.topk, 1) &&
            p.slot_entry.numel() == p.tokens * p.cfg.topk;
  if (p.mode == EpMode::capacity)
    ok = ok && p.stage_send.view().present() && p.stage_row_bytes > 0 &&
         p.meta_send.view().device == ctx.device() && p.splits_at_most.numel() == p.local_experts;
  GROUPMM_CHECK(ok, op, ": plan is inconsistent or was built for another Context (", p.to_string(),
                "); build it with ep_dispatch_plan or ep_capacity_plan_create");
}

void staging_fits(const char* op, const EpPlan& p, const char* arg, DType t) {
  if (p.mode != EpMode::capacity) return;
  const int64_t need = dtype_storage_bytes(t, p.cfg.hidden);
  GROUPMM_CHECK(need <= p.stage_row_bytes, op, ": ", arg, ".dtype=", dtype_name(t), " needs ", need,
                " bytes a row but the capacity plan was made for ", p.stage_row_bytes,
                " (ep_capacity_plan_create's row_dtype)");
}

}  // namespace check

namespace detail {
Tensor byte_buffer(Context& ctx, int64_t bytes) {
  // int32 elements: 4-byte granules; allocations are 256-byte aligned on both devices.
  return Tensor::empty({std::max<int64_t>((bytes + 3) / 4, 1)}, DType::int32, ctx.device(),
                       ctx.stream());
}

void fill_entry_grouped(Context& ctx, EpPlan& p) {
  const int64_t n = p.recv_total * p.cfg.topk;
  int32_t* out = p.entry_grouped.ptr<int32_t>();
  const int32_t* idx = p.grouped_entry.ptr<int32_t>();
  ctx.device() == Device::CPU ? cpu::ep_invert_index(ctx, out, n, idx, p.rows)
                              : cuda::ep_invert_index(ctx, out, n, idx, p.rows);
}
}  // namespace detail

// ================================================================================================
// Capacity plan
// ================================================================================================

EpPlan ep_capacity_plan_create(Context& ctx, const Transport& tr, const EpConfig& cfg,
                               const EpCapacity& cap, int64_t tokens, DType row_dtype) {
  const char* op = "ep_capacity_plan_create";
  check::device(op, ctx, tr);
  check::cfg(op, cfg, tr);
  const int64_t R = cfg.ranks, k = cfg.topk, El = cfg.experts / cfg.ranks;
  GROUPMM_CHECK(tokens >= 0, op, ": tokens=", tokens, " must be >= 0");
  // The CUDA plan ranks entries by local expert and by peer with moe_permute_plan's kernels (one
  // spare group each: at most 1024 groups).
  GROUPMM_CHECK(ctx.device() == Device::CPU || (El < 1024 && R < 1024), op, ": E / R=", El,
                " and R=", R, " must be < 1024 on CUDA");
  GROUPMM_CHECK(cap.rows_per_peer >= 1, op, ": cap.rows_per_peer=", cap.rows_per_peer,
                " must be >= 1");
  GROUPMM_CHECK(cap.entries_per_peer >= 0, op, ": cap.entries_per_peer=", cap.entries_per_peer,
                " must be >= 0 (0: rows_per_peer * k)");
  GROUPMM_CHECK(row_dtype == DType::bf16 || row_dtype == DType::fp16 || row_dtype == DType::fp32,
                op, ": row_dtype=", dtype_name(row_dtype), " must be bf16, fp16 or fp32");
  const int64_t C = cap.rows_per_peer;
  const int64_t Ce = cap.entries_per_peer > 0 ? cap.entries_per_peer : C * k;
  // int32 indices: every buffer index (entries of received rows, grouped rows, slots) fits.
  GROUPMM_CHECK(R * C * k < INT32_MAX && R * Ce < INT32_MAX && tokens * k < INT32_MAX, op,
                ": R * rows_per_peer * k=", R * C * k, ", R * entries_per_peer=", R * Ce,
                " and tokens * k=", tokens * k, " must fit int32");
  EpPlan p;
  p.cfg = cfg;
  p.mode = EpMode::capacity;
  p.cap = EpCapacity{C, Ce, cap.zero_tail};
  p.rank = tr.rank();
  p.tokens = tokens;
  p.local_experts = El;
  p.rows = R * Ce;
  for (int64_t q = 0; q < R; ++q) {
    p.send_rows.push_back(C);
    p.send_offsets.push_back(q * C);
    p.back_send.push_back(Ce);
    p.back_send_offsets.push_back(q * Ce);
  }
  p.recv_rows = p.send_rows;
  p.recv_offsets = p.send_offsets;
  p.back_recv = p.back_send;
  p.back_recv_offsets = p.back_send_offsets;
  p.send_total = p.recv_total = R * C;
  p.back_send_total = p.back_recv_total = R * Ce;
  const Device d = ctx.device();
  const auto ints = [&](int64_t n) {
    return Tensor::empty({std::max<int64_t>(n, 1)}, DType::int32, d, ctx.stream());
  };
  p.splits = Tensor::empty({El}, DType::int32, d, ctx.stream());
  p.splits_at_most = Tensor::empty({El}, DType::int32, d, ctx.stream());
  p.send_token = ints(R * C);
  p.grouped_entry = Tensor::empty({p.rows}, DType::int32, d, ctx.stream());
  p.entry_grouped = ints(R * C * k);
  p.back_grouped = ints(R * Ce);
  p.slot_entry = Tensor::empty({tokens, k}, DType::int32, d, ctx.stream());
  p.meta_send = ints(R * (1 + C * k));
  p.meta_recv = ints(R * (1 + C * k));
  if (d == Device::CUDA) p.scratch = detail::byte_buffer(ctx, cuda::ep_capacity_scratch_bytes(p));
  p.stage_row_bytes = dtype_storage_bytes(row_dtype, cfg.hidden);
  // Every peer's block but the rank's own: no mover stages that one (movers.hpp).
  const int64_t stage_rows = (R - 1) * std::max(C, Ce);
  p.stage_send = detail::byte_buffer(ctx, stage_rows * p.stage_row_bytes);
  p.stage_recv = detail::byte_buffer(ctx, stage_rows * p.stage_row_bytes);
  const int64_t aux = R * std::max(C * k, Ce) * int64_t(sizeof(float));
  p.stage_aux_send = detail::byte_buffer(ctx, aux);
  p.stage_aux_recv = detail::byte_buffer(ctx, aux);
  return p;
}

void ep_capacity_plan(Context& ctx, Transport& tr, const TensorView& expert_ids, EpPlan& plan) {
  const char* op = "ep_capacity_plan";
  check::plan(op, ctx, plan, tr);
  GROUPMM_CHECK(plan.mode == EpMode::capacity, op, ": plan.mode=", ep_mode_name(plan.mode),
                " must be capacity (make it with ep_capacity_plan_create)");
  check::expert_ids(ctx, op, expert_ids, plan.tokens, plan.cfg.topk, false);
  const bool cpu = ctx.device() == Device::CPU;
  cpu ? cpu::ep_capacity_plan_send(ctx, expert_ids, plan)
      : cuda::ep_capacity_plan_send(ctx, expert_ids, plan);
  // One fixed-size exchange: per peer, the row count, then k local-expert slots per row.
  const int64_t R = plan.cfg.ranks, block = (1 + plan.cap.rows_per_peer * plan.cfg.topk) * 4;
  std::vector<int64_t> counts(static_cast<size_t>(R), block), offsets(static_cast<size_t>(R));
  for (int64_t q = 0; q < R; ++q) offsets[size_t(q)] = q * block;
  tr.all_to_all_v(plan.meta_send.data(), counts.data(), offsets.data(), plan.meta_recv.data(),
                  counts.data(), offsets.data(), ctx.stream());
  cpu ? cpu::ep_capacity_plan_recv(ctx, plan) : cuda::ep_capacity_plan_recv(ctx, plan);
  detail::fill_entry_grouped(ctx, plan);
  ctx.after_op();
}

}  // namespace groupmm::ep
