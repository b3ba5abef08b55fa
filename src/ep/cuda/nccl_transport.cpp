// The NCCL transport of the expert-parallel ops (groupmm/ep_nccl.hpp): grouped point-to-point
// send / receive on the caller's stream. Compiled only in builds with NCCL (CMakeLists.txt leaves
// out sources named *nccl* otherwise).
#include "groupmm/ep_nccl.hpp"

#include <vector>

namespace groupmm::ep {

namespace {

#define GROUPMM_CHECK_NCCL(expr)                                                         \
  do {                                                                                   \
    const ncclResult_t groupmm_nccl_ = (expr);                                           \
    GROUPMM_CHECK(groupmm_nccl_ == ncclSuccess, "NCCL error ", int(groupmm_nccl_), " (", \
                  ncclGetErrorString(groupmm_nccl_), ") in ", #expr);                    \
  } while (0)

// One NCCL group around calls(issue): issue(result) keeps the first failure, and the group is
// always closed before an error is thrown (an open group would swallow the next calls).
template <class Calls>
void nccl_group(const char* what, Calls calls) {
  GROUPMM_CHECK_NCCL(ncclGroupStart());
  ncclResult_t first = ncclSuccess;
  calls([&first](ncclResult_t r) {
    if (first == ncclSuccess) first = r;
  });
  const ncclResult_t end = ncclGroupEnd();
  const ncclResult_t err = first != ncclSuccess ? first : end;
  GROUPMM_CHECK(err == ncclSuccess, what, ": NCCL error ", int(err), " (", ncclGetErrorString(err),
                ")");
}

}  // namespace

NcclTransport::NcclTransport(ncclComm_t comm) : NcclTransport(comm, false) {}

NcclTransport::NcclTransport(ncclComm_t comm, bool owns) : comm_(comm), owns_(owns) {
  GROUPMM_CHECK(comm != nullptr, "NcclTransport: comm is null");
  GROUPMM_CHECK_NCCL(ncclCommUserRank(comm, &rank_));
  GROUPMM_CHECK_NCCL(ncclCommCount(comm, &size_));
  // NCCL connects two ranks on their first exchange, which allocates and maps buffers and so
  // cannot run under stream capture (NCCL reports an internal error there). One small all-to-all
  // now connects every pair, so that a capacity-mode step can be captured first thing.
  try {
    std::vector<int64_t> zeros(size_t(size_), 0), got(size_t(size_), 0);
    all_to_all_counts(zeros.data(), got.data(), 1);
  } catch (...) {
    release();
    throw;
  }
}

void NcclTransport::release() noexcept {
  if (count_buf_ != nullptr) cudaFree(count_buf_);
  if (count_stream_ != nullptr) cudaStreamDestroy(count_stream_);
  count_buf_ = nullptr;
  count_stream_ = nullptr;
}

std::unique_ptr<NcclTransport> NcclTransport::create(const ncclUniqueId& id, int ranks, int rank) {
  GROUPMM_CHECK(ranks >= 1 && rank >= 0 && rank < ranks, "NcclTransport::create: rank=", rank,
                " must be in [0, ranks=", ranks, ")");
  ncclComm_t comm = nullptr;
  GROUPMM_CHECK_NCCL(ncclCommInitRank(&comm, ranks, id, rank));
  try {
    return std::unique_ptr<NcclTransport>(new NcclTransport(comm, true));
  } catch (...) {
    ncclCommDestroy(comm);
    throw;
  }
}

ncclUniqueId NcclTransport::unique_id() {
  ncclUniqueId id;
  GROUPMM_CHECK_NCCL(ncclGetUniqueId(&id));
  return id;
}

NcclTransport::~NcclTransport() {
  release();
  if (owns_) ncclCommDestroy(comm_);
}

void NcclTransport::all_to_all_counts(const int64_t* send, int64_t* recv, int64_t n) {
  if (n <= 0) return;
  if (count_stream_ == nullptr)
    GROUPMM_CHECK_CUDA(cudaStreamCreateWithFlags(&count_stream_, cudaStreamNonBlocking));
  if (n > count_cap_) {
    if (count_buf_ != nullptr) GROUPMM_CHECK_CUDA(cudaFree(count_buf_));
    count_buf_ = nullptr;
    GROUPMM_CHECK_CUDA(cudaMalloc(&count_buf_, size_t(2 * size_ * n) * sizeof(int64_t)));
    count_cap_ = n;
  }
  const size_t bytes = size_t(size_ * n) * sizeof(int64_t);
  int64_t* dsend = count_buf_;
  int64_t* drecv = count_buf_ + size_ * n;
  GROUPMM_CHECK_CUDA(cudaMemcpyAsync(dsend, send, bytes, cudaMemcpyHostToDevice, count_stream_));
  nccl_group("NcclTransport::all_to_all_counts", [&](auto issue) {
    for (int p = 0; p < size_; ++p) {
      issue(ncclSend(dsend + p * n, size_t(n), ncclInt64, p, comm_, count_stream_));
      issue(ncclRecv(drecv + p * n, size_t(n), ncclInt64, p, comm_, count_stream_));
    }
  });
  GROUPMM_CHECK_CUDA(cudaMemcpyAsync(recv, drecv, bytes, cudaMemcpyDeviceToHost, count_stream_));
  GROUPMM_CHECK_CUDA(cudaStreamSynchronize(count_stream_));
}

void NcclTransport::all_to_all_v(const void* send, const int64_t* send_counts,
                                 const int64_t* send_offsets, void* recv,
                                 const int64_t* recv_counts, const int64_t* recv_offsets,
                                 cudaStream_t stream) {
  const char* s = static_cast<const char*>(send);
  char* r = static_cast<char*>(recv);
  // The block a rank sends itself is a device copy on the same stream, not an NCCL send and
  // receive to itself: NCCL moves it through its few channels' kernels, a copy at full device
  // bandwidth (at R = 1 it is the whole exchange). Both sides of that block have the same size.
  const int64_t self = send_counts[rank_];
  GROUPMM_CHECK(self == recv_counts[rank_], "NcclTransport::all_to_all_v: rank ", rank_,
                " sends itself ", self, " bytes but expects ", recv_counts[rank_]);
  if (self > 0)
    GROUPMM_CHECK_CUDA(cudaMemcpyAsync(r + recv_offsets[rank_], s + send_offsets[rank_],
                                       size_t(self), cudaMemcpyDeviceToDevice, stream));
  nccl_group("NcclTransport::all_to_all_v", [&](auto issue) {
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      if (send_counts[p] > 0)
        issue(ncclSend(s + send_offsets[p], size_t(send_counts[p]), ncclUint8, p, comm_, stream));
      if (recv_counts[p] > 0)
        issue(ncclRecv(r + recv_offsets[p], size_t(recv_counts[p]), ncclUint8, p, comm_, stream));
    }
  });
}

}  // namespace groupmm::ep
