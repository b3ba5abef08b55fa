// The throughput-mode plan (groupmm/ep.hpp): exact per-peer counts exchanged first, then k local
// expert slots per sent row. Host code for both backends: a CUDA plan reads expert_ids on the
// host, exchanges the metadata through device staging, and uploads its index arrays.
#include <algorithm>

#include "ep/check.hpp"

namespace groupmm::ep {

namespace {

std::vector<int64_t> exclusive_scan(const std::vector<int64_t>& v) {
  std::vector<int64_t> out(v.size(), 0);
  for (size_t i = 1; i < v.size(); ++i) out[i] = out[i - 1] + v[i - 1];
  return out;
}

int64_t total(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

// Int32 tensors on ctx's device from host vectors; the host copies stay alive until finish(),
// which waits for the uploads (a CUDA plan synchronizes anyway).
class Uploader {
 public:
  explicit Uploader(Context& ctx) : ctx_(ctx) {}
  Tensor operator()(const std::vector<int32_t>& v, std::initializer_list<int64_t> dims) {
    Tensor host = Tensor::empty(dims, DType::int32, Device::CPU);
    if (!v.empty()) std::copy(v.begin(), v.end(), host.ptr<int32_t>());
    if (ctx_.device() == Device::CPU) return host;
    Tensor dev = Tensor::empty(dims, DType::int32, ctx_.device(), ctx_.stream());
    copy(dev, host, ctx_.stream());
    keep_.push_back(std::move(host));
    return dev;
  }
  // At least one element, so that views of empty arrays are valid.
  Tensor operator()(const std::vector<int32_t>& v) {
    return (*this)(v, {std::max<int64_t>(int64_t(v.size()), 1)});
  }
  void finish() {
    if (!keep_.empty()) ctx_.synchronize();
    keep_.clear();
  }

 private:
  Context& ctx_;
  std::vector<Tensor> keep_;
};

// The metadata exchange (k int32 per row) on host vectors; a device transport goes through device
// buffers (this plan synchronizes anyway).
void exchange_meta(Context& ctx, Transport& tr, const std::vector<int32_t>& send,
                   std::vector<int32_t>& recv, const EpPlan& p) {
  const size_t R = p.send_rows.size();
  const int64_t row = p.cfg.topk * int64_t(sizeof(int32_t));
  std::vector<int64_t> sc(R), so(R), rc(R), ro(R);
  for (size_t q = 0; q < R; ++q) {
    sc[q] = p.send_rows[q] * row;
    so[q] = p.send_offsets[q] * row;
    rc[q] = p.recv_rows[q] * row;
    ro[q] = p.recv_offsets[q] * row;
  }
  if (tr.device() == Device::CPU) {
    tr.all_to_all_v(send.data(), sc.data(), so.data(), recv.data(), rc.data(), ro.data(),
                    ctx.stream());
    return;
  }
  Uploader up(ctx);
  Tensor s = up(send), r = detail::byte_buffer(ctx, int64_t(recv.size()) * 4);
  tr.all_to_all_v(s.data(), sc.data(), so.data(), r.data(), rc.data(), ro.data(), ctx.stream());
  if (!recv.empty())  // a host destination: synchronizes
    copy(TensorView(recv.data(), DType::int32, Device::CPU, {int64_t(recv.size())}),
         TensorView(r.data(), DType::int32, ctx.device(), {int64_t(recv.size())}), ctx.stream());
  up.finish();
}

}  // namespace

EpPlan ep_dispatch_plan(Context& ctx, Transport& tr, const EpConfig& cfg,
                        const TensorView& expert_ids) {
  const char* op = "ep_dispatch_plan";
  check::device(op, ctx, tr);
  check::cfg(op, cfg, tr);
  check::expert_ids(ctx, op, expert_ids, -1, cfg.topk, true);
  const int R = tr.size(), me = tr.rank();
  const int64_t T = expert_ids.dim(0), k = cfg.topk, El = cfg.experts / cfg.ranks;
  // The ids on the host (a CUDA plan synchronizes here), validated before any exchange.
  const Tensor ids_host = clone_to(expert_ids, Device::CPU, ctx.stream());
  std::vector<int64_t> ids(size_t(T * k));
  for (int64_t i = 0; i < T * k; ++i) {
    const int64_t e =
        expert_ids.dtype == DType::int32 ? ids_host.ptr<int32_t>()[i] : ids_host.ptr<int64_t>()[i];
    GROUPMM_CHECK(e >= 0 && e < cfg.experts, op, ": expert_ids[", i / k, ", ", i % k, "]=", e,
                  " must be in [0, ", cfg.experts, ")");
    ids[size_t(i)] = e;
  }
  GROUPMM_CHECK(T * k < INT32_MAX, op, ": tokens * k=", T * k, " must fit int32");
  EpPlan p;
  p.cfg = cfg;
  p.mode = EpMode::throughput;
  p.rank = me;
  p.tokens = T;
  p.local_experts = El;

  // ---- sender side: each token goes once to every rank holding one of its experts, in token
  // order; its metadata row says, per slot, the local expert there (-1: another rank's expert).
  std::vector<std::vector<int32_t>> tokens_to(static_cast<size_t>(R));
  std::vector<std::vector<int32_t>> meta_to(static_cast<size_t>(R));
  for (int64_t t = 0; t < T; ++t) {
    for (int q = 0; q < R; ++q) {
      bool needed = false;
      for (int64_t j = 0; j < k; ++j) needed |= ids[size_t(t * k + j)] / El == q;
      if (!needed) continue;
      tokens_to[size_t(q)].push_back(int32_t(t));
      for (int64_t j = 0; j < k; ++j) {
        const int64_t e = ids[size_t(t * k + j)];
        meta_to[size_t(q)].push_back(e / El == q ? int32_t(e - q * El) : -1);
      }
    }
  }
  std::vector<int32_t> send_token, meta_send;
  for (int q = 0; q < R; ++q) {
    p.send_rows.push_back(int64_t(tokens_to[size_t(q)].size()));
    send_token.insert(send_token.end(), tokens_to[size_t(q)].begin(), tokens_to[size_t(q)].end());
    meta_send.insert(meta_send.end(), meta_to[size_t(q)].begin(), meta_to[size_t(q)].end());
  }
  p.send_offsets = exclusive_scan(p.send_rows);
  p.send_total = total(p.send_rows);

  // ---- the count exchange, then the metadata in exact bytes
  p.recv_rows.assign(size_t(R), 0);
  tr.all_to_all_counts(p.send_rows.data(), p.recv_rows.data(), 1);
  p.recv_offsets = exclusive_scan(p.recv_rows);
  p.recv_total = total(p.recv_rows);
  GROUPMM_CHECK(p.recv_total * k < INT32_MAX, op, ": rows received * k=", p.recv_total * k,
                " must fit int32");
  std::vector<int32_t> meta_recv(size_t(p.recv_total * k));
  exchange_meta(ctx, tr, meta_send, meta_recv, p);

  // ---- receiver side: entries (received row r, slot j) for local experts, in (r, j) order, which
  // is (source rank, source token, j); a stable grouping by local expert gives the grouped rows.
  p.splits_host.assign(size_t(El), 0);
  for (int32_t le : meta_recv)
    if (le >= 0) ++p.splits_host[size_t(le)];
  std::vector<int64_t> next = exclusive_scan(p.splits_host);
  p.rows = total(p.splits_host);
  std::vector<int32_t> grouped_entry(size_t(p.rows)), back_grouped;
  p.back_send.assign(size_t(R), 0);
  for (int src = 0; src < R; ++src) {
    for (int64_t r = p.recv_offsets[size_t(src)];
         r < p.recv_offsets[size_t(src)] + p.recv_rows[size_t(src)]; ++r) {
      for (int64_t j = 0; j < k; ++j) {
        const int32_t le = meta_recv[size_t(r * k + j)];
        if (le < 0) continue;
        const int64_t g = next[size_t(le)]++;
        grouped_entry[size_t(g)] = int32_t(r * k + j);
        back_grouped.push_back(int32_t(g));
        ++p.back_send[size_t(src)];
      }
    }
  }
  p.back_send_offsets = exclusive_scan(p.back_send);
  p.back_send_total = total(p.back_send);

  // ---- home side of the way back: the entries coming back from rank q are this rank's (t, j)
  // with an expert on q, in (t, j) order (the order q sends them back in).
  std::vector<int32_t> slot_entry(size_t(T * k), -1);
  p.back_recv.assign(size_t(R), 0);
  int32_t entry = 0;
  for (int q = 0; q < R; ++q)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j)
        if (ids[size_t(t * k + j)] / El == q) {
          slot_entry[size_t(t * k + j)] = entry++;
          ++p.back_recv[size_t(q)];
        }
  p.back_recv_offsets = exclusive_scan(p.back_recv);
  p.back_recv_total = entry;

  Uploader up(ctx);
  p.splits = up(std::vector<int32_t>(p.splits_host.begin(), p.splits_host.end()), {El});
  p.send_token = up(send_token);
  p.grouped_entry = up(grouped_entry, {p.rows});
  p.back_grouped = up(back_grouped);
  p.slot_entry = up(slot_entry, {T, k});
  up.finish();
  ctx.after_op();
  return p;
}

}  // namespace groupmm::ep
