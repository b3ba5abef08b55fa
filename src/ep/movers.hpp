// The expert-parallel movers' shared parts (src/ep/movers.cpp, movers_chunked.cpp): staging,
// the exchange along a route with the rank's own block packed in place, and the checks every
// mover starts with. Internal.
#pragma once

#include <initializer_list>
#include <utility>
#include <vector>

#include "ep/check.hpp"

namespace groupmm::ep::movers {

#define GROUPMM_EP_CALL(ctx, fn, ...) \
  ((ctx).device() == Device::CPU ? cpu::fn(__VA_ARGS__) : cuda::fn(__VA_ARGS__))

// The send and receive buffers of one mover: the capacity plan's, or fresh ones.
struct Stage {
  Tensor own_send, own_recv;
  void* send = nullptr;
  void* recv = nullptr;
};

// The staging of one mover's rows (row_bytes each) and of its fp32 values (k weights per forward
// row, one value per back entry): the capacity plan's buffers, or fresh ones (stream-ordered).
Stage row_stage(Context& ctx, const EpPlan& p, int64_t send_rows, int64_t recv_rows,
                int64_t row_bytes);
Stage aux_stage(Context& ctx, const EpPlan& p);

// One all-to-all along a route: per-peer counts and offsets in units of `unit` bytes.
void exchange(Context& ctx, Transport& tr, const void* send, const std::vector<int64_t>& sc,
              const std::vector<int64_t>& so, void* recv, const std::vector<int64_t>& rc,
              const std::vector<int64_t>& ro, int64_t unit);

// One direction of a plan: per-peer counts and offsets (rows or entries) on each side.
struct Route {
  const std::vector<int64_t>& send_count;
  const std::vector<int64_t>& send_offset;
  const std::vector<int64_t>& recv_count;
  const std::vector<int64_t>& recv_offset;
};
Route forward_route(const EpPlan& p);
Route back_route(const EpPlan& p);

// The rows of a route's count vector (send_count or recv_count) other than the rank's own block:
// what its staging holds, since no mover stages the own block.
inline int64_t others_rows(const std::vector<int64_t>& count, int me) {
  int64_t n = 0;
  for (size_t q = 0; q < count.size(); ++q) n += q == size_t(me) ? 0 : count[q];
  return n;
}

// The row staging of one route for rank `me`: others_rows of its send side and (with_recv) of its
// receive side, the rows pack_others_and_exchange stages.
Stage route_stage(Context& ctx, const EpPlan& p, const Route& r, int me, int64_t row_bytes,
                  bool with_recv = true);

// Packs every row a route sends but the rank's own block, and exchanges them: pack(dst, first, n)
// writes send rows [first, first + n) at dst, rows of `unit` bytes. The own block (send rows
// [send_offset[me], + mine), which are receive rows [recv_offset[me], + mine)) is neither packed
// nor exchanged: the receive side reads it in place (own_rows), one pass over those rows where
// packing them was two (at R = 1 they are every row). Neither side's staging keeps a hole for
// it: the send rows after it are packed `mine` rows earlier, and the receive rows after it land
// `mine` rows earlier (RecvRows' layout), so each staging holds others_rows(...) rows; with
// compact_recv false they land at their receive offsets instead (for pack_and_exchange). Returns
// the own block's first send row.
template <class Pack>
int64_t pack_others_and_exchange(Context& ctx, Transport& tr, const Route& r, void* send,
                                 void* recv, int64_t unit, const Pack& pack,
                                 bool compact_recv = true) {
  const size_t me = size_t(tr.rank()), R = r.send_count.size();
  const int64_t at = r.send_offset[me], mine = r.send_count[me];
  const int64_t total = r.send_offset[R - 1] + r.send_count[R - 1];
  GROUPMM_CHECK(mine == r.recv_count[me], "ep: rank ", me, " sends itself ", mine,
                " rows but expects ", r.recv_count[me], " (an inconsistent plan)");
  char* s = static_cast<char*>(send);
  pack(s, int64_t(0), at);
  pack(s + at * unit, at + mine, total - at - mine);
  // Offsets grow with the peer (the blocks lie in rank order), so the blocks past the own one are
  // the peers past me.
  std::vector<int64_t> sc = r.send_count, so = r.send_offset, rc = r.recv_count, ro = r.recv_offset;
  sc[me] = rc[me] = 0;
  for (size_t q = me + 1; q < R; ++q) {
    so[q] -= mine;
    if (compact_recv) ro[q] -= mine;
  }
  exchange(ctx, tr, send, sc, so, recv, rc, ro, unit);
  return at;
}

// The receive rows of a route after pack_others_and_exchange (`unit` bytes a staged row): the
// own block's receive row recv_offset[me] + i is row idx[send_offset[me] + i] of src
// (src_stride bytes a row), where idx is the route's send index (send row -> source row).
RecvRows own_rows(const Route& r, int me, const void* recv, int64_t unit, const void* src,
                  int64_t src_stride, const int32_t* idx);

// Packs and exchanges every row of a route, the rank's own block packed straight into the
// receive buffer, where the exchange would have put it (for receive sides that read the buffer
// later, when the own block's source may be gone: the chunked movers, the fp32 values). The
// receive buffer holds every receive row at its offset; the send staging others_rows(...).
template <class Pack>
void pack_and_exchange(Context& ctx, Transport& tr, const Route& r, void* send, void* recv,
                       int64_t unit, const Pack& pack) {
  const int64_t at = pack_others_and_exchange(ctx, tr, r, send, recv, unit, pack, false);
  const size_t me = size_t(tr.rank());
  pack(static_cast<char*>(recv) + r.recv_offset[me] * unit, at, r.send_count[me]);
}

// pack_and_exchange with the plain gather: send row i is src row idx[i] (`unit` bytes).
void gather_and_exchange(Context& ctx, Transport& tr, const Route& r, const void* src,
                         const int32_t* idx, void* send, void* recv, int64_t unit);
// pack_others_and_exchange with the plain gather; returns the receive rows, the own block's read
// in place from src.
RecvRows gather_others_and_exchange(Context& ctx, Transport& tr, const Route& r, const void* src,
                                    const int32_t* idx, void* send, void* recv, int64_t unit);

// The checks every mover starts with; returns the dtype of `first` (the rows all operands share).
DType check_mover(const char* op, const Context& ctx, const EpPlan& p, const Transport& tr,
                  const char* arg, const TensorView& first);
// fp32 [n] (cols 0) or [n, cols].
void check_floats(const Context& ctx, const char* op, const char* arg, const TensorView& v,
                  int64_t n, int64_t cols);
// `out` overlaps none of the given inputs (absent ones are skipped).
void check_no_alias(const char* op, const char* out, const TensorView& o,
                    std::initializer_list<std::pair<const char*, const TensorView*>> ins);

}  // namespace groupmm::ep::movers
