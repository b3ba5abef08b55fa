// The capacity-mode plan on CUDA (the CPU reference: src/ep/cpu/capacity_plan.cpp), graph safe:
// every buffer comes with the plan, nothing is read on the host.
//   send: per chunk of tokens and peer q, a block scan of (needs q, entries on q) after the sums
//     of the earlier chunks gives each token its running totals, which decide the prefix rule
//     (kept while both fit), its send slot and where its entries come back; overflow is reported
//     once per peer.
//   recv: the received slots become two id lists (their local expert, and their peer; a spare
//     group collects the empty and foreign slots), ranked stably with moe_permute_plan's kernels:
//     by local expert they give the grouped rows, by peer the order of the way back.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "moe/backends.hpp"
#include "ep/cuda/ep_common.cuh"

namespace groupmm::ep::cuda {
namespace {

struct PlanConfig {
  static constexpr int kSendThreads = 256;
  static constexpr int kThreads = PlanLaunch::kThreads;
  static_assert(kSendThreads % 32 == 0, "whole warps");
};

// ---- scratch: [S] ids by expert, ids by peer, their dest rows; two maps' row_start / kept /
// splits; the permute plan's workspace (S = R C k received slots); the send side's per (peer,
// chunk) sums and kept counts ---------------------------------------------------------------------
struct Scratch {
  int64_t S = 0, G1 = 0, G2 = 0;  // slots, groups by expert (E_l + 1), groups by peer (R + 1)
  int64_t ids1 = 0, ids2 = 0, dest1 = 0, dest2 = 0, meta1 = 0, meta2 = 0, ws = 0;  // int32 offsets
  int64_t chunks = 0;          // send chunks of kSendThreads tokens
  int64_t sums = 0, kept = 0;  // byte offsets: [R, chunks] int64, [R, chunks] int32
  int64_t ws_bytes = 0, bytes = 0;
  explicit Scratch(const EpPlan& p) {
    S = p.cfg.ranks * p.cap.rows_per_peer * p.cfg.topk;
    G1 = p.local_experts + 1;
    G2 = p.cfg.ranks + 1;
    const int64_t rows = p.cfg.ranks * p.cap.rows_per_peer;
    ws_bytes =
        int64_t(std::max(groupmm::cuda::moe_permute_plan_workspace_size(rows, p.cfg.topk, G1),
                         groupmm::cuda::moe_permute_plan_workspace_size(rows, p.cfg.topk, G2)));
    ids2 = ids1 + S;
    dest1 = ids2 + S;
    dest2 = dest1 + S;
    meta1 = dest2 + S;
    meta2 = meta1 + 3 * G1;
    ws = qnum::round_up(meta2 + 3 * G2, int64_t(64));  // 256-byte aligned
    chunks = std::max<int64_t>(qnum::ceil_div(p.tokens, int64_t(PlanConfig::kSendThreads)), 1);
    sums = qnum::round_up(ws * 4 + ws_bytes, int64_t(256));
    kept = sums + p.cfg.ranks * chunks * 8;
    bytes = kept + p.cfg.ranks * chunks * 4;
  }
};

// A PermuteMap over the scratch: rows R C with k slots, G groups, dropless, align 1.
PermuteMap scratch_map(int32_t* base, const Scratch& s, const EpPlan& p, int64_t dest, int64_t meta,
                       int64_t G) {
  PermuteMap m;
  m.tokens = p.cfg.ranks * p.cap.rows_per_peer;
  m.topk = p.cfg.topk;
  m.experts = G;
  m.rows = s.S;
  m.dest_row = TensorView(base + dest, DType::int32, Device::CUDA, {m.tokens, m.topk});
  m.row_start = TensorView(base + meta, DType::int32, Device::CUDA, {G});
  m.kept = TensorView(base + meta + G, DType::int32, Device::CUDA, {G});
  m.splits = TensorView(base + meta + 2 * G, DType::int32, Device::CUDA, {G});
  return m;
}

// ---- send side ----------------------------------------------------------------------------------
// Three steps over chunks of kSendThreads tokens, each a grid of (chunk, peer q) CTAs but the last:
//   sums: the chunk's (rows << 32) + entries for q (one scan value carries both: entries < 2^31);
//   apply: the running totals at the chunk (its earlier chunks' sums) and a block scan decide the
//     prefix rule (a token is kept while both budgets hold), its send slot, its metadata row and
//     where its entries come back; the chunk's kept tokens are counted;
//   finish (one CTA per peer): the kept rows (meta[0]), the unused send slots, overflow (once).
struct SendParams {
  const int32_t* ids;   // [T, k]
  int32_t* send_token;  // [R, C]
  int32_t* meta;        // [R, 1 + C k]
  int32_t* slot_entry;  // [T, k]
  long long* sums;      // [R, chunks]
  int32_t* kept;        // [R, chunks]
  StatusBlock* status;
  int64_t T, k, E, El, C, Ce, chunks;
};

using SendScan = cub::BlockScan<long long, PlanConfig::kSendThreads>;
using SendSum = cub::BlockReduce<long long, PlanConfig::kSendThreads>;

// Token t's entries on peer q, packed as a scan value.
__device__ long long send_value(const SendParams& p, int64_t t, int64_t q) {
  if (t >= p.T) return 0;
  int64_t n = 0;
  for (int64_t j = 0; j < p.k; ++j) {
    const int32_t e = p.ids[t * p.k + j];
    n += e >= 0 && e < p.E && e / p.El == q;
  }
  return n > 0 ? (1ll << 32) + n : 0;
}

__global__ void __launch_bounds__(PlanConfig::kSendThreads) capacity_sums_kernel(SendParams p) {
  __shared__ typename SendSum::TempStorage tmp;
  const int64_t c = blockIdx.x, q = blockIdx.y;
  const long long v = send_value(p, c * PlanConfig::kSendThreads + threadIdx.x, q);
  const long long sum = SendSum(tmp).Sum(v);
  if (threadIdx.x == 0) p.sums[q * p.chunks + c] = sum;
}

__global__ void __launch_bounds__(PlanConfig::kSendThreads) capacity_apply_kernel(SendParams p) {
  union Tmp {
    typename SendScan::TempStorage scan;
    typename SendSum::TempStorage sum;
  };
  __shared__ Tmp tmp;
  __shared__ long long carry;
  const int64_t c = blockIdx.x, q = blockIdx.y;
  const int64_t t = c * PlanConfig::kSendThreads + threadIdx.x;
  // the earlier chunks' totals for q
  long long before = 0;
  for (int64_t i = threadIdx.x; i < c; i += PlanConfig::kSendThreads)
    before += p.sums[q * p.chunks + i];
  before = SendSum(tmp.sum).Sum(before);
  if (threadIdx.x == 0) carry = before;
  __syncthreads();
  if (q == 0 && t < p.T)  // one peer's CTAs own the bad ids: skipped (no row) and reported
    for (int64_t j = 0; j < p.k; ++j) {
      const int32_t e = p.ids[t * p.k + j];
      if (e >= 0 && e < p.E) continue;
      p.slot_entry[t * p.k + j] = -1;
      if (e != -1)  // -1 names no expert (groupmm/ep.hpp): no fault
        report_fault(p.status, kFaultBadIndex, OpId::ep_dispatch, int32_t(t), e);
    }
  const long long v = send_value(p, t, q);
  long long excl;
  SendScan(tmp.scan).ExclusiveSum(v, excl);
  const long long incl = carry + excl + v;
  const int64_t n = v & 0xFFFFFFFFll;
  const int64_t rows_incl = incl >> 32, ent_incl = incl & 0xFFFFFFFFll;
  const bool kept = n > 0 && rows_incl <= p.C && ent_incl <= p.Ce;
  if (n > 0) {
    int64_t next = q * p.Ce + ent_incl - n;  // this token's first entry on the way back
    int32_t* m = kept ? p.meta + q * (1 + p.C * p.k) + 1 + (rows_incl - 1) * p.k : nullptr;
    if (kept) p.send_token[q * p.C + rows_incl - 1] = int32_t(t);
    for (int64_t j = 0; j < p.k; ++j) {
      const int32_t e = p.ids[t * p.k + j];
      const bool here = e >= 0 && e < p.E && e / p.El == q;
      if (kept) m[j] = here ? int32_t(e - q * p.El) : -1;
      if (here) p.slot_entry[t * p.k + j] = kept ? int32_t(next++) : -1;
    }
  }
  __syncthreads();  // tmp is reused
  const long long kept_here = SendSum(tmp.sum).Sum(kept ? 1 : 0);
  if (threadIdx.x == 0) p.kept[q * p.chunks + c] = int32_t(kept_here);
}

__global__ void __launch_bounds__(PlanConfig::kSendThreads) capacity_finish_kernel(SendParams p) {
  using IntSum = cub::BlockReduce<long long, PlanConfig::kSendThreads>;
  __shared__ typename IntSum::TempStorage tmp;
  __shared__ long long kept_rows;
  const int64_t q = blockIdx.x;
  long long total = 0, kept = 0;
  for (int64_t i = threadIdx.x; i < p.chunks; i += PlanConfig::kSendThreads) {
    total += p.sums[q * p.chunks + i];
    kept += p.kept[q * p.chunks + i];
  }
  total = IntSum(tmp).Sum(total);
  __syncthreads();  // tmp is reused
  kept = IntSum(tmp).Sum(kept);
  if (threadIdx.x == 0) {
    kept_rows = kept;
    p.meta[q * (1 + p.C * p.k)] = int32_t(kept);
    const int64_t rows = total >> 32, entries = total & 0xFFFFFFFFll;
    if (rows > p.C || entries > p.Ce)
      report_fault(p.status, kFaultEpCapacity, OpId::ep_dispatch, int32_t(q),
                   rows > p.C ? rows : entries);
  }
  __syncthreads();
  for (int64_t i = kept_rows + threadIdx.x; i < p.C; i += PlanConfig::kSendThreads)
    p.send_token[q * p.C + i] = -1;
}

// ---- receive side -------------------------------------------------------------------------------
struct RecvParams {
  const int32_t* meta;  // [R, 1 + C k]
  int32_t* ids1;        // [S] local expert, or E_l (spare)
  int32_t* ids2;        // [S] peer, or R (spare)
  const int32_t* dest1;
  const int32_t* dest2;
  const int32_t* map1;      // row_start, kept, splits of the expert ranking [3 (E_l + 1)]
  const int32_t* map2;      // of the peer ranking [3 (R + 1)]
  int32_t* grouped_entry;   // [rows]
  int32_t* back_grouped;    // [R C_e]
  int32_t* splits;          // [E_l]
  int32_t* splits_at_most;  // [E_l]: splits without the tail
  StatusBlock* status;
  int64_t R, C, Ce, k, El, S, rows;
};

// Slot s = (q C + i) k + j: valid when row i is below q's count and names a local expert.
__global__ void __launch_bounds__(PlanConfig::kThreads) capacity_ids_kernel(RecvParams p) {
  for (int64_t s = grid_stride_start(); s < p.S; s += grid_stride()) {
    const int64_t q = s / (p.C * p.k), i = s / p.k % p.C, j = s % p.k;
    const int32_t* m = p.meta + q * (1 + p.C * p.k);
    const int64_t count = min(max(int64_t(m[0]), int64_t(0)), p.C);
    if (i == 0 && j == 0 && m[0] != count)
      report_fault(p.status, kFaultBadIndex, OpId::ep_dispatch, int32_t(q), m[0]);
    const int32_t le = i < count ? m[1 + i * p.k + j] : -1;
    if (le >= p.El) report_fault(p.status, kFaultBadIndex, OpId::ep_dispatch, int32_t(q), le);
    const bool valid = le >= 0 && le < p.El;
    p.ids1[s] = valid ? le : int32_t(p.El);
    p.ids2[s] = valid ? int32_t(q) : int32_t(p.R);
  }
}

// The tail of the grouped rows and every way-back slot start empty; the splits are the experts'
// counts with the zero tail in the last (splits_at_most: without it).
__global__ void __launch_bounds__(PlanConfig::kThreads) capacity_fill_kernel(RecvParams p) {
  const int64_t total = p.map1[p.El];  // the spare group's start: the entries of real experts
  for (int64_t g = total + grid_stride_start(); g < p.rows; g += grid_stride())
    p.grouped_entry[g] = -1;
  for (int64_t i = grid_stride_start(); i < p.R * p.Ce; i += grid_stride()) p.back_grouped[i] = -1;
  if (grid_stride_start() == 0) {
    for (int64_t e = 0; e < p.El; ++e)
      p.splits[e] = p.splits_at_most[e] = p.map1[2 * (p.El + 1) + e];
    const int64_t tail = p.rows - total;
    if (tail < 0) report_fault(p.status, kFaultEpCapacity, OpId::ep_dispatch, -1, total);
    p.splits[p.El - 1] += int32_t(max(tail, int64_t(0)));
  }
}

__global__ void __launch_bounds__(PlanConfig::kThreads) capacity_scatter_kernel(RecvParams p) {
  for (int64_t s = grid_stride_start(); s < p.S; s += grid_stride()) {
    if (p.ids1[s] >= p.El) continue;
    const int64_t g = p.dest1[s], q = p.ids2[s];
    const int64_t n = p.dest2[s] - p.map2[q];  // its rank among peer q's entries
    if (g < p.rows) p.grouped_entry[g] = int32_t(s);
    if (n < p.Ce && g < p.rows)
      p.back_grouped[q * p.Ce + n] = int32_t(g);
    else
      report_fault(p.status, kFaultEpCapacity, OpId::ep_dispatch, int32_t(q), n + 1);
  }
}

}  // namespace

int64_t ep_capacity_scratch_bytes(const EpPlan& plan) {
  return Scratch(plan).bytes;
}

void ep_capacity_plan_send(Context& ctx, const TensorView& expert_ids, EpPlan& p) {
  const Scratch sc(p);
  char* base = static_cast<char*>(p.scratch.data());
  const SendParams s{expert_ids.ptr<int32_t>(),
                     p.send_token.ptr<int32_t>(),
                     p.meta_send.ptr<int32_t>(),
                     p.slot_entry.ptr<int32_t>(),
                     reinterpret_cast<long long*>(base + sc.sums),
                     reinterpret_cast<int32_t*>(base + sc.kept),
                     ctx.status(),
                     p.tokens,
                     p.cfg.topk,
                     p.cfg.experts,
                     p.local_experts,
                     p.cap.rows_per_peer,
                     p.cap.entries_per_peer,
                     sc.chunks};
  const unsigned R = unsigned(p.cfg.ranks);
  const dim3 grid(unsigned(sc.chunks), R);
  capacity_sums_kernel<<<grid, PlanConfig::kSendThreads, 0, ctx.stream()>>>(s);
  GROUPMM_CHECK_LAUNCH();
  capacity_apply_kernel<<<grid, PlanConfig::kSendThreads, 0, ctx.stream()>>>(s);
  GROUPMM_CHECK_LAUNCH();
  capacity_finish_kernel<<<R, PlanConfig::kSendThreads, 0, ctx.stream()>>>(s);
  GROUPMM_CHECK_LAUNCH();
}

void ep_capacity_plan_recv(Context& ctx, EpPlan& p) {
  const Scratch sc(p);
  auto* base = p.scratch.ptr<int32_t>();
  RecvParams r{};
  r.meta = p.meta_recv.ptr<int32_t>();
  r.ids1 = base + sc.ids1;
  r.ids2 = base + sc.ids2;
  r.dest1 = base + sc.dest1;
  r.dest2 = base + sc.dest2;
  r.map1 = base + sc.meta1;
  r.map2 = base + sc.meta2;
  r.grouped_entry = p.grouped_entry.ptr<int32_t>();
  r.back_grouped = p.back_grouped.ptr<int32_t>();
  r.splits = p.splits.ptr<int32_t>();
  r.splits_at_most = p.splits_at_most.ptr<int32_t>();
  r.status = ctx.status();
  r.R = p.cfg.ranks;
  r.C = p.cap.rows_per_peer;
  r.Ce = p.cap.entries_per_peer;
  r.k = p.cfg.topk;
  r.El = p.local_experts;
  r.S = sc.S;
  r.rows = p.rows;
  const unsigned grid = PlanLaunch::grid(ctx, sc.S);
  capacity_ids_kernel<<<grid, PlanConfig::kThreads, 0, ctx.stream()>>>(r);
  GROUPMM_CHECK_LAUNCH();
  // Stable ranks in slot order, which is (peer, row, slot) order: by local expert, then by peer.
  const int64_t rows_in = p.cfg.ranks * p.cap.rows_per_peer;
  const TensorView ids1(r.ids1, DType::int32, Device::CUDA, {rows_in, p.cfg.topk});
  const TensorView ids2(r.ids2, DType::int32, Device::CUDA, {rows_in, p.cfg.topk});
  groupmm::cuda::moe_permute_plan(ctx, ids1, scratch_map(base, sc, p, sc.dest1, sc.meta1, sc.G1),
                                  base + sc.ws);
  groupmm::cuda::moe_permute_plan(ctx, ids2, scratch_map(base, sc, p, sc.dest2, sc.meta2, sc.G2),
                                  base + sc.ws);
  capacity_fill_kernel<<<PlanLaunch::grid(ctx, std::max(p.rows, r.R * r.Ce)), PlanConfig::kThreads,
                         0, ctx.stream()>>>(r);
  GROUPMM_CHECK_LAUNCH();
  capacity_scatter_kernel<<<grid, PlanConfig::kThreads, 0, ctx.stream()>>>(r);
  GROUPMM_CHECK_LAUNCH();
}

}  // namespace groupmm::ep::cuda
