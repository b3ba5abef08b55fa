// Expert-parallel dispatch / combine: validation and backend dispatch (groupmm/ep.hpp).
#include <algorithm>

#include "core/ep_impl.hpp"

namespace groupmm::ep {

std::string EpConfig::to_string() const {
  return detail::cat("EpConfig(E=", experts, ", R=", ranks, ", H=", hidden, ", k=", topk, ")");
}

std::string EpPlan::to_string() const {
  return detail::cat("EpPlan(", cfg.to_string(), ", rank=", rank, ", T=", tokens,
                     ", local_experts=", local_experts, ", rows_received=", rows_received,
                     ", rows=", rows, ")");
}

namespace {

void check_cfg(const char* op, const EpConfig& cfg, const Transport& tr) {
  GROUPMM_CHECK(cfg.ranks >= 1 && cfg.ranks == tr.size(), op, ": cfg.ranks=", cfg.ranks,
                " must equal the transport's size ", tr.size());
  GROUPMM_CHECK(cfg.experts >= 1 && cfg.experts % cfg.ranks == 0, op, ": cfg.experts=", cfg.experts,
                " must be >= 1 and divisible by cfg.ranks=", cfg.ranks);
  GROUPMM_CHECK(cfg.hidden >= 1, op, ": cfg.hidden=", cfg.hidden, " must be >= 1");
  GROUPMM_CHECK(cfg.topk >= 1 && cfg.topk <= std::min<int64_t>(cfg.experts, 32), op,
                ": cfg.topk=", cfg.topk, " must be in 1..min(E=", cfg.experts, ", 32)");
}

// The CUDA backend comes with the NCCL transport; until then a CUDA Context is refused up front.
void check_device(const char* op, const Context& ctx) {
  GROUPMM_CHECK(ctx.device() == Device::CPU, op, ": not implemented yet on CUDA (the Context is ",
                device_name(ctx.device()), "; use a CPU Context)");
}

// The common checks of a collective that moves rows: CPU Context, this rank's plan, and the
// row tensor whose dtype the others must share (bf16, fp16 or fp32: moved as bytes).
void check_collective(const char* op, const Context& ctx, const EpPlan& plan, const Transport& tr,
                      const char* arg, const TensorView& rows);

void check_rows(const char* op, const char* arg, const TensorView& v, int64_t rows, int64_t H,
                DType t) {
  check_view(op, arg, v, t, 2, Device::CPU);
  check_dim(op, arg, v, 0, rows);
  check_dim(op, arg, v, 1, H);
}

// The plan a caller passes back must be the one ep_dispatch_plan built on this rank.
void check_plan(const char* op, const EpPlan& p, const Transport& tr) {
  check_cfg(op, p.cfg, tr);
  GROUPMM_CHECK(p.rank == tr.rank(), op, ": plan.rank=", p.rank,
                " must equal the transport's rank ", tr.rank());
  GROUPMM_CHECK(int64_t(p.grouped_src.size()) == p.rows &&
                    int64_t(p.back_grouped.size()) == p.rows &&
                    int64_t(p.back_slot.size()) <= p.tokens * p.cfg.topk,
                op, ": plan is inconsistent (", p.to_string(), "); build it with ep_dispatch_plan");
}

void check_collective(const char* op, const Context& ctx, const EpPlan& plan, const Transport& tr,
                      const char* arg, const TensorView& rows) {
  check_device(op, ctx);
  check_plan(op, plan, tr);
  const DType t = rows.dtype;
  GROUPMM_CHECK(rows.present() && (t == DType::bf16 || t == DType::fp16 || t == DType::fp32), op,
                ": ", arg, ".dtype=", rows.present() ? dtype_name(t) : "absent",
                " must be bf16, fp16 or fp32");
}

}  // namespace

EpPlan ep_dispatch_plan(Context& ctx, Transport& tr, const EpConfig& cfg,
                        const TensorView& expert_ids) {
  const char* op = "ep_dispatch_plan";
  check_device(op, ctx);
  check_cfg(op, cfg, tr);
  GROUPMM_CHECK(expert_ids.present(), op, ": expert_ids is required");
  GROUPMM_CHECK(expert_ids.dtype == DType::int32 || expert_ids.dtype == DType::int64, op,
                ": expert_ids.dtype=", dtype_name(expert_ids.dtype), " must be int32 or int64");
  check_view(op, "expert_ids", expert_ids, expert_ids.dtype, 2, Device::CPU);
  check_dim(op, "expert_ids", expert_ids, 1, cfg.topk);
  // Host memory on the CPU backend: a bad id is an argument error, raised before any exchange.
  const int64_t n = expert_ids.numel();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t e = expert_ids.dtype == DType::int32 ? expert_ids.ptr<int32_t>()[i]
                                                       : expert_ids.ptr<int64_t>()[i];
    GROUPMM_CHECK(e >= 0 && e < cfg.experts, op, ": expert_ids[", i / cfg.topk, ", ", i % cfg.topk,
                  "]=", e, " must be in [0, ", cfg.experts, ")");
  }
  EpPlan plan = cpu::ep_dispatch_plan(ctx, tr, cfg, expert_ids);
  ctx.after_op();
  return plan;
}

void ep_dispatch(Context& ctx, Transport& tr, const EpPlan& plan, const TensorView& x,
                 const TensorView& x_grouped) {
  const char* op = "ep_dispatch";
  check_collective(op, ctx, plan, tr, "x", x);
  check_rows(op, "x", x, plan.tokens, plan.cfg.hidden, x.dtype);
  check_rows(op, "x_grouped", x_grouped, plan.rows, plan.cfg.hidden, x.dtype);
  GROUPMM_CHECK(!views_overlap(x, x_grouped), op, ": x_grouped may not alias x");
  cpu::ep_dispatch(ctx, tr, plan, x, x_grouped);
  ctx.after_op();
}

void ep_combine(Context& ctx, Transport& tr, const EpPlan& plan, const TensorView& y_grouped,
                const TensorView& weights, const TensorView& out) {
  const char* op = "ep_combine";
  check_collective(op, ctx, plan, tr, "y_grouped", y_grouped);
  check_rows(op, "y_grouped", y_grouped, plan.rows, plan.cfg.hidden, y_grouped.dtype);
  check_view(op, "weights", weights, DType::fp32, 2, Device::CPU);
  check_dim(op, "weights", weights, 0, plan.tokens);
  check_dim(op, "weights", weights, 1, plan.cfg.topk);
  check_rows(op, "out", out, plan.tokens, plan.cfg.hidden, y_grouped.dtype);
  GROUPMM_CHECK(!views_overlap(out, y_grouped) && !views_overlap(out, weights), op,
                ": out may not alias y_grouped or weights");
  cpu::ep_combine(ctx, tr, plan, y_grouped, weights, out);
  ctx.after_op();
}

}  // namespace groupmm::ep
