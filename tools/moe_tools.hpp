// The MoE block's benchmark and demo (tools/moe_bench.cpp, tools/moe_demo.cpp), as functions the
// command line calls: `groupmm bench moe` and `groupmm demo moe`. Public API only.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "groupmm/nn/moe.hpp"

namespace groupmm::tool {

struct MoeBenchOptions {
  // Cases to run: qwen3 (Qwen3-30B-A3B, T=16384 H=2048 F=768 E=128 k=8), dsv3 (DeepSeek-V3-like,
  // 32 local experts: T=8192 H=7168 F=2048 E=32 k=8, sigmoid group-limited routing, a shared
  // expert of width 2048), mixtral (Mixtral-8x7B: T=8192 H=4096 F=14336 E=8 k=2). Empty = all.
  std::vector<std::string> cases;
  int64_t tokens = 0;  // overrides every case's T when > 0
  int iters = 20;      // timed runs per measurement (median)
  int warmup = 3;
  bool cpu = false;  // smoke run on the CPU reference backend (tiny shapes, wall clock)
  std::string json;  // write the results here (bench/peers_torch_moe.py reads them)
  // Expert parallelism (nn::MoE over ranks, moe_bench_ep.cpp): ep "capacity" or "throughput" runs
  // every case as one rank of a group with E / R local experts and T tokens a rank; "" = one GPU,
  // no EP (then ranks must be 1). The group as in `bench ep` (ep_tools.hpp): one process per GPU,
  // ranks / rank from the options or torchrun's environment, the NCCL unique id through id_file;
  // with cpu, `ranks` (default 2) threads on the CPU reference backend.
  std::string ep;
  int ranks = 0, rank = -1;
  std::string id_file;
  double capacity_factor = 2.0;  // capacity mode's budgets over the uniform routing's expectation
};

// The suite's cases: qwen3, dsv3, mixtral (cpu: shapes small enough for the reference backend).
struct MoeBenchCase {
  const char* name;
  nn::MoEConfig cfg;
};
std::vector<MoeBenchCase> moe_bench_cases(bool cpu);
// Prints per case: forward and forward+backward time (one CUDA graph each), the per-stage
// breakdown (router, permute, expert GEMMs, activation, unpermute, shared expert) with each
// stage's share, the non-GEMM share, and the four row movers' GB/s against a device-to-device copy
// timed in the same run. Each case is validated first (sampled tokens against the CPU reference).
// Returns 0 when every case ran and validated.
int run_bench_moe(const MoeBenchOptions& o);

// The block over ranks (MoeBenchOptions::ep set): per case, this rank's forward and forward +
// backward time (capacity mode: one CUDA graph each; throughput mode: eager, its plan synchronizes)
// and whether capacity overflowed; rank 0 prints and writes the JSON. Compare with `bench moe`
// on one GPU (the same T tokens a rank with all E experts) for the weak scaling. Returns 0 when
// every case ran.
int run_bench_moe_ep(const MoeBenchOptions& o);

struct MoeDemoOptions {
  bool cpu = false;  // run on the CPU reference backend (a scaled-down block)
  // 0 = the device's default: GPU Qwen3-30B-A3B (E=128, H=2048, F=768, T=16384, k=8), CPU
  // scaled down (E=16, H=128, F=64, T=256, k=4).
  int64_t experts = 0, hidden = 0, ffn_hidden = 0, tokens = 0, topk = 0;
  int64_t shared_ffn_hidden = 0;  // > 0 adds a shared expert
  int iters = 0;                  // 0 = 10 on the GPU, 1 on the CPU
  int samples = 8;                // tokens checked against the CPU reference
};
// Runs the whole block forward + backward, prints the routing histogram summary, a per-stage table
// (times and shares), the one-CUDA-graph step time, and checks sampled tokens' outputs and
// routing against the CPU reference ops. Returns 0 when the check passes.
int run_demo_moe(const MoeDemoOptions& o);

// Per-stage medians (us) over `iters` eager steps (forward, then backward when dy is present),
// measured through the layer's stage hook: CUDA events on a CUDA context, the host clock on a CPU
// one. Index by MoEStage; total_us is the median of whole steps.
struct StageTimes {
  double fwd[7] = {}, bwd[7] = {};
  double total_us = 0;
};
StageTimes time_stages(Context& ctx, nn::MoE& moe, const TensorView& x, const TensorView& dy,
                       int warmup, int iters);

// The block's inputs: x [T, H] ~ U(-1, 1) and dy [T, H] ~ U(-0.01, 0.01), bf16, on ctx's device.
struct BlockInputs {
  Tensor x, dy;
};
BlockInputs block_inputs(Context& ctx, int64_t T, int64_t H, uint64_t seed);

// Median us of one CUDA-graph replay of the work `enqueue` puts on ctx's stream (captured once).
double graph_replay_us(Context& ctx, int iters, const std::function<void()>& enqueue);

// Recomputes the outputs of `samples` tokens of the last forward of `moe` (spread over [0, T)) with
// the CPU reference ops from the layer's parameters and routing, and compares: routing (ids and
// weights from the router on the CPU) and y. Returns the worst relative error of y and prints a
// line per token when `verbose`; *routing_mismatches counts tokens whose CPU routing differs (a
// near-tie in the logits: reported, not an error).
double check_sampled_tokens(Context& ctx, nn::MoE& moe, const TensorView& x, const TensorView& y,
                            int samples, bool verbose, int* routing_mismatches);

}  // namespace groupmm::tool
