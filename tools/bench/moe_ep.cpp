// `groupmm bench moe --ep capacity|throughput`: the MoE block over ranks (nn::MoE with an
// expert-parallel transport). One process per GPU, e.g.
//   torchrun --no-python --nproc-per-node 2 groupmm bench moe --ep capacity --id-file /tmp/moe.id
// or --cpu for a smoke run with ranks as threads. Every rank holds T tokens and E / R of the
// experts; compared with `groupmm bench moe` on one GPU (T tokens, all E experts: the same expert
// GEMM work a rank), the time a rank takes for a step is the block's weak scaling over GPUs.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>

#include "bench/suites.hpp"
#include "common/ep_group.hpp"
#include "common/moe_block.hpp"
#include "groupmm/version.hpp"

namespace groupmm::tool {
namespace {

// One rank's overlap breakdown (eager steps, us): the exchange (the plan and the four movers:
// the permute and unpermute stages, forward and backward) and the experts (gate_up, activation,
// down) of an unchunked block from its stage hook, its whole step, and the chunked block's step;
// the exchange left exposed is the chunked step less the unchunked step's time outside the
// exchange.
struct EpBreakdown {
  double exchange_us = 0, experts_us = 0, step1_us = 0, stepn_us = 0;
  double exposed_us() const { return std::max(0.0, stepn_us - (step1_us - exchange_us)); }
  double exposed_share() const { return stepn_us > 0 ? exposed_us() / stepn_us : 0; }
};

struct EpCaseResult {
  std::string name;
  nn::MoEConfig cfg;
  int64_t C = 0, Ce = 0;  // capacity mode's budgets (rows and entries a peer, and a chunk)
  double fwd_us = 0, step_us = 0;
  bool overflow = false;              // capacity dropped (token, slot) entries (kFaultEpCapacity)
  std::vector<EpBreakdown> per_rank;  // every rank's, gathered
};

constexpr int kBreakdownValues = 4;

// Every rank's breakdown (a collective): the values travel as int64 bit patterns through the
// transport's count exchange, each rank sending its own to every peer.
std::vector<EpBreakdown> gather_breakdowns(ep::Transport& tr, const EpBreakdown& mine) {
  const int R = tr.size();
  const double v[kBreakdownValues] = {mine.exchange_us, mine.experts_us, mine.step1_us,
                                      mine.stepn_us};
  std::vector<int64_t> send(size_t(R * kBreakdownValues)), recv(send.size());
  for (int q = 0; q < R; ++q) std::memcpy(&send[size_t(q * kBreakdownValues)], v, sizeof(v));
  tr.all_to_all_counts(send.data(), recv.data(), kBreakdownValues);
  std::vector<EpBreakdown> out(static_cast<size_t>(R));
  for (int q = 0; q < R; ++q) {
    double w[kBreakdownValues];
    std::memcpy(w, &recv[size_t(q * kBreakdownValues)], sizeof(w));
    out[size_t(q)] = EpBreakdown{w[0], w[1], w[2], w[3]};
  }
  return out;
}

// Eager steps of `moe`: the median step (us), and with `stages` its exchange and experts' time
// (and the stage table, printed when print_rank: rank 0's, the permute and unpermute stages hold
// the plan and the movers).
void eager_times(Context& ctx, nn::MoE& moe, const TensorView& x, const TensorView& dy, int iters,
                 bool stages, double& step_us, EpBreakdown* b, bool print_rank = false) {
  const bool gpu = ctx.device() == Device::CUDA;
  if (!stages) {
    step_us = time_us(ctx, gpu ? 2 : 0, iters, [&](int) {
      moe.forward(ctx, x);
      moe.backward(ctx, dy);
    });
    return;
  }
  const StageTimes st = time_stages(ctx, moe, x, dy, gpu ? 2 : 0, iters);
  if (print_rank) (void)print_moe_stages(st, gpu, iters);
  step_us = st.total_us;
  for (nn::MoEStage s : {nn::MoEStage::permute, nn::MoEStage::unpermute})
    b->exchange_us += st.fwd[int(s)] + st.bwd[int(s)];
  for (nn::MoEStage s : {nn::MoEStage::gate_up, nn::MoEStage::activation, nn::MoEStage::down})
    b->experts_us += st.fwd[int(s)] + st.bwd[int(s)];
}

// One case on this rank: the block over the group, one eager step, then forward and forward +
// backward timed, then the overlap breakdown.
void time_moe_ep_case(Context& ctx, ep::Transport& tr, const BenchMoeOptions& o, EpCaseResult& r) {
  nn::MoEConfig& c = r.cfg;
  const int R = tr.size();
  const bool gpu = ctx.device() == Device::CUDA;
  GROUPMM_CHECK(c.experts % R == 0, "bench moe: case ", r.name, " has E=", c.experts,
                " experts, which ranks=", R, " does not divide");
  const int64_t T = c.max_tokens;
  c.ep.transport = &tr;
  c.ep.mode = o.ep == "throughput" ? ep::EpMode::throughput : ep::EpMode::capacity;
  const BlockInputs in = block_inputs(ctx, T, c.hidden, 31 + uint64_t(tr.rank()));
  const TensorView x = in.x, dy = in.dy;
  EpBreakdown b;
  if (o.ep_chunks > 1) {  // the unchunked block's stages first (its own budgets), then freed
    nn::MoEConfig c1 = c;
    if (c1.ep.mode == ep::EpMode::capacity)
      c1.ep.capacity = uniform_ep_capacity(T, c.topk, R, o.capacity_factor);
    nn::MoE one(ctx, c1);
    one.forward(ctx, x);
    one.backward(ctx, dy);
    eager_times(ctx, one, x, dy, o.iters, true, b.step1_us, &b);
    (void)ctx.take_status();  // its overflow is not the chunked block's
  }
  c.ep.chunks = o.ep_chunks;
  c.ep.exchange_sms = int(o.ep_exchange_sms);
  if (c.ep.mode == ep::EpMode::capacity) {
    // Each chunk of a peer holds E / (R n) experts: its budgets are those of R n ranks.
    c.ep.capacity = uniform_ep_capacity(T, c.topk, R * int(o.ep_chunks), o.capacity_factor);
    r.C = c.ep.capacity.rows_per_peer;
    r.Ce = c.ep.capacity.entries_per_peer;
  }
  nn::MoE moe(ctx, c);
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
  if (o.ep_chunks > 1) {
    eager_times(ctx, moe, x, dy, o.iters, false, b.stepn_us, nullptr);
  } else {
    if (tr.rank() == 0) std::printf("\n== %s, rank 0 of %d:\n", r.name.c_str(), R);
    eager_times(ctx, moe, x, dy, o.iters, true, b.step1_us, &b, tr.rank() == 0);
    b.stepn_us = b.step1_us;
  }
  // Overflow is a reported fault, not an error here: the bench says so and goes on.
  r.overflow = ctx.take_status().bits != 0;
  r.per_rank = gather_breakdowns(tr, b);
}

// Every chosen case on this rank (a collective: every rank runs the same cases in the same order).
std::vector<EpCaseResult> run_moe_rank(Context& ctx, ep::Transport& tr, const BenchMoeOptions& o) {
  std::vector<EpCaseResult> out;
  for (const MoeBenchCase& bc : moe_bench_cases(o)) {
    EpCaseResult r;
    r.name = bc.name;
    r.cfg = bc.cfg;
    out.push_back(std::move(r));
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
                 .add("overflow", r.overflow)
                 .add("chunks", o.ep_chunks)
                 .add("exchange_sms", o.ep_exchange_sms)
                 .add("exchange_us", r.per_rank.empty() ? 0.0 : r.per_rank[0].exchange_us)
                 .add("experts_us", r.per_rank.empty() ? 0.0 : r.per_rank[0].experts_us)
                 .add("exposed_us", r.per_rank.empty() ? 0.0 : r.per_rank[0].exposed_us())
                 .add("exposed_share", r.per_rank.empty() ? 0.0 : r.per_rank[0].exposed_share()));
  }
  std::printf(
      "(rank 0's times; every step is a collective, so they include waiting for the slowest "
      "rank. tokens/s = R T / (fwd+bwd). Weak scaling: `bench moe` on one GPU with the same T, "
      "all experts, over this step time.)\n");
  std::printf(
      "overlap, %lld chunk(s), %lld SM(s) left to the exchanges, every rank (eager steps, "
      "us):\n",
      (long long)o.ep_chunks, (long long)o.ep_exchange_sms);
  const Table ov({text_col("case", 8), int_col("rank", 4), num_col("exchange", 10, 1),
                  num_col("experts", 10, 1), num_col("step 1", 10, 1), num_col("step n", 10, 1),
                  num_col("exposed", 10, 1), num_col("exp/step", 9, 3), num_col("exp/xchg", 9, 3)});
  ov.print_header();
  for (const EpCaseResult& r : rs)
    for (size_t q = 0; q < r.per_rank.size(); ++q) {
      const EpBreakdown& b = r.per_rank[q];
      ov.print_row({r.name, int64_t(q), b.exchange_us, b.experts_us, b.step1_us, b.stepn_us,
                    b.exposed_us(), b.exposed_share(),
                    b.exchange_us > 0 ? b.exposed_us() / b.exchange_us : 0.0});
    }
  std::printf(
      "(exchange: the plan and the four movers of an unchunked step, its permute and unpermute "
      "stages; experts: gate_up, activation, down; step 1 / step n: the unchunked and chunked "
      "steps; exposed = step n - (step 1 - exchange), as a share of step n and of the "
      "exchange.)\n");
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
