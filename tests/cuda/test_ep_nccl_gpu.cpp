// Expert-parallel ops over a real NCCL communicator on one GPU (R = 1; several ranks need a
// multi-GPU machine): a forward + backward step in both modes equals the CPU backend bit for bit,
// and the capacity mode captured in a CUDA graph (NCCL point-to-point under stream capture)
// replays with new routing. Built only with NCCL (CMakeLists.txt leaves out *nccl* sources).
#include "common/ep_graph.hpp"
#include "groupmm/ep_nccl.hpp"

namespace groupmm::test {
namespace {

using namespace ep_harness;

TEST(EpNcclGpu, OneRankMatchesCpu) {
  GROUPMM_REQUIRE_GPU();
  auto tr = ep::NcclTransport::create(ep::NcclTransport::unique_id(), 1, 0);
  ASSERT_EQ(tr->size(), 1);
  ASSERT_EQ(tr->rank(), 0);
  cudaStream_t s;
  GROUPMM_CHECK_CUDA(cudaStreamCreate(&s));
  for (const RunOpts& o : {RunOpts{DType::bf16, EpMode::throughput, {}},
                           RunOpts{DType::fp32, EpMode::capacity, {40, 0}},
                           RunOpts{DType::bf16, EpMode::capacity, {4, 0}}}) {  // overflow
    SCOPED_TRACE(std::string(ep::ep_mode_name(o.mode)) + " " + o.cap.to_string());
    const EpConfig cfg{8, 1, 64, 3};
    std::mt19937_64 g(seed_for("ep_nccl"));
    const std::vector<RankData> d = make_case(cfg, o.dt, Routing::mixed, g, 20);
    Context ctx(Device::CUDA, s);
    const RankOut got = run_rank(ctx, *tr, cfg, d[0], o);
    const RankOut want = run_layer(cfg, d, o)[0];
    EXPECT_EQ(got.splits, want.splits);
    EXPECT_TRUE(same_bits(got.x_grouped, want.x_grouped)) << "x_grouped";
    EXPECT_TRUE(same_bits(got.out, want.out)) << "out";
    EXPECT_TRUE(same_bits(got.d_y_grouped, want.d_y_grouped)) << "d_y_grouped";
    EXPECT_TRUE(same_bits(got.d_weights, want.d_weights)) << "d_weights";
    EXPECT_TRUE(same_bits(got.dx, want.dx)) << "dx";
    EXPECT_EQ(got.status, want.status);
  }
  cudaStreamDestroy(s);
}

TEST(EpNcclGpu, OneRankCapacityGraphReplays) {
  GROUPMM_REQUIRE_GPU();
  auto tr = ep::NcclTransport::create(ep::NcclTransport::unique_id(), 1, 0);
  const EpConfig cfg{8, 1, 64, 3};
  const RunOpts o{DType::bf16, EpMode::capacity, EpCapacity{12, 0}};
  cudaStream_t s;
  GROUPMM_CHECK_CUDA(cudaStreamCreate(&s));
  {
    std::vector<std::unique_ptr<GraphRank>> ranks;
    ranks.push_back(std::make_unique<GraphRank>(*tr, s, cfg, o, 12));
    GROUPMM_CHECK_CUDA(cudaStreamSynchronize(s));
    check_graph_replays(
        cfg, o, 12, ranks, s, [](std::function<void(int)> fn) { fn(0); },
        [&](int) -> ep::Transport& { return *tr; });
  }
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace groupmm::test
