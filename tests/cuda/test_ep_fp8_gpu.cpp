// FP8 dispatch (ep_dispatch_fp8) on the CUDA backend: R = 1, 2, 4 ranks as threads sharing one GPU
// (the device in-process group), against the CPU backend bit for bit (quantized rows, scales,
// probs, splits, status, bytes on the wire), both modes (capacity with and without overflow); the
// FP8 block GEMM run on the dispatched operand as it lies (against the CPU GEMM on the same
// operand, within the FP8 GEMM tests' tolerance); quantize + capacity plan + FP8 dispatch captured
// in one CUDA graph and replayed with new routing (overflow included).
#include <functional>

#include "common/ep_fp8_harness.hpp"
#include "common/ep_graph.hpp"

namespace groupmm::test {
namespace {

using namespace ep_harness;

void expect_same(const std::vector<Fp8RankOut>& got, const std::vector<Fp8RankOut>& want,
                 bool gemm_exact) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t r = 0; r < got.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(got[r].rows, want[r].rows);
    EXPECT_EQ(got[r].splits, want[r].splits);
    EXPECT_EQ(got[r].data, want[r].data) << "data";
    EXPECT_TRUE(same_bits(got[r].scales, want[r].scales)) << "scales";
    EXPECT_TRUE(same_bits(got[r].probs, want[r].probs)) << "probs";
    EXPECT_EQ(got[r].status, want[r].status);
    EXPECT_EQ(got[r].sent_bytes, want[r].sent_bytes);
    ASSERT_EQ(got[r].gemm.size(), want[r].gemm.size());
    if (gemm_exact)
      EXPECT_TRUE(same_bits(got[r].gemm, want[r].gemm)) << "gemm";
    else  // the CUTLASS FP8 block GEMM against the CPU reference: fp32 sums in another order
      EXPECT_LE(rel_error(got[r].gemm, want[r].gemm), 1e-2) << "gemm";
  }
}

TEST(EpFp8Gpu, MatchesCpuBitForBit) {
  GROUPMM_REQUIRE_GPU();
  const EpMode tp = EpMode::throughput, cap = EpMode::capacity;
  for (int R : {1, 2, 4})
    for (const RunOpts& o :
         {RunOpts{DType::bf16, tp, {}}, RunOpts{DType::bf16, cap, {9 + 3 * R, 0}},
          RunOpts{DType::bf16, cap, {2, 0}}, RunOpts{DType::bf16, cap, {6, 5}},
          RunOpts{DType::bf16, cap, {9 + 3 * R, 0, false}}})  // the tail left alone
      for (int64_t H : {128, 384, 512}) {                     // wire rows of 144, 432 and 576 bytes
        const EpConfig cfg{8, R, H, 3};
        SCOPED_TRACE(cfg.to_string() + " " + ep::ep_mode_name(o.mode) + " " + o.cap.to_string());
        std::mt19937_64 g(seed_for("ep_fp8_gpu") + uint64_t(R * 131 + H));
        const std::vector<RankData> d = make_case(cfg, DType::bf16, Routing::mixed, g, 12);
        expect_same(run_fp8(cfg, d, o, {}, Device::CUDA), run_fp8(cfg, d, o, {}, Device::CPU),
                    true);
      }
}

TEST(EpFp8Gpu, GemmReadsTheDispatchedOperand) {
  GROUPMM_REQUIRE_GPU();
  for (int R : {1, 2, 4})
    for (EpMode mode : {EpMode::throughput, EpMode::capacity}) {
      const EpConfig cfg{8, R, 256, 2};
      const RunOpts o{DType::bf16, mode, EpCapacity{40, 0}};
      SCOPED_TRACE(cfg.to_string() + " " + ep::ep_mode_name(mode));
      std::mt19937_64 g(seed_for("ep_fp8_gpu_gemm") + uint64_t(R));
      const std::vector<RankData> d = make_case(cfg, DType::bf16, Routing::mixed, g, 30);
      Fp8Weights w{128, randn(size_t(cfg.experts * 128 * cfg.hidden), 0.05f, g)};
      for (float& v : w.w) v = round_to(DType::bf16, v);
      expect_same(run_fp8(cfg, d, o, w, Device::CUDA), run_fp8(cfg, d, o, w, Device::CPU), false);
    }
}

// One rank's fixed buffers for a captured step: quantize its tokens, capacity plan, FP8 dispatch.
struct Fp8GraphRank {
  std::unique_ptr<Context> ctx;
  ep::EpPlan plan;
  Tensor ids, x, w, probs, splits;
  QuantizedBuffers xq, xg;
  GroupQuantizeArgs qa;
  int64_t T, H, El;

  Fp8GraphRank(ep::Transport& tr, cudaStream_t s, const EpConfig& cfg, const EpCapacity& cap,
               int64_t T_)
      : ctx(std::make_unique<Context>(Device::CUDA, s)),
        T(T_),
        H(cfg.hidden),
        El(cfg.experts / cfg.ranks) {
    const QuantizeConfig qc = ep::ep_fp8_dispatch_config();
    plan = ep::ep_capacity_plan_create(*ctx, tr, cfg, cap, T, DType::bf16);
    ids = Tensor::empty({T, cfg.topk}, DType::int32, Device::CUDA, s);
    x = Tensor::empty({T, H}, DType::bf16, Device::CUDA, s);
    w = Tensor::empty({T, cfg.topk}, DType::fp32, Device::CUDA, s);
    probs = Tensor::empty({plan.rows}, DType::fp32, Device::CUDA, s);
    splits = upload_ids({int32_t(T)}, {1}, Device::CUDA, s);
    xq = allocate_quantized(group_quantize_shapes(T, H, 1, qc), Device::CUDA, s);
    xg = allocate_quantized(group_quantize_shapes(plan.rows, H, El, qc), Device::CUDA, s);
    qa.input = x;
    qa.splits = splits;
    qa.config = qc;
    qa.out = xq.view(1, splits, qc);
    ctx->reserve_workspace(group_quantize_workspace_size(*ctx, qa));
  }
  void step(ep::Transport& tr) {
    const GroupedTensor q = group_quantize(*ctx, qa);
    ep::ep_capacity_plan(*ctx, tr, ids, plan);
    ep::ep_dispatch_fp8(*ctx, tr, plan, q, xg.view(El, TensorView(), ep::ep_fp8_dispatch_config()),
                        w, probs);
  }
  void load(const RankData& d) {
    cudaStream_t s = ctx->stream();
    const int64_t k = ids.view().dim(1);
    copy(ids, upload_ids(d.ids, {T, k}, Device::CPU, nullptr), s);
    copy(x, upload(d.x, DType::bf16, {T, H}, Device::CPU, nullptr), s);
    copy(w, upload(d.w, DType::fp32, {T, k}, Device::CPU, nullptr), s);
    for (const Tensor* t : {&xg.data, &xg.scale_inv, &probs}) fill_bytes(*t, 0xFF, s);
    GROUPMM_CHECK_CUDA(cudaStreamSynchronize(s));
  }
  Fp8RankOut collect() {
    Fp8RankOut o;
    o.rows = plan.rows;
    o.splits = ints_of(plan.splits);
    o.data = bytes_of(xg.data);
    o.scales = floats_of(xg.scale_inv);
    o.probs = floats_of(probs);
    o.status = ctx->take_status().bits;
    return o;
  }
};

TEST(EpFp8Gpu, CapacityModeGraphReplaysWithChangedRouting) {
  GROUPMM_REQUIRE_GPU();
  for (int R : {1, 2, 4}) {
    SCOPED_TRACE("R=" + std::to_string(R));
    const EpConfig cfg{8, R, 256, 3};
    const int64_t T = 12;
    const RunOpts o{DType::bf16, EpMode::capacity, EpCapacity{T / R, 0}};
    cudaStream_t s;
    GROUPMM_CHECK_CUDA(cudaStreamCreate(&s));
    {
      auto group = ep::make_in_process_group(R, Device::CUDA, s);
      std::vector<std::unique_ptr<Fp8GraphRank>> ranks;
      for (int r = 0; r < R; ++r)
        ranks.push_back(std::make_unique<Fp8GraphRank>(*group[size_t(r)], s, cfg, o.cap, T));
      const auto run_all = [&](const std::function<void(int)>& fn) {
        run_ranks(R, [&](int r, ep::InProcessTransport&) { fn(r); });
      };
      std::mt19937_64 g(seed_for("ep_fp8_graph") + uint64_t(R));
      // Eagerly once (kernel attributes are set on first use), then capture.
      for (int r = 0; r < R; ++r)
        ranks[size_t(r)]->load(fixed_case(cfg, DType::bf16, T, false, g)[size_t(r)]);
      run_all([&](int r) { ranks[size_t(r)]->step(*group[size_t(r)]); });
      GROUPMM_CHECK_CUDA(cudaStreamSynchronize(s));
      for (auto& rk : ranks) (void)rk->ctx->take_status();
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      GROUPMM_CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
      run_all([&](int r) { ranks[size_t(r)]->step(*group[size_t(r)]); });
      GROUPMM_CHECK_CUDA(cudaStreamEndCapture(s, &graph));
      GROUPMM_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
      for (int round = 0; round < 4; ++round) {
        SCOPED_TRACE("replay " + std::to_string(round));
        const std::vector<RankData> d = fixed_case(cfg, DType::bf16, T, round == 2, g);
        for (int r = 0; r < R; ++r) ranks[size_t(r)]->load(d[size_t(r)]);
        GROUPMM_CHECK_CUDA(cudaGraphLaunch(exec, s));
        GROUPMM_CHECK_CUDA(cudaStreamSynchronize(s));
        const std::vector<Fp8RankOut> want = run_fp8(cfg, d, o, {}, Device::CPU);
        std::vector<Fp8RankOut> got;
        for (auto& rk : ranks) got.push_back(rk->collect());
        for (auto& gr : got) gr.sent_bytes = {};
        std::vector<Fp8RankOut> want_nb = want;
        for (auto& wr : want_nb) wr.sent_bytes = {};
        expect_same(got, want_nb, true);
        const bool over = round == 2 && T > o.cap.rows_per_peer;
        for (const Fp8RankOut& gr : got)
          EXPECT_EQ(gr.status, over ? uint32_t(kFaultEpCapacity) : 0u);
      }
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
    }
    cudaStreamDestroy(s);
  }
}

}  // namespace
}  // namespace groupmm::test
