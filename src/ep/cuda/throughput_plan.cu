// The throughput-mode plan built by kernels (the host reference: ep_dispatch_plan_host in
// src/ep/plan.cpp, whose arrays these equal bit for bit). src/ep/plan.cpp runs the three steps
// around the count and metadata exchanges and reads the sizes once, between the first two.
//   count: per (token, slot) entry, its peer (the rank of its expert) and whether it is the
//     token's first slot on that peer. One stable ranking of both lists (moe_permute_plan's
//     kernels, entries in (token, slot) order) gives each entry its place on the way back
//     (slot_entry: grouped by peer, token order within) and each (token, peer) its send row
//     (grouped by peer, token order within). The peer's block of the count exchange: the rows
//     it gets, and per local expert of it the entries (a warp-aggregated integer histogram); and
//     the first id outside [0, E), which the host reports.
//   pack: send_token, the metadata rows (per slot: the local expert on that peer, or -1) and
//     slot_entry, scattered by those ranks.
//   recv: the received slots ranked stably by local expert (the grouped rows) and by whether they
//     name one (the way back's order: (source rank, row, slot)), as the capacity plan does.
// Two lists ranked in one call: rows [0, r) carry list A with groups [0, G_A), rows [r, 2r) list
// B with groups [G_A, G): every A entry precedes every B entry and every A group every B group, so
// a B entry's destination minus r k (the A entries) is its place among the B entries.
#include "moe/backends.hpp"
#include "ep/cuda/ep_common.cuh"

namespace groupmm::ep::cuda {
namespace {

struct TpConfig {
  static constexpr int kThreads = PlanLaunch::kThreads;
  static constexpr int kMaxGroups = 1024;  // moe_permute_plan's bound
};

// One double ranking's scratch (int32 offsets): the lists [2 n], their destinations [2 n], the
// map's row_start / kept / splits [3 G], then moe_permute_plan's workspace (256-byte aligned);
// n = rows k.
struct Ranking {
  int64_t rows = 0, k = 0, n = 0, G = 0;
  int64_t list = 0, dest = 0, meta = 0, ws = 0, bytes = 0;
  Ranking(int64_t rows_, int64_t k_, int64_t groups)
      : rows(rows_), k(k_), n(rows_ * k_), G(groups) {
    dest = list + 2 * n;
    meta = dest + 2 * n;
    ws = qnum::round_up(meta + 3 * G, int64_t(64));
    bytes = ws * 4 + int64_t(groupmm::cuda::moe_permute_plan_workspace_size(2 * rows, k, G));
  }
  const int32_t* kept(const int32_t* base) const { return base + meta + G; }
  // Stable ranks of both lists (dropless, align 1): dest of entry i = row_start[its group] + the
  // entries of that group before it.
  void run(Context& ctx, int32_t* base) const {
    PermuteMap m;
    m.tokens = 2 * rows;
    m.topk = k;
    m.experts = G;
    m.rows = 2 * n;  // every entry has a group: no tail
    m.dest_row = TensorView(base + dest, DType::int32, Device::CUDA, {2 * rows, k});
    m.row_start = TensorView(base + meta, DType::int32, Device::CUDA, {G});
    m.kept = TensorView(base + meta + G, DType::int32, Device::CUDA, {G});
    m.splits = TensorView(base + meta + 2 * G, DType::int32, Device::CUDA, {G});
    const TensorView ids(base + list, DType::int32, Device::CUDA, {2 * rows, k});
    groupmm::cuda::moe_permute_plan(ctx, ids, m, base + ws);
  }
};

// ---- count --------------------------------------------------------------------------------------
template <class Id>
struct EntryParams {
  const Id* ids;              // [T k]
  int32_t* list;              // [2 T k]: A = peer (R: bad id), B = R + 1 + peer (2R + 1: not first)
  unsigned long long* block;  // [R][W] int64: per peer, rows (set later), entries per local expert
  unsigned long long* bad;    // max of n - i over bad entries i (0: none)
  int64_t n, k, E, El, R, W;
};

template <class Id>
__global__ void __launch_bounds__(TpConfig::kThreads) tp_entries_kernel(EntryParams<Id> p) {
  const int lane = int(threadIdx.x % 32);
  // The trip count is the same for every lane of a warp: __match_any_sync below needs them all.
  for (int64_t base = int64_t(blockIdx.x) * blockDim.x; base < p.n; base += grid_stride()) {
    const int64_t i = base + threadIdx.x;
    const bool in = i < p.n;
    const int64_t e = in ? int64_t(p.ids[i]) : -1;
    const bool valid = in && e >= 0 && e < p.E;
    if (in && !valid && e != -1)  // -1 names no expert (groupmm/ep.hpp): not a bad id
      atomicMax(p.bad, (unsigned long long)(p.n - i));
    const int64_t q = valid ? e / p.El : p.R;
    bool first = valid;  // no earlier slot of the token names an expert on q
    for (int64_t f = i - i % p.k; first && f < i; ++f) {
      const int64_t o = int64_t(p.ids[f]);
      first = !(o >= 0 && o < p.E && o / p.El == q);
    }
    if (in) {
      p.list[i] = int32_t(q);
      p.list[p.n + i] = int32_t(first ? p.R + 1 + q : 2 * p.R + 1);
    }
    // The (peer, local expert) histogram: one integer atomic per expert a warp step names.
    const unsigned same = __match_any_sync(kFullMask, valid ? int(e) : -1);
    if (valid && (same & ((1u << lane) - 1u)) == 0)
      atomicAdd(p.block + q * p.W + 1 + e % p.El, (unsigned long long)__popc(same));
  }
}

// The rows each peer gets (the B groups' sizes) into the block, and the first bad entry.
template <class Id>
__global__ void __launch_bounds__(TpConfig::kThreads)
    tp_sizes_kernel(const Id* ids, const int32_t* kept, int64_t* counts, int64_t n, int64_t R,
                    int64_t W) {
  for (int64_t q = threadIdx.x; q < R; q += blockDim.x) counts[q * W] = kept[R + 1 + q];
  if (threadIdx.x == 0) {
    int64_t* bad = counts + 2 * R * W;
    const int64_t key = bad[0];  // n - i of the first bad entry i, or 0
    const int64_t i = key > 0 ? n - key : -1;
    bad[0] = i;
    bad[1] = i >= 0 ? int64_t(ids[i]) : 0;
  }
}

// ---- pack ---------------------------------------------------------------------------------------
template <class Id>
struct PackParams {
  const Id* ids;
  const int32_t* list;  // the count step's lists and destinations [2 T k]
  const int32_t* dest;
  int32_t* send_token;  // [send_total]
  int32_t* meta;        // [send_total, k]
  int32_t* slot_entry;  // [T, k]
  StatusBlock* status;
  int64_t n, k, E, El, R, send_total;
};

template <class Id>
__global__ void __launch_bounds__(TpConfig::kThreads) tp_pack_kernel(PackParams<Id> p) {
  for (int64_t i = grid_stride_start(); i < p.n; i += grid_stride()) {
    // Rank among the entries on its peer, after the earlier peers'; -1 for a slot that names no
    // expert (ranked in the spare group R, past every peer's entries).
    p.slot_entry[i] = p.list[i] < p.R ? p.dest[i] : -1;
    const int64_t g = p.list[p.n + i];
    if (g > 2 * p.R) continue;  // not the token's first slot on its peer
    const int64_t q = g - (p.R + 1), row = p.dest[p.n + i] - p.n, t = i / p.k;
    if (row < 0 || row >= p.send_total) {  // the sizes read on the host disagree: none written
      report_fault(p.status, kFaultBadIndex, OpId::ep_dispatch, int32_t(q), row);
      continue;
    }
    p.send_token[row] = int32_t(t);
    for (int64_t j = 0; j < p.k; ++j) {
      const int64_t e = int64_t(p.ids[t * p.k + j]);
      p.meta[row * p.k + j] = e >= 0 && e < p.E && e / p.El == q ? int32_t(e - q * p.El) : -1;
    }
  }
}

// ---- recv ---------------------------------------------------------------------------------------
struct RecvParams {
  const int32_t* meta;  // [S] received slots: local expert or -1
  int32_t* list;        // [2 S]: A = local expert (E_l: none), B = E_l + 1 (names one) or E_l + 2
  const int32_t* dest;  // [2 S]
  const int32_t* kept;  // [E_l + 3]
  int32_t* grouped_entry;  // [rows]
  int32_t* back_grouped;   // [back_send_total]
  int32_t* splits;         // [E_l]
  StatusBlock* status;
  int64_t S, k, El, rows, back_total;
};

__global__ void __launch_bounds__(TpConfig::kThreads) tp_recv_list_kernel(RecvParams p) {
  for (int64_t s = grid_stride_start(); s < p.S; s += grid_stride()) {
    const int32_t le = p.meta[s];
    if (le >= p.El) report_fault(p.status, kFaultBadIndex, OpId::ep_dispatch, int32_t(s / p.k), le);
    const bool valid = le >= 0 && le < p.El;
    p.list[s] = valid ? le : int32_t(p.El);
    p.list[p.S + s] = int32_t(valid ? p.El + 1 : p.El + 2);
  }
}

__global__ void __launch_bounds__(TpConfig::kThreads) tp_recv_scatter_kernel(RecvParams p) {
  for (int64_t e = grid_stride_start(); e < p.El; e += grid_stride()) p.splits[e] = p.kept[e];
  for (int64_t s = grid_stride_start(); s < p.S; s += grid_stride()) {
    if (p.list[s] >= p.El) continue;
    const int64_t g = p.dest[s], b = p.dest[p.S + s] - p.S;
    if (g >= p.rows || b >= p.back_total) {  // the sizes read on the host disagree: skipped
      report_fault(p.status, kFaultBadIndex, OpId::ep_dispatch, int32_t(s / p.k), g);
      continue;
    }
    p.grouped_entry[g] = int32_t(s);
    p.back_grouped[b] = int32_t(g);
  }
}

template <class F>
void dispatch_id(DType t, F&& f) {
  if (t == DType::int64)
    f(int64_t{});
  else
    f(int32_t{});
}

}  // namespace

int64_t ep_throughput_scratch_bytes(int64_t rows, int64_t k, int64_t groups) {
  return Ranking(rows, k, groups).bytes;
}

void ep_throughput_plan_count(Context& ctx, const TensorView& expert_ids, const EpPlan& plan,
                              void* scratch, int64_t* counts) {
  const int64_t R = plan.cfg.ranks, k = plan.cfg.topk, El = plan.local_experts, W = 1 + El;
  const Ranking rk(plan.tokens, k, 2 * R + 2);
  GROUPMM_CHECK(rk.G <= TpConfig::kMaxGroups, "ep_throughput_plan_count: 2 R + 2=", rk.G,
                " groups must be <= ", TpConfig::kMaxGroups);
  auto* base = static_cast<int32_t*>(scratch);
  GROUPMM_CHECK_CUDA(
      cudaMemsetAsync(counts, 0, size_t(2 * R * W + 2) * sizeof(int64_t), ctx.stream()));
  dispatch_id(expert_ids.dtype, [&](auto id) {
    using Id = decltype(id);
    const Id* ids = expert_ids.ptr<Id>();
    if (rk.n > 0) {
      const EntryParams<Id> e{ids,
                              base + rk.list,
                              reinterpret_cast<unsigned long long*>(counts),
                              reinterpret_cast<unsigned long long*>(counts + 2 * R * W),
                              rk.n,
                              k,
                              plan.cfg.experts,
                              El,
                              R,
                              W};
      tp_entries_kernel<Id>
          <<<PlanLaunch::grid(ctx, rk.n), TpConfig::kThreads, 0, ctx.stream()>>>(e);
      GROUPMM_CHECK_LAUNCH();
    }
    rk.run(ctx, base);
    tp_sizes_kernel<Id>
        <<<1, TpConfig::kThreads, 0, ctx.stream()>>>(ids, rk.kept(base), counts, rk.n, R, W);
    GROUPMM_CHECK_LAUNCH();
  });
}

void ep_throughput_plan_pack(Context& ctx, const TensorView& expert_ids, EpPlan& plan,
                             const void* scratch, int32_t* meta_send) {
  const int64_t R = plan.cfg.ranks, k = plan.cfg.topk;
  const Ranking rk(plan.tokens, k, 2 * R + 2);
  if (rk.n == 0) return;
  const auto* base = static_cast<const int32_t*>(scratch);
  dispatch_id(expert_ids.dtype, [&](auto id) {
    using Id = decltype(id);
    const PackParams<Id> p{expert_ids.ptr<Id>(),
                           base + rk.list,
                           base + rk.dest,
                           plan.send_token.ptr<int32_t>(),
                           meta_send,
                           plan.slot_entry.ptr<int32_t>(),
                           ctx.status(),
                           rk.n,
                           k,
                           plan.cfg.experts,
                           plan.local_experts,
                           R,
                           plan.send_total};
    tp_pack_kernel<Id><<<PlanLaunch::grid(ctx, rk.n), TpConfig::kThreads, 0, ctx.stream()>>>(p);
    GROUPMM_CHECK_LAUNCH();
  });
}

void ep_throughput_plan_recv(Context& ctx, EpPlan& plan, const int32_t* meta_recv, void* scratch) {
  const int64_t k = plan.cfg.topk, El = plan.local_experts;
  const Ranking rk(plan.recv_total, k, El + 3);
  GROUPMM_CHECK(rk.G <= TpConfig::kMaxGroups, "ep_throughput_plan_recv: E_l + 3=", rk.G,
                " groups must be <= ", TpConfig::kMaxGroups);
  auto* base = static_cast<int32_t*>(scratch);
  RecvParams r{};
  r.meta = meta_recv;
  r.list = base + rk.list;
  r.dest = base + rk.dest;
  r.kept = rk.kept(base);
  r.grouped_entry = plan.grouped_entry.ptr<int32_t>();
  r.back_grouped = plan.back_grouped.ptr<int32_t>();
  r.splits = plan.splits.ptr<int32_t>();
  r.status = ctx.status();
  r.S = rk.n;
  r.k = k;
  r.El = El;
  r.rows = plan.rows;
  r.back_total = plan.back_send_total;
  if (rk.n > 0) {
    tp_recv_list_kernel<<<PlanLaunch::grid(ctx, rk.n), TpConfig::kThreads, 0, ctx.stream()>>>(r);
    GROUPMM_CHECK_LAUNCH();
  }
  rk.run(ctx, base);
  tp_recv_scatter_kernel<<<PlanLaunch::grid(ctx, std::max(rk.n, El)), TpConfig::kThreads, 0,
                           ctx.stream()>>>(r);
  GROUPMM_CHECK_LAUNCH();
}

}  // namespace groupmm::ep::cuda
