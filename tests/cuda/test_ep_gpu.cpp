// Expert-parallel ops on the CUDA backend against the CPU backend, bit for bit: R ranks as host
// threads sharing one GPU through the device in-process group (one stream), every output of a
// forward + backward step, both modes (capacity with and without overflow), bf16 / fp16 / fp32,
// vector and scalar row paths, weighted combine or router weights routed as probs; the capacity
// mode captured in a CUDA graph and replayed with new routing (overflow included); the combine's
// and dispatch backward's addend; the transport / Context device check.
#include "common/ep_graph.hpp"

namespace groupmm::test {
namespace {

using namespace ep_harness;

struct GpuCase {
  EpConfig cfg;
  RunOpts o;
  Routing routing = Routing::mixed;
  int64_t max_tokens = 9;
};

TEST(EpGpu, MatchesCpuBitForBit) {
  GROUPMM_REQUIRE_GPU();
  const EpMode tp = EpMode::throughput, cap = EpMode::capacity;
  std::vector<GpuCase> cases;
  for (int R : {1, 2, 4}) {
    cases.push_back({EpConfig{8, R, 24, 2}, RunOpts{DType::fp32, tp, {}}});
    cases.push_back({EpConfig{16, R, 64, 4}, RunOpts{DType::bf16, tp, {}}});  // vectors
    cases.push_back({EpConfig{8, R, 13, 3}, RunOpts{DType::fp16, tp, {}}});   // odd H
    cases.push_back({EpConfig{16, R, 64, 4}, RunOpts{DType::bf16, cap, {9 + 3 * R, 0}}});
    cases.push_back({EpConfig{8, R, 40, 3}, RunOpts{DType::fp32, cap, {2, 0}}});  // overflow
    cases.push_back({EpConfig{8, R, 40, 3}, RunOpts{DType::bf16, cap, {6, 5}}});  // entries
    cases.push_back({EpConfig{8, R, 32, 2}, RunOpts{DType::bf16, tp, {}}, Routing::one_expert});
    // the router weights through the dispatch (probs), unweighted combine
    cases.push_back({EpConfig{16, R, 64, 4}, RunOpts{DType::bf16, tp, {}, false, true}});
    cases.push_back({EpConfig{8, R, 40, 3}, RunOpts{DType::fp32, cap, {3, 0}, false, true}});
    // the tail left alone (EpCapacity::zero_tail), both weight conventions
    cases.push_back({EpConfig{16, R, 64, 4}, RunOpts{DType::bf16, cap, {9 + 3 * R, 0, false}}});
    cases.push_back(
        {EpConfig{8, R, 40, 3}, RunOpts{DType::fp32, cap, {9 + 3 * R, 0, false}, false, true}});
  }
  // Many tokens: several chunks of the send scan (256 tokens) and of the permute-plan ranking.
  cases.push_back({EpConfig{64, 4, 256, 8}, RunOpts{DType::bf16, tp, {}}, Routing::mixed, 600});
  cases.push_back(
      {EpConfig{64, 4, 256, 8}, RunOpts{DType::bf16, cap, {700, 0}}, Routing::mixed, 600});
  cases.push_back(
      {EpConfig{64, 4, 128, 8}, RunOpts{DType::fp32, cap, {300, 900}}, Routing::mixed, 600});
  // Capacity plans over many send chunks (256 tokens), overflowing in a later chunk: by rows, and
  // by entries.
  cases.push_back(
      {EpConfig{16, 2, 64, 4}, RunOpts{DType::bf16, cap, {700, 0}}, Routing::mixed, 2000});
  cases.push_back(
      {EpConfig{16, 2, 64, 4}, RunOpts{DType::bf16, cap, {2100, 1500}}, Routing::mixed, 2000});
  for (const GpuCase& c : cases) {
    SCOPED_TRACE(c.cfg.to_string() + " " + dtype_name(c.o.dt) + " " + ep::ep_mode_name(c.o.mode) +
                 " " + c.o.cap.to_string());
    std::mt19937_64 g(seed_for("ep_gpu") + uint64_t(c.cfg.ranks * 131 + c.cfg.hidden));
    const std::vector<RankData> d = make_case(c.cfg, c.o.dt, c.routing, g, c.max_tokens);
    expect_same_steps(run_layer(c.cfg, d, c.o, Device::CUDA), run_layer(c.cfg, d, c.o, Device::CPU),
                      true);
  }
}

TEST(EpGpu, CapacityModeGraphReplaysWithChangedRouting) {
  GROUPMM_REQUIRE_GPU();
  for (int R : {1, 2, 4}) {
    SCOPED_TRACE("R=" + std::to_string(R));
    const EpConfig cfg{8, R, 64, 3};
    const int64_t T = 12;  // the balanced rounds fit C = T / R rows a peer; the hot one does not
    const RunOpts o{DType::bf16, EpMode::capacity, EpCapacity{T / R, 0}};
    cudaStream_t s;
    GROUPMM_CHECK_CUDA(cudaStreamCreate(&s));
    {
      auto group = ep::make_in_process_group(R, Device::CUDA, s);
      std::vector<std::unique_ptr<GraphRank>> ranks;
      for (int r = 0; r < R; ++r)
        ranks.push_back(std::make_unique<GraphRank>(*group[size_t(r)], s, cfg, o, T));
      GROUPMM_CHECK_CUDA(cudaStreamSynchronize(s));
      const auto run_all = [&](std::function<void(int)> fn) {
        run_ranks(R, [&](int r, ep::InProcessTransport&) { fn(r); });
      };
      check_graph_replays(cfg, o, T, ranks, s, run_all,
                          [&](int r) -> ep::Transport& { return *group[size_t(r)]; });
    }
    cudaStreamDestroy(s);
  }
}

// ep_combine / ep_dispatch_backward with the addend (the shared expert's output / dx): out = the
// k rows' fp32 sum + add, rounded once; CUDA against the CPU backend, bit for bit (vector and
// scalar rows).
std::vector<std::vector<float>> addend_step(const EpConfig& cfg, const std::vector<RankData>& d,
                                            DType dt, Device dev) {
  const int R = int(cfg.ranks);
  std::vector<std::vector<float>> res(size_t(2 * R));
  cudaStream_t s = nullptr;
  if (dev == Device::CUDA) GROUPMM_CHECK_CUDA(cudaStreamCreate(&s));
  run_ranks(
      R,
      [&](int r, ep::InProcessTransport& tr) {
        Context ctx(dev, s);
        const RankData& rd = d[size_t(r)];
        const int64_t H = cfg.hidden;
        Tensor ids = upload_ids(rd.ids, {rd.T, cfg.topk}, dev, s);
        Tensor x = upload(rd.x, dt, {rd.T, H}, dev, s);
        Tensor add = upload(rd.dy, dt, {rd.T, H}, dev, s);
        Tensor w = upload(rd.w, DType::fp32, {rd.T, cfg.topk}, dev, s);
        ep::EpPlan plan = ep::ep_dispatch_plan(ctx, tr, cfg, ids);
        Tensor xg = Tensor::empty({plan.rows, H}, dt, dev, s);
        Tensor y = Tensor::empty({rd.T, H}, dt, dev, s);
        Tensor dx = Tensor::empty({rd.T, H}, dt, dev, s);
        ep::ep_dispatch(ctx, tr, plan, x, xg);
        ep::ep_combine(ctx, tr, plan, xg, w, y, add);
        ep::ep_dispatch_backward(ctx, tr, plan, xg, dx, TensorView(), TensorView(), add);
        res[size_t(2 * r)] = floats_of(y);
        res[size_t(2 * r + 1)] = floats_of(dx);
      },
      dev, s);
  if (s != nullptr) cudaStreamDestroy(s);
  return res;
}

TEST(EpGpu, AddendMatchesCpuBitForBit) {
  GROUPMM_REQUIRE_GPU();
  for (int R : {1, 2, 4})
    for (auto [H, dt] : {std::pair{int64_t(64), DType::bf16},
                         {int64_t(13), DType::fp16},
                         {int64_t(24), DType::fp32}}) {
      const EpConfig cfg{8, R, H, 3};
      SCOPED_TRACE(cfg.to_string() + " " + dtype_name(dt));
      std::mt19937_64 g(seed_for("ep_gpu_add") + uint64_t(R * 131 + H));
      const std::vector<RankData> d = make_case(cfg, dt, Routing::mixed, g);
      const auto got = addend_step(cfg, d, dt, Device::CUDA);
      const auto want = addend_step(cfg, d, dt, Device::CPU);
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_TRUE(same_bits(got[i], want[i])) << (i % 2 ? "dx" : "y") << " of rank " << i / 2;
    }
}

TEST(EpGpu, TransportMustLiveOnTheContextsDevice) {
  GROUPMM_REQUIRE_GPU();
  auto group = ep::make_in_process_group(1);  // host buffers
  Context ctx(Device::CUDA);
  Tensor ids = Tensor::empty({1, 1}, DType::int32, Device::CUDA);
  EXPECT_THROW_MSG(ep::ep_dispatch_plan(ctx, *group[0], EpConfig{2, 1, 8, 1}, ids),
                   "ep_dispatch_plan: the transport's buffers live on cpu but the Context is cuda");
}

}  // namespace
}  // namespace groupmm::test
