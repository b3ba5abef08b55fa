// groupmm/ep_nccl.hpp: the NCCL transport of expert parallelism (groupmm/ep.hpp).
//
// Only in builds made with NCCL (CMake found nccl.h and libnccl; groupmm/version.hpp then says
// GROUPMM_WITH_NCCL 1, and the imported target links libnccl). Including this header from a build
// without it is a compile error that says so.
//
// The exchanges are grouped ncclSend / ncclRecv (ncclGroupStart / ncclGroupEnd) on the Context's
// stream: point-to-point only, so NVLink multicast (NVLS) is never used or needed (set
// NCCL_NVLS_ENABLE=0 to also skip its setup when a communicator is created). They are graph
// capturable (NCCL supports stream capture of point-to-point calls), so the capacity mode of the
// ep ops is graph safe over this transport. NCCL connects two ranks lazily, on their first
// exchange, and that cannot happen under capture: making a transport (either constructor) runs
// one small all-to-all that connects every pair, so making one is a collective of all ranks.
// One rank per GPU: the communicator's device must be the current device of the thread that
// makes the transport and runs the ops.
#pragma once

#include "groupmm/version.hpp"

#if !GROUPMM_WITH_NCCL
#error "groupmm was built without NCCL (GROUPMM_WITH_NCCL 0): groupmm/ep_nccl.hpp is not available"
#endif

#include <nccl.h>

#include <memory>

#include "groupmm/ep.hpp"

namespace groupmm::ep {

class NcclTransport final : public Transport {
 public:
  // Wraps a communicator the caller created and keeps owning (ncclCommInitRank, or the one behind
  // a torch.distributed process group); it must outlive this object. A collective (see above).
  explicit NcclTransport(ncclComm_t comm);
  // Creates a communicator of `ranks` ranks, owned by the returned transport (destroyed with it).
  // A collective: every rank calls it with the id rank 0 made (unique_id()) and shared, on the
  // thread whose current device is this rank's GPU.
  static std::unique_ptr<NcclTransport> create(const ncclUniqueId& id, int ranks, int rank);
  // ncclGetUniqueId, with NCCL errors as groupmm::Error.
  static ncclUniqueId unique_id();
  ~NcclTransport() override;
  NcclTransport(const NcclTransport&) = delete;
  NcclTransport& operator=(const NcclTransport&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::CUDA; }
  // Through a small device buffer on the transport's own stream; synchronizes (throughput plan).
  void all_to_all_counts(const int64_t* send, int64_t* recv, int64_t n) override;
  // One NCCL group of a send and a receive per other peer with bytes (peers with 0 bytes
  // skipped), and this rank's own block as a device-to-device copy, all on `stream`; returns once
  // enqueued.
  void all_to_all_v(const void* send, const int64_t* send_counts, const int64_t* send_offsets,
                    void* recv, const int64_t* recv_counts, const int64_t* recv_offsets,
                    cudaStream_t stream) override;
  // NCCL orders a transfer on whatever stream it is given: a chunked step's exchanges may run on
  // a second stream beside the compute (every rank issues them in the same order).
  bool concurrent_streams() const override { return true; }
  ncclComm_t comm() const { return comm_; }

 private:
  NcclTransport(ncclComm_t comm, bool owns);
  void release() noexcept;  // the count stream and buffer
  ncclComm_t comm_ = nullptr;
  bool owns_ = false;
  int rank_ = 0, size_ = 0;
  cudaStream_t count_stream_ = nullptr;
  int64_t* count_buf_ = nullptr;  // device: [2 * size * count_cap_]
  int64_t count_cap_ = 0;
};

}  // namespace groupmm::ep
