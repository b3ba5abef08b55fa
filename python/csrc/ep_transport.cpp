// ep_transport.cpp: ProcessGroupTransport (ep_transport.hpp).
#include "ep_transport.hpp"

#include <cstring>

namespace groupmm_torch {

void ProcessGroupTransport::all_to_all_counts(const int64_t* send, int64_t* recv, int64_t n) {
  const int64_t total = int64_t(size()) * n;
  if (total == 0) return;
  const auto host = at::TensorOptions().dtype(at::kLong);
  at::Tensor s = at::from_blob(const_cast<int64_t*>(send), {total}, host);
  at::Tensor r = at::from_blob(recv, {total}, host);
  exchange(r, s, {}, {});
}

void ProcessGroupTransport::all_to_all_v(const void* send, const int64_t* send_counts,
                                         const int64_t* send_offsets, void* recv,
                                         const int64_t* recv_counts, const int64_t* recv_offsets,
                                         cudaStream_t /*stream: CPU, none*/) {
  const int R = size();
  std::vector<int64_t> sc(send_counts, send_counts + R), rc(recv_counts, recv_counts + R);
  // alltoall_base takes one packed buffer per side: block p right after block p - 1. The core's
  // movers leave the rank's own block out of the exchange (count 0, packed in place), so their
  // blocks can have a hole there: such a side goes through a packed copy (host memory, the CPU
  // backend's path).
  bool send_packed = true, recv_packed = true;
  int64_t st = 0, rt = 0;
  for (int p = 0; p < R; ++p) {
    send_packed = send_packed && (sc[size_t(p)] == 0 || send_offsets[p] == st);
    recv_packed = recv_packed && (rc[size_t(p)] == 0 || recv_offsets[p] == rt);
    st += sc[size_t(p)];
    rt += rc[size_t(p)];
  }
  const char* s = static_cast<const char*>(send);
  char* r = static_cast<char*>(recv);
  const auto staging = [](int64_t n) {
    return at::empty({n}, at::TensorOptions().dtype(at::kByte));
  };
  at::Tensor in = send_packed ? bytes(const_cast<void*>(send), st) : staging(st);
  at::Tensor out = recv_packed ? bytes(recv, rt) : staging(rt);
  if (!send_packed) {
    char* d = static_cast<char*>(in.data_ptr());
    int64_t o = 0;
    for (int p = 0; p < R; ++p) {
      if (sc[size_t(p)] > 0) std::memcpy(d + o, s + send_offsets[p], size_t(sc[size_t(p)]));
      o += sc[size_t(p)];
    }
  }
  exchange(out, in, rc, sc);
  if (!recv_packed) {
    const char* d = static_cast<const char*>(out.data_ptr());
    int64_t o = 0;
    for (int p = 0; p < R; ++p) {
      if (rc[size_t(p)] > 0) std::memcpy(r + recv_offsets[p], d + o, size_t(rc[size_t(p)]));
      o += rc[size_t(p)];
    }
  }
}

at::Tensor ProcessGroupTransport::bytes(void* p, int64_t n) const {
  const auto o = at::TensorOptions().dtype(at::kByte).device(device_);
  if (n == 0 || p == nullptr) return at::empty({0}, o);
  return at::for_blob(p, {n}).options(o).target_device(device_).make_tensor();
}

void ProcessGroupTransport::exchange(at::Tensor& out, at::Tensor& in,
                                     std::vector<int64_t> out_splits,
                                     std::vector<int64_t> in_splits) {
  c10d::AllToAllOptions opts;
  auto work = pg_->alltoall_base(out, in, out_splits, in_splits, opts);
  work->wait();
}

}  // namespace groupmm_torch
