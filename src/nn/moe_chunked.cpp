// nn::MoE's chunked expert-parallel step (MoEExpertParallel::chunks > 1): the local experts in
// chunks whose exchanges run on a second stream beside the other chunks' compute (moe.hpp).
#include "groupmm/nn/moe.hpp"
#include "nn/moe_internal.hpp"

namespace groupmm::nn {

// The chunked step's forward after the router (see the header): the plan, then per chunk the
// dispatch (on the exchanges' stream, one chunk ahead), the experts (on the caller's stream) and
// the combine's way back, then one sum. Issue order on the exchanges' stream: dispatch 0,
// dispatch 1, combine 0, dispatch 2, combine 1, ..., so that chunk c's experts run while
// dispatch c + 1 and combine c - 1 move. Every rank issues the same exchanges in the same order.
// While a chunked step runs on CUDA, its GEMMs leave ep.exchange_sms SMs to the exchanges'
// stream; the caller's limit comes back after it (also when the step throws).
class MoE::GemmSms {
 public:
  GemmSms(Context& ctx, int exchange_sms) : ctx_(ctx), saved_(ctx.gemm_sm_limit()) {
    if (exchange_sms > 0 && ctx.device() == Device::CUDA)
      ctx.set_gemm_sm_limit(ctx.sm_count() - exchange_sms);
  }
  ~GemmSms() { ctx_.set_gemm_sm_limit(saved_); }
  GemmSms(const GemmSms&) = delete;
  GemmSms& operator=(const GemmSms&) = delete;

 private:
  Context& ctx_;
  int saved_;
};

TensorView MoE::forward_chunked(Context& ctx, const TensorView& x, const TensorView& weights) {
  const char* op = "MoE.forward";
  const GemmSms sms(ctx, cfg_.ep.exchange_sms);
  const int64_t T = x.dim(0), H = cfg_.hidden, F = cfg_.ffn_hidden, n = cfg_.ep.chunks;
  const DType t = cfg_.dtype;
  ep::Transport& tr = transport();
  if (cfg_.ep.mode == ep::EpMode::throughput) {
    cplan_ = std::make_unique<ep::EpChunkedPlan>(
        ep::ep_dispatch_plan_chunked(ctx, tr, ep_config_of(cfg_, ranks()), expert_ids(), n, t));
  } else {
    ep_plan_for(ctx, T);
    ep::ep_capacity_plan_chunked(ctx, tr, expert_ids(), *cplan_);
  }
  ep::EpChunkedPlan& cp = *cplan_;
  rows_ = cp.rows();
  GROUPMM_CHECK(rows_ <= expert_rows_bound(), op, ": this rank received ", rows_,
                " expert rows, more than ep.max_rows=", expert_rows_bound(),
                " (raise ep.max_rows)");
  stage(MoEStage::permute, false);  // the plan; the rows move beside the experts below
  Context& xc = streams_ ? *streams_->xctx : ctx;
  TensorView shared_y, yp;
  Streams::pipeline(
      streams_.get(), ctx, xc, n,
      [&](int64_t c) {  // dispatch
        const int64_t b = cp.row_base[size_t(c)], m = cp.rows_of(c);
        ep::ep_dispatch(xc, tr, cp.plans[size_t(c)], x, region(xp_, b, m, H, t), weights,
                        region(probs_, b, m, 0, DType::fp32));
      },
      [&] { shared_y = shared_forward(ctx, x, T); },
      [&](int64_t c) {  // the experts
        const int64_t b = cp.row_base[size_t(c)], m = cp.rows_of(c);
        const TensorView splits = cp.entry_splits(c);
        const TensorView probs = region(probs_, b, m, 0, DType::fp32), h = region(h_, b, m, F, t);
        chunk_gu_[size_t(c)] =
            gate_up_parts_[size_t(c)]->forward(ctx, region(xp_, b, m, H, t), splits);
        stage(MoEStage::gate_up, false);
        weighted_swiglu_forward(ctx, chunk_gu_[size_t(c)], probs, h, SwigluForm{},
                                capacity_ep(cfg_) ? splits : TensorView());
        stage(MoEStage::activation, false);
        yp = down_parts_[size_t(c)]->forward(ctx, h, splits);
        stage(MoEStage::down, false);
      },
      [&](int64_t c) { ep::ep_combine_chunk(xc, tr, cp, c, yp); });
  const TensorView y = rows_view(y_, T, H, t);
  ep::ep_combine_finish(ctx, cp, TensorView(), y, shared_y);
  stage(MoEStage::unpermute, false);
  return y;
}

// The chunked step's backward up to the router (see forward_chunked): per chunk the combine
// backward (dy to the experts, one chunk ahead), the experts' backward and the gradients' way
// home, then one sum into dx and d_weights.
void MoE::backward_chunked(Context& ctx, const TensorView& dy, const TensorView& dx,
                           const TensorView& dweights) {
  const GemmSms sms(ctx, cfg_.ep.exchange_sms);
  const int64_t T = saved_t_, H = cfg_.hidden, F = cfg_.ffn_hidden, n = cfg_.ep.chunks;
  const DType t = cfg_.dtype;
  ep::Transport& tr = transport();
  ep::EpChunkedPlan& cp = *cplan_;
  Context& xc = streams_ ? *streams_->xctx : ctx;
  TensorView shared_dx, dxp, dprobs;
  Streams::pipeline(
      streams_.get(), ctx, xc, n,
      [&](int64_t c) {  // dy to the experts, unweighted: the weights entered the activation
        const int64_t b = cp.row_base[size_t(c)], m = cp.rows_of(c);
        ep::ep_combine_backward(xc, tr, cp.plans[size_t(c)], dy, TensorView(), TensorView(),
                                region(dyp_, b, m, H, t), TensorView());
      },
      [&] {
        stage(MoEStage::unpermute, true);
        shared_dx = shared_backward(ctx, dy, T);
      },
      [&](int64_t c) {  // the experts' backward
        const int64_t b = cp.row_base[size_t(c)], m = cp.rows_of(c);
        const TensorView splits = cp.entry_splits(c);
        const TensorView dh = down_parts_[size_t(c)]->backward(ctx, region(dyp_, b, m, H, t));
        stage(MoEStage::down, true);
        const TensorView dgu = region(dgu_, b, m, 2 * F, t);
        dprobs = region(dprobs_, b, m, 0, DType::fp32);
        weighted_swiglu_backward(ctx, dh, chunk_gu_[size_t(c)],
                                 region(probs_, b, m, 0, DType::fp32), dgu, dprobs, SwigluForm{},
                                 capacity_ep(cfg_) ? splits : TensorView());
        stage(MoEStage::activation, true);
        dxp = gate_up_parts_[size_t(c)]->backward(ctx, dgu);
        stage(MoEStage::gate_up, true);
      },
      [&](int64_t c) { ep::ep_dispatch_backward_chunk(xc, tr, cp, c, dxp, dprobs); });
  ep::ep_dispatch_backward_finish(ctx, cp, dx, dweights, shared_dx);
  stage(MoEStage::permute, true);
}

}  // namespace groupmm::nn
