// `groupmm demo moe`: the whole MoE block (router, permute, expert MLP, unpermute, optional shared
// expert) forward + backward: routing summary, per-stage table, one-CUDA-graph step time, and
// sampled tokens checked against the CPU reference ops (common/moe_block.cpp). GPU:
// Qwen3-30B-A3B sized; CPU: scaled down.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "cli.hpp"
#include "common/limits.hpp"
#include "common/moe_block.hpp"
#include "common/timing.hpp"

namespace groupmm::tool {
namespace {

using nn::MoE;
using nn::MoEStage;

struct DemoMoeOptions {
  bool cpu = false;  // run on the CPU reference backend (a scaled-down block)
  // 0 = the device's default: GPU Qwen3-30B-A3B (E=128, H=2048, F=768, T=16384, k=8), CPU
  // scaled down (E=16, H=128, F=64, T=256, k=4).
  int64_t experts = 0, hidden = 0, ffn_hidden = 0, tokens = 0, topk = 0;
  int64_t shared_ffn_hidden = 0;  // > 0 adds a shared expert
  int iters = 0;                  // 0 = 10 on the GPU, 1 on the CPU
  int samples = 8;                // tokens checked against the CPU reference
};

// The block of the options, the device's defaults where an option is not given; its sizes
// checked against each other and against the memory there (usage errors).
nn::MoEConfig demo_moe_config(const DemoMoeOptions& o, Device dev) {
  const bool gpu = dev == Device::CUDA;
  nn::MoEConfig c;
  c.experts = o.experts > 0 ? o.experts : (gpu ? 128 : 16);
  c.hidden = o.hidden > 0 ? o.hidden : (gpu ? 2048 : 128);
  c.ffn_hidden = o.ffn_hidden > 0 ? o.ffn_hidden : (gpu ? 768 : 64);
  c.topk = o.topk > 0 ? o.topk : (gpu ? 8 : 4);
  c.max_tokens = o.tokens > 0 ? o.tokens : (gpu ? 16384 : 256);
  c.shared_ffn_hidden = o.shared_ffn_hidden;
  c.renormalize = true;  // Qwen3's norm_topk_prob
  c.aux_loss_coeff = 0.001f;
  c.seed = 1;
  if (c.topk > c.experts)
    throw UsageError("--topk " + std::to_string(c.topk) + " must be at most --experts " +
                     std::to_string(c.experts));
  check_fits_memory("demo moe", moe_block_bytes(c), dev,
                    "--tokens, --experts, --hidden, --width or --shared");
  return c;
}

void print_demo_moe_routing(MoE& moe) {
  const auto& c = moe.config();
  std::vector<uint8_t> cb = fetch_bytes(moe.counts(), 0, c.experts);
  std::vector<uint8_t> aux = fetch_bytes(moe.aux_loss(), 0, 1);
  std::vector<int32_t> counts(reinterpret_cast<int32_t*>(cb.data()),
                              reinterpret_cast<int32_t*>(cb.data()) + c.experts);
  std::sort(counts.begin(), counts.end());
  const double mean = double(c.max_tokens * c.topk) / double(c.experts);
  std::printf(
      "\nrouting: rows per expert min %d, median %d, max %d (max/mean %.2f), %lld empty; "
      "aux loss %.5f\n",
      counts.front(), counts[counts.size() / 2], counts.back(), counts.back() / mean,
      (long long)std::count(counts.begin(), counts.end(), 0),
      double(as_floats(aux, DType::fp32, 1)[0]));
}

// The per-stage table (times in a unit that reads: the CPU's run to seconds) and, on the GPU, the
// step as one CUDA graph.
void print_demo_moe_stages(Context& ctx, MoE& moe, const BlockInputs& in, int iters) {
  const bool gpu = ctx.device() == Device::CUDA;
  const StageTimes st = time_stages(ctx, moe, in.x, in.dy, gpu ? 2 : 0, iters);
  ctx.check();
  print_demo_moe_routing(moe);
  std::printf("\nper-stage times (%s, median of %d steps):\n",
              gpu ? "CUDA events, eager" : "wall clock", iters);
  std::printf("  %-16s %12s %12s %8s\n", "stage", "forward", "backward", "share");
  for (int s = 0; s < kMoeStages; ++s) {
    if (st.fwd[s] == 0 && st.bwd[s] == 0) continue;
    std::printf("  %-16s %12s %12s %7.1f%%\n", nn::moe_stage_name(MoEStage(s)),
                format_us(st.fwd[s]).c_str(), format_us(st.bwd[s]).c_str(),
                100 * (st.fwd[s] + st.bwd[s]) / st.total_us);
  }
  std::printf("  %-16s %25s\n", "whole step", format_us(st.total_us).c_str());
  if (!gpu) return;
  const double us = graph_replay_us(ctx, 3, iters, [&] {
    moe.forward(ctx, in.x);
    moe.backward(ctx, in.dy);
  });
  std::printf("  %-16s %25s  (forward + backward as one CUDA graph)\n", "graph step",
              format_us(us).c_str());
  ctx.check();
}

int run_demo_moe(const DemoMoeOptions& o) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  const Device dev = o.cpu ? Device::CPU : default_device();
  const bool gpu = dev == Device::CUDA;
  const nn::MoEConfig c = demo_moe_config(o, dev);
  const int iters = o.iters > 0 ? o.iters : (gpu ? 10 : 1);
  std::printf(
      "groupmm demo moe: the MoE block (router -> permute -> gate_up -> weighted SwiGLU -> "
      "down -> unpermute%s), forward + backward\n",
      c.shared_ffn_hidden > 0 ? " + shared expert" : "");
  std::printf("  ran on: %s\n", gpu ? "GPU (CUDA backend), Qwen3-30B-A3B-sized block"
                                    : "CPU reference backend, scaled-down block");
  std::printf(
      "  block: T=%lld tokens, H=%lld, expert F=%lld, E=%lld experts, top-%lld, softmax "
      "router with renormalized weights, aux loss coeff %.3g, bf16\n",
      (long long)c.max_tokens, (long long)c.hidden, (long long)c.ffn_hidden, (long long)c.experts,
      (long long)c.topk, double(c.aux_loss_coeff));
  bool ok = false;
  {
    const GpuStream stream(gpu);
    Context ctx(dev, stream);
    MoE moe(ctx, c);
    const BlockInputs in = block_inputs(ctx, c.max_tokens, c.hidden, 21);
    print_demo_moe_stages(ctx, moe, in, iters);
    const TensorView y = moe.forward(ctx, in.x);
    std::printf(
        "\ncheck of %d sampled tokens against the CPU reference ops (router, gate_up, "
        "weighted SwiGLU, down, combine):\n",
        o.samples);
    int mism = 0;
    const double worst = check_sampled_tokens(ctx, moe, in.x, y, o.samples, true, &mism);
    ok = worst <= 1e-2;
    std::printf(
        "  worst y rel err %.2e (tolerance 1e-2, bf16 with fp32 accumulation): %s; "
        "routing differs on %d of %d tokens\n",
        worst, ok ? "PASS" : "FAIL", mism, o.samples);
  }
  std::printf("\ndemo moe %s on the %s in %.1f s\n", ok ? "passed" : "FAILED",
              gpu ? "GPU" : "CPU reference backend",
              std::chrono::duration<double>(clock::now() - t0).count());
  return ok ? 0 : 1;
}

void add_demo_moe_options(CLI::App& app, DemoMoeOptions& o) {
  app.add_flag("--cpu", o.cpu, "run on the CPU reference backend even with a GPU");
  add_int(app, "--experts", o.experts, 1, kMaxExperts, "experts E (default: GPU 128, CPU 16)");
  add_int_multiple(app, "--hidden", o.hidden, kGemmAlign, 65536, kGemmAlign,
                   "hidden size H, a multiple of 8 (default: GPU 2048, CPU 128)");
  add_int_multiple(app, "--width", o.ffn_hidden, kGemmAlign, 65536, kGemmAlign,
                   "expert width F, a multiple of 8 (default: GPU 768, CPU 64)");
  add_int(app, "--tokens", o.tokens, 1, int64_t(1) << 24, "tokens T (default: GPU 16384, CPU 256)");
  add_int(app, "--topk", o.topk, 1, kMaxTopk,
          "experts per token, <= --experts (default: GPU 8, CPU 4)");
  add_int_multiple(app, "--shared", o.shared_ffn_hidden, 0, 65536, kGemmAlign,
                   "width of a shared expert, a multiple of 8 (default 0: none)");
  add_int(app, "--samples", o.samples, 1, 4096,
          "tokens checked against the CPU reference (default 8)");
  add_iters(app, o.iters, "timed steps (default: GPU 10, CPU 1)");
}

Register reg_demo_moe(command<DemoMoeOptions>(
    "demo", "moe",
    "the MoE block (router, permute, grouped SwiGLU experts, unpermute, optional shared expert) "
    "forward + backward, per-stage table, sampled tokens checked against the CPU reference",
    add_demo_moe_options, run_demo_moe));

}  // namespace
}  // namespace groupmm::tool
