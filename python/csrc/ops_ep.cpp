// ops_ep.cpp: expert parallelism (groupmm/ep.hpp) over a torch.distributed process group.
//
// Two transports behind one custom class, chosen by the device:
//  - CPU tensors: ProcessGroupTransport (ep_transport.hpp), a groupmm::ep::Transport whose two
//    collectives run through the c10d ProcessGroup (alltoall_base with split sizes) on the group's
//    own communicator (gloo); nothing is created.
//  - CUDA tensors: the core's NCCL transport (groupmm/ep_nccl.hpp) on a communicator groupmm
//    creates for the group: rank 0 makes a unique id (ep_nccl_unique_id), the Python side
//    broadcasts it over the process group, and every rank passes it to the constructor. The
//    process group's own NCCL communicator is not borrowed: c10d does not expose it, and driving
//    ProcessGroupNCCL from this extension crashed in its one GPU run, while the core's transport
//    is the one the C++ tests and benchmarks run over several GPUs (point-to-point calls on the
//    op's stream, capturable in a CUDA graph).
// Two custom classes carry the state the ops share, defined here beside the ops that take them
// (the schema parser needs a class registered before an op names it):
//   torch.classes.groupmm.EpGroup(group_name, device, nccl_id=None): the transport of one process
//     group on one device (group_name: ProcessGroup.group_name, resolved with
//     c10d::resolve_process_group; nccl_id: the unique id, for a CUDA device only);
//   torch.classes.groupmm.EpPlan: an ep::EpPlan (throughput or capacity), made by the plan ops.
// The movers (ep_dispatch, ep_combine) have autograd formulas (their backward ops, which are
// collectives too: every rank's backward must run them, as every rank's forward ran the movers).
//
// Streams: a groupmm op runs on torch's current stream (binding.hpp's Call). Over gloo the
// collectives block; over NCCL the core's transport enqueues them on the op's stream, between the
// groupmm kernels, as in the C++ layers.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/autograd.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <cstring>
#include <memory>
#include <string>

#include "autograd.hpp"
#include "binding.hpp"
#include "ep_transport.hpp"
#include "groupmm/ep.hpp"
#include "groupmm/version.hpp"
#if GROUPMM_WITH_NCCL
#include "groupmm/ep_nccl.hpp"
#endif

namespace groupmm_torch {
namespace {

namespace ep = groupmm::ep;

// ================================================================================================
// The custom classes
// ================================================================================================

// NCCL's unique id, ncclUniqueId's bytes (NCCL_UNIQUE_ID_BYTES).
constexpr int64_t kNcclIdBytes = 128;

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

// [128] uint8 on the CPU: a new NCCL unique id (rank 0 makes it; every rank of the group passes
// the same bytes to EpGroup).
at::Tensor ep_nccl_unique_id() {
#if GROUPMM_WITH_NCCL
  ncclUniqueId uid;
  try {
    uid = ep::NcclTransport::unique_id();
  } catch (const groupmm::Error& e) {
    throw groupmm::Error(without_source_locations(e.what()));
  }
  at::Tensor t = at::empty({kNcclIdBytes}, at::TensorOptions().dtype(at::kByte));
  std::memcpy(t.data_ptr(), &uid, sizeof(uid));
  return t;
#else
  TORCH_CHECK_NOT_IMPLEMENTED(false,
                              "groupmm.ep_nccl_unique_id: this groupmm was built without "
                              "NCCL (groupmm/version.hpp GROUPMM_WITH_NCCL 0)");
#endif
}

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

// ================================================================================================
// The op kernels (CPU and CUDA: the core dispatches on the Context's device)
// ================================================================================================

ep::EpConfig ep_config(const EpGroup& g, int64_t experts, int64_t hidden, int64_t topk) {
  return {experts, g.size(), hidden, topk};
}

void check_group_device(const char* op, const EpGroup& g, const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.device() == g.torch_device(), "groupmm.", op, ": the tensors are on ",
                    t.device(), " but the EpGroup exchanges ", g.device(), " buffers");
}

PlanPtr ep_dispatch_plan(const GroupPtr& group, const at::Tensor& expert_ids, int64_t experts,
                         int64_t hidden) {
  Call call("ep_dispatch_plan", expert_ids);
  check_group_device("ep_dispatch_plan", *group, expert_ids);
  TORCH_CHECK_VALUE(expert_ids.dim() == 2,
                    "groupmm.ep_dispatch_plan: expert_ids must be [T, k]; got ",
                    expert_ids.sizes());
  const auto ids = call.in(expert_ids, "expert_ids");
  auto plan = std::make_shared<ep::EpPlan>(ep::ep_dispatch_plan(
      call.ctx(), group->transport(), ep_config(*group, experts, hidden, expert_ids.size(1)), ids));
  call.finish();
  return c10::make_intrusive<EpPlan>(group, std::move(plan));
}

PlanPtr ep_capacity_plan_create(const GroupPtr& group, const at::Tensor& expert_ids,
                                int64_t experts, int64_t hidden, int64_t rows_per_peer,
                                int64_t entries_per_peer, at::ScalarType row_dtype,
                                bool zero_tail) {
  const char* op = "ep_capacity_plan_create";
  Call call(op, expert_ids);
  check_group_device(op, *group, expert_ids);
  TORCH_CHECK_VALUE(expert_ids.dim() == 2, "groupmm.", op, ": expert_ids must be [T, k]; got ",
                    expert_ids.sizes());
  auto plan = std::make_shared<ep::EpPlan>(ep::ep_capacity_plan_create(
      call.ctx(), group->transport(), ep_config(*group, experts, hidden, expert_ids.size(1)),
      ep::EpCapacity{rows_per_peer, entries_per_peer, zero_tail}, expert_ids.size(0),
      to_groupmm(row_dtype, op, "row_dtype")));
  call.finish();
  return c10::make_intrusive<EpPlan>(group, std::move(plan));
}

// Fills a capacity plan for this step's routing. A drop is not an error of the op: on the CPU it
// is kept in plan.last_overflow() (the status block's description) and cleared; on CUDA it stays
// in the Context's status block, where groupmm.check() raises it (as every device fault).
void ep_capacity_plan(const PlanPtr& plan, const at::Tensor& expert_ids) {
  const char* op = "ep_capacity_plan";
  Call call(op, expert_ids);
  check_group_device(op, *plan->group, expert_ids);
  const auto ids = call.in(expert_ids, "expert_ids");
  ep::ep_capacity_plan(call.ctx(), plan->group->transport(), ids, *plan->plan);
  if (expert_ids.is_cpu()) {
    const groupmm::StatusBlock s = call.ctx().take_status();
    plan->overflow = s.bits != 0 ? groupmm::describe_status(s) : std::string();
    TORCH_CHECK((s.bits & ~uint32_t(groupmm::kFaultEpCapacity)) == 0, "groupmm.", op, ": ",
                plan->overflow);
  }
}

std::tuple<at::Tensor, at::Tensor> ep_dispatch(const PlanPtr& plan, const at::Tensor& x,
                                               const std::optional<at::Tensor>& weights) {
  Call call("ep_dispatch", x);
  check_group_device("ep_dispatch", *plan->group, x);
  TORCH_CHECK_VALUE(x.dim() == 2, "groupmm.ep_dispatch: x must be [T, H]; got ", x.sizes());
  const ep::EpPlan& p = *plan->plan;
  const auto xv = call.in(x, "x"), wv = call.in(weights, "weights");
  at::Tensor xg = call.empty({p.rows, x.size(1)}, x.scalar_type());
  at::Tensor probs = call.empty({weights ? p.rows : 0}, at::kFloat);
  ep::ep_dispatch(call.ctx(), plan->group->transport(), p, xv, call.out(xg, "x_grouped"), wv,
                  weights ? call.out(probs, "probs") : groupmm::TensorView());
  call.finish();
  return {xg, probs};
}

std::tuple<at::Tensor, at::Tensor> ep_dispatch_backward(const PlanPtr& plan,
                                                        const at::Tensor& d_x_grouped,
                                                        const std::optional<at::Tensor>& d_probs) {
  Call call("ep_dispatch_backward", d_x_grouped);
  check_group_device("ep_dispatch_backward", *plan->group, d_x_grouped);
  const ep::EpPlan& p = *plan->plan;
  const auto dxg = call.in(d_x_grouped, "d_x_grouped"), dpv = call.in(d_probs, "d_probs");
  at::Tensor dx = call.empty({p.tokens, d_x_grouped.size(1)}, d_x_grouped.scalar_type());
  at::Tensor dw = call.empty({d_probs ? p.tokens : 0, d_probs ? p.cfg.topk : 0}, at::kFloat);
  ep::ep_dispatch_backward(call.ctx(), plan->group->transport(), p, dxg, call.out(dx, "dx"), dpv,
                           d_probs ? call.out(dw, "d_weights") : groupmm::TensorView());
  call.finish();
  return {dx, dw};
}

at::Tensor ep_combine(const PlanPtr& plan, const at::Tensor& y_grouped,
                      const std::optional<at::Tensor>& weights,
                      const std::optional<at::Tensor>& add) {
  Call call("ep_combine", y_grouped);
  check_group_device("ep_combine", *plan->group, y_grouped);
  TORCH_CHECK_VALUE(y_grouped.dim() == 2, "groupmm.ep_combine: y_grouped must be [rows, H]; got ",
                    y_grouped.sizes());
  const ep::EpPlan& p = *plan->plan;
  const auto yg = call.in(y_grouped, "y_grouped"), wv = call.in(weights, "weights");
  const auto av = call.in(add, "add");
  at::Tensor y = call.empty({p.tokens, y_grouped.size(1)}, y_grouped.scalar_type());
  ep::ep_combine(call.ctx(), plan->group->transport(), p, yg, wv, call.out(y, "y"), av);
  call.finish();
  return y;
}

std::tuple<at::Tensor, at::Tensor> ep_combine_backward(const PlanPtr& plan, const at::Tensor& dy,
                                                       const std::optional<at::Tensor>& weights,
                                                       const std::optional<at::Tensor>& y_grouped) {
  Call call("ep_combine_backward", dy);
  check_group_device("ep_combine_backward", *plan->group, dy);
  const ep::EpPlan& p = *plan->plan;
  const auto dyv = call.in(dy, "dy"), wv = call.in(weights, "weights");
  const auto ygv = call.in(y_grouped, "y_grouped");
  at::Tensor dyg = call.empty({p.rows, dy.size(1)}, dy.scalar_type());
  at::Tensor dw = call.empty({weights ? p.tokens : 0, weights ? p.cfg.topk : 0}, at::kFloat);
  ep::ep_combine_backward(call.ctx(), plan->group->transport(), p, dyv, wv, ygv,
                          call.out(dyg, "d_y_grouped"),
                          weights ? call.out(dw, "d_weights") : groupmm::TensorView());
  call.finish();
  return {dyg, dw};
}

// ================================================================================================
// Autograd
// ================================================================================================

using EpDispatchSig = Tensors2(const PlanPtr&, const at::Tensor&, const OptTensor&);
using EpDispatchBwdSig = Tensors2(const PlanPtr&, const at::Tensor&, const OptTensor&);
using EpCombineSig = at::Tensor(const PlanPtr&, const at::Tensor&, const OptTensor&,
                                const OptTensor&);
using EpCombineBwdSig = Tensors2(const PlanPtr&, const at::Tensor&, const OptTensor&,
                                 const OptTensor&);
using EpPlanSig = PlanPtr(const GroupPtr&, const at::Tensor&, int64_t, int64_t);
using EpCapCreateSig = PlanPtr(const GroupPtr&, const at::Tensor&, int64_t, int64_t, int64_t,
                               int64_t, at::ScalarType, bool);
using EpCapFillSig = void(const PlanPtr&, const at::Tensor&);

bool present(const OptTensor& t) {
  return t.has_value() && t->defined();
}

// A node keeps a lease of the plan (EpPlan.in_use() is true until the node is freed). Its
// backward always runs the backward collective, with zero gradients where none came (every rank
// must make the same collectives).
struct EpDispatchFn : torch::autograd::Function<EpDispatchFn> {
  static variable_list forward(AutogradContext* ctx, const PlanPtr& plan, const at::Tensor& x,
                               const OptTensor& weights) {
    ctx->saved_data["plan"] = plan->lease();
    const bool has_w = present(weights);
    ctx->saved_data["has_w"] = has_w;
    const at::AutoDispatchBelowADInplaceOrView guard;
    auto [xg, probs] = GROUPMM_OP("ep_dispatch", EpDispatchSig).call(plan, x, weights);
    if (!has_w) ctx->mark_non_differentiable({probs});
    return {xg, probs};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const PlanPtr plan = ctx->saved_data["plan"].toCustomClass<EpPlan>();
    const bool has_w = ctx->saved_data["has_w"].toBool();
    auto [dx, dw] = GROUPMM_OP("ep_dispatch_backward", EpDispatchBwdSig)
                        .call(plan, grads[0], has_w ? OptTensor(grads[1]) : std::nullopt);
    return {at::Tensor(), dx, has_w ? dw : at::Tensor()};
  }
};

Tensors2 ep_dispatch_autograd(c10::DispatchKeySet ks, const PlanPtr& plan, const at::Tensor& x,
                              const OptTensor& weights) {
  if (!records({&x}) && !records(weights))
    return below_autograd(GROUPMM_OP("ep_dispatch", EpDispatchSig), ks, plan, x, weights);
  auto o = EpDispatchFn::apply(plan, x, weights);
  return {o[0], o[1]};
}

struct EpCombineFn : torch::autograd::Function<EpCombineFn> {
  static at::Tensor forward(AutogradContext* ctx, const PlanPtr& plan, const at::Tensor& y_grouped,
                            const OptTensor& weights, const OptTensor& add) {
    ctx->saved_data["plan"] = plan->lease();
    const bool has_w = present(weights);
    ctx->saved_data["has_w"] = has_w;
    ctx->saved_data["has_add"] = present(add);
    if (has_w) ctx->save_for_backward({*weights, y_grouped});
    const at::AutoDispatchBelowADInplaceOrView guard;
    return GROUPMM_OP("ep_combine", EpCombineSig).call(plan, y_grouped, weights, add);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const PlanPtr plan = ctx->saved_data["plan"].toCustomClass<EpPlan>();
    const bool has_w = ctx->saved_data["has_w"].toBool();
    OptTensor w, yg;
    if (has_w) {
      const auto saved = ctx->get_saved_variables();
      w = saved[0];
      yg = saved[1];
    }
    auto [dyg, dw] = GROUPMM_OP("ep_combine_backward", EpCombineBwdSig).call(plan, grads[0], w, yg);
    return {at::Tensor(), dyg, has_w ? dw : at::Tensor(),
            ctx->saved_data["has_add"].toBool() ? grads[0] : at::Tensor()};
  }
};

at::Tensor ep_combine_autograd(c10::DispatchKeySet ks, const PlanPtr& plan,
                               const at::Tensor& y_grouped, const OptTensor& weights,
                               const OptTensor& add) {
  const bool rec = records({&y_grouped}) || records(weights) || records(add);
  if (!rec)
    return below_autograd(GROUPMM_OP("ep_combine", EpCombineSig), ks, plan, y_grouped, weights,
                          add);
  return EpCombineFn::apply(plan, y_grouped, weights, add);
}

// The plans carry no gradient: their Autograd kernels step below autograd.
PlanPtr ep_dispatch_plan_autograd(c10::DispatchKeySet ks, const GroupPtr& g, const at::Tensor& ids,
                                  int64_t experts, int64_t hidden) {
  return below_autograd(GROUPMM_OP("ep_dispatch_plan", EpPlanSig), ks, g, ids, experts, hidden);
}
PlanPtr ep_capacity_plan_create_autograd(c10::DispatchKeySet ks, const GroupPtr& g,
                                         const at::Tensor& ids, int64_t experts, int64_t hidden,
                                         int64_t rows, int64_t entries, at::ScalarType dtype,
                                         bool zero_tail) {
  return below_autograd(GROUPMM_OP("ep_capacity_plan_create", EpCapCreateSig), ks, g, ids, experts,
                        hidden, rows, entries, dtype, zero_tail);
}
void ep_capacity_plan_autograd(c10::DispatchKeySet ks, const PlanPtr& plan, const at::Tensor& ids) {
  below_autograd(GROUPMM_OP("ep_capacity_plan", EpCapFillSig), ks, plan, ids);
}

void register_ep_impls(Kernels& m) {
  m.impl("ep_dispatch_plan", &ep_dispatch_plan);
  m.impl("ep_capacity_plan_create", &ep_capacity_plan_create);
  m.impl("ep_capacity_plan", &ep_capacity_plan);
  m.impl("ep_dispatch", &ep_dispatch);
  m.impl("ep_dispatch_backward", &ep_dispatch_backward);
  m.impl("ep_combine", &ep_combine);
  m.impl("ep_combine_backward", &ep_combine_backward);
}

}  // namespace

// The classes and the EP ops' schemas (schema.cpp lists every other op): a fragment, so that each
// class is registered before the ops that name it are parsed.
TORCH_LIBRARY_FRAGMENT(groupmm, m) {
  m.class_<EpGroup>("EpGroup")
      .def(torch::init<std::string, std::string, std::optional<at::Tensor>>())
      .def("rank", &EpGroup::rank)
      .def("size", &EpGroup::size)
      .def("backend", &EpGroup::backend)
      .def("device", &EpGroup::device)
      .def("describe", &EpGroup::describe);
  m.class_<EpPlan>("EpPlan")
      .def("rows", &EpPlan::rows)
      .def("tokens", &EpPlan::tokens)
      .def("local_experts", &EpPlan::local_experts)
      .def("mode", &EpPlan::mode)
      .def("splits", &EpPlan::splits)
      .def("splits_at_most", &EpPlan::splits_at_most)
      .def("in_use", &EpPlan::in_use)
      .def("last_overflow", &EpPlan::last_overflow)
      .def("describe", &EpPlan::describe);
#define GROUPMM_EP_GROUP "__torch__.torch.classes.groupmm.EpGroup"
  // A new NCCL unique id for a CUDA EpGroup (no tensor argument: a catch-all kernel).
  m.def("ep_nccl_unique_id() -> Tensor", &ep_nccl_unique_id);
#define GROUPMM_EP_PLAN "__torch__.torch.classes.groupmm.EpPlan"
  // plans (ep.hpp): throughput (a count exchange, host reads: not graph safe); capacity (create
  // once per T, allocating; fill every step, graph safe)
  m.def("ep_dispatch_plan(" GROUPMM_EP_GROUP
        " group, Tensor expert_ids, int experts, int hidden) -> " GROUPMM_EP_PLAN);
  m.def("ep_capacity_plan_create(" GROUPMM_EP_GROUP
        " group, Tensor expert_ids, int experts, int hidden, int rows_per_peer, "
        "int entries_per_peer, ScalarType row_dtype, bool zero_tail=True) -> " GROUPMM_EP_PLAN);
  m.def("ep_capacity_plan(" GROUPMM_EP_PLAN " plan, Tensor expert_ids) -> ()");
  // movers (collectives) and their backwards
  m.def("ep_dispatch(" GROUPMM_EP_PLAN
        " plan, Tensor x, Tensor? weights=None) -> (Tensor x_grouped, Tensor probs)");
  m.def("ep_dispatch_backward(" GROUPMM_EP_PLAN
        " plan, Tensor d_x_grouped, Tensor? d_probs=None) -> (Tensor dx, Tensor d_weights)");
  m.def("ep_combine(" GROUPMM_EP_PLAN
        " plan, Tensor y_grouped, Tensor? weights=None, Tensor? add=None) -> Tensor");
  m.def("ep_combine_backward(" GROUPMM_EP_PLAN
        " plan, Tensor dy, Tensor? weights=None, Tensor? y_grouped=None) -> "
        "(Tensor d_y_grouped, Tensor d_weights)");
#undef GROUPMM_EP_GROUP
#undef GROUPMM_EP_PLAN
}

GROUPMM_TORCH_CPU_AND_CUDA(register_ep_impls)

TORCH_LIBRARY_IMPL(groupmm, Autograd, m) {
  m.impl("ep_dispatch_plan", TORCH_FN(ep_dispatch_plan_autograd));
  m.impl("ep_capacity_plan_create", TORCH_FN(ep_capacity_plan_create_autograd));
  m.impl("ep_capacity_plan", TORCH_FN(ep_capacity_plan_autograd));
  m.impl("ep_dispatch", TORCH_FN(ep_dispatch_autograd));
  m.impl("ep_combine", TORCH_FN(ep_combine_autograd));
}

}  // namespace groupmm_torch
