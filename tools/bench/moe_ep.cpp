// `groupmm bench moe --ep capacity|throughput`: the MoE block over ranks (nn::MoE with an
// expert-parallel transport). One process per GPU, e.g.
//   torchrun --no-python --nproc-per-node 2 groupmm bench moe --ep capacity --id-file /tmp/moe.id
// or --cpu for a smoke run with ranks as threads. Every rank holds T tokens and E / R of the
// experts; compared with `groupmm bench moe` on one GPU (T tokens, all E experts: the same expert
// GEMM work a rank), the time a rank takes for a step is the block's weak scaling over GPUs.
#include <cstdio>
#include <memory>

#include "bench/suites.hpp"
#include "common/ep_group.hpp"
#include "common/moe_block.hpp"
#include "groupmm/version.hpp"

namespace groupmm::tool {
namespace {

struct EpCaseResult {
  std::string name;
  nn::MoEConfig cfg;
  int64_t C = 0, Ce = 0;  // capacity mode's budgets (rows and entries a peer)
  double fwd_us = 0, step_us = 0;
  bool overflow = false;  // capacity dropped (token, slot) entries (kFaultEpCapacity)
};

// One case on this rank: the block over the group, one eager step, then forward and forward +
// backward timed.
void time_moe_ep_case(Context& ctx, ep::Transport& tr, const BenchMoeOptions& o, EpCaseResult& r) {
  nn::MoEConfig& c = r.cfg;
  const int R = tr.size();
  const bool gpu = ctx.device() == Device::CUDA;
  GROUPMM_CHECK(c.experts % R == 0, "bench moe: case ", r.name, " has E=", c.experts,
                " experts, which ranks=", R, " does not divide");
  const int64_t T = c.max_tokens;
  c.ep.transport = &tr;
  c.ep.mode = o.ep == "throughput" ? ep::EpMode::throughput : ep::EpMode::capacity;
  if (c.ep.mode == ep::EpMode::capacity) {
    c.ep.capacity = uniform_ep_capacity(T, c.topk, R, o.capacity_factor);
    r.C = c.ep.capacity.rows_per_peer;
    r.Ce = c.ep.capacity.entries_per_peer;
  }
  nn::MoE moe(ctx, c);
  const BlockInputs in = block_inputs(ctx, T, c.hidden, 31 + uint64_t(tr.rank()));
  const TensorView x = in.x, dy = in.dy;
  // One eager step first: capacity mode's plan is made for the T of the first forward, and
  // NCCL connects the peers lazily on their first exchange (neither may happen in a capture).
  moe.forward(ctx, x);
  moe.backward(ctx, dy);
  ctx.synchronize();
  const auto step = [&] {
    moe.forward(ctx, x);
    moe.backward(ctx, dy);
  };
  if (gpu && c.ep.mode == ep::EpMode::capacity) {
    r.fwd_us = graph_replay_us(ctx, 3, o.iters, [&] { moe.forward(ctx, x); });
    r.step_us = graph_replay_us(ctx, 3, o.iters, step);
  } else {  // throughput mode synchronizes in every forward (its count exchange): eager
    r.fwd_us = time_us(ctx, gpu ? 2 : 0, o.iters, [&](int) { moe.forward(ctx, x); });
    r.step_us = time_us(ctx, gpu ? 2 : 0, o.iters, [&](int) { step(); });
  }
  // Overflow is a reported fault, not an error here: the bench says so and goes on.
  r.overflow = ctx.take_status().bits != 0;
}

// Every chosen case on this rank (a collective: every rank runs the same cases in the same order).
std::vector<EpCaseResult> run_moe_rank(Context& ctx, ep::Transport& tr, const BenchMoeOptions& o) {
  std::vector<EpCaseResult> out;
  for (const MoeBenchCase& bc : moe_bench_cases(o)) {
    out.push_back({bc.name, bc.cfg});
    time_moe_ep_case(ctx, tr, o, out.back());
  }
  return out;
}

void report_moe_ep(const std::vector<EpCaseResult>& rs, int R, const BenchMoeOptions& o,
                   JsonFile& json) {
  std::printf("bench moe: %d rank(s), expert parallelism in %s mode, %s transport\n", R,
              o.ep.c_str(), o.cpu ? "in-process" : (GROUPMM_WITH_NCCL ? "NCCL" : "in-process"));
  const Table t({text_col("case", 8), int_col("T/rank", 7), int_col("E", 5), int_col("E/rank", 6),
                 int_col("k", 6), num_col("fwd us", 12, 1), num_col("fwd+bwd us", 14, 1),
                 num_col("tokens/s", 12, 3, 'g'), Column{"capacity", 0, 's', 0, true, "", "  "}});
  t.print_header();
  for (const EpCaseResult& r : rs) {
    const nn::MoEConfig& c = r.cfg;
    const double tps = r.step_us > 0 ? double(R) * double(c.max_tokens) / (r.step_us * 1e-6) : 0;
    const std::string cap =
        r.C > 0
            ? detail::cat("C=", r.C, " C_e=", r.Ce,
                          r.overflow ? " OVERFLOW (entries dropped: raise --capacity-factor)" : "")
            : "-";
    t.print_row(
        {r.name, c.max_tokens, c.experts, c.experts / R, c.topk, r.fwd_us, r.step_us, tps, cap});
    json.add(JsonRecord()
                 .add("case", r.name)
                 .add("T", c.max_tokens)
                 .add("H", c.hidden)
                 .add("F", c.ffn_hidden)
                 .add("E", c.experts)
                 .add("k", c.topk)
                 .add("ranks", R)
                 .add("fwd_us", r.fwd_us)
                 .add("fwd_bwd_us", r.step_us)
                 .add("C", r.C)
                 .add("C_e", r.Ce)
                 .add("overflow", r.overflow));
  }
  std::printf(
      "(rank 0's times; every step is a collective, so they include waiting for the slowest "
      "rank. tokens/s = R T / (fwd+bwd). Weak scaling: `bench moe` on one GPU with the same T, "
      "all experts, over this step time.)\n");
  json.write(JsonRecord().add("device", o.cpu ? "cpu" : "cuda").add("ranks", R).add("ep", o.ep), {},
             true);
}

}  // namespace

int run_moe_ep(const BenchMoeOptions& o) {
  JsonFile json(o.json);  // every rank checks the path; rank 0 writes it
  if (o.cpu) {
    const int R = o.ranks > 0 ? o.ranks : 2;
    const auto rs = run_cpu_ranks(
        "bench moe", R, [&](Context& ctx, ep::Transport& tr) { return run_moe_rank(ctx, tr, o); });
    report_moe_ep(rs[0], R, o, json);
    return 0;
  }
  const auto [g, rs] =
      run_gpu_rank("bench moe", o.ranks, o.rank, o.id_file,
                   [&](Context& ctx, ep::Transport& tr) { return run_moe_rank(ctx, tr, o); });
  if (g.rank == 0) report_moe_ep(rs, g.ranks, o, json);
  return 0;
}

}  // namespace groupmm::tool
