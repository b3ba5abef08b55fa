// `groupmm bench ep`: expert-parallel dispatch and combine per rank, in both modes, on
// DeepSeek-V3-like and Qwen3-30B-A3B settings. One process per GPU over NCCL (ranks from the
// command line or torchrun's environment, the unique id through a file), one GPU alone, or a CPU
// smoke run with ranks as threads. Public API only.
#include "ep_bench.hpp"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <sstream>

#include "bench_common.hpp"
#include "cli.hpp"
#include "ep_tools.hpp"
#include "groupmm/ep.hpp"
#include "groupmm/quantize.hpp"
#include "groupmm/random.hpp"
#include "groupmm/version.hpp"

namespace groupmm::tool {
namespace {

struct EpCase {
  const char* name;
  int64_t H, E, k;
};
const EpCase kEpCases[] = {{"dsv3", 7168, 256, 8}, {"qwen3", 2048, 128, 8}};
// (--cpu: H a multiple of 128 for dsv3, so that the FP8 dispatch runs in the smoke run too.)
const EpCase kCpuCases[] = {{"dsv3", 128, 32, 8}, {"qwen3", 32, 16, 4}};

// k distinct experts per token, uniform; every weight 1/k (a power of two for k = 1, 2, 4, 8, ...,
// so the identity-expert check below is exact).
std::vector<int32_t> routing(int64_t T, int64_t E, int64_t k, uint64_t seed) {
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

struct ModeResult {
  const char* mode;
  double plan_us = 0, dispatch_us = 0, combine_us = 0;
  double dispatch_bytes = 0, combine_bytes = 0;  // sent to other ranks (what crosses the links)
  bool valid = false, overflow = false;
  int64_t C = 0, Ce = 0;
};

// Bytes this rank sends to the other ranks along a route (per-peer units of `unit` bytes).
double remote_bytes(const std::vector<int64_t>& per_peer, int me, int64_t unit) {
  double b = 0;
  for (size_t q = 0; q < per_peer.size(); ++q)
    if (int(q) != me) b += double(per_peer[q]) * double(unit);
  return b;
}

// One mode on this rank: plan, dispatch, combine timed; then the check (identity experts:
// combine(dispatch(x)) with weights 1/k is x again, bit for bit, unless capacity overflowed).
ModeResult run_mode(Context& ctx, ep::Transport& tr, const ep::EpConfig& cfg, ep::EpMode mode,
                    const EpBenchOptions& o, const Tensor& ids, const Tensor& x, const Tensor& w,
                    int warmup, int iters) {
  const Device d = ctx.device();
  cudaStream_t s = ctx.stream();
  const int64_t T = x.view().dim(0), H = cfg.hidden, R = cfg.ranks, k = cfg.topk;
  ModeResult r;
  r.mode = ep::ep_mode_name(mode);
  ep::EpPlan plan;
  if (mode == ep::EpMode::throughput) {
    r.plan_us =
        time_us(ctx, warmup, iters, [&](int) { plan = ep::ep_dispatch_plan(ctx, tr, cfg, ids); });
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
  r.dispatch_bytes = remote_bytes(plan.send_rows, tr.rank(), row);
  r.combine_bytes = remote_bytes(plan.back_send, tr.rank(), row);
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
ModeResult run_fp8_mode(Context& ctx, ep::Transport& tr, const ep::EpConfig& cfg, const Tensor& ids,
                        const Tensor& x, int warmup, int iters) {
  const Device d = ctx.device();
  cudaStream_t s = ctx.stream();
  const int64_t T = x.view().dim(0), H = cfg.hidden, El = cfg.experts / cfg.ranks;
  ModeResult r;
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
  r.dispatch_bytes = remote_bytes(plan.send_rows, tr.rank(), ep::ep_fp8_wire_row_bytes(H));
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

struct CaseReport {
  EpCase c;
  int64_t T = 0;
  std::vector<ModeResult> modes;
};

std::vector<EpCase> chosen_cases(const EpBenchOptions& o) {
  std::vector<EpCase> out;
  for (const EpCase& c : o.cpu ? std::vector<EpCase>(std::begin(kCpuCases), std::end(kCpuCases))
                               : std::vector<EpCase>(std::begin(kEpCases), std::end(kEpCases)))
    if (o.cases.empty() || std::find(o.cases.begin(), o.cases.end(), c.name) != o.cases.end())
      out.push_back(c);
  return out;
}

// Every chosen case on this rank (a collective: every rank runs the same cases in order).
std::vector<CaseReport> run_rank(Context& ctx, ep::Transport& tr, const EpBenchOptions& o) {
  const int R = tr.size(), me = tr.rank();
  const Device d = ctx.device();
  cudaStream_t s = ctx.stream();
  const int warmup = o.cpu ? 0 : o.warmup, iters = o.cpu ? 1 : o.iters;
  std::vector<CaseReport> reps;
  for (const EpCase& c : chosen_cases(o)) {
    GROUPMM_CHECK(c.E % R == 0, "bench ep: case ", c.name, " has E=", c.E,
                  " experts, which ranks=", R, " does not divide");
    const int64_t T = o.tokens > 0 ? o.tokens : (o.cpu ? 64 : 4096);
    const ep::EpConfig cfg{c.E, R, c.H, c.k};
    std::vector<int32_t> ids_h = routing(T, c.E, c.k, 1000 + uint64_t(me));
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
    CaseReport rep{c, T, {}};
    for (ep::EpMode m : {ep::EpMode::throughput, ep::EpMode::capacity})
      rep.modes.push_back(run_mode(ctx, tr, cfg, m, o, ids, x, w, warmup, iters));
    if (c.H % 128 == 0) rep.modes.push_back(run_fp8_mode(ctx, tr, cfg, ids, x, warmup, iters));
    reps.push_back(rep);
  }
  return reps;
}

bool report(const std::vector<CaseReport>& reps, int R, const EpBenchOptions& o) {
  bool ok = true;
  std::ostringstream js;
  js << "{\"device\": \"" << (o.cpu ? "cpu" : "cuda") << "\", \"ranks\": " << R << ", \"cases\": [";
  int n = 0;
  for (const CaseReport& r : reps) {
    std::printf("\n== %s: R=%d, T=%lld tokens a rank, H=%lld, E=%lld (%lld a rank), k=%lld, bf16\n",
                r.c.name, R, (long long)r.T, (long long)r.c.H, (long long)r.c.E,
                (long long)(r.c.E / R), (long long)r.c.k);
    std::printf("  %-14s %10s %12s %8s %11s %8s  %s\n", "mode", "plan us", "dispatch us", "GB/s",
                "combine us", "GB/s", "check (combine of dispatch == x; fp8: == quantized rows)");
    for (const ModeResult& m : r.modes) {
      const double dg = m.dispatch_bytes / (m.dispatch_us * 1e3);
      const double cg = m.combine_us > 0 ? m.combine_bytes / (m.combine_us * 1e3) : 0.0;
      ok = ok && m.valid;
      if (m.combine_us > 0)
        std::printf("  %-14s %10.1f %12.1f %8.1f %11.1f %8.1f  %s", m.mode, m.plan_us,
                    m.dispatch_us, dg, m.combine_us, cg, m.valid ? "ok" : "FAILED");
      else  // FP8 dispatch: its combine is the 16-bit one
        std::printf("  %-14s %10.1f %12.1f %8.1f %11s %8s  %s", m.mode, m.plan_us, m.dispatch_us,
                    dg, "-", "-", m.valid ? "ok" : "FAILED");
      if (m.C > 0)
        std::printf(" (C=%lld, C_e=%lld%s)", (long long)m.C, (long long)m.Ce,
                    m.overflow ? "; OVERFLOW: raise --capacity-factor" : "");
      std::printf("\n");
      js << (n++ ? ", " : "") << "{\"case\": \"" << r.c.name << "\", \"mode\": \"" << m.mode
         << "\", \"T\": " << r.T << ", \"H\": " << r.c.H << ", \"E\": " << r.c.E
         << ", \"k\": " << r.c.k << ", \"plan_us\": " << m.plan_us
         << ", \"dispatch_us\": " << m.dispatch_us << ", \"dispatch_gbs\": " << dg
         << ", \"combine_us\": " << m.combine_us << ", \"combine_gbs\": " << cg
         << ", \"C\": " << m.C << ", \"C_e\": " << m.Ce
         << ", \"overflow\": " << (m.overflow ? "true" : "false")
         << ", \"valid\": " << (m.valid ? "true" : "false") << "}";
    }
  }
  js << "]}";
  std::printf(
      "\n(rank 0's view: GB/s = bytes it sends to other ranks / time; a capacity exchange moves "
      "fixed blocks of C rows / C_e entries to each peer; throughput_fp8: quantize + FP8 dispatch, "
      "wire rows of H fp8 bytes + H/128 fp32 scales, its combine is the 16-bit one above)\n");
  if (!o.json.empty()) {
    write_json(o.json, js.str());
  }
  return ok;
}

int run_cpu(const EpBenchOptions& o) {
  const int R = o.ranks > 0 ? o.ranks : 2;
  const auto reps =
      run_cpu_ranks(R, [&](Context& ctx, ep::Transport& tr) { return run_rank(ctx, tr, o); });
  return report(reps[0], R, o) ? 0 : 1;
}

}  // namespace

int run_bench_ep(const EpBenchOptions& o) {
  if (o.cpu) return run_cpu(o);
  GROUPMM_CHECK(cuda_available(),
                "bench ep: needs an sm_90 GPU (none visible); --cpu runs a smoke "
                "version with ranks as threads on the CPU");
  const RankGroup g = join_rank_group("bench ep", o.ranks, o.rank);
  const int R = g.ranks, me = g.rank;
  cudaStream_t s = nullptr;
  GROUPMM_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::unique_ptr<ep::Transport> tr = rank_transport("bench ep", g, o.id_file, s);
  int rc = 0;
  {
    Context ctx(Device::CUDA, s);
    const std::vector<CaseReport> reps = run_rank(ctx, *tr, o);
    if (me == 0) {
      std::printf("bench ep: %d rank(s), %s transport\n", R,
                  GROUPMM_WITH_NCCL ? "NCCL" : "in-process");
      rc = report(reps, R, o) ? 0 : 1;
    }
  }
  tr.reset();
  cudaStreamDestroy(s);
  return rc;
}

}  // namespace groupmm::tool
