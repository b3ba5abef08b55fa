// nn::MoE's chunked expert-parallel step (ep.chunks) over a real NCCL communicator, one rank on
// one GPU: NcclTransport::concurrent_streams() is true, so the exchanges run on the layer's
// second stream beside the experts' compute. Bit for bit against the unchunked block (eager, both
// modes, 2 and 3 chunks), and the capacity mode's chunked step captured in one CUDA graph (fork
// and join of the two streams, NCCL under capture) replays with new routing equal to an eager
// unchunked step; the GEMMs on fewer SMs (ep.exchange_sms) change no bit. Built only with NCCL
// (CMakeLists.txt leaves out *nccl* sources).
#include "common/moe_ep_harness.hpp"
#include "groupmm/ep_nccl.hpp"

namespace groupmm::test {
namespace {

using namespace moe_ep;

MoEConfig nccl_block(ep::Transport& tr, ep::EpMode mode, int64_t chunks, bool training_grads) {
  MoEConfig c{.hidden = 256,
              .ffn_hidden = 128,
              .experts = 8,
              .topk = 2,
              .max_tokens = 48,
              .renormalize = true,
              .shared_ffn_hidden = 128,
              .bias = true,
              .dtype = DType::bf16,
              .seed = 9};
  // Delayed wgrad into fp32 main grads (eager), or grads written afresh each step (replays).
  c.delay_wgrad = training_grads;
  c.accumulate_into_main_grad = training_grads;
  c.ep.transport = &tr;
  c.ep.mode = mode;
  c.ep.capacity = ep::EpCapacity{48, 0};
  c.ep.chunks = chunks;
  return c;
}

// The outputs and grads of the block's last step (y and dx: the views that step returned).
StepOut collect(Context& ctx, MoE& m, const TensorView& y, const TensorView& dx) {
  StepOut o;
  o.y = floats_of(y);
  o.dx = floats_of(dx);
  o.weights = floats_of(m.router_weights());
  o.wr_grad = values(m.router_weight_grad());
  o.gu_w = values(m.gate_up().weight_grad());
  o.gu_b = values(m.gate_up().bias_grad());
  o.down_w = values(m.down().weight_grad());
  o.down_b = values(m.down().bias_grad());
  o.sgu_w = values(m.shared_gate_up().weight_grad());
  o.sdown_w = values(m.shared_down().weight_grad());
  o.status = ctx.take_status().bits;
  return o;
}

TEST(MoeEpOverlapNcclGpu, OneRankChunksMatchUnchunked) {
  GROUPMM_REQUIRE_GPU();
  auto tr = ep::NcclTransport::create(ep::NcclTransport::unique_id(), 1, 0);
  ASSERT_TRUE(tr->concurrent_streams());
  const ep_harness::GroupStream gs(Device::CUDA);
  const int64_t T = 40, H = 256;
  std::mt19937_64 g(seed_for("moe_ep_overlap_nccl"));
  std::vector<float> x = randn(size_t(T * H), 1.0f, g), dy = randn(size_t(T * H), 0.5f, g);
  for (auto* v : {&x, &dy})
    for (float& f : *v) f = ep_harness::round_to(DType::bf16, f);
  for (ep::EpMode mode : {ep::EpMode::throughput, ep::EpMode::capacity}) {
    Context ctx(Device::CUDA, gs.s);
    MoE base(ctx, nccl_block(*tr, mode, 1, true));
    const StepOut want = step(ctx, base, x, dy, T);
    // exchange_sms: the chunked step's GEMMs on fewer SMs compute the same tiles.
    for (auto [n, sms] :
         {std::pair<int64_t, int>{2, 0}, {3, 0}, {2, 20}, {3, ctx.sm_count() - 1}}) {
      SCOPED_TRACE(std::string(ep::ep_mode_name(mode)) + " chunks=" + std::to_string(n) +
                   " exchange_sms=" + std::to_string(sms));
      MoEConfig cfg = nccl_block(*tr, mode, n, true);
      cfg.ep.exchange_sms = sms;
      MoE m(ctx, cfg);
      copy_params(ctx, m, base);
      const StepOut got = step(ctx, m, x, dy, T);
      EXPECT_EQ(got.status, 0u);
      EXPECT_EQ(ctx.gemm_sm_limit(), 0);  // the step gave the caller's limit back
      expect_same_step(got, want);
    }
  }
}

TEST(MoeEpOverlapNcclGpu, OneRankCapacityChunkedGraphReplays) {
  GROUPMM_REQUIRE_GPU();
  auto tr = ep::NcclTransport::create(ep::NcclTransport::unique_id(), 1, 0);
  const ep_harness::GroupStream gs(Device::CUDA);
  cudaStream_t s = gs.s;
  const int64_t T = 40, H = 256;
  Context ctx(Device::CUDA, s);
  MoE ref(ctx, nccl_block(*tr, ep::EpMode::capacity, 1, false));
  MoE m(ctx, nccl_block(*tr, ep::EpMode::capacity, 2, false));
  copy_params(ctx, m, ref);
  Tensor x = Tensor::empty({T, H}, DType::bf16, Device::CUDA, s);
  Tensor dy = Tensor::empty({T, H}, DType::bf16, Device::CUDA, s);
  std::mt19937_64 g(seed_for("moe_ep_overlap_nccl_graph"));
  const auto load = [&] {  // new inputs (so new routing) into the same buffers
    std::vector<float> xv = randn(size_t(T * H), 1.0f, g), dv = randn(size_t(T * H), 0.5f, g);
    copy(x, ep_harness::upload(xv, DType::bf16, {T, H}, Device::CPU, nullptr), s);
    copy(dy, ep_harness::upload(dv, DType::bf16, {T, H}, Device::CPU, nullptr), s);
    GROUPMM_CHECK_CUDA(cudaStreamSynchronize(s));
  };
  // An eager step first: the plan for T and every kernel's first use happen outside the capture.
  load();
  const TensorView y = m.forward(ctx, x);
  const TensorView dx = m.backward(ctx, dy);
  ctx.synchronize();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  GROUPMM_CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  m.forward(ctx, x);
  m.backward(ctx, dy);
  GROUPMM_CHECK_CUDA(cudaStreamEndCapture(s, &graph));
  GROUPMM_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    load();
    GROUPMM_CHECK_CUDA(cudaGraphLaunch(exec, s));
    GROUPMM_CHECK_CUDA(cudaStreamSynchronize(s));
    const StepOut got = collect(ctx, m, y, dx);
    const TensorView ry = ref.forward(ctx, x);
    const TensorView rdx = ref.backward(ctx, dy);
    const StepOut want = collect(ctx, ref, ry, rdx);
    EXPECT_EQ(got.status, 0u);
    expect_same_step(got, want);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

}  // namespace
}  // namespace groupmm::test
