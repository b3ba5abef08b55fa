// Expert-parallel ops over a real NCCL communicator: one rank on one GPU, and (where the machine
// has several GPUs) one rank per GPU, ranks as threads of this process. A forward + backward step
// in both modes equals the CPU backend bit for bit, so do the FP8 dispatch's rows, and the
// capacity mode captured in CUDA graphs (NCCL point-to-point under stream capture) replays with
// new routing. Built only with NCCL (CMakeLists.txt leaves out *nccl* sources).
//
// Not here: nn::MoE with ranks on several GPUs of one process. NCCL's kernels on the GPUs must run
// at once, and a synchronizing CUDA call of one rank's thread (a cudaFree when a workspace grows)
// between two ranks' launches can hold them apart (NCCL's documented caveat for one process
// driving several GPUs); such a threaded test hung on the two-GPU machine. Its deployment is one
// process per GPU, which `groupmm bench ep` runs (torchrun).
#include <functional>
#include <thread>

#include "common/ep_fp8_harness.hpp"
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

// ---- One rank per GPU -----------------------------------------------------------------------

// R ranks on GPUs 0..R-1 of this machine, rank r a thread whose current device is r, over one
// NCCL communicator; each rank has its own stream.
class GpuGroup {
 public:
  explicit GpuGroup(int R) : tr_(static_cast<size_t>(R)), streams_(static_cast<size_t>(R)) {
    const ncclUniqueId id = ep::NcclTransport::unique_id();
    run([&](int r) {  // a collective: every rank joins at once
      tr_[size_t(r)] = ep::NcclTransport::create(id, R, r);
      GROUPMM_CHECK_CUDA(cudaStreamCreate(&streams_[size_t(r)]));
    });
  }
  ~GpuGroup() {
    try {
      run([&](int r) {
        tr_[size_t(r)].reset();
        if (streams_[size_t(r)] != nullptr) cudaStreamDestroy(streams_[size_t(r)]);
      });
    } catch (...) {  // a destructor does not throw; the test has reported the failure
    }
  }
  GpuGroup(const GpuGroup&) = delete;
  GpuGroup& operator=(const GpuGroup&) = delete;

  int size() const { return int(tr_.size()); }
  ep::NcclTransport& transport(int r) { return *tr_[size_t(r)]; }
  cudaStream_t stream(int r) const { return streams_[size_t(r)]; }

  // fn(r) on one thread per rank, device r current; rethrows the first rank's exception.
  void run(const std::function<void(int)>& fn) const {
    std::vector<std::exception_ptr> errs(tr_.size());
    std::vector<std::thread> threads;
    for (int r = 0; r < size(); ++r)
      threads.emplace_back([&, r] {
        try {
          GROUPMM_CHECK_CUDA(cudaSetDevice(r));
          fn(r);
        } catch (...) {
          errs[size_t(r)] = std::current_exception();
        }
      });
    for (auto& t : threads) t.join();
    for (auto& e : errs)
      if (e) std::rethrow_exception(e);
  }

 private:
  std::vector<std::unique_ptr<ep::NcclTransport>> tr_;
  std::vector<cudaStream_t> streams_;
};

// Ranks for the one-rank-per-GPU tests: every GPU, at most 4; 0 (skip) with fewer than 2.
int gpu_ranks() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n >= 2 ? std::min(n, 4) : 0;
}

#define GROUPMM_REQUIRE_GPUS(R) \
  GROUPMM_REQUIRE_GPU();        \
  const int R = gpu_ranks();    \
  if (R < 2) GTEST_SKIP() << "one rank per GPU needs 2 or more GPUs; this machine has fewer"

TEST(EpNcclMultiGpu, StepMatchesCpu) {
  GROUPMM_REQUIRE_GPUS(R);
  GpuGroup group(R);
  RunOpts with_probs{DType::bf16, EpMode::capacity, {24, 0}};
  with_probs.probs = true;
  for (const RunOpts& o : {RunOpts{DType::bf16, EpMode::throughput, {}},
                           RunOpts{DType::fp32, EpMode::capacity, {40, 0}},
                           RunOpts{DType::bf16, EpMode::capacity, {4, 0}}, with_probs})
    for (Routing routing : {Routing::mixed, Routing::one_expert}) {
      const EpConfig cfg{4 * R, R, 192, 3};
      SCOPED_TRACE(cfg.to_string() + " " + ep::ep_mode_name(o.mode) + " " + o.cap.to_string() +
                   (o.probs ? " probs" : "") + (routing == Routing::mixed ? " mixed" : " one"));
      std::mt19937_64 g(seed_for("ep_nccl_multi") + uint64_t(R));
      const std::vector<RankData> d = make_case(cfg, o.dt, routing, g, 20);
      std::vector<RankOut> got(static_cast<size_t>(R));
      group.run([&](int r) {
        Context ctx(Device::CUDA, group.stream(r));
        got[size_t(r)] = run_rank(ctx, group.transport(r), cfg, d[size_t(r)], o);
      });
      expect_same_steps(got, run_layer(cfg, d, o), false);
    }
}

TEST(EpNcclMultiGpu, Fp8DispatchMatchesCpu) {
  GROUPMM_REQUIRE_GPUS(R);
  GpuGroup group(R);
  for (const RunOpts& o : {RunOpts{DType::bf16, EpMode::throughput, {}},
                           RunOpts{DType::bf16, EpMode::capacity, {2, 0}}}) {
    const EpConfig cfg{4 * R, R, 384, 3};
    SCOPED_TRACE(cfg.to_string() + " " + ep::ep_mode_name(o.mode) + " " + o.cap.to_string());
    std::mt19937_64 g(seed_for("ep_nccl_multi_fp8") + uint64_t(R));
    const std::vector<RankData> d = make_case(cfg, DType::bf16, Routing::mixed, g, 12);
    std::vector<Fp8RankOut> got(static_cast<size_t>(R));
    group.run([&](int r) {
      Context ctx(Device::CUDA, group.stream(r));
      got[size_t(r)] = run_fp8_rank(ctx, group.transport(r), cfg, d[size_t(r)], o, {});
    });
    const std::vector<Fp8RankOut> want = run_fp8(cfg, d, o, {}, Device::CPU);
    for (int r = 0; r < R; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      const Fp8RankOut &a = got[size_t(r)], &b = want[size_t(r)];
      EXPECT_EQ(a.rows, b.rows);
      EXPECT_EQ(a.splits, b.splits);
      EXPECT_EQ(a.data, b.data) << "data";
      EXPECT_TRUE(same_bits(a.scales, b.scales)) << "scales";
      EXPECT_TRUE(same_bits(a.probs, b.probs)) << "probs";
      EXPECT_EQ(a.status, b.status);
    }
  }
}

// Each rank captures its own step into its own graph on its own GPU (as one process per GPU
// would); the graphs replay together with new routing, overflow included. Small and 4 MB rows
// per peer: NCCL connects peers lazily, so the capture must not be their first exchange (the
// transport connects them when it is made).
TEST(EpNcclMultiGpu, CapacityGraphsReplay) {
  GROUPMM_REQUIRE_GPUS(R);
  GpuGroup group(R);
  for (auto [T, H] : {std::pair<int64_t, int64_t>{12, 64}, {1024, 4096}}) {
    const EpConfig cfg{4 * R, R, H, 3};
    const RunOpts o{DType::bf16, EpMode::capacity, EpCapacity{(T + R - 1) / R, 0}};
    SCOPED_TRACE(cfg.to_string() + " T=" + std::to_string(T));
    std::vector<std::unique_ptr<GraphRank>> ranks(static_cast<size_t>(R));
    std::vector<cudaGraphExec_t> execs(static_cast<size_t>(R), nullptr);
    group.run([&](int r) {
      cudaStream_t s = group.stream(r);
      ranks[size_t(r)] = std::make_unique<GraphRank>(group.transport(r), s, cfg, o, T);
      GROUPMM_CHECK_CUDA(cudaStreamSynchronize(s));
      cudaGraph_t graph = nullptr;
      GROUPMM_CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      try {
        ranks[size_t(r)]->step(group.transport(r));
      } catch (...) {  // end the capture, or the stream stays unusable for the next tests
        if (cudaStreamEndCapture(s, &graph) == cudaSuccess && graph != nullptr)
          cudaGraphDestroy(graph);
        throw;
      }
      GROUPMM_CHECK_CUDA(cudaStreamEndCapture(s, &graph));
      const cudaError_t inst = cudaGraphInstantiate(&execs[size_t(r)], graph, 0);
      cudaGraphDestroy(graph);
      GROUPMM_CHECK_CUDA(inst);
    });
    std::mt19937_64 g(replay_seed(cfg));
    for (int round = 0; round < 4; ++round) {
      SCOPED_TRACE("replay " + std::to_string(round));
      const std::vector<RankData> d = fixed_case(cfg, o.dt, T, round == 2, g);
      std::vector<RankOut> got(static_cast<size_t>(R));
      group.run([&](int r) {
        ranks[size_t(r)]->load(d[size_t(r)], o.dt);
        GROUPMM_CHECK_CUDA(cudaGraphLaunch(execs[size_t(r)], group.stream(r)));
        GROUPMM_CHECK_CUDA(cudaStreamSynchronize(group.stream(r)));
        got[size_t(r)] = ranks[size_t(r)]->collect();
      });
      expect_replay_round(cfg, o, T, round, d, got);
    }
    group.run([&](int r) {
      if (execs[size_t(r)] != nullptr) cudaGraphExecDestroy(execs[size_t(r)]);
      ranks[size_t(r)].reset();
    });
  }
}

}  // namespace
}  // namespace groupmm::test
