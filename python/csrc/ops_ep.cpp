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
// Two custom classes carry the state the ops share (ep_classes.hpp), registered here beside the
// ops that take them (the schema parser needs a class registered before an op names it):
//   torch.classes.groupmm.EpGroup(group_name, device, nccl_id=None): the transport of one process
//     group on one device (group_name: ProcessGroup.group_name, resolved with
//     c10d::resolve_process_group; nccl_id: the unique id, for a CUDA device only);
//   torch.classes.groupmm.EpPlan: an ep::EpPlan (throughput or capacity), made by the plan ops.
// The movers (ep_dispatch, ep_combine) have autograd formulas (ops_ep_autograd.cpp: their
// backward ops, which are collectives too: every rank's backward must run them, as every rank's
// forward ran the movers).
//
// Streams: a groupmm op runs on torch's current stream (binding.hpp's Call). Over gloo the
// collectives block; over NCCL the core's transport enqueues them on the op's stream, between the
// groupmm kernels, as in the C++ layers.
#include <ATen/ATen.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <cstring>
#include <memory>
#include <string>

#include "binding.hpp"
#include "ep_classes.hpp"

namespace groupmm_torch {
namespace {

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
  register_ep_autograd(m);
}

}  // namespace groupmm_torch
