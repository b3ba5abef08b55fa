// A capacity-mode EP layer step captured in one CUDA graph, for the GPU suites: every rank's
// plan, dispatch, combine (identity expert: y_grouped = x_grouped), combine backward and dispatch
// backward on one stream, then replays with new routing loaded into the same buffers.
#pragma once

#include <functional>

#include "common/ep_harness.hpp"

namespace groupmm::test::ep_harness {

// One rank's fixed buffers (T tokens) and capacity plan.
struct GraphRank {
  std::unique_ptr<Context> ctx;
  ep::EpPlan plan;
  Tensor ids, x, w, dy, xg, out, dyg, dw, dx;
  int64_t T = 0;

  GraphRank(ep::Transport& tr, cudaStream_t s, const EpConfig& cfg, const RunOpts& o, int64_t T_)
      : ctx(std::make_unique<Context>(Device::CUDA, s)), T(T_) {
    const int64_t H = cfg.hidden, k = cfg.topk;
    plan = ep::ep_capacity_plan_create(*ctx, tr, cfg, o.cap, T, o.dt);
    ids = Tensor::empty({T, k}, DType::int32, Device::CUDA, s);
    x = Tensor::empty({T, H}, o.dt, Device::CUDA, s);
    w = Tensor::empty({T, k}, DType::fp32, Device::CUDA, s);
    dy = Tensor::empty({T, H}, o.dt, Device::CUDA, s);
    xg = Tensor::empty({plan.rows, H}, o.dt, Device::CUDA, s);
    dyg = Tensor::empty({plan.rows, H}, o.dt, Device::CUDA, s);
    out = Tensor::empty({T, H}, o.dt, Device::CUDA, s);
    dx = Tensor::empty({T, H}, o.dt, Device::CUDA, s);
    dw = Tensor::empty({T, k}, DType::fp32, Device::CUDA, s);
  }
  // The captured work (no host sync, no allocation).
  void step(ep::Transport& tr) {
    Context& c = *ctx;
    ep::ep_capacity_plan(c, tr, ids, plan);
    ep::ep_dispatch(c, tr, plan, x, xg);
    ep::ep_combine(c, tr, plan, xg, w, out);
    ep::ep_combine_backward(c, tr, plan, dy, w, xg, dyg, dw);
    ep::ep_dispatch_backward(c, tr, plan, dyg, dx);
  }
  // New inputs into the same buffers, outputs poisoned.
  void load(const RankData& d, DType dt) {
    cudaStream_t s = ctx->stream();
    const int64_t H = x.view().dim(1), k = ids.view().dim(1);
    copy(ids, upload_ids(d.ids, {T, k}, Device::CPU, nullptr), s);
    copy(x, upload(d.x, dt, {T, H}, Device::CPU, nullptr), s);
    copy(w, upload(d.w, DType::fp32, {T, k}, Device::CPU, nullptr), s);
    copy(dy, upload(d.dy, dt, {T, H}, Device::CPU, nullptr), s);
    for (const Tensor* t : {&xg, &dyg, &out, &dx, &dw}) fill_bytes(*t, 0xFF, s);
    GROUPMM_CHECK_CUDA(cudaStreamSynchronize(s));
  }
  RankOut collect() {
    RankOut o;
    o.rows = plan.rows;
    o.splits = ints_of(plan.splits);
    o.x_grouped = floats_of(xg);
    o.out = floats_of(out);
    o.d_y_grouped = floats_of(dyg);
    o.d_weights = floats_of(dw);
    o.dx = floats_of(dx);
    o.status = ctx->take_status().bits;
    return o;
  }
};

// T tokens on every rank; token t of rank r sends its k slots to random experts of rank
// (t + r) % R, so no peer gets more than ceil(T / R) rows of one rank. `hot` sends every slot to
// expert 0 instead: T rows to rank 0, which overflows a capacity of ceil(T / R) rows when R >= 2.
inline std::vector<RankData> fixed_case(const EpConfig& cfg, DType dt, int64_t T, bool hot,
                                        std::mt19937_64& g) {
  const int64_t R = cfg.ranks, El = cfg.experts / R;
  std::vector<RankData> d(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    RankData& rd = d[size_t(r)];
    rd.T = T;
    rd.x = randn(size_t(T * cfg.hidden), 1.0f, g);
    rd.dy = randn(size_t(T * cfg.hidden), 1.0f, g);
    for (float& v : rd.x) v = round_to(dt, v);
    for (float& v : rd.dy) v = round_to(dt, v);
    rd.w = randn(size_t(T * cfg.topk), 1.0f, g);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < cfg.topk; ++j)
        rd.ids.push_back(hot ? 0 : int32_t((t + r) % R * El + int64_t(g() % uint64_t(El))));
  }
  return d;
}

// One replay round's outputs against the CPU backend bit for bit (status too): `got` from the
// ranks' buffers after replaying with routing `d` (round 2 is the overflowing `hot` one).
inline void expect_replay_round(const EpConfig& cfg, const RunOpts& o, int64_t T, int round,
                                const std::vector<RankData>& d, const std::vector<RankOut>& got) {
  RunOpts ref_o = o;
  ref_o.identity = true;
  const std::vector<RankOut> want = run_layer(cfg, d, ref_o);
  expect_same_steps(got, want, false);
  // Rank r overflows exactly when it sends rank 0 more than C rows (the hot round, R >= 2).
  const bool over = round == 2 && T > o.cap.rows_per_peer;
  for (size_t r = 0; r < got.size(); ++r)
    EXPECT_EQ(got[r].status, over ? uint32_t(kFaultEpCapacity) : 0u) << "rank " << r;
}

// The seed of the replay rounds' routing.
inline uint64_t replay_seed(const EpConfig& cfg) {
  return seed_for("ep_graph") + uint64_t(cfg.ranks);
}

// Captures every rank's step (rank r on thread r through run(r, step)) into one graph on `s`,
// then for each routing: load, replay, compare with the CPU backend bit for bit (status too).
inline void check_graph_replays(const EpConfig& cfg, const RunOpts& o, int64_t T,
                                std::vector<std::unique_ptr<GraphRank>>& ranks, cudaStream_t s,
                                const std::function<void(std::function<void(int)>)>& run_all,
                                const std::function<ep::Transport&(int)>& transport) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  GROUPMM_CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  run_all([&](int r) { ranks[size_t(r)]->step(transport(r)); });
  GROUPMM_CHECK_CUDA(cudaStreamEndCapture(s, &graph));
  GROUPMM_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  std::mt19937_64 g(replay_seed(cfg));
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE("replay " + std::to_string(round));
    const std::vector<RankData> d = fixed_case(cfg, o.dt, T, round == 2, g);
    for (size_t r = 0; r < ranks.size(); ++r) ranks[r]->load(d[r], o.dt);
    GROUPMM_CHECK_CUDA(cudaGraphLaunch(exec, s));
    GROUPMM_CHECK_CUDA(cudaStreamSynchronize(s));
    std::vector<RankOut> got;
    for (auto& rank : ranks) got.push_back(rank->collect());
    expect_replay_round(cfg, o, T, round, d, got);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

}  // namespace groupmm::test::ep_harness
