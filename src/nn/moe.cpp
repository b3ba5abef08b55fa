// nn::MoE: the MoE block from the public ops (moe.hpp) and four GroupedLinear layers. Nothing here
// knows about the backends; every buffer is sized for max_tokens at construction.
#include "groupmm/nn/moe.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "groupmm/random.hpp"
#include "nn/moe_config.hpp"
#include "nn/moe_internal.hpp"

namespace groupmm::nn {

namespace {

GroupedLinearConfig linear(const MoEConfig& c, int64_t G, int64_t K, int64_t N, int64_t rows,
                           uint64_t which, bool experts) {
  const bool at_most = experts && capacity_ep(c);
  const SplitsTotal total = at_most ? SplitsTotal::at_most : SplitsTotal::exact;
  return GroupedLinearConfig{.experts = G,
                             .in_features = K,
                             .out_features = N,
                             .bias = c.bias,
                             .dtype = c.dtype,
                             .delay_wgrad = c.delay_wgrad,
                             .accumulate_into_main_grad = c.accumulate_into_main_grad,
                             .max_tokens = rows,
                             .seed = c.seed * 8 + which,
                             .recipe = c.recipe,
                             .splits_total = total,
                             // a rank receives its own share of T k routed rows on average,
                             // whatever the capacity buffer holds: the GEMMs' kernel choice
                             .expected_rows = at_most ? c.max_tokens * c.topk : 0};
}

}  // namespace

MoE::MoE(Context& ctx, const MoEConfig& cfg) : cfg_(cfg), device_(ctx.device()) {
  check_moe_config(ctx, cfg);
  const RouterConfig rc = cfg.router_config();
  (void)moe_router_workspace_size(ctx, rc, cfg.max_tokens);  // validates the router fields
  const int64_t H = cfg.hidden, F = cfg.ffn_hidden, E = cfg.experts, k = cfg.topk;
  const int64_t T = cfg.max_tokens, Fs = cfg.shared_ffn_hidden;
  const int64_t R = expert_rows_bound(), El = local_experts();
  // Chunked: the wholes hold the parameters (their buffers unused: one row), the parts compute.
  const int64_t whole_rows = chunked() ? 1 : R;
  gate_up_ = std::make_unique<GroupedLinear>(ctx, linear(cfg, El, H, 2 * F, whole_rows, 1, true));
  down_ = std::make_unique<GroupedLinear>(ctx, linear(cfg, El, F, H, whole_rows, 2, true));
  if (chunked()) {
    const int64_t n = cfg.ep.chunks, rows = chunk_rows_bound();
    for (int64_t c = 0; c < n; ++c) {  // the chunks of ep.hpp's EpChunkedPlan
      const int64_t lo = c * El / n, hi = (c + 1) * El / n;
      gate_up_parts_.push_back(std::make_unique<GroupedLinear>(ctx, *gate_up_, lo, hi - lo, rows));
      down_parts_.push_back(std::make_unique<GroupedLinear>(ctx, *down_, lo, hi - lo, rows));
    }
    chunk_gu_.resize(size_t(n));
    if (ctx.device() == Device::CUDA && cfg.ep.transport->concurrent_streams())
      streams_ = std::make_unique<Streams>(ctx, n);
  }
  if (Fs > 0) {
    shared_up_ = std::make_unique<GroupedLinear>(ctx, linear(cfg, 1, H, 2 * Fs, T, 3, false));
    shared_down_ = std::make_unique<GroupedLinear>(ctx, linear(cfg, 1, Fs, H, T, 4, false));
  }
  gathered_ = cfg.gathered_quantize && !cfg.ep.enabled() && !cfg.fused_gate_up &&
              gate_up_->gathers() && down_->gathers();
  cudaStream_t s = ctx.stream();
  const Device d = device_;
  const DType t = cfg.dtype, gt = cfg.accumulate_into_main_grad ? DType::fp32 : t;
  wr_ = Tensor::empty({E, H}, t, d, s);
  dwr_ = Tensor::empty({E, H}, gt, d, s);
  if (cfg.expert_bias) bias_ = Tensor::empty({E}, DType::fp32, d, s);
  logits_ = Tensor::empty({T, E}, DType::fp32, d, s);
  ids_ = Tensor::empty({T, k}, DType::int32, d, s);
  weights_ = Tensor::empty({T, k}, DType::fp32, d, s);
  counts_ = Tensor::empty({E}, DType::int32, d, s);
  losses_ = Tensor::empty({2}, DType::fp32, d, s);
  map_buf_ = Tensor::empty({3 * E}, DType::int32, d, s);
  dest_ = Tensor::empty({T, k}, DType::int32, d, s);
  if (!gathered_) xp_ = Tensor::empty({R, H}, t, d, s);  // gathered: no permuted copies
  probs_ = Tensor::empty({R}, DType::fp32, d, s);
  if (cfg.fused_gate_up || gathered_) src_row_ = Tensor::empty({R}, DType::int32, d, s);
  h_ = Tensor::empty({R, F}, t, d, s);
  y_ = Tensor::empty({T, H}, t, d, s);
  if (!gathered_) dyp_ = Tensor::empty({R, H}, t, d, s);
  dprobs_ = Tensor::empty({R}, DType::fp32, d, s);
  dgu_ = Tensor::empty({R, 2 * F}, t, d, s);
  dx_ = Tensor::empty({T, H}, t, d, s);
  dweights_ = Tensor::empty({T, k}, DType::fp32, d, s);
  dlogits_ = Tensor::empty({T, E}, DType::fp32, d, s);
  if (Fs > 0) {
    sh_h_ = Tensor::empty({T, Fs}, t, d, s);
    sh_dgu_ = Tensor::empty({T, 2 * Fs}, t, d, s);
    // token_counts_[n] = n: the shared expert's one-group splits for any T, without a host copy
    // inside a captured step.
    std::vector<int32_t> n(static_cast<size_t>(T + 1));
    for (int64_t i = 0; i <= T; ++i) n[size_t(i)] = int32_t(i);
    token_counts_ = Tensor::empty({T + 1}, DType::int32, d, s);
    copy(token_counts_, TensorView(n.data(), DType::int32, Device::CPU, {T + 1}), s);
    ctx.synchronize();  // n leaves scope
  }
  const float bound = 1.0f / std::sqrt(static_cast<float>(H));
  fill_uniform(ctx, wr_, -bound, bound, cfg.seed * 8 + 5);
  if (cfg.expert_bias) fill_bytes(bias_, 0, s);
  fill_bytes(losses_, 0, s);
  zero_grad(ctx);
  if (cfg.ep.enabled() && cfg.ep.mode == ep::EpMode::capacity) ep_plan_for(ctx, T);
  prepare(ctx);
}

MoE::~MoE() = default;

void MoE::check_ctx(const Context& ctx, const char* fn) const {
  GROUPMM_CHECK(ctx.device() == device_, "MoE.", fn, ": the context is ", device_name(ctx.device()),
                " but the layer lives on ", device_name(device_));
}

PermuteMap MoE::map_for(int64_t T) const {
  PermuteMap m;
  m.tokens = T;
  m.topk = cfg_.topk;
  m.experts = cfg_.experts;
  m.align = cfg_.pad_align;
  m.capacity = moe_capacity(T, cfg_.topk, cfg_.experts, cfg_.capacity_factor);
  m.rows = moe_permuted_rows(T, m.topk, m.experts, m.align, m.capacity);
  if (map_buf_.data() == nullptr) return m;  // geometry only (the constructor sizing buffers)
  const int64_t E = cfg_.experts;
  int32_t* b = map_buf_.ptr<int32_t>();
  m.dest_row = TensorView(dest_.data(), DType::int32, device_, {T, m.topk});
  m.row_start = TensorView(b, DType::int32, device_, {E});
  m.kept = TensorView(b + E, DType::int32, device_, {E});
  m.splits = TensorView(b + 2 * E, DType::int32, device_, {E});
  return m;
}

int MoE::rank() const {
  return cfg_.ep.enabled() ? cfg_.ep.transport->rank() : 0;
}
int MoE::ranks() const {
  return cfg_.ep.enabled() ? cfg_.ep.transport->size() : 1;
}

int64_t MoE::expert_rows_bound() const {
  const MoEExpertParallel& e = cfg_.ep;
  if (!e.enabled()) return map_for(cfg_.max_tokens).rows;
  // Capacity mode: one block of R C_e rows a chunk; throughput mode: the chunks' rows are the
  // unchunked ones, split.
  if (e.mode == ep::EpMode::capacity) return std::max<int64_t>(e.chunks, 1) * chunk_rows_bound();
  return e.max_rows > 0 ? e.max_rows : std::max<int64_t>(ranks() * cfg_.max_tokens * cfg_.topk, 1);
}

// The most grouped rows one chunk may get: its capacity block, or every row.
int64_t MoE::chunk_rows_bound() const {
  const MoEExpertParallel& e = cfg_.ep;
  if (e.mode != ep::EpMode::capacity) return expert_rows_bound();
  const int64_t Ce = e.capacity.entries_per_peer > 0 ? e.capacity.entries_per_peer
                                                     : e.capacity.rows_per_peer * cfg_.topk;
  return std::max<int64_t>(ranks() * Ce, 1);
}

// Capacity mode: the plan for T tokens (allocated once per T; a captured step keeps its T).
void MoE::ep_plan_for(Context& ctx, int64_t T) {
  const ep::EpConfig ec = ep_config_of(cfg_, ranks());
  // The expert MLP runs over the at-most splits and never reads the grouped buffers' tail.
  ep::EpCapacity cap = cfg_.ep.capacity;
  cap.zero_tail = false;
  if (chunked()) {
    if (cplan_ && cplan_->tokens() == T) return;
    cplan_ = std::make_unique<ep::EpChunkedPlan>(ep::ep_capacity_plan_chunked_create(
        ctx, transport(), ec, cap, cfg_.ep.chunks, T, cfg_.dtype));
    return;
  }
  if (plan_ && plan_->tokens == T) return;
  plan_ = std::make_unique<ep::EpPlan>(
      ep::ep_capacity_plan_create(ctx, transport(), ec, cap, T, cfg_.dtype));
}

TensorView MoE::rows_view(const Tensor& t, int64_t rows, int64_t cols, DType dt) const {
  return cols > 0 ? TensorView(t.data(), dt, device_, {rows, cols})
                  : TensorView(t.data(), dt, device_, {rows});
}

TensorView MoE::region(const Tensor& t, int64_t first, int64_t rows, int64_t cols, DType dt) const {
  void* p =
      static_cast<char*>(t.data()) + dtype_storage_bytes(dt, first * std::max<int64_t>(cols, 1));
  return cols > 0 ? TensorView(p, dt, device_, {rows, cols}) : TensorView(p, dt, device_, {rows});
}

void MoE::prepare(Context& ctx) {
  check_ctx(ctx, "prepare");
  const int64_t T = cfg_.max_tokens;
  gate_up_->prepare(ctx);
  down_->prepare(ctx);
  for (auto* parts : {&gate_up_parts_, &down_parts_})
    for (auto& p : *parts) p->prepare(ctx);
  if (shared_up_) {
    shared_up_->prepare(ctx);
    shared_down_->prepare(ctx);
  }
  ctx.reserve_workspace(moe_router_logits_workspace_size(ctx, T, cfg_.experts));
  ctx.reserve_workspace(moe_router_workspace_size(ctx, cfg_.router_config(), T));
  ctx.reserve_workspace(moe_permute_plan_workspace_size(ctx, T, cfg_.topk, cfg_.experts));
  if (ctx.device() == Device::CUDA) (void)ctx.cublas_handle();  // created outside any capture
}

GroupedLinear& MoE::shared_gate_up() {
  GROUPMM_CHECK(shared_up_ != nullptr,
                "MoE.shared_gate_up: shared_ffn_hidden=0 (no shared expert)");
  return *shared_up_;
}
GroupedLinear& MoE::shared_down() {
  GROUPMM_CHECK(shared_down_ != nullptr, "MoE.shared_down: shared_ffn_hidden=0 (no shared expert)");
  return *shared_down_;
}

TensorView MoE::expert_ids() const {
  return TensorView(ids_.data(), DType::int32, device_, {map_.tokens, cfg_.topk});
}
TensorView MoE::router_weights() const {
  return TensorView(weights_.data(), DType::fp32, device_, {map_.tokens, cfg_.topk});
}
TensorView MoE::aux_loss() const {
  return TensorView(losses_.ptr<float>(), DType::fp32, device_, {1});
}
TensorView MoE::z_loss() const {
  return TensorView(losses_.ptr<float>() + 1, DType::fp32, device_, {1});
}

int64_t MoE::saved_bytes() const {
  if (saved_t_ < 0) return 0;
  const int64_t T = saved_t_, R = rows_, H = cfg_.hidden, F = cfg_.ffn_hidden, k = cfg_.topk;
  const int64_t e = dtype_storage_bytes(cfg_.dtype, 1);
  int64_t b = T * cfg_.experts * 4 + 3 * T * k * 4;  // logits; ids, weights, destination rows
  const bool row_map = cfg_.fused_gate_up || gathered_;
  b += R * 4 * (row_map ? 2 : 1);           // row weights (and the row map)
  if (!row_map) b += R * H * e;             // the permuted rows
  b += R * 3 * F * e;                       // pre-activation [R, 2F], activation [R, F]
  b += T * 3 * cfg_.shared_ffn_hidden * e;  // the shared expert's
  return b;
}

// ---- forward ------------------------------------------------------------------------------------

TensorView MoE::forward(Context& ctx, const TensorView& x) {
  const char* op = "MoE.forward";
  check_ctx(ctx, "forward");
  GROUPMM_CHECK(!pending_dw_, op, ": a delayed wgrad is pending; call backward_dw() first");
  check_view(op, "x", x, cfg_.dtype, 2, device_);
  check_dim(op, "x", x, 1, cfg_.hidden);
  const int64_t T = x.dim(0), H = cfg_.hidden, E = cfg_.experts;
  GROUPMM_CHECK(T <= cfg_.max_tokens, op, ": x.shape[0]=", T,
                " exceeds max_tokens=", cfg_.max_tokens);
  const DType t = cfg_.dtype;
  const bool ep_on = cfg_.ep.enabled();
  map_ = map_for(T);  // with EP only its tokens are used (the routing views' T)
  saved_x_ = x;       // for backward (router dW, the shared expert's wgrad)
  saved_t_ = T;

  const TensorView logits = rows_view(logits_, T, E, DType::fp32);
  moe_router_logits(ctx, x, wr_, logits);
  RouterArgs ra;
  ra.logits = logits;
  ra.expert_bias = bias_.view();
  ra.expert_ids = expert_ids();
  ra.weights = router_weights();
  ra.counts = counts_;
  ra.aux_loss = aux_loss();
  ra.z_loss = z_loss();
  moe_router_forward(ctx, cfg_.router_config(), ra);
  stage(MoEStage::router, false);
  if (chunked()) return forward_chunked(ctx, x, ra.weights);

  if (ep_on) {  // the plan: exact rows (a count exchange) or the capacity plan's fixed blocks
    if (cfg_.ep.mode == ep::EpMode::throughput) {
      plan_ = std::make_unique<ep::EpPlan>(
          ep::ep_dispatch_plan(ctx, transport(), ep_config_of(cfg_, ranks()), ra.expert_ids));
    } else {
      ep_plan_for(ctx, T);
      ep::ep_capacity_plan(ctx, transport(), ra.expert_ids, *plan_);
    }
    rows_ = plan_->rows;
    splits_ = plan_->entry_splits();  // capacity mode: without the tail (the layers' at_most)
    GROUPMM_CHECK(rows_ <= expert_rows_bound(), op, ": this rank received ", rows_,
                  " expert rows, more than ep.max_rows=", expert_rows_bound(),
                  " (raise ep.max_rows)");
  } else {
    moe_permute_plan(ctx, ra.expert_ids, map_);
    rows_ = map_.rows;
    splits_ = map_.splits;
  }
  const int64_t R = rows_;
  const TensorView xp = rows_view(xp_, R, H, t), probs = rows_view(probs_, R, 0, DType::fp32);
  const TensorView h = rows_view(h_, R, cfg_.ffn_hidden, t);
  if (cfg_.fused_gate_up) {
    // the row map instead of the permuted copy; xp is gathered in backward (gate_up's wgrad)
    const TensorView src_row = rows_view(src_row_, R, 0, DType::int32);
    moe_permute_sources(ctx, map_, src_row, ra.weights, probs);
    stage(MoEStage::permute, false);
    gu_ = gate_up_->forward_external(ctx, xp, splits_);
    moe_gate_up_swiglu(ctx, MoeGateUpArgs{.x = x,
                                          .src_row = src_row,
                                          .splits = splits_,
                                          .w = gate_up_->weight(),
                                          .prob = probs,
                                          .out = h,
                                          .gate_up = gu_,
                                          .config = {}});
    stage(MoEStage::gate_up, false);
    stage(MoEStage::activation, false);  // inside gate_up's kernel
  } else {
    if (gathered_) {  // gate_up quantizes the permuted rows straight from x
      moe_permute_sources(ctx, map_, rows_view(src_row_, R, 0, DType::int32), ra.weights, probs);
    } else if (ep_on) {
      ep::ep_dispatch(ctx, transport(), *plan_, x, xp, ra.weights, probs);
    } else {
      moe_permute(ctx, x, map_, xp, ra.weights, probs);
    }
    stage(MoEStage::permute, false);

    gu_ = gathered_
              ? gate_up_->forward_gathered(ctx, x, rows_view(src_row_, R, 0, DType::int32), splits_)
              : gate_up_->forward(ctx, xp, splits_);
    stage(MoEStage::gate_up, false);
    weighted_swiglu_forward(ctx, gu_, probs, h, SwigluForm{},
                            capacity_ep(cfg_) ? splits_ : TensorView());
    stage(MoEStage::activation, false);
  }
  const TensorView yp = down_->forward(ctx, h, splits_);
  stage(MoEStage::down, false);

  const TensorView shared_y = shared_forward(ctx, x, T);
  const TensorView y = rows_view(y_, T, H, t);
  if (ep_on)
    ep::ep_combine(ctx, transport(), *plan_, yp, TensorView(), y, shared_y);
  else
    moe_unpermute(ctx, yp, map_, y, shared_y);
  stage(MoEStage::unpermute, false);
  return y;
}

// The shared expert's output on x [T, H] (absent without one).
TensorView MoE::shared_forward(Context& ctx, const TensorView& x, int64_t T) {
  if (!shared_up_) return TensorView();
  const TensorView splits(token_counts_.ptr<int32_t>() + T, DType::int32, device_, {1});
  sh_gu_ = shared_up_->forward(ctx, x, splits);
  const TensorView sh = rows_view(sh_h_, T, cfg_.shared_ffn_hidden, cfg_.dtype);
  swiglu_forward(ctx, sh_gu_, sh);
  const TensorView y = shared_down_->forward(ctx, sh, splits);
  stage(MoEStage::shared_expert, false);
  return y;
}

// ---- backward -----------------------------------------------------------------------------------

// The shared expert's dx for dy [T, H] (absent without one).
TensorView MoE::shared_backward(Context& ctx, const TensorView& dy, int64_t T) {
  if (!shared_up_) return TensorView();
  const TensorView dsh = shared_down_->backward(ctx, dy);
  const TensorView sdgu = rows_view(sh_dgu_, T, 2 * cfg_.shared_ffn_hidden, cfg_.dtype);
  swiglu_backward(ctx, dsh, sh_gu_, sdgu);
  const TensorView dx = shared_up_->backward(ctx, sdgu);
  stage(MoEStage::shared_expert, true);
  return dx;
}

TensorView MoE::backward(Context& ctx, const TensorView& dy) {
  const char* op = "MoE.backward";
  check_ctx(ctx, "backward");
  GROUPMM_CHECK(saved_t_ >= 0, op, ": no saved forward (each backward consumes one forward)");
  check_view(op, "dy", dy, cfg_.dtype, 2, device_);
  check_dim(op, "dy", dy, 0, saved_t_);  // forward's T
  check_dim(op, "dy", dy, 1, cfg_.hidden);
  const int64_t T = saved_t_, H = cfg_.hidden, E = cfg_.experts, F = cfg_.ffn_hidden;
  const int64_t R = rows_;
  const DType t = cfg_.dtype;
  const bool ep_on = cfg_.ep.enabled();
  const TensorView dx = rows_view(dx_, T, H, t);
  const TensorView dweights = rows_view(dweights_, T, cfg_.topk, DType::fp32);

  if (chunked()) {
    backward_chunked(ctx, dy, dx, dweights);
  } else {
    const TensorView dyp = rows_view(dyp_, R, H, t);
    if (gathered_) {
      // down quantizes its gradient straight from dy: unpermute's backward is the row map's
      // gather (dy_perm[dest_row[t, j]] = dy[t], padding rows 0).
    } else if (ep_on) {
      ep::ep_combine_backward(ctx, transport(), *plan_, dy, TensorView(), TensorView(), dyp,
                              TensorView());
    } else {
      moe_unpermute_backward(ctx, dy, map_, dyp);
    }
    stage(MoEStage::unpermute, true);
    const TensorView dh =
        gathered_ ? down_->backward_gathered(ctx, dy, rows_view(src_row_, R, 0, DType::int32))
                  : down_->backward(ctx, dyp);
    stage(MoEStage::down, true);
    const TensorView dgu = rows_view(dgu_, R, 2 * F, t);
    const TensorView probs = rows_view(probs_, R, 0, DType::fp32);
    const TensorView dprobs = rows_view(dprobs_, R, 0, DType::fp32);
    weighted_swiglu_backward(ctx, dh, gu_, probs, dgu, dprobs, SwigluForm{},
                             capacity_ep(cfg_) ? splits_ : TensorView());
    stage(MoEStage::activation, true);
    // fused_gate_up: the permuted rows gate_up's wgrad reads (forward saved the buffer, unfilled)
    if (cfg_.fused_gate_up) moe_permute(ctx, saved_x_, map_, rows_view(xp_, R, H, t));
    const TensorView dxp = gate_up_->backward(ctx, dgu);
    stage(MoEStage::gate_up, true);

    const TensorView shared_dx = shared_backward(ctx, dy, T);
    if (ep_on)
      ep::ep_dispatch_backward(ctx, transport(), *plan_, dxp, dx, dprobs, dweights, shared_dx);
    else
      moe_permute_backward(ctx, dxp, map_, dx, dprobs, dweights, shared_dx);
    stage(MoEStage::permute, true);
  }

  RouterBackwardArgs rb;
  rb.logits = rows_view(logits_, T, E, DType::fp32);
  rb.expert_ids = expert_ids();
  rb.counts = counts_;
  rb.d_weights = dweights;
  rb.d_logits = rows_view(dlogits_, T, E, DType::fp32);
  moe_router_backward(ctx, cfg_.router_config(), rb);
  const bool main_grad = cfg_.accumulate_into_main_grad;
  moe_router_logits_backward(ctx, rb.d_logits, saved_x_, wr_, dx,
                             cfg_.delay_wgrad ? TensorView() : dwr_.view(), true, main_grad);
  stage(MoEStage::router, true);
  if (cfg_.delay_wgrad) {
    pending_dw_ = true;
  } else {
    saved_x_ = TensorView();
  }
  saved_t_ = -1;
  return dx;
}

void MoE::backward_dw(Context& ctx) {
  check_ctx(ctx, "backward_dw");
  if (!cfg_.delay_wgrad) return;  // the weight grads ran in backward
  GROUPMM_CHECK(pending_dw_, "MoE.backward_dw: no wgrad is pending (call backward first)");
  if (chunked()) {  // the parts computed: each expert's wgrad over its chunk's rows
    for (auto* parts : {&gate_up_parts_, &down_parts_})
      for (auto& p : *parts) p->backward_dw(ctx);
  } else {
    gate_up_->backward_dw(ctx);
    down_->backward_dw(ctx);
  }
  if (shared_up_) {
    shared_up_->backward_dw(ctx);
    shared_down_->backward_dw(ctx);
  }
  const int64_t T = saved_x_.dim(0);
  moe_router_logits_backward(ctx, rows_view(dlogits_, T, cfg_.experts, DType::fp32), saved_x_, wr_,
                             TensorView(), dwr_, false, cfg_.accumulate_into_main_grad);
  pending_dw_ = false;
  saved_x_ = TensorView();
}

void MoE::zero_grad(Context& ctx) {
  check_ctx(ctx, "zero_grad");
  fill_bytes(dwr_, 0, ctx.stream());
  gate_up_->zero_grad(ctx);
  down_->zero_grad(ctx);
  if (shared_up_) {
    shared_up_->zero_grad(ctx);
    shared_down_->zero_grad(ctx);
  }
}

std::string MoE::to_string() const {
  return detail::cat("MoE(", cfg_.to_string(), ", device=", device_name(device_), ")");
}

}  // namespace groupmm::nn
