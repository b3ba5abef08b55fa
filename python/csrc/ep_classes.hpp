// ep_classes.hpp: the two custom classes of the expert-parallel ops (ops_ep.cpp registers them
// and the ops that take them; ops_ep_autograd.cpp keeps plans in its graph nodes).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <cstring>
#include <memory>
#include <string>

#include "binding.hpp"
#include "ep_transport.hpp"
#include "groupmm/ep.hpp"
#include "groupmm/version.hpp"
#if GROUPMM_WITH_NCCL
#include "groupmm/ep_nccl.hpp"
#endif

namespace groupmm_torch {

namespace ep = groupmm::ep;

// NCCL's unique id, ncclUniqueId's bytes (NCCL_UNIQUE_ID_BYTES).
inline constexpr int64_t kNcclIdBytes = 128;

struct EpGroup : torch::CustomClassHolder {
  // A collective of the group's ranks: one small exchange connects every pair now (NCCL
  // connects lazily, which cannot happen under graph capture) and checks that every rank took
  // part with this group.
  EpGroup(const std::string& group_name, const std::string& device,
          const std::optional<at::Tensor>& nccl_id)
      : device_(device) {
    TORCH_CHECK_VALUE(device_.is_cpu() || device_.is_cuda(), "groupmm EpGroup: device ", device,
                      " must be cpu or cuda");
    if (device_.is_cuda() && !device_.has_index()) {
      const c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
      device_ = at::Device(c10::DeviceType::CUDA, impl.getDevice().index());
    }
    pg_ = c10d::resolve_process_group(group_name);
    if (device_.is_cpu()) {
      TORCH_CHECK_VALUE(!nccl_id.has_value(),
                        "groupmm EpGroup: nccl_id is for a CUDA group; "
                        "a CPU group exchanges over the process group's own (gloo) communicator");
      backend_ = pg_->getBackend(device_.type())->getBackendName();
      tr_ = std::make_unique<ProcessGroupTransport>(pg_, device_);
    } else {
      tr_ = make_nccl(nccl_id);
      backend_ = "nccl";
    }
    const c10::OptionalDeviceGuard guard(device_.is_cuda() ? std::optional<at::Device>(device_)
                                                           : std::nullopt);
    const int R = tr_->size();
    std::vector<int64_t> send(size_t(R), tr_->rank()), recv(size_t(R), -1);
    tr_->all_to_all_counts(send.data(), recv.data(), 1);
    for (int p = 0; p < R; ++p)
      TORCH_CHECK(recv[size_t(p)] == p, "groupmm EpGroup: rank ", tr_->rank(), " got ",
                  recv[size_t(p)], " from peer ", p, " in the connecting exchange");
  }
  int64_t rank() const { return tr_->rank(); }
  int64_t size() const { return tr_->size(); }
  std::string backend() const { return backend_; }
  std::string device() const { return device_.str(); }
  std::string describe() const {
    return "EpGroup(rank " + std::to_string(rank()) + " of " + std::to_string(size()) + ", " +
           backend_ + " on " + device_.str() +
           (device_.is_cpu() ? ", the process group's own communicator)"
                             : ", a communicator groupmm made for the process group)");
  }
  ep::Transport& transport() { return *tr_; }
  const at::Device& torch_device() const { return device_; }

 private:
  // The core's NCCL transport on a new communicator of the group's ranks, made with the unique id
  // every rank received (a collective: every rank of the group calls it with the same id).
  std::unique_ptr<ep::Transport> make_nccl(const std::optional<at::Tensor>& id) {
    TORCH_CHECK_VALUE(id.has_value(),
                      "groupmm EpGroup: a CUDA group needs nccl_id, the unique "
                      "id rank 0 made with ep_nccl_unique_id() and broadcast over the process "
                      "group (groupmm.nn.moe_ep.ep_group does both)");
    TORCH_CHECK_VALUE(id->device().is_cpu() && id->scalar_type() == at::kByte && id->dim() == 1 &&
                          id->numel() == kNcclIdBytes,
                      "groupmm EpGroup: nccl_id must be a CPU uint8 tensor of ", kNcclIdBytes,
                      " bytes; got ", id->scalar_type(), " ", id->sizes(), " on ", id->device());
#if GROUPMM_WITH_NCCL
    ncclUniqueId uid;
    static_assert(sizeof(uid) == kNcclIdBytes, "ncclUniqueId's size");
    const at::Tensor c = id->contiguous();
    std::memcpy(&uid, c.data_ptr(), sizeof(uid));
    // The communicator's device is the current device while it is made and used (ep_nccl.hpp).
    const c10::OptionalDeviceGuard guard{std::optional<at::Device>(device_)};
    try {
      return ep::NcclTransport::create(uid, pg_->getSize(), pg_->getRank());
    } catch (const groupmm::Error& e) {
      throw groupmm::Error(without_source_locations(e.what()));
    }
#else
    TORCH_CHECK_NOT_IMPLEMENTED(false,
                                "groupmm EpGroup: this groupmm was built without NCCL "
                                "(groupmm/version.hpp GROUPMM_WITH_NCCL 0): no CUDA group");
#endif
  }

  at::Device device_;
  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  std::string backend_;
  std::unique_ptr<ep::Transport> tr_;
};

struct EpPlan : torch::CustomClassHolder {
  EpPlan(c10::intrusive_ptr<EpGroup> g, std::shared_ptr<ep::EpPlan> p)
      : group(std::move(g)), plan(std::move(p)) {}
  c10::intrusive_ptr<EpGroup> group;
  std::shared_ptr<ep::EpPlan> plan;
  std::string overflow;  // CPU capacity plans: the last fill's drops (describe_status), or ""

  // Another holder of the same plan: what an autograd node keeps (in_use() counts it).
  c10::intrusive_ptr<EpPlan> lease() const { return c10::make_intrusive<EpPlan>(group, plan); }
  // Whether anything but this holder still refers to the plan (an autograd graph that will run
  // its backward, a splits() tensor): a capacity plan in use must not be refilled.
  bool in_use() const { return plan.use_count() > 1; }
  int64_t rows() const { return plan->rows; }
  int64_t tokens() const { return plan->tokens; }
  int64_t local_experts() const { return plan->local_experts; }
  std::string mode() const { return ep::ep_mode_name(plan->mode); }
  std::string last_overflow() const { return overflow; }
  std::string describe() const { return plan->to_string(); }
  // [E_l] int32 on the plan's device: the plan's own buffer (a capacity plan's is refilled by
  // every ep_capacity_plan), kept alive with the plan while the tensor lives.
  at::Tensor splits() const {
    const at::Device d = group->torch_device();
    std::shared_ptr<ep::EpPlan> keep = plan;
    return at::for_blob(plan->splits.data(), {plan->local_experts})
        .options(at::TensorOptions().dtype(at::kInt).device(d))
        .target_device(d)
        .deleter([keep](void*) mutable { keep.reset(); })
        .make_tensor();
  }
  // [E_l] int32: the splits that cover only the rows holding entries (ep.hpp entry_splits():
  // capacity mode's splits without the zero tail, throughput mode's splits), for the expert ops'
  // at-most mode (splits_total='at_most', weighted_swiglu's splits). Kept alive as splits().
  at::Tensor splits_at_most() const {
    const at::Device d = group->torch_device();
    std::shared_ptr<ep::EpPlan> keep = plan;
    return at::for_blob(plan->entry_splits().data, {plan->local_experts})
        .options(at::TensorOptions().dtype(at::kInt).device(d))
        .target_device(d)
        .deleter([keep](void*) mutable { keep.reset(); })
        .make_tensor();
  }
};

using GroupPtr = c10::intrusive_ptr<EpGroup>;
using PlanPtr = c10::intrusive_ptr<EpPlan>;

// The Autograd kernels of the EP ops (ops_ep_autograd.cpp), registered from ops_ep.cpp after the
// classes.
void register_ep_autograd(torch::Library& m);

}  // namespace groupmm_torch
