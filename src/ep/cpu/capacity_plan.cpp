// The capacity-mode plan on the CPU backend (the reference of src/ep/cuda/capacity_plan.cu):
// fixed per-peer blocks, counts carried in-band, overflow dropped by the header's rule and
// reported in the status block (groupmm/ep.hpp).
#include <algorithm>

#include "ep/backends.hpp"

namespace groupmm::ep::cpu {

// Home side: which tokens go to which peer (in token order while both budgets hold), the metadata
// block of each peer ([count, then k local-expert slots per row]) and where each (t, j) comes back.
void ep_capacity_plan_send(Context& ctx, const TensorView& expert_ids, EpPlan& p) {
  const int64_t R = p.cfg.ranks, E = p.cfg.experts, El = p.local_experts, k = p.cfg.topk;
  const int64_t T = p.tokens, C = p.cap.rows_per_peer, Ce = p.cap.entries_per_peer;
  const int32_t* ids = expert_ids.ptr<int32_t>();
  int32_t* send_token = p.send_token.ptr<int32_t>();
  int32_t* meta = p.meta_send.ptr<int32_t>();
  int32_t* slot_entry = p.slot_entry.ptr<int32_t>();
  std::fill(send_token, send_token + R * C, -1);
  std::fill(slot_entry, slot_entry + T * k, -1);
  std::vector<int64_t> rows(size_t(R), 0), entries(size_t(R), 0);  // kept so far
  std::vector<int64_t> need_rows(size_t(R), 0), need_entries(size_t(R), 0);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < k; ++j)  // -1: the slot names no expert (no fault)
      if (ids[t * k + j] < -1 || ids[t * k + j] >= E)
        report_fault_host(ctx.status(), kFaultBadIndex, OpId::ep_dispatch, int32_t(t),
                          ids[t * k + j]);
    for (int64_t q = 0; q < R; ++q) {
      int64_t n = 0;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t e = ids[t * k + j];
        n += e >= 0 && e < E && e / El == q;
      }
      if (n == 0) continue;
      need_rows[size_t(q)] += 1;
      need_entries[size_t(q)] += n;
      // The prefix rule: kept while both running totals (over every token needing q) fit.
      if (need_rows[size_t(q)] > C || need_entries[size_t(q)] > Ce) continue;
      const int64_t i = rows[size_t(q)]++;
      send_token[q * C + i] = int32_t(t);
      int32_t* m = meta + q * (1 + C * k) + 1 + i * k;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t e = ids[t * k + j];
        const bool here = e >= 0 && e < E && e / El == q;
        m[j] = here ? int32_t(e - q * El) : -1;
        if (here) slot_entry[t * k + j] = int32_t(q * Ce + entries[size_t(q)]++);
      }
    }
  }
  for (int64_t q = 0; q < R; ++q) {
    meta[q * (1 + C * k)] = int32_t(rows[size_t(q)]);
    if (need_rows[size_t(q)] > C || need_entries[size_t(q)] > Ce)
      report_fault_host(ctx.status(), kFaultEpCapacity, OpId::ep_dispatch, int32_t(q),
                        need_rows[size_t(q)] > C ? need_rows[size_t(q)] : need_entries[size_t(q)]);
  }
}

// Expert side: the received entries (peer q, row i, slot j) grouped by local expert, stably in
// (q, i, j) order; the tail rows past them are -1 (zero) and counted in the last split (not in
// splits_at_most); per peer,
// the entries going back in (i, j) order. A malformed block (a count past C, a slot naming no
// local expert, more than C_e entries) is clamped or skipped and reported.
void ep_capacity_plan_recv(Context& ctx, EpPlan& p) {
  const int64_t R = p.cfg.ranks, El = p.local_experts, k = p.cfg.topk;
  const int64_t C = p.cap.rows_per_peer, Ce = p.cap.entries_per_peer;
  const int32_t* meta = p.meta_recv.ptr<int32_t>();
  int32_t* splits = p.splits.ptr<int32_t>();
  int32_t* grouped_entry = p.grouped_entry.ptr<int32_t>();
  int32_t* back = p.back_grouped.ptr<int32_t>();
  // The valid slots of peer q's block: (row, slot, local expert), in (i, j) order.
  const auto for_each_entry = [&](int64_t q, auto&& f) {
    const int32_t* m = meta + q * (1 + C * k);
    const int64_t count = std::clamp<int64_t>(m[0], 0, C);
    if (m[0] != count)
      report_fault_host(ctx.status(), kFaultBadIndex, OpId::ep_dispatch, int32_t(q), m[0]);
    int64_t n = 0;
    for (int64_t i = 0; i < count; ++i)
      for (int64_t j = 0; j < k; ++j) {
        const int32_t le = m[1 + i * k + j];
        if (le < 0) continue;
        if (le >= El || n >= Ce) {
          report_fault_host(ctx.status(), le >= El ? kFaultBadIndex : kFaultEpCapacity,
                            OpId::ep_dispatch, int32_t(q), le >= El ? le : n + 1);
          continue;
        }
        f((q * C + i) * k + j, le, n++);
      }
  };
  std::vector<int64_t> next(size_t(El), 0);
  for (int64_t q = 0; q < R; ++q)
    for_each_entry(q, [&](int64_t, int32_t le, int64_t) { ++next[size_t(le)]; });
  int64_t total = 0;
  for (int64_t e = 0; e < El; ++e) {
    splits[e] = int32_t(next[size_t(e)]);
    next[size_t(e)] = total;
    total += splits[e];
  }
  std::copy(splits, splits + El, p.splits_at_most.ptr<int32_t>());
  splits[El - 1] += int32_t(p.rows - total);  // the zero tail
  std::fill(grouped_entry + total, grouped_entry + p.rows, -1);
  std::fill(back, back + R * Ce, -1);
  for (int64_t q = 0; q < R; ++q)
    for_each_entry(q, [&](int64_t slot, int32_t le, int64_t n) {
      const int64_t g = next[size_t(le)]++;
      grouped_entry[g] = int32_t(slot);
      back[q * Ce + n] = int32_t(g);
    });
}

}  // namespace groupmm::ep::cpu
