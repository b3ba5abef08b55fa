// `groupmm bench moe`: the MoE block forward and forward + backward on Qwen3-30B-A3B, a
// DeepSeek-V3-like layer (32 local experts + a shared expert) and Mixtral-8x7B; per-stage
// breakdown; the four row movers (permute, unpermute and their backwards) in GB/s against a
// device-to-device copy of the same size timed in the same run. bench/peers_torch_moe.py times a
// plain PyTorch block on the same shapes (reading --json).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "bench_common.hpp"
#include "cli.hpp"
#include "groupmm/random.hpp"
#include "moe_tools.hpp"

namespace groupmm::tool {
namespace {

using nn::MoE;
using nn::MoEConfig;
using nn::MoEStage;

MoEConfig base(int64_t H, int64_t F, int64_t E, int64_t k, int64_t T) {
  MoEConfig c;
  c.hidden = H;
  c.ffn_hidden = F;
  c.experts = E;
  c.topk = k;
  c.max_tokens = T;
  c.renormalize = true;
  c.seed = 5;
  return c;
}

}  // namespace

std::vector<MoeBenchCase> moe_bench_cases(bool cpu) {
  MoEConfig q = base(2048, 768, 128, 8, 16384), d = base(7168, 2048, 32, 8, 8192),
            m = base(4096, 14336, 8, 2, 8192);
  d.score = RouterScore::sigmoid;  // DeepSeek-V3 routing, scaled to 32 local experts
  d.n_group = 8;
  d.topk_group = 4;
  d.scaling_factor = 2.5f;
  d.expert_bias = true;
  d.shared_ffn_hidden = 2048;
  if (cpu) {  // smoke shapes: every code path, small enough for the reference backend
    q = base(64, 32, 16, 4, 96);
    d.hidden = 64, d.ffn_hidden = 32, d.experts = 16, d.n_group = 4, d.topk_group = 2,
    d.shared_ffn_hidden = 32, d.max_tokens = 64;
    m = base(64, 96, 4, 2, 64);
  }
  return {{"qwen3", q}, {"dsv3", d}, {"mixtral", m}};
}

namespace {

struct Mover {
  const char* name;
  double us, bytes;
};

// The row movers on the layer's current map (from its last forward), each alone, and a D2D copy
// of the permuted buffer's size: bytes are what each moves (rows read + rows written).
std::vector<Mover> time_movers(Context& ctx, MoE& moe, const TensorView& x, int iters,
                               double* copy_gbs) {
  const PermuteMap& m = moe.permute_map();
  const int64_t T = m.tokens, R = m.rows, H = moe.config().hidden, k = m.topk;
  const Device d = ctx.device();
  cudaStream_t s = ctx.stream();
  Tensor a = Tensor::empty({R, H}, DType::bf16, d, s), b = Tensor::empty({R, H}, DType::bf16, d, s);
  Tensor y = Tensor::empty({T, H}, DType::bf16, d, s), pr = Tensor::empty({R}, DType::fp32, d, s);
  Tensor dw = Tensor::empty({T, k}, DType::fp32, d, s);
  fill_uniform(ctx, a, -1.0f, 1.0f, 3);
  fill_uniform(ctx, pr, -1.0f, 1.0f, 4);
  const TensorView w = moe.router_weights();
  const double row = double(H) * 2;
  std::vector<Mover> out;
  out.push_back({"permute (scatter)",
                 time_us(ctx, 2, iters, [&](int) { moe_permute(ctx, x, m, b, w, pr); }),
                 (T + R) * row});
  out.push_back({"unpermute (k-way sum)",
                 time_us(ctx, 2, iters, [&](int) { moe_unpermute(ctx, a, m, y); }), (T + R) * row});
  out.push_back({"unpermute backward",
                 time_us(ctx, 2, iters, [&](int) { moe_unpermute_backward(ctx, x, m, b); }),
                 (T + R) * row});
  out.push_back({"permute backward",
                 time_us(ctx, 2, iters, [&](int) { moe_permute_backward(ctx, a, m, y, pr, dw); }),
                 (T + R) * row});
  const double copy_us = time_us(ctx, 2, iters, [&](int) {
    if (d == Device::CUDA)
      GROUPMM_CHECK_CUDA(
          cudaMemcpyAsync(b.data(), a.data(), size_t(a.nbytes()), cudaMemcpyDeviceToDevice, s));
    else
      copy(b, a);
  });
  *copy_gbs = 2.0 * double(a.nbytes()) / (copy_us * 1e3);
  return out;
}

}  // namespace

double graph_replay_us(Context& ctx, int iters, const std::function<void()>& enqueue) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  GROUPMM_CHECK_CUDA(cudaStreamBeginCapture(ctx.stream(), cudaStreamCaptureModeThreadLocal));
  enqueue();
  GROUPMM_CHECK_CUDA(cudaStreamEndCapture(ctx.stream(), &graph));
  GROUPMM_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  const double us =
      time_us(ctx, 3, iters, [&](int) { GROUPMM_CHECK_CUDA(cudaGraphLaunch(exec, ctx.stream())); });
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return us;
}

int run_bench_moe(const MoeBenchOptions& o) {
  if (!o.ep.empty()) return run_bench_moe_ep(o);
  const bool gpu = !o.cpu;
  GROUPMM_CHECK(!gpu || cuda_available(),
                "bench moe: needs an sm_90 GPU (none visible); "
                "the cpu option runs a smoke version on the CPU");
  const Device dev = gpu ? Device::CUDA : Device::CPU;
  cudaStream_t stream = nullptr;
  if (gpu) GROUPMM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int iters = gpu ? o.iters : 1;
  std::ostringstream js;
  js << "{\"device\": \"" << (gpu ? "cuda" : "cpu") << "\", \"cases\": [";
  int rc = 0, n = 0;
  for (const MoeBenchCase& bc : moe_bench_cases(o.cpu)) {
    if (!o.cases.empty() && std::find(o.cases.begin(), o.cases.end(), bc.name) == o.cases.end())
      continue;
    MoEConfig c = bc.cfg;
    if (o.tokens > 0) c.max_tokens = o.tokens;
    const int64_t T = c.max_tokens, H = c.hidden;
    Context ctx(dev, stream);
    MoE moe(ctx, c);
    const BlockInputs in = block_inputs(ctx, T, H, 31);
    const Tensor &x = in.x, &dy = in.dy;
    std::printf("\n== %s: T=%lld H=%lld F=%lld E=%lld k=%lld%s, permuted rows %lld, bf16\n",
                bc.name, (long long)T, (long long)H, (long long)c.ffn_hidden, (long long)c.experts,
                (long long)c.topk,
                c.shared_ffn_hidden > 0
                    ? detail::cat(" + shared expert F=", c.shared_ffn_hidden).c_str()
                    : "",
                (long long)moe_permuted_rows(T, c.topk, c.experts));
    // validate first: sampled tokens against the CPU reference
    const TensorView y = moe.forward(ctx, x);
    ctx.check();
    int mism = 0;
    const double err = check_sampled_tokens(ctx, moe, x, y, 2, false, &mism);
    const bool ok = err <= 1e-2;
    std::printf(
        "  check: 2 sampled tokens vs the CPU reference: y rel err %.2e %s (routing "
        "differs on %d)\n",
        err, ok ? "ok" : "FAILED", mism);
    if (!ok) rc = 1;

    double fwd_us = 0, step_us = 0;
    if (gpu) {
      fwd_us = graph_replay_us(ctx, iters, [&] { moe.forward(ctx, x); });
      step_us = graph_replay_us(ctx, iters, [&] {
        moe.forward(ctx, x);
        moe.backward(ctx, dy);
      });
      std::printf("  forward            %10.1f us  (one CUDA graph)\n", fwd_us);
      std::printf("  forward+backward   %10.1f us  (one CUDA graph)\n", step_us);
    }
    const StageTimes st = time_stages(ctx, moe, x, dy, gpu ? 2 : 0, iters);
    std::printf("  stages (eager, %s, median of %d):\n", gpu ? "CUDA events" : "wall clock", iters);
    std::printf("    %-14s %10s %10s %7s\n", "stage", "fwd us", "bwd us", "share");
    double gemm = 0;
    for (int s = 0; s < 7; ++s) {
      const double tot = st.fwd[s] + st.bwd[s];
      if (tot == 0) continue;
      const MoEStage ms = MoEStage(s);
      if (ms == MoEStage::gate_up || ms == MoEStage::down || ms == MoEStage::shared_expert)
        gemm += tot;
      std::printf("    %-14s %10.1f %10.1f %6.1f%%\n", nn::moe_stage_name(ms), st.fwd[s], st.bwd[s],
                  100 * tot / st.total_us);
    }
    const double non_gemm = 100 * (st.total_us - gemm) / st.total_us;
    std::printf(
        "    %-14s %21.1f  non-GEMM share %.1f%% (router, permute, activation, "
        "unpermute; target <= 15%% on qwen3)\n",
        "eager step", st.total_us, non_gemm);
    double copy_gbs = 0;
    const auto movers = time_movers(ctx, moe, x, iters, &copy_gbs);
    std::printf(
        "  row movers (bytes = rows read + rows written; copy = D2D memcpy of the permuted "
        "buffer, same run: %.0f GB/s):\n",
        copy_gbs);
    js << (n++ ? ", " : "") << "{\"case\": \"" << bc.name << "\", \"T\": " << T << ", \"H\": " << H
       << ", \"F\": " << c.ffn_hidden << ", \"E\": " << c.experts << ", \"k\": " << c.topk
       << ", \"shared_F\": " << c.shared_ffn_hidden << ", \"score\": \""
       << router_score_name(c.score) << "\", \"fwd_us\": " << fwd_us
       << ", \"fwd_bwd_us\": " << step_us << ", \"eager_step_us\": " << st.total_us
       << ", \"non_gemm_pct\": " << non_gemm << ", \"copy_gbs\": " << copy_gbs << ", \"movers\": {";
    for (size_t i = 0; i < movers.size(); ++i) {
      const double gbs = movers[i].bytes / (movers[i].us * 1e3);
      std::printf("    %-22s %9.1f us %8.0f GB/s %6.1f%% of copy\n", movers[i].name, movers[i].us,
                  gbs, 100 * gbs / copy_gbs);
      js << (i ? ", " : "") << "\"" << movers[i].name << "\": " << gbs;
    }
    js << "}}";
    ctx.check();
  }
  js << "]}";
  if (!o.json.empty()) {
    std::printf("\n");
    write_json(o.json, js.str());
  }
  if (stream) cudaStreamDestroy(stream);
  return rc;
}

}  // namespace groupmm::tool
