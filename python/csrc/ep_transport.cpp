// ep_transport.cpp: ProcessGroupTransport (ep_transport.hpp).
#include "ep_transport.hpp"

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
  // alltoall_base takes one packed buffer per side: block p right after block p - 1. The
  // core's movers always send packed blocks; anything else is a caller error, said here.
  int64_t st = 0, rt = 0;
  for (int p = 0; p < R; ++p) {
    TORCH_CHECK(send_offsets[p] == st && recv_offsets[p] == rt,
                "groupmm EpGroup: all_to_all_v needs packed blocks (offset of block ", p, " is ",
                send_offsets[p], " / ", recv_offsets[p], ", expected ", st, " / ", rt, ")");
    st += sc[size_t(p)];
    rt += rc[size_t(p)];
  }
  at::Tensor in = bytes(const_cast<void*>(send), st), out = bytes(recv, rt);
  exchange(out, in, rc, sc);
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
