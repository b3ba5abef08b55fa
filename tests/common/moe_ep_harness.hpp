// nn::MoE with expert parallelism against the one-rank block, for the CPU and GPU suites: R ranks
// as threads over an in-process group (host, or one GPU's stream), each an EP MoE block with the
// one-rank block's parameters (router and shared expert copied, its slice of the experts), a
// forward and backward (and backward_dw) on its own tokens, or the forward alone (inference
// recipes); the one-rank block runs the global tokens (rank 0's, then rank 1's, ...).
#pragma once

#include "common/ep_harness.hpp"
#include "groupmm/nn/moe.hpp"

namespace groupmm::test::moe_ep {

using ep_harness::run_ranks;
using nn::MoE;
using nn::MoEConfig;

// Every output and gradient of one block's step, as fp32 values.
struct StepOut {
  std::vector<float> y, dx, wr_grad;
  std::vector<float> gu_w, gu_b, down_w, down_b;      // expert grads (all E, or this rank's E_l)
  std::vector<float> sgu_w, sgu_b, sdown_w, sdown_b;  // shared expert grads
  std::vector<float> weights;                         // router weights [T, k]
  uint32_t status = 0;
};

inline std::vector<float> values(const TensorView& v) {
  return v.present() ? floats_of(v) : std::vector<float>();
}

inline StepOut step(Context& ctx, MoE& m, const std::vector<float>& x, const std::vector<float>& dy,
                    int64_t T, bool forward_only = false) {
  const MoEConfig& c = m.config();
  const Device dev = ctx.device();
  Tensor xt = ep_harness::upload(x, c.dtype, {T, c.hidden}, dev, ctx.stream());
  Tensor dyt = ep_harness::upload(dy, c.dtype, {T, c.hidden}, dev, ctx.stream());
  StepOut o;
  o.y = floats_of(m.forward(ctx, xt));
  o.weights = floats_of(m.router_weights());
  if (forward_only) {
    o.status = ctx.take_status().bits;
    return o;
  }
  o.dx = floats_of(m.backward(ctx, dyt));
  m.backward_dw(ctx);
  o.wr_grad = values(m.router_weight_grad());
  o.gu_w = values(m.gate_up().weight_grad());
  o.gu_b = values(m.gate_up().bias_grad());
  o.down_w = values(m.down().weight_grad());
  o.down_b = values(m.down().bias_grad());
  if (m.has_shared_expert()) {
    o.sgu_w = values(m.shared_gate_up().weight_grad());
    o.sgu_b = values(m.shared_gate_up().bias_grad());
    o.sdown_w = values(m.shared_down().weight_grad());
    o.sdown_b = values(m.shared_down().bias_grad());
  }
  o.status = ctx.take_status().bits;
  return o;
}

// dst's parameters from src's: the router (and expert bias) and the shared expert whole, the
// experts [first, first + dst's groups).
inline void copy_params(Context& ctx, MoE& dst, MoE& src) {
  cudaStream_t s = ctx.stream();
  copy(dst.router_weight(), src.router_weight(), s);
  if (dst.expert_bias().present()) copy(dst.expert_bias(), src.expert_bias(), s);
  const int64_t first = dst.first_expert();
  for (auto [d, g] : {std::pair{&dst.gate_up(), &src.gate_up()}, {&dst.down(), &src.down()}}) {
    const TensorView& dw = d->weight();
    const TensorView& sw = g->weight();
    const int64_t per = dw.dim(1) * dw.dim(2), n = dw.dim(0);
    copy(dw,
         TensorView(static_cast<char*>(sw.data) + first * per * dtype_storage_bytes(sw.dtype, 1),
                    sw.dtype, sw.device, {n, dw.dim(1), dw.dim(2)}),
         s);
    if (d->bias().present()) {
      const TensorView& db = d->bias();
      const TensorView& sb = g->bias();
      copy(db,
           TensorView(
               static_cast<char*>(sb.data) + first * db.dim(1) * dtype_storage_bytes(sb.dtype, 1),
               sb.dtype, sb.device, {n, db.dim(1)}),
           s);
    }
    d->weights_changed();
  }
  if (dst.has_shared_expert())
    for (auto [d, g] : {std::pair{&dst.shared_gate_up(), &src.shared_gate_up()},
                        {&dst.shared_down(), &src.shared_down()}}) {
      copy(d->weight(), g->weight(), s);
      if (d->bias().present()) copy(d->bias(), g->bias(), s);
      d->weights_changed();
    }
  ctx.synchronize();
}

struct Case {
  MoEConfig cfg;  // the one-rank block's (max_tokens: the global token count is what it needs)
  int ranks = 2;
  ep::EpMode mode = ep::EpMode::throughput;
  ep::EpCapacity cap;
  std::vector<int64_t> tokens;  // per rank
  int64_t chunks = 1;           // ep.chunks of the EP blocks (overlap)
  bool forward_only = false;    // the forward alone (the 4-bit weight recipes: inference)
};

struct Result {
  StepOut one;                // the one-rank block on all tokens
  std::vector<StepOut> rank;  // each EP rank's
};

inline Result run_case(const Case& c, Device dev, uint64_t seed) {
  const int R = c.ranks;
  const int64_t H = c.cfg.hidden;
  std::mt19937_64 g(seed);
  std::vector<std::vector<float>> xs(static_cast<size_t>(R)), dys(static_cast<size_t>(R));
  std::vector<float> x_all, dy_all;
  int64_t T_all = 0, T_max = 1;
  for (int r = 0; r < R; ++r) {
    const int64_t T = c.tokens[size_t(r)];
    xs[size_t(r)] = randn(size_t(T * H), 1.0f, g);
    dys[size_t(r)] = randn(size_t(T * H), 0.5f, g);
    for (auto* v : {&xs[size_t(r)], &dys[size_t(r)]})
      for (float& f : *v) f = ep_harness::round_to(c.cfg.dtype, f);
    x_all.insert(x_all.end(), xs[size_t(r)].begin(), xs[size_t(r)].end());
    dy_all.insert(dy_all.end(), dys[size_t(r)].begin(), dys[size_t(r)].end());
    T_all += T;
    T_max = std::max(T_max, T);
  }
  const ep_harness::GroupStream group_stream(dev);
  const cudaStream_t stream = group_stream.s;
  Result res;
  res.rank.resize(size_t(R));
  Context ctx(dev, stream);
  MoEConfig oc = c.cfg;
  oc.max_tokens = std::max<int64_t>(T_all, 1);
  MoE one(ctx, oc);
  res.one = step(ctx, one, x_all, dy_all, T_all, c.forward_only);
  // The EP blocks get the one-rank block's parameters (a step changes grads, not weights).
  run_ranks(
      R,
      [&](int r, ep::InProcessTransport& tr) {
        Context rctx(dev, stream);
        MoEConfig ec = c.cfg;
        ec.max_tokens = T_max;
        ec.ep.transport = &tr;
        ec.ep.mode = c.mode;
        ec.ep.capacity = c.cap;
        ec.ep.chunks = c.chunks;
        MoE m(rctx, ec);
        copy_params(rctx, m, one);
        res.rank[size_t(r)] =
            step(rctx, m, xs[size_t(r)], dys[size_t(r)], c.tokens[size_t(r)], c.forward_only);
      },
      dev, stream);
  return res;
}

// Every field of two steps, bit for bit.
inline void expect_same_step(const StepOut& a, const StepOut& b) {
  using ep_harness::same_bits;
  EXPECT_EQ(a.status, b.status);
  EXPECT_TRUE(same_bits(a.y, b.y)) << "y";
  EXPECT_TRUE(same_bits(a.dx, b.dx)) << "dx";
  EXPECT_TRUE(same_bits(a.weights, b.weights)) << "router weights";
  EXPECT_TRUE(same_bits(a.wr_grad, b.wr_grad)) << "router dW";
  EXPECT_TRUE(same_bits(a.gu_w, b.gu_w)) << "gate_up dW";
  EXPECT_TRUE(same_bits(a.gu_b, b.gu_b)) << "gate_up db";
  EXPECT_TRUE(same_bits(a.down_w, b.down_w)) << "down dW";
  EXPECT_TRUE(same_bits(a.down_b, b.down_b)) << "down db";
  EXPECT_TRUE(same_bits(a.sgu_w, b.sgu_w)) << "shared gate_up dW";
  EXPECT_TRUE(same_bits(a.sdown_w, b.sdown_w)) << "shared down dW";
}

// Rows [first, first + n) of a [*, cols] vector.
inline std::vector<float> rows_of(const std::vector<float>& v, int64_t first, int64_t n,
                                  int64_t cols) {
  return {v.begin() + first * cols, v.begin() + (first + n) * cols};
}

// The sum over ranks of one replicated grad (fp64, then fp32).
inline std::vector<float> rank_sum(const std::vector<StepOut>& outs,
                                   std::vector<float> StepOut::*field) {
  std::vector<double> acc((outs[0].*field).size(), 0.0);
  for (const StepOut& o : outs)
    for (size_t i = 0; i < acc.size(); ++i) acc[i] += (o.*field)[i];
  return {acc.begin(), acc.end()};
}

}  // namespace groupmm::test::moe_ep
