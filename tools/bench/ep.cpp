// `groupmm bench ep`: expert-parallel dispatch and combine per rank, in both modes, on
// DeepSeek-V3-like and Qwen3-30B-A3B settings. One process per GPU over NCCL (ranks from the
// command line or torchrun's environment, the unique id through a file), one GPU alone, or a CPU
// smoke run with ranks as threads. Public API only. E.g.
//   torchrun --no-python --nproc-per-node 8 groupmm bench ep --id-file /tmp/ep.id
// (WORLD_SIZE, RANK and LOCAL_RANK from the environment), or --ranks / --rank explicitly.
//
// Per case and mode (throughput, capacity): the plan, dispatch and combine times of this rank
// (median; each is a collective, so it includes waiting for the slowest peer), the bytes this rank
// sends to other ranks and its GB/s. Each case is validated first (identity experts: the combine
// of the dispatched rows gives x[t] * sum_j w[t, j]). Rank 0 prints. A third mode, throughput_fp8
// (cases with H a multiple of 128): quantizing this rank's tokens plus ep_dispatch_fp8 on the
// throughput plan, timed together (its combine is the 16-bit one), checked against quantizing
// ep_dispatch's rows.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>

#include "bench/harness.hpp"
#include "common/ep_group.hpp"
#include "groupmm/ep.hpp"
#include "groupmm/quantize.hpp"
#include "groupmm/random.hpp"
#include "groupmm/version.hpp"

namespace groupmm::tool {
namespace {

struct BenchEpOptions {
  // Cases: dsv3 (DeepSeek-V3-like: H=7168, E=256, k=8) and qwen3 (Qwen3-30B-A3B: H=2048, E=128,
  // k=8), T tokens a rank, bf16 rows, uniform random top-k routing. Empty = all.
  std::vector<std::string> cases;
  int64_t tokens = 0;            // T per rank; 0: 4096 (GPU), 64 (CPU)
  double capacity_factor = 1.5;  // capacity mode's budgets over the uniform routing's expectation
  int iters = 20;
  int warmup = 3;
  // The process group: one process per GPU. ranks / rank default to the WORLD_SIZE / RANK
  // environment (torchrun's), else 1 / 0; the GPU is LOCAL_RANK, else rank % device count. With
  // ranks > 1 (NCCL builds only), rank 0 writes the NCCL unique id to id_file and the others
  // read it there (a path every process sees).
  int ranks = 0, rank = -1;
  std::string id_file;
  bool cpu = false;  // smoke run: `ranks` (default 2) ranks as threads on the CPU reference backend
  std::string json;  // rank 0 writes its records here
  const CLI::App* app = nullptr;  // the command's options (which were given)
};

struct EpCase {
  const char* name;
  int64_t H, E, k;
};
const EpCase kEpCases[] = {{"dsv3", 7168, 256, 8}, {"qwen3", 2048, 128, 8}};
// (--cpu: H a multiple of 128 for dsv3, so that the FP8 dispatch runs in the smoke run too.)
const EpCase kCpuCases[] = {{"dsv3", 128, 32, 8}, {"qwen3", 32, 16, 4}};

// k distinct experts per token, uniform; every weight 1/k (a power of two for k = 1, 2, 4, 8, ...,
// so the identity-expert check below is exact).
std::vector<int32_t> ep_routing(int64_t T, int64_t E, int64_t k, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> perm(static_cast<size_t>(E)), ids;
  for (int64_t e = 0; e < E; ++e) perm[size_t(e)] = int32_t(e);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      std::swap(perm[size_t(j)], perm[size_t(j + int64_t(g() % uint64_t(E - j)))]);
      ids.push_back(perm[size_t(j)]);
    }
  return ids;
}

struct EpModeResult {
  const char* mode;
  double plan_us = 0, dispatch_us = 0, combine_us = 0;
  double plan_host_us = -1;  // throughput: median host time outside the wait (EpPlan::host_us)
  double dispatch_bytes = 0, combine_bytes = 0;  // sent to other ranks (what crosses the links)
  bool valid = false, overflow = false;
  int64_t C = 0, Ce = 0;
};

// The median of the last n values (the timed calls after the warm-up ones).
double median_of_last(std::vector<double> v, int n) {
  if (v.empty()) return -1;
  v.erase(v.begin(), v.end() - std::min<std::ptrdiff_t>(std::ptrdiff_t(v.size()), std::max(n, 1)));
  std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// Bytes this rank sends to the other ranks along a route (per-peer units of `unit` bytes).
double ep_remote_bytes(const std::vector<int64_t>& per_peer, int me, int64_t unit) {
  double b = 0;
  for (size_t q = 0; q < per_peer.size(); ++q)
    if (int(q) != me) b += double(per_peer[q]) * double(unit);
  return b;
}

// One mode on this rank: plan, dispatch, combine timed; then the check (identity experts:
// combine(dispatch(x)) with weights 1/k is x again, bit for bit, unless capacity overflowed).
EpModeResult run_ep_mode(Context& ctx, ep::Transport& tr, const ep::EpConfig& cfg, ep::EpMode mode,
                         const BenchEpOptions& o, const Tensor& ids, const Tensor& x,
                         const Tensor& w, int warmup, int iters) {
  const Device d = ctx.device();
  cudaStream_t s = ctx.stream();
  const int64_t T = x.view().dim(0), H = cfg.hidden, R = cfg.ranks, k = cfg.topk;
  EpModeResult r;
  r.mode = ep::ep_mode_name(mode);
  ep::EpPlan plan;
  if (mode == ep::EpMode::throughput) {
    std::vector<double> host;
    r.plan_us = time_us(ctx, warmup, iters, [&](int) {
      plan = ep::ep_dispatch_plan(ctx, tr, cfg, ids);
      host.push_back(plan.host_us);
    });
    r.plan_host_us = median_of_last(host, iters);
  } else {
    const ep::EpCapacity cap = uniform_ep_capacity(T, k, int(R), o.capacity_factor);
    r.C = cap.rows_per_peer;
    r.Ce = cap.entries_per_peer;
    plan = ep::ep_capacity_plan_create(ctx, tr, cfg, cap, T, DType::bf16);
    r.plan_us = time_us(ctx, warmup, iters, [&](int) { ep::ep_capacity_plan(ctx, tr, ids, plan); });
  }
  Tensor xg = Tensor::empty({plan.rows, H}, DType::bf16, d, s);
  Tensor out = Tensor::empty({T, H}, DType::bf16, d, s);
  r.dispatch_us = time_us(ctx, warmup, iters, [&](int) { ep::ep_dispatch(ctx, tr, plan, x, xg); });
  r.combine_us =
      time_us(ctx, warmup, iters, [&](int) { ep::ep_combine(ctx, tr, plan, xg, w, out); });
  const int64_t row = H * 2;
  r.dispatch_bytes = ep_remote_bytes(plan.send_rows, tr.rank(), row);
  r.combine_bytes = ep_remote_bytes(plan.back_send, tr.rank(), row);
  r.overflow = ctx.take_status().bits != 0;
  std::vector<uint16_t> hx(size_t(T * H)), ho(hx.size());
  if (T > 0) {
    copy(TensorView(hx.data(), DType::bf16, Device::CPU, {T, H}), x, s);
    copy(TensorView(ho.data(), DType::bf16, Device::CPU, {T, H}), out, s);
  }
  r.valid = r.overflow || hx == ho;
  return r;
}

// FP8 dispatch (throughput plan): this rank's tokens quantized (group_quantize, the FP8 block
// GEMM's activation recipe) and ep_dispatch_fp8, timed together; the combine is ep_combine's
// (16-bit, the rows above). The check: the received operand equals quantizing ep_dispatch's bf16
// grouped rows (data and scales, byte for byte).
EpModeResult run_fp8_mode(Context& ctx, ep::Transport& tr, const ep::EpConfig& cfg,
                          const Tensor& ids, const Tensor& x, int warmup, int iters) {
  const Device d = ctx.device();
  cudaStream_t s = ctx.stream();
  const int64_t T = x.view().dim(0), H = cfg.hidden, El = cfg.experts / cfg.ranks;
  EpModeResult r;
  r.mode = "throughput_fp8";
  ep::EpPlan plan;
  r.plan_us =
      time_us(ctx, warmup, iters, [&](int) { plan = ep::ep_dispatch_plan(ctx, tr, cfg, ids); });
  const QuantizeConfig qc = ep::ep_fp8_dispatch_config();
  const int32_t t32 = int32_t(T);
  Tensor splits1 = Tensor::empty({1}, DType::int32, d, s);
  copy(splits1, TensorView(const_cast<int32_t*>(&t32), DType::int32, Device::CPU, {1}), s);
  QuantizedBuffers xq = allocate_quantized(group_quantize_shapes(T, H, 1, qc), d, s);
  QuantizedBuffers xg = allocate_quantized(group_quantize_shapes(plan.rows, H, El, qc), d, s);
  GroupQuantizeArgs qa;
  qa.input = x;
  qa.splits = splits1;
  qa.config = qc;
  qa.out = xq.view(1, splits1, qc);
  r.dispatch_us = time_us(ctx, warmup, iters, [&](int) {
    const GroupedTensor q = group_quantize(ctx, qa);
    ep::ep_dispatch_fp8(ctx, tr, plan, q, xg.view(El, TensorView(), qc));
  });
  r.dispatch_bytes = ep_remote_bytes(plan.send_rows, tr.rank(), ep::ep_fp8_wire_row_bytes(H));
  // The check against quantizing the 16-bit dispatch's rows.
  Tensor xb = Tensor::empty({plan.rows, H}, DType::bf16, d, s);
  ep::ep_dispatch(ctx, tr, plan, x, xb);
  QuantizedBuffers ref = allocate_quantized(group_quantize_shapes(plan.rows, H, El, qc), d, s);
  if (plan.rows > 0) {
    GroupQuantizeArgs ra;
    ra.input = xb;
    ra.splits = plan.splits;
    ra.config = qc;
    ra.out = ref.view(El, plan.splits, qc);
    group_quantize(ctx, ra);
  }
  const auto host_bytes = [&](const Tensor& t) {
    std::vector<uint8_t> h(size_t(t.view().nbytes()));
    if (!h.empty())
      copy(TensorView(h.data(), DType::e8m0, Device::CPU, {int64_t(h.size())}),
           TensorView(t.data(), DType::e8m0, d, {int64_t(h.size())}), s);
    return h;
  };
  r.overflow = ctx.take_status().bits != 0;
  r.valid = !r.overflow && host_bytes(xg.data) == host_bytes(ref.data) &&
            host_bytes(xg.scale_inv) == host_bytes(ref.scale_inv);
  return r;
}

struct EpCaseReport {
  EpCase c;
  int64_t T = 0;
  std::vector<EpModeResult> modes;
};

std::vector<EpCase> chosen_ep_cases(const BenchEpOptions& o) {
  std::vector<EpCase> out;
  for (const EpCase& c : o.cpu ? std::vector<EpCase>(std::begin(kCpuCases), std::end(kCpuCases))
                               : std::vector<EpCase>(std::begin(kEpCases), std::end(kEpCases)))
    if (o.cases.empty() || std::find(o.cases.begin(), o.cases.end(), c.name) != o.cases.end())
      out.push_back(c);
  return out;
}

// Every chosen case on this rank (a collective: every rank runs the same cases in order).
std::vector<EpCaseReport> run_ep_rank(Context& ctx, ep::Transport& tr, const BenchEpOptions& o) {
  const int R = tr.size(), me = tr.rank();
  const Device d = ctx.device();
  cudaStream_t s = ctx.stream();
  const int warmup = o.cpu ? 0 : o.warmup, iters = o.cpu ? 1 : o.iters;
  std::vector<EpCaseReport> reps;
  for (const EpCase& c : chosen_ep_cases(o)) {
    GROUPMM_CHECK(c.E % R == 0, "bench ep: case ", c.name, " has E=", c.E,
                  " experts, which ranks=", R, " does not divide");
    const int64_t T = o.tokens > 0 ? o.tokens : (o.cpu ? 64 : 4096);
    const ep::EpConfig cfg{c.E, R, c.H, c.k};
    std::vector<int32_t> ids_h = ep_routing(T, c.E, c.k, 1000 + uint64_t(me));
    std::vector<float> w_h(size_t(T * c.k), 1.0f / float(c.k));
    Tensor ids = Tensor::empty({T, c.k}, DType::int32, d, s);
    Tensor w = Tensor::empty({T, c.k}, DType::fp32, d, s);
    Tensor x = Tensor::empty({T, c.H}, DType::bf16, d, s);
    if (T > 0) {
      copy(ids, TensorView(ids_h.data(), DType::int32, Device::CPU, {T, c.k}), s);
      copy(w, TensorView(w_h.data(), DType::fp32, Device::CPU, {T, c.k}), s);
    }
    fill_uniform(ctx, x, -1.0f, 1.0f, 17 + uint64_t(me));
    ctx.synchronize();  // the host vectors are freed at the end of this iteration
    EpCaseReport rep{c, T, {}};
    for (ep::EpMode m : {ep::EpMode::throughput, ep::EpMode::capacity})
      rep.modes.push_back(run_ep_mode(ctx, tr, cfg, m, o, ids, x, w, warmup, iters));
    if (c.H % 128 == 0) rep.modes.push_back(run_fp8_mode(ctx, tr, cfg, ids, x, warmup, iters));
    reps.push_back(rep);
  }
  return reps;
}

// Rank 0's report: per case a table of its modes; the --json records. Returns whether every
// mode's check passed.
bool report_ep(const std::vector<EpCaseReport>& reps, int R, const BenchEpOptions& o,
               JsonFile& json) {
  const Table t({text_col("mode", 14), num_col("plan us", 10, 1), num_col("host us", 8, 1),
                 num_col("dispatch us", 12, 1), num_col("GB/s", 8, 1), num_col("combine us", 11, 1),
                 num_col("GB/s", 8, 1),
                 Column{"check (combine of dispatch == x; fp8: == quantized rows)", 0, 's', 0, true,
                        "", "  "}},
                "  ");
  bool ok = true;
  for (const EpCaseReport& r : reps) {
    std::printf("\n== %s: R=%d, T=%lld tokens a rank, H=%lld, E=%lld (%lld a rank), k=%lld, bf16\n",
                r.c.name, R, (long long)r.T, (long long)r.c.H, (long long)r.c.E,
                (long long)(r.c.E / R), (long long)r.c.k);
    t.print_header();
    for (const EpModeResult& m : r.modes) {
      const double dg = m.dispatch_bytes / (m.dispatch_us * 1e3);
      const double cg = m.combine_us > 0 ? m.combine_bytes / (m.combine_us * 1e3) : 0.0;
      ok = ok && m.valid;
      const bool combined = m.combine_us > 0;  // FP8 dispatch: its combine is the 16-bit one
      const std::string cap =
          m.C > 0 ? detail::cat(" (C=", m.C, ", C_e=", m.Ce,
                                m.overflow ? "; OVERFLOW: raise --capacity-factor" : "", ")")
                  : "";
      t.print_row({m.mode, m.plan_us, m.plan_host_us >= 0 ? Cell(m.plan_host_us) : "-",
                   m.dispatch_us, dg, combined ? Cell(m.combine_us) : "-",
                   combined ? Cell(cg) : "-", m.valid ? "ok" : "FAILED"},
                  cap);
      json.add(JsonRecord()
                   .add("case", r.c.name)
                   .add("mode", m.mode)
                   .add("T", r.T)
                   .add("H", r.c.H)
                   .add("E", r.c.E)
                   .add("k", r.c.k)
                   .add("plan_us", m.plan_us)
                   .add("plan_host_us", m.plan_host_us)
                   .add("dispatch_us", m.dispatch_us)
                   .add("dispatch_gbs", dg)
                   .add("combine_us", m.combine_us)
                   .add("combine_gbs", cg)
                   .add("C", m.C)
                   .add("C_e", m.Ce)
                   .add("overflow", m.overflow)
                   .add("valid", m.valid));
    }
  }
  std::printf(
      "\n(rank 0's view: GB/s = bytes it sends to other ranks / time; a capacity exchange moves "
      "fixed blocks of C rows / C_e entries to each peer; throughput_fp8: quantize + FP8 dispatch, "
      "wire rows of H fp8 bytes + H/128 fp32 scales, its combine is the 16-bit one above)\n");
  json.write(JsonRecord().add("device", o.cpu ? "cpu" : "cuda").add("ranks", R), {}, true);
  return ok;
}

// Before any rank starts: the ranks divide every chosen case's experts, and the buffers of the
// largest case fit (all R ranks in this process's memory with --cpu; one rank per GPU otherwise).
void check_ep_run(const BenchEpOptions& o, int R) {
  double worst = 0;
  for (const EpCase& c : chosen_ep_cases(o)) {
    if (c.E % R != 0)
      throw UsageError(detail::cat("bench ep: --ranks ", R,
                                   " must divide the experts of every "
                                   "chosen case (case ",
                                   c.name, " has E=", c.E, ")"));
    // x and the combined rows; per mode the grouped rows on both sides of the exchange, a
    // capacity plan's padded blocks (factor x the expected rows), FP8 rows and their scales.
    const double T = double(o.tokens > 0 ? o.tokens : (o.cpu ? 64 : 4096));
    const double row = double(c.H) * 2.0, rows = T * double(c.k) * (1.0 + o.capacity_factor);
    worst = std::max(worst, 2.0 * T * row + 3.0 * rows * row + T * double(c.k) * 16.0);
  }
  check_fits_memory("bench ep", o.cpu ? worst * R : worst, o.cpu ? Device::CPU : Device::CUDA,
                    "--tokens or --ranks");
}

int run_bench_ep(const BenchEpOptions& o) {
  for (const char* name : {"--rank", "--id-file"})
    reject_option(o.cpu && o.app->get_option(name)->count() > 0, name,
                  "to --cpu (its ranks are threads of one process)");
  JsonFile json(o.json);  // every rank checks the path; rank 0 writes it
  if (o.cpu) {
    const int R = o.ranks > 0 ? o.ranks : 2;
    check_ep_run(o, R);
    const auto reps = run_cpu_ranks(
        "bench ep", R, [&](Context& ctx, ep::Transport& tr) { return run_ep_rank(ctx, tr, o); });
    return report_ep(reps[0], R, o, json) ? 0 : 1;
  }
  require_gpu("bench ep", "; --cpu runs a smoke version with ranks as threads on the CPU");
  check_ep_run(o, o.ranks > 0 ? o.ranks : env_int("WORLD_SIZE", 1));
  const auto [g, reps] =
      run_gpu_rank("bench ep", o.ranks, o.rank, o.id_file,
                   [&](Context& ctx, ep::Transport& tr) { return run_ep_rank(ctx, tr, o); });
  if (g.rank != 0) return 0;
  std::printf("bench ep: %d rank(s), %s transport\n", g.ranks,
              GROUPMM_WITH_NCCL ? "NCCL" : "in-process");
  return report_ep(reps, g.ranks, o, json) ? 0 : 1;
}

void add_bench_ep_options(CLI::App& app, BenchEpOptions& o) {
  o.app = &app;
  add_choice_list(app, "--case", o.cases, {"dsv3", "qwen3"},
                  "cases to run (comma separated; default all): dsv3 = DeepSeek-V3-like (H=7168, "
                  "E=256, k=8), qwen3 = Qwen3-30B-A3B (H=2048, E=128, k=8)");
  add_int(app, "--tokens", o.tokens, 1, int64_t(1) << 20,
          "tokens T a rank (default 4096; --cpu: 64)");
  add_real(app, "--capacity-factor", o.capacity_factor, 1.0, 64.0,
           "capacity mode's per-peer budgets over the uniform routing's expected rows and "
           "entries (default 1.5)");
  add_iters(app, o.iters, "timed runs per measurement, median (default 20)");
  add_rank_group_options(app, o.ranks, o.rank, o.id_file, "");
  app.add_flag("--cpu", o.cpu, "smoke run: ranks as threads on the CPU reference backend");
  add_json(app, o.json);
}

Register reg_bench_ep(command<BenchEpOptions>(
    "bench", "ep",
    "expert-parallel dispatch and combine per rank (throughput and capacity modes, FP8 dispatch, "
    "GB/s; one process per GPU over NCCL; --cpu: a smoke run with threads)",
    add_bench_ep_options, run_bench_ep));

}  // namespace
}  // namespace groupmm::tool
