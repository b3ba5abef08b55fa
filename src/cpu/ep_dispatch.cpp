// Expert-parallel dispatch on the CPU backend: the plan (count + metadata exchange) and the row
// exchange. The ordering rules are the header's (groupmm/ep.hpp); the combine undoes this plan.
#include <cstring>

#include "core/ep_impl.hpp"

namespace groupmm::cpu {

namespace {

std::vector<int64_t> exclusive_scan(const std::vector<int64_t>& v) {
  std::vector<int64_t> out(v.size(), 0);
  for (size_t i = 1; i < v.size(); ++i) out[i] = out[i - 1] + v[i - 1];
  return out;
}

int64_t expert_id(const TensorView& ids, int64_t i) {
  return ids.dtype == DType::int32 ? ids.ptr<int32_t>()[i] : ids.ptr<int64_t>()[i];
}

// All-to-all of whole rows: per peer q, rows send_rows[q] from row send_offsets[q] of `send`, and
// recv_rows[q] into row recv_offsets[q] of `recv`, each row `row_bytes` long.
void all_to_all_rows(ep::Transport& tr, const void* send, const std::vector<int64_t>& send_rows,
                     const std::vector<int64_t>& send_offsets, void* recv,
                     const std::vector<int64_t>& recv_rows,
                     const std::vector<int64_t>& recv_offsets, int64_t row_bytes) {
  const size_t R = send_rows.size();
  std::vector<int64_t> sc(R), so(R), rc(R), ro(R);
  for (size_t q = 0; q < R; ++q) {
    sc[q] = send_rows[q] * row_bytes;
    so[q] = send_offsets[q] * row_bytes;
    rc[q] = recv_rows[q] * row_bytes;
    ro[q] = recv_offsets[q] * row_bytes;
  }
  tr.all_to_all_v(send, sc.data(), so.data(), recv, rc.data(), ro.data());
}

}  // namespace

ep::EpPlan ep_dispatch_plan(Context& ctx, ep::Transport& tr, const ep::EpConfig& cfg,
                            const TensorView& ids) {
  const int R = tr.size(), me = tr.rank();
  const int64_t T = ids.dim(0), k = cfg.topk, El = cfg.experts / cfg.ranks;
  ep::EpPlan p;
  p.cfg = cfg;
  p.rank = me;
  p.tokens = T;
  p.local_experts = El;

  // ---- sender side: each token goes once to every rank holding one of its experts, in token
  // order; its metadata row says, per slot, the local expert there (-1: another rank's expert).
  p.send_rows.assign(size_t(R), 0);
  p.back_recv_entries.assign(size_t(R), 0);
  std::vector<std::vector<int64_t>> tokens_to(static_cast<size_t>(R));
  std::vector<std::vector<int32_t>> meta_to(static_cast<size_t>(R));
  for (int64_t t = 0; t < T; ++t) {
    for (int q = 0; q < R; ++q) {
      bool needed = false;
      for (int64_t j = 0; j < k; ++j) needed |= expert_id(ids, t * k + j) / El == q;
      if (!needed) continue;
      tokens_to[size_t(q)].push_back(t);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t e = expert_id(ids, t * k + j);
        meta_to[size_t(q)].push_back(e / El == q ? int32_t(e - q * El) : -1);
      }
    }
  }
  for (int q = 0; q < R; ++q) {
    p.send_rows[size_t(q)] = int64_t(tokens_to[size_t(q)].size());
    p.send_token.insert(p.send_token.end(), tokens_to[size_t(q)].begin(),
                        tokens_to[size_t(q)].end());
  }
  p.send_offsets = exclusive_scan(p.send_rows);

  // ---- the count exchange, then the metadata (k int32 per row) in exact bytes
  p.recv_rows.assign(size_t(R), 0);
  tr.all_to_all_counts(p.send_rows.data(), p.recv_rows.data(), 1);
  p.recv_offsets = exclusive_scan(p.recv_rows);
  p.rows_received = p.recv_offsets.back() + p.recv_rows.back();
  const int64_t meta_row = k * int64_t(sizeof(int32_t));
  std::vector<int32_t> meta_send, meta_recv(size_t(p.rows_received * k));
  for (int q = 0; q < R; ++q)
    meta_send.insert(meta_send.end(), meta_to[size_t(q)].begin(), meta_to[size_t(q)].end());
  all_to_all_rows(tr, meta_send.data(), p.send_rows, p.send_offsets, meta_recv.data(), p.recv_rows,
                  p.recv_offsets, meta_row);

  // ---- receiver side: entries (received row r, slot j) for local experts, in (r, j) order, which
  // is (source rank, source token, j); a stable grouping by local expert gives the grouped rows.
  p.splits_host.assign(size_t(El), 0);
  for (int64_t i = 0; i < p.rows_received * k; ++i)
    if (meta_recv[size_t(i)] >= 0) ++p.splits_host[size_t(meta_recv[size_t(i)])];
  std::vector<int64_t> next = exclusive_scan(p.splits_host);
  p.rows = El > 0 ? next.back() + p.splits_host.back() : 0;
  p.grouped_src.assign(size_t(p.rows), 0);
  p.back_send_entries.assign(size_t(R), 0);
  for (int src = 0; src < R; ++src) {
    for (int64_t r = p.recv_offsets[size_t(src)];
         r < p.recv_offsets[size_t(src)] + p.recv_rows[size_t(src)]; ++r) {
      for (int64_t j = 0; j < k; ++j) {
        const int32_t le = meta_recv[size_t(r * k + j)];
        if (le < 0) continue;
        const int64_t g = next[size_t(le)]++;
        p.grouped_src[size_t(g)] = r;
        p.back_grouped.push_back(g);
        ++p.back_send_entries[size_t(src)];
      }
    }
  }

  // ---- home side of the combine: the entries coming back from rank q are this rank's (t, j)
  // with an expert on q, in (t, j) order (the order q sends them back in).
  for (int q = 0; q < R; ++q) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        if (expert_id(ids, t * k + j) / El != q) continue;
        p.back_slot.push_back(t * k + j);
        ++p.back_recv_entries[size_t(q)];
      }
    }
  }

  p.splits = Tensor::empty({El}, DType::int32, ctx.device());
  for (int64_t e = 0; e < El; ++e) p.splits.ptr<int32_t>()[e] = int32_t(p.splits_host[size_t(e)]);
  return p;
}

void ep_dispatch(Context&, ep::Transport& tr, const ep::EpPlan& p, const TensorView& x,
                 const TensorView& x_grouped) {
  const int64_t row_bytes = dtype_storage_bytes(x.dtype, p.cfg.hidden);
  const char* xs = static_cast<const char*>(x.data);
  // Rows move as bytes (any 16-bit or fp32 dtype); each token row once per destination rank.
  std::vector<char> send(size_t(int64_t(p.send_token.size()) * row_bytes));
  for (size_t i = 0; i < p.send_token.size(); ++i)
    std::memcpy(send.data() + int64_t(i) * row_bytes, xs + p.send_token[i] * row_bytes,
                size_t(row_bytes));
  std::vector<char> recv(size_t(p.rows_received * row_bytes));
  all_to_all_rows(tr, send.data(), p.send_rows, p.send_offsets, recv.data(), p.recv_rows,
                  p.recv_offsets, row_bytes);
  // A row two local experts need was received once; it is copied into both groups here.
  char* out = static_cast<char*>(x_grouped.data);
  for (int64_t g = 0; g < p.rows; ++g)
    std::memcpy(out + g * row_bytes, recv.data() + p.grouped_src[size_t(g)] * row_bytes,
                size_t(row_bytes));
}

}  // namespace groupmm::cpu
