// Permute plan, permute / unpermute and their backwards: validation and backend dispatch.
#include <algorithm>
#include <cmath>
#include <tuple>

#include "moe/backends.hpp"

namespace groupmm {

std::string PermuteMap::to_string() const {
  return detail::cat("PermuteMap(T=", tokens, ", k=", topk, ", E=", experts, ", align=", align,
                     ", capacity=", capacity, ", rows=", rows, ", dest_row=", dest_row.to_string(),
                     ", splits=", splits.to_string(), ")");
}

int64_t moe_permuted_rows(int64_t T, int64_t k, int64_t E, int64_t align, int64_t capacity) {
  GROUPMM_CHECK(T >= 0 && k >= 1 && E >= 1 && align >= 1 && capacity >= 0,
                "moe_permuted_rows: tokens=", T, ", topk=", k, ", experts=", E, ", align=", align,
                ", capacity=", capacity, " must be >= 0, >= 1, >= 1, >= 1, >= 0");
  const int64_t kept_max = capacity > 0 ? std::min(T * k, E * capacity) : T * k;
  return qnum::round_up(kept_max + E * (align - 1), align);
}

int64_t moe_capacity(int64_t T, int64_t k, int64_t E, double factor) {
  GROUPMM_CHECK(T >= 0 && k >= 1 && E >= 1 && std::isfinite(factor), "moe_capacity: tokens=", T,
                ", topk=", k, ", experts=", E, ", capacity_factor=", factor,
                " must be >= 0, >= 1, >= 1, finite");
  if (factor <= 0) return 0;
  return std::max<int64_t>(1, int64_t(std::ceil(factor * double(T * k) / double(E))));
}

void check_permute_map(const Context& ctx, const char* op, const PermuteMap& m) {
  GROUPMM_CHECK(m.tokens >= 0 && m.topk >= 1 && m.experts >= 1 && m.align >= 1 && m.capacity >= 0,
                op, ": map (T=", m.tokens, ", k=", m.topk, ", E=", m.experts, ", align=", m.align,
                ", capacity=", m.capacity,
                ") needs T >= 0, k >= 1, E >= 1, align >= 1, "
                "capacity >= 0");
  const int64_t R = moe_permuted_rows(m.tokens, m.topk, m.experts, m.align, m.capacity);
  GROUPMM_CHECK(m.rows == R, op, ": map.rows=", m.rows, " must equal moe_permuted_rows(...)=", R);
  GROUPMM_CHECK(R <= INT32_MAX && m.tokens * m.topk <= INT32_MAX, op, ": map.rows=", R,
                " and tokens * topk=", m.tokens * m.topk, " must fit int32");
  check_view(op, "map.dest_row", m.dest_row, DType::int32, 2, ctx.device());
  check_dim(op, "map.dest_row", m.dest_row, 0, m.tokens);
  check_dim(op, "map.dest_row", m.dest_row, 1, m.topk);
  for (auto [name, v] : {std::pair{"map.row_start", &m.row_start}, std::pair{"map.kept", &m.kept},
                         std::pair{"map.splits", &m.splits}}) {
    check_view(op, name, *v, DType::int32, 1, ctx.device());
    check_dim(op, name, *v, 0, m.experts);
  }
}

namespace {

// A float activation [rows, H] (bf16/fp16/fp32); returns nothing, checks dtype `t` when given.
void check_rows(const Context& ctx, const char* op, const char* arg, const TensorView& v,
                int64_t rows, int64_t H, DType t) {
  check_view(op, arg, v, t, 2, ctx.device());
  check_dim(op, arg, v, 0, rows);
  check_dim(op, arg, v, 1, H);
}

// The first [T or R, H] operand fixes dtype and H.
DType check_source(const Context& ctx, const char* op, const char* arg, const TensorView& v,
                   int64_t rows) {
  GROUPMM_CHECK(v.present(), op, ": ", arg, " is required");
  GROUPMM_CHECK(v.dtype == DType::bf16 || v.dtype == DType::fp16 || v.dtype == DType::fp32, op,
                ": ", arg, ".dtype=", dtype_name(v.dtype), " must be bf16, fp16 or fp32");
  check_view(op, arg, v, v.dtype, 2, ctx.device());
  check_dim(op, arg, v, 0, rows);
  return v.dtype;
}

// Optional pair (both or none) of fp32 vectors: `a` [a_rows, a_cols] (cols 0 = rank 1), `b` same.
bool check_prob_pair(const Context& ctx, const char* op, const char* an, const TensorView& a,
                     std::initializer_list<int64_t> ad, const char* bn, const TensorView& b,
                     std::initializer_list<int64_t> bd) {
  GROUPMM_CHECK(a.present() == b.present(), op, ": ", an, " and ", bn, " must be given together (",
                an, a.present() ? " given" : " absent", ")");
  if (!a.present()) return false;
  auto check = [&](const char* n, const TensorView& v, std::initializer_list<int64_t> d) {
    check_view(op, n, v, DType::fp32, int(d.size()), ctx.device());
    int i = 0;
    for (int64_t x : d) check_dim(op, n, v, i++, x);
  };
  check(an, a, ad);
  check(bn, b, bd);
  return true;
}

void check_no_alias(const char* op, const char* out_name, const TensorView& out,
                    std::initializer_list<TensorView> ins) {
  for (const TensorView& in : ins)
    GROUPMM_CHECK(!in.present() || !views_overlap(out, in), op, ": ", out_name,
                  " may not alias an input");
}

}  // namespace

size_t moe_permute_plan_workspace_size(const Context& ctx, int64_t T, int64_t k, int64_t E) {
  GROUPMM_CHECK(T >= 0 && k >= 1 && E >= 1, "moe_permute_plan_workspace_size: tokens=", T,
                ", topk=", k, ", experts=", E, " must be >= 0, >= 1, >= 1");
  return ctx.device() == Device::CUDA ? cuda::moe_permute_plan_workspace_size(T, k, E) : 0;
}

void moe_permute_plan(Context& ctx, const TensorView& ids, const PermuteMap& map, void* ws,
                      size_t ws_bytes) {
  const char* op = "moe_permute_plan";
  check_permute_map(ctx, op, map);
  GROUPMM_CHECK(map.experts <= 1024, op, ": map.experts=", map.experts, " must be <= 1024");
  check_view(op, "expert_ids", ids, DType::int32, 2, ctx.device());
  check_dim(op, "expert_ids", ids, 0, map.tokens);
  check_dim(op, "expert_ids", ids, 1, map.topk);
  if (ctx.device() == Device::CPU) {
    cpu::moe_permute_plan(ctx, ids, map);
  } else {
    const size_t need = cuda::moe_permute_plan_workspace_size(map.tokens, map.topk, map.experts);
    ws = moe_workspace(ctx, op, need, ws, ws_bytes, "moe_permute_plan_workspace_size");
    cuda::moe_permute_plan(ctx, ids, map, ws);
  }
  ctx.after_op();
}

namespace {

// The row scatter behind moe_permute and moe_unpermute_backward: src [T, H] -> dst [R, H], and the
// optional weights [T, k] -> probs [R].
void scatter_op(Context& ctx, const char* op, const PermuteMap& map, const char* src_name,
                const TensorView& src, const char* dst_name, const TensorView& dst,
                const TensorView& weights, const TensorView& probs) {
  check_permute_map(ctx, op, map);
  const DType t = check_source(ctx, op, src_name, src, map.tokens);
  check_rows(ctx, op, dst_name, dst, map.rows, src.dim(1), t);
  check_prob_pair(ctx, op, "weights", weights, {map.tokens, map.topk}, "probs", probs, {map.rows});
  check_no_alias(op, dst_name, dst, {src, weights, probs});
  check_no_alias(op, "probs", probs, {src, weights});
  if (ctx.device() == Device::CPU)
    cpu::moe_scatter_rows(ctx, src, map, dst, weights, probs);
  else
    cuda::moe_scatter_rows(ctx, src, map, dst, weights, probs);
  ctx.after_op();
}

// The k-way gather-sum behind moe_unpermute and moe_permute_backward: src [R, H] -> dst [T, H]
// (+ add [T, H]), and the optional d_probs [R] -> d_weights [T, k].
void gather_op(Context& ctx, const char* op, const PermuteMap& map, const char* src_name,
               const TensorView& src, const char* dst_name, const TensorView& dst,
               const TensorView& add, const TensorView& d_probs, const TensorView& d_weights,
               const RoutedBias& routed = RoutedBias()) {
  check_permute_map(ctx, op, map);
  const DType t = check_source(ctx, op, src_name, src, map.rows);
  check_rows(ctx, op, dst_name, dst, map.tokens, src.dim(1), t);
  if (add.present()) check_rows(ctx, op, "add", add, map.tokens, src.dim(1), t);
  check_prob_pair(ctx, op, "d_probs", d_probs, {map.rows}, "d_weights", d_weights,
                  {map.tokens, map.topk});
  const bool ids = routed.expert_ids.present(), w = routed.weights.present();
  GROUPMM_CHECK(routed.present() == ids && ids == w, op,
                ": routed.bias, routed.expert_ids and routed.weights go together (got ",
                routed.present() ? "bias" : "no bias", ", ", ids ? "ids" : "no ids", ", ",
                w ? "weights" : "no weights", ")");
  if (routed.present()) {
    check_rows(ctx, op, "routed.bias", routed.bias, map.experts, src.dim(1), t);
    for (auto [name, v, dt] : {std::tuple{"routed.expert_ids", &routed.expert_ids, DType::int32},
                               std::tuple{"routed.weights", &routed.weights, DType::fp32}}) {
      check_view(op, name, *v, dt, 2, ctx.device());
      check_dim(op, name, *v, 0, map.tokens);
      check_dim(op, name, *v, 1, map.topk);
    }
  }
  check_no_alias(op, dst_name, dst,
                 {src, add, d_probs, d_weights, routed.bias, routed.expert_ids, routed.weights});
  check_no_alias(op, "d_weights", d_weights, {src, add, d_probs});
  if (ctx.device() == Device::CPU)
    cpu::moe_gather_rows(ctx, src, map, dst, add, d_probs, d_weights, routed);
  else
    cuda::moe_gather_rows(ctx, src, map, dst, add, d_probs, d_weights, routed);
  ctx.after_op();
}

}  // namespace

void moe_permute(Context& ctx, const TensorView& x, const PermuteMap& map, const TensorView& x_perm,
                 const TensorView& weights, const TensorView& probs) {
  scatter_op(ctx, "moe_permute", map, "x", x, "x_perm", x_perm, weights, probs);
}

void moe_unpermute_backward(Context& ctx, const TensorView& dy, const PermuteMap& map,
                            const TensorView& dy_perm) {
  scatter_op(ctx, "moe_unpermute_backward", map, "dy", dy, "dy_perm", dy_perm, TensorView(),
             TensorView());
}

void moe_unpermute(Context& ctx, const TensorView& y_perm, const PermuteMap& map,
                   const TensorView& y, const TensorView& add, const RoutedBias& routed) {
  gather_op(ctx, "moe_unpermute", map, "y_perm", y_perm, "y", y, add, TensorView(), TensorView(),
            routed);
}

void moe_permute_backward(Context& ctx, const TensorView& d_x_perm, const PermuteMap& map,
                          const TensorView& dx, const TensorView& d_probs,
                          const TensorView& d_weights, const TensorView& add) {
  gather_op(ctx, "moe_permute_backward", map, "d_x_perm", d_x_perm, "dx", dx, add, d_probs,
            d_weights);
}

}  // namespace groupmm
