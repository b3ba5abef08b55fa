// `groupmm bench ep`: expert-parallel dispatch and combine (tools/ep_bench.cpp). One process per
// GPU: e.g. `torchrun --no-python --nproc-per-node 8 groupmm bench ep --id-file /tmp/ep.id`
// (WORLD_SIZE, RANK and LOCAL_RANK from the environment), or --ranks / --rank explicitly; --cpu
// runs ranks as threads on the CPU reference backend.
#include "cli.hpp"
#include "ep_bench.hpp"

namespace groupmm::tool {
namespace {

int run(const EpBenchOptions& o) {
  if (!o.json.empty()) {
    std::ofstream probe = open_json(o.json);  // a wrong path fails before any work
  }
  return run_bench_ep(o);
}

void add_options(CLI::App& app, EpBenchOptions& o) {
  add_choice_list(app, "--case", o.cases, {"dsv3", "qwen3"},
                  "cases to run (comma separated; default all): dsv3 = DeepSeek-V3-like (H=7168, "
                  "E=256, k=8), qwen3 = Qwen3-30B-A3B (H=2048, E=128, k=8)");
  add_int(app, "--tokens", o.tokens, 1, int64_t(1) << 20,
          "tokens T a rank (default 4096; --cpu: 64)");
  app.add_option("--capacity-factor", o.capacity_factor,
                 "capacity mode's per-peer budgets over the uniform routing's expected rows and "
                 "entries (default 1.5)")
      ->check(CLI::Range(1.0, 64.0));
  add_iters(app, o.iters, "timed runs per measurement, median (default 20)");
  add_int(app, "--ranks", o.ranks, 1, 1024,
          "ranks in the group (default: WORLD_SIZE, else 1; --cpu: threads, default 2)");
  add_int(app, "--rank", o.rank, 0, 1023, "this process's rank (default: RANK, else 0)");
  app.add_option("--id-file", o.id_file,
                 "with several ranks: rank 0 writes the NCCL unique id here and the others read it "
                 "(a fresh path every run, seen by every process)");
  app.add_flag("--cpu", o.cpu, "smoke run: ranks as threads on the CPU reference backend");
  add_json(app, o.json);
}

Register reg_cmd_bench_ep(command<EpBenchOptions>(
    "bench", "ep",
    "expert-parallel dispatch and combine per rank (throughput and capacity modes, FP8 dispatch, "
    "GB/s; one process per GPU over NCCL; --cpu: a smoke run with threads)",
    add_options, run));

}  // namespace
}  // namespace groupmm::tool
