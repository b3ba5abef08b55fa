// ep_transport.hpp: ProcessGroupTransport, the core's ep::Transport over a torch.distributed
// process group for CPU tensors. Its two collectives run as ProcessGroup::alltoall_base with split
// sizes on the group's own communicator (gloo), and block until done. CUDA groups use the core's
// NCCL transport instead (ops_ep.cpp says why).
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <vector>

#include "groupmm/ep.hpp"

namespace groupmm_torch {

class ProcessGroupTransport final : public groupmm::ep::Transport {
 public:
  ProcessGroupTransport(c10::intrusive_ptr<c10d::ProcessGroup> pg, at::Device device)
      : pg_(std::move(pg)), device_(device) {
    TORCH_CHECK_VALUE(device_.is_cpu(),
                      "groupmm EpGroup: the process group's transport is for "
                      "CPU tensors; got ",
                      device_);
  }
  int rank() const override { return pg_->getRank(); }
  int size() const override { return pg_->getSize(); }
  groupmm::Device device() const override { return groupmm::Device::CPU; }
  // Host int64 blocks.
  void all_to_all_counts(const int64_t* send, int64_t* recv, int64_t n) override;
  // Packed blocks only (block p right after block p - 1, as the core's movers send them).
  void all_to_all_v(const void* send, const int64_t* send_counts, const int64_t* send_offsets,
                    void* recv, const int64_t* recv_counts, const int64_t* recv_offsets,
                    cudaStream_t stream) override;
  const c10::intrusive_ptr<c10d::ProcessGroup>& pg() const { return pg_; }

 private:
  at::Tensor bytes(void* p, int64_t n) const;
  void exchange(at::Tensor& out, at::Tensor& in, std::vector<int64_t> out_splits,
                std::vector<int64_t> in_splits);

  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  at::Device device_;
};

}  // namespace groupmm_torch
