// `groupmm bench moe --ep capacity|throughput`: the MoE block over ranks (nn::MoE with an
// expert-parallel transport). One process per GPU, e.g.
//   torchrun --no-python --nproc-per-node 2 groupmm bench moe --ep capacity --id-file /tmp/moe.id
// or --cpu for a smoke run with ranks as threads. Every rank holds T tokens and E / R of the
// experts; compared with `groupmm bench moe` on one GPU (T tokens, all E experts: the same expert
// GEMM work a rank), the time a rank takes for a step is the block's weak scaling over GPUs.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <sstream>

#include "bench_common.hpp"
#include "cli.hpp"
#include "ep_tools.hpp"
#include "groupmm/version.hpp"
#include "moe_tools.hpp"

namespace groupmm::tool {
namespace {

struct EpCaseResult {
  std::string name;
  nn::MoEConfig cfg;
  int64_t C = 0, Ce = 0;  // capacity mode's budgets (rows and entries a peer)
  double fwd_us = 0, step_us = 0;
  bool overflow = false;  // capacity dropped (token, slot) entries (kFaultEpCapacity)
};

// Every chosen case on this rank (a collective: every rank runs the same cases in the same order).
std::vector<EpCaseResult> run_moe_rank(Context& ctx, ep::Transport& tr, const MoeBenchOptions& o) {
  const int R = tr.size(), me = tr.rank();
  const bool gpu = ctx.device() == Device::CUDA;
  const int iters = gpu ? o.iters : 1;
  const ep::EpMode mode = o.ep == "throughput" ? ep::EpMode::throughput : ep::EpMode::capacity;
  std::vector<EpCaseResult> out;
  for (const MoeBenchCase& bc : moe_bench_cases(o.cpu)) {
    if (!o.cases.empty() && std::find(o.cases.begin(), o.cases.end(), bc.name) == o.cases.end())
      continue;
    EpCaseResult r{bc.name, bc.cfg};
    nn::MoEConfig& c = r.cfg;
    if (o.tokens > 0) c.max_tokens = o.tokens;
    GROUPMM_CHECK(c.experts % R == 0, "bench moe: case ", bc.name, " has E=", c.experts,
                  " experts, which ranks=", R, " does not divide");
    const int64_t T = c.max_tokens;
    c.ep.transport = &tr;
    c.ep.mode = mode;
    if (mode == ep::EpMode::capacity) {
      c.ep.capacity = uniform_ep_capacity(T, c.topk, R, o.capacity_factor);
      r.C = c.ep.capacity.rows_per_peer;
      r.Ce = c.ep.capacity.entries_per_peer;
    }
    nn::MoE moe(ctx, c);
    const BlockInputs in = block_inputs(ctx, T, c.hidden, 31 + uint64_t(me));
    const TensorView x = in.x, dy = in.dy;
    // One eager step first: capacity mode's plan is made for the T of the first forward, and
    // NCCL connects the peers lazily on their first exchange (neither may happen in a capture).
    moe.forward(ctx, x);
    moe.backward(ctx, dy);
    ctx.synchronize();
    if (gpu && mode == ep::EpMode::capacity) {
      r.fwd_us = graph_replay_us(ctx, iters, [&] { moe.forward(ctx, x); });
      r.step_us = graph_replay_us(ctx, iters, [&] {
        moe.forward(ctx, x);
        moe.backward(ctx, dy);
      });
    } else {  // throughput mode synchronizes in every forward (its count exchange): eager
      r.fwd_us = time_us(ctx, gpu ? 2 : 0, iters, [&](int) { moe.forward(ctx, x); });
      r.step_us = time_us(ctx, gpu ? 2 : 0, iters, [&](int) {
        moe.forward(ctx, x);
        moe.backward(ctx, dy);
      });
    }
    // Overflow is a reported fault, not an error here: the bench says so and goes on.
    r.overflow = ctx.take_status().bits != 0;
    out.push_back(std::move(r));
  }
  return out;
}

int report_moe_ep(const std::vector<EpCaseResult>& rs, int R, const MoeBenchOptions& o) {
  std::ostringstream js;
  js << "{\"device\": \"" << (o.cpu ? "cpu" : "cuda") << "\", \"ranks\": " << R << ", \"ep\": \""
     << o.ep << "\", \"cases\": [";
  std::printf("bench moe: %d rank(s), expert parallelism in %s mode, %s transport\n", R,
              o.ep.c_str(), o.cpu ? "in-process" : (GROUPMM_WITH_NCCL ? "NCCL" : "in-process"));
  std::printf("%-8s %7s %5s %6s %6s %12s %14s %12s  %s\n", "case", "T/rank", "E", "E/rank", "k",
              "fwd us", "fwd+bwd us", "tokens/s", "capacity");
  int n = 0;
  for (const EpCaseResult& r : rs) {
    const nn::MoEConfig& c = r.cfg;
    const double tps = r.step_us > 0 ? double(R) * double(c.max_tokens) / (r.step_us * 1e-6) : 0;
    std::printf("%-8s %7lld %5lld %6lld %6lld %12.1f %14.1f %12.3g  ", r.name.c_str(),
                (long long)c.max_tokens, (long long)c.experts, (long long)(c.experts / R),
                (long long)c.topk, r.fwd_us, r.step_us, tps);
    if (r.C > 0)
      std::printf("C=%lld C_e=%lld%s\n", (long long)r.C, (long long)r.Ce,
                  r.overflow ? " OVERFLOW (entries dropped: raise --capacity-factor)" : "");
    else
      std::printf("-\n");
    js << (n++ ? ", " : "") << "{\"case\": \"" << r.name << "\", \"T\": " << c.max_tokens
       << ", \"H\": " << c.hidden << ", \"F\": " << c.ffn_hidden << ", \"E\": " << c.experts
       << ", \"k\": " << c.topk << ", \"ranks\": " << R << ", \"fwd_us\": " << r.fwd_us
       << ", \"fwd_bwd_us\": " << r.step_us << ", \"C\": " << r.C << ", \"C_e\": " << r.Ce
       << ", \"overflow\": " << (r.overflow ? "true" : "false") << "}";
  }
  js << "]}";
  std::printf(
      "(rank 0's times; every step is a collective, so they include waiting for the slowest "
      "rank. tokens/s = R T / (fwd+bwd). Weak scaling: `bench moe` on one GPU with the same T, "
      "all experts, over this step time.)\n");
  if (!o.json.empty()) {
    write_json(o.json, js.str());
  }
  return 0;
}

int run_moe_ep_cpu(const MoeBenchOptions& o) {
  const int R = o.ranks > 0 ? o.ranks : 2;
  const auto rs =
      run_cpu_ranks(R, [&](Context& ctx, ep::Transport& tr) { return run_moe_rank(ctx, tr, o); });
  return report_moe_ep(rs[0], R, o);
}

}  // namespace

int run_bench_moe_ep(const MoeBenchOptions& o) {
  if (o.cpu) return run_moe_ep_cpu(o);
  GROUPMM_CHECK(cuda_available(),
                "bench moe: needs an sm_90 GPU (none visible); --cpu runs a smoke version with "
                "ranks as threads on the CPU");
  const RankGroup g = join_rank_group("bench moe", o.ranks, o.rank);
  cudaStream_t s = nullptr;
  GROUPMM_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int rc = 0;
  {
    std::unique_ptr<ep::Transport> tr = rank_transport("bench moe", g, o.id_file, s);
    Context ctx(Device::CUDA, s);
    const std::vector<EpCaseResult> rs = run_moe_rank(ctx, *tr, o);
    if (g.rank == 0) rc = report_moe_ep(rs, g.ranks, o);
  }
  cudaStreamDestroy(s);
  return rc;
}

}  // namespace groupmm::tool
