// `groupmm bench moe`: the MoE block suite (tools/moe_bench.cpp): forward and forward + backward
// of one CUDA graph each, the per-stage breakdown and the row movers against a copy of the same
// run. --json is read by bench/peers_torch_moe.py (a plain PyTorch block on the same shapes).
#include "cli.hpp"
#include "moe_tools.hpp"

namespace groupmm::tool {
namespace {

struct BenchMoeOptions {
  MoeBenchOptions o;
  CLI::Option* iters_opt = nullptr;
};

// Bytes one case allocates, roughly: the routed rows' activations (x, gate_up, act, down and their
// gradients) plus the parameters with gradients and fp32 main grads. Only to refuse absurd sizes.
double moe_bytes(int64_t T, int64_t topk, int64_t H, int64_t F, int64_t E) {
  const double rows = double(T) * double(topk);
  return (rows * (2.0 * H + 6.0 * F) * 2 * 2 + double(E) * 3 * H * F * (2 + 2 + 4)) * 1.2;
}

int run(const BenchMoeOptions& b) {
  MoeBenchOptions o = b.o;
  if (!b.iters_opt->count()) o.iters = 20;
  if (o.tokens > 0)  // the largest case: DeepSeek-V3-like, k=8, H=7168, F=2048, 32 experts
    check_fits_memory("bench moe", moe_bytes(o.tokens, 8, 7168, 2048, 32),
                      o.cpu ? Device::CPU : Device::CUDA, "--tokens");
  if (!o.json.empty()) {
    std::ofstream probe = open_json(o.json);  // a wrong path fails before any work
  }
  return run_bench_moe(o);
}

void add_options(CLI::App& app, BenchMoeOptions& b) {
  add_choice_list(app, "--case", b.o.cases, {"qwen3", "dsv3", "mixtral"},
                  "cases to run (comma separated; default all): qwen3 = Qwen3-30B-A3B, dsv3 = "
                  "DeepSeek-V3-like with 32 local experts and a shared expert, mixtral = "
                  "Mixtral-8x7B");
  add_int(app, "--tokens", b.o.tokens, 1, int64_t(1) << 24,
          "tokens T of every case (default: the case's own, 8192-16384)");
  b.iters_opt = add_iters(app, b.o.iters, "timed runs per measurement, median (default 20)");
  app.add_flag("--cpu", b.o.cpu, "smoke run on the CPU reference backend (tiny shapes)");
  add_json(app, b.o.json);
}

Register reg_cmd_bench_moe(command<BenchMoeOptions>(
    "bench", "moe",
    "MoE block (router, permute, grouped SwiGLU experts, unpermute, shared expert) forward and "
    "forward + backward, per-stage breakdown, row movers vs copy (GPU; --cpu: a smoke run)",
    add_options, run));

}  // namespace
}  // namespace groupmm::tool
