// The throughput-mode plan (groupmm/ep.hpp): exact per-peer counts exchanged first, then k local
// expert slots per sent row. Two builds with one result, bit for bit:
// - host code (ep_dispatch_plan_host): the CPU backend's plan and the reference; on a CUDA Context
//   it reads expert_ids on the host, exchanges the metadata through device staging and uploads
//   its index arrays;
// - on CUDA, kernels (src/ep/cuda/throughput_plan.cu) around the same two exchanges, with one host
//   read: the sizes (this rank's and its peers' counts, after the count exchange, which moves them
//   device to device), which size the buffers and the all-to-alls. The host work is a few launches
//   and loops over R and E / R, never over the tokens.
#include <algorithm>
#include <chrono>

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

// The checks both builds start with (every rank sees the same ones before any exchange).
void check_args(const char* op, const Context& ctx, const Transport& tr, const EpConfig& cfg,
                const TensorView& expert_ids) {
  check::device(op, ctx, tr);
  check::cfg(op, cfg, tr);
  check::expert_ids(ctx, op, expert_ids, -1, cfg.topk, true);
  GROUPMM_CHECK(expert_ids.dim(0) * cfg.topk < INT32_MAX, op,
                ": tokens * k=", expert_ids.dim(0) * cfg.topk, " must fit int32");
}

// -1 names no expert (ep.hpp): not an error.
void bad_id(const char* op, const EpConfig& cfg, int64_t i, int64_t e) {
  GROUPMM_CHECK(e == -1 || (e >= 0 && e < cfg.experts), op, ": expert_ids[", i / cfg.topk, ", ",
                i % cfg.topk, "]=", e, " must be in [0, ", cfg.experts, ")");
}

EpPlan empty_plan(const EpConfig& cfg, int rank, int64_t tokens) {
  EpPlan p;
  p.cfg = cfg;
  p.mode = EpMode::throughput;
  p.rank = rank;
  p.tokens = tokens;
  p.local_experts = cfg.experts / cfg.ranks;
  return p;
}

EpPlan host_plan(Context& ctx, Transport& tr, const EpConfig& cfg, const TensorView& expert_ids) {
  const char* op = "ep_dispatch_plan";
  const int R = tr.size(), me = tr.rank();
  const int64_t T = expert_ids.dim(0), k = cfg.topk, El = cfg.experts / cfg.ranks;
  // The ids on the host (a CUDA plan synchronizes here), validated before any exchange.
  const Tensor ids_host = clone_to(expert_ids, Device::CPU, ctx.stream());
  std::vector<int64_t> ids(size_t(T * k));
  for (int64_t i = 0; i < T * k; ++i) {
    const int64_t e =
        expert_ids.dtype == DType::int32 ? ids_host.ptr<int32_t>()[i] : ids_host.ptr<int64_t>()[i];
    bad_id(op, cfg, i, e);
    ids[size_t(i)] = e;
  }
  EpPlan p = empty_plan(cfg, me, T);
  // The rank holding a slot's expert; R for a slot that names none (-1), which no rank gets.
  const auto rank_of = [&](int64_t i) { return ids[size_t(i)] < 0 ? R : ids[size_t(i)] / El; };

  // ---- sender side: each token goes once to every rank holding one of its experts, in token
  // order; its metadata row says, per slot, the local expert there (-1: another rank's expert).
  std::vector<std::vector<int32_t>> tokens_to(static_cast<size_t>(R));
  std::vector<std::vector<int32_t>> meta_to(static_cast<size_t>(R));
  for (int64_t t = 0; t < T; ++t) {
    for (int q = 0; q < R; ++q) {
      bool needed = false;
      for (int64_t j = 0; j < k; ++j) needed |= rank_of(t * k + j) == q;
      if (!needed) continue;
      tokens_to[size_t(q)].push_back(int32_t(t));
      for (int64_t j = 0; j < k; ++j) {
        const int64_t e = ids[size_t(t * k + j)];
        meta_to[size_t(q)].push_back(rank_of(t * k + j) == q ? int32_t(e - q * El) : -1);
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
        if (rank_of(t * k + j) == q) {
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
  return p;
}

// ---- the device-built plan ----------------------------------------------------------------------

// Whether the CUDA plan's rankings hold: moe_permute_plan's 1024 groups (2 R + 2 on the home
// side, E / R + 3 on the expert side) and 2 T k destinations in int32.
bool device_built(const Context& ctx, const EpConfig& cfg, int64_t T) {
  return ctx.device() == Device::CUDA && 2 * cfg.ranks + 2 <= 1024 &&
         cfg.experts / cfg.ranks + 3 <= 1024 && 2 * T * cfg.topk < INT32_MAX;
}

// An all-to-all of fixed blocks of `bytes` per peer (the count exchange).
void exchange_blocks(Context& ctx, Transport& tr, const void* send, void* recv, int64_t bytes) {
  const size_t R = size_t(tr.size());
  std::vector<int64_t> counts(R, bytes), offsets(R);
  for (size_t q = 0; q < R; ++q) offsets[q] = int64_t(q) * bytes;
  tr.all_to_all_v(send, counts.data(), offsets.data(), recv, counts.data(), offsets.data(),
                  ctx.stream());
}

std::vector<int64_t> scaled(const std::vector<int64_t>& v, int64_t unit) {
  std::vector<int64_t> out(v);
  for (int64_t& x : out) x *= unit;
  return out;
}

EpPlan device_plan(Context& ctx, Transport& tr, const EpConfig& cfg, const TensorView& expert_ids) {
  const char* op = "ep_dispatch_plan";
  const int64_t R = cfg.ranks, k = cfg.topk, El = cfg.experts / cfg.ranks, W = 1 + El;
  const int64_t T = expert_ids.dim(0);
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  EpPlan p = empty_plan(cfg, tr.rank(), T);
  const auto ints = [&](std::initializer_list<int64_t> dims) {
    return Tensor::empty(dims, DType::int32, ctx.device(), ctx.stream());
  };

  // ---- home side, then the count exchange: per peer, the rows it gets and the entries for each
  // of its local experts (W int64), device to device; then the one host read of the sizes.
  Tensor send_scratch =
      detail::byte_buffer(ctx, cuda::ep_throughput_scratch_bytes(T, k, 2 * R + 2));
  Tensor counts = Tensor::empty({2 * R * W + 2}, DType::int64, ctx.device(), ctx.stream());
  int64_t* c = counts.ptr<int64_t>();
  cuda::ep_throughput_plan_count(ctx, expert_ids, p, send_scratch.data(), c);
  exchange_blocks(ctx, tr, c, c + R * W, W * int64_t(sizeof(int64_t)));
  std::vector<int64_t> h(size_t(2 * R * W + 2));
  const Clock::time_point t1 = Clock::now();
  copy(TensorView(h.data(), DType::int64, Device::CPU, {int64_t(h.size())}), counts.view(),
       ctx.stream());  // synchronizes: the plan's one wait for the device
  const Clock::time_point t2 = Clock::now();
  if (h[size_t(2 * R * W)] >= 0) bad_id(op, cfg, h[size_t(2 * R * W)], h[size_t(2 * R * W + 1)]);
  const int64_t* mine = h.data();
  const int64_t* theirs = h.data() + R * W;
  p.splits_host.assign(size_t(El), 0);
  for (int64_t q = 0; q < R; ++q) {
    p.send_rows.push_back(mine[q * W]);
    p.recv_rows.push_back(theirs[q * W]);
    int64_t back = 0, sent = 0;
    for (int64_t le = 0; le < El; ++le) {
      back += mine[q * W + 1 + le];  // entries on q's experts: they come back from q
      sent += theirs[q * W + 1 + le];
      p.splits_host[size_t(le)] += theirs[q * W + 1 + le];
    }
    p.back_recv.push_back(back);
    p.back_send.push_back(sent);
  }
  p.send_offsets = exclusive_scan(p.send_rows);
  p.recv_offsets = exclusive_scan(p.recv_rows);
  p.back_send_offsets = exclusive_scan(p.back_send);
  p.back_recv_offsets = exclusive_scan(p.back_recv);
  p.send_total = total(p.send_rows);
  p.recv_total = total(p.recv_rows);
  p.back_send_total = total(p.back_send);
  p.back_recv_total = total(p.back_recv);
  p.rows = p.back_send_total;  // every received entry is one grouped row
  GROUPMM_CHECK(2 * p.recv_total * k < INT32_MAX, op,
                ": 2 * rows received * k=", 2 * p.recv_total * k,
                " must fit int32 (the CUDA plan ranks two lists of them)");

  // ---- home side's arrays, the metadata exchange, the expert side's arrays
  p.send_token = ints({std::max<int64_t>(p.send_total, 1)});
  p.slot_entry = ints({T, k});
  Tensor meta_send = detail::byte_buffer(ctx, p.send_total * k * 4);
  cuda::ep_throughput_plan_pack(ctx, expert_ids, p, send_scratch.data(), meta_send.ptr<int32_t>());
  Tensor meta_recv = detail::byte_buffer(ctx, p.recv_total * k * 4);
  const int64_t row = k * int64_t(sizeof(int32_t));
  const std::vector<int64_t> sc = scaled(p.send_rows, row), so = scaled(p.send_offsets, row);
  const std::vector<int64_t> rc = scaled(p.recv_rows, row), ro = scaled(p.recv_offsets, row);
  tr.all_to_all_v(meta_send.data(), sc.data(), so.data(), meta_recv.data(), rc.data(), ro.data(),
                  ctx.stream());
  p.splits = ints({El});
  p.grouped_entry = ints({p.rows});
  p.back_grouped = ints({std::max<int64_t>(p.back_send_total, 1)});
  Tensor recv_scratch =
      detail::byte_buffer(ctx, cuda::ep_throughput_scratch_bytes(p.recv_total, k, El + 3));
  cuda::ep_throughput_plan_recv(ctx, p, meta_recv.ptr<int32_t>(), recv_scratch.data());
  p.host_us = std::chrono::duration<double, std::micro>((t1 - t0) + (Clock::now() - t2)).count();
  return p;
}

// Both builds end here: the receive side's inverse map (grouped row of each received slot).
void add_entry_grouped(Context& ctx, EpPlan& p) {
  p.entry_grouped = Tensor::empty({std::max<int64_t>(p.recv_total * p.cfg.topk, 1)}, DType::int32,
                                  ctx.device(), ctx.stream());
  detail::fill_entry_grouped(ctx, p);
}

}  // namespace

EpPlan ep_dispatch_plan(Context& ctx, Transport& tr, const EpConfig& cfg,
                        const TensorView& expert_ids) {
  check_args("ep_dispatch_plan", ctx, tr, cfg, expert_ids);
  if (device_built(ctx, cfg, expert_ids.dim(0))) {
    EpPlan p = device_plan(ctx, tr, cfg, expert_ids);
    const auto t0 = std::chrono::steady_clock::now();
    add_entry_grouped(ctx, p);
    p.host_us +=
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    ctx.after_op();
    return p;
  }
  const auto t0 = std::chrono::steady_clock::now();  // host code throughout: all of it counts
  EpPlan p = host_plan(ctx, tr, cfg, expert_ids);
  add_entry_grouped(ctx, p);
  p.host_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  ctx.after_op();
  return p;
}

namespace detail {
EpPlan ep_dispatch_plan_host(Context& ctx, Transport& tr, const EpConfig& cfg,
                             const TensorView& expert_ids) {
  check_args("ep_dispatch_plan", ctx, tr, cfg, expert_ids);
  EpPlan p = host_plan(ctx, tr, cfg, expert_ids);
  add_entry_grouped(ctx, p);
  ctx.after_op();
  return p;
}
}  // namespace detail

}  // namespace groupmm::ep
