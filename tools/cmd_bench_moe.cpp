// `groupmm bench moe`: the MoE block suite (tools/moe_bench.cpp): forward and forward + backward
// of one CUDA graph each, the per-stage breakdown and the row movers against a copy of the same
// run. --json is read by bench/peers_torch_moe.py (a plain PyTorch block on the same shapes).
// --ep: the block over ranks, one process per GPU (tools/moe_bench_ep.cpp).
#include "cli.hpp"
#include "moe_tools.hpp"

namespace groupmm::tool {
namespace {

struct BenchMoeOptions {
  MoeBenchOptions o;
  CLI::Option* iters_opt = nullptr;
  CLI::Option* capacity_opt = nullptr;
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
  if (o.ep.empty() &&
      (o.ranks > 1 || o.rank >= 0 || !o.id_file.empty() || b.capacity_opt->count() > 0))
    throw UsageError(
        "--ranks, --rank, --id-file and --capacity-factor need --ep capacity|throughput");
  if (o.ep == "throughput" && b.capacity_opt->count() > 0)
    throw UsageError("--capacity-factor applies to --ep capacity (got --ep throughput)");
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
  add_choice(app, "--ep", b.o.ep, {"capacity", "throughput"},
             "expert parallelism: every case as one rank of a group (E / R experts and T tokens a "
             "rank; one process per GPU over NCCL, e.g. torchrun --no-python --nproc-per-node R "
             "groupmm bench moe --ep capacity --id-file F; --cpu: ranks as threads). capacity: "
             "fixed per-peer budgets, one CUDA graph; throughput: exact exchange, eager");
  add_int(app, "--ranks", b.o.ranks, 1, 1024,
          "with --ep: ranks in the group (default: WORLD_SIZE, else 1; --cpu: threads, default 2)");
  add_int(app, "--rank", b.o.rank, 0, 1023,
          "with --ep: this process's rank (default: RANK, else 0)");
  app.add_option(
      "--id-file", b.o.id_file,
      "with --ep and several ranks: rank 0 writes the NCCL unique id here and the others "
      "read it (a fresh path every run, seen by every process)");
  b.capacity_opt = app.add_option("--capacity-factor", b.o.capacity_factor,
                                  "with --ep capacity: the per-peer budgets over the uniform "
                                  "routing's expected rows and entries (default 2)")
                       ->check(CLI::Range(1.0, 64.0));
}

Register reg_cmd_bench_moe(command<BenchMoeOptions>(
    "bench", "moe",
    "MoE block (router, permute, grouped SwiGLU experts, unpermute, shared expert) forward and "
    "forward + backward, per-stage breakdown, row movers vs copy (GPU; --cpu: a smoke run)",
    add_options, run));

}  // namespace
}  // namespace groupmm::tool
