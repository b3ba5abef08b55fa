// ops_ep_autograd.cpp: the autograd formulas of the expert-parallel movers (ep_dispatch,
// ep_combine: their backward ops, collectives too) and the Autograd kernels of the plans, which
// carry no gradient; the ops themselves are in ops_ep.cpp, which registers these too.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "autograd.hpp"
#include "ep_classes.hpp"

namespace groupmm_torch {
namespace {

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

}  // namespace

// Called by ops_ep.cpp's Autograd registration, which runs after the custom classes are
// registered in that file (a kernel's schema, inferred from its C++ signature, names them; a
// registration of its own here could run first).
void register_ep_autograd(torch::Library& m) {
  m.impl("ep_dispatch_plan", TORCH_FN(ep_dispatch_plan_autograd));
  m.impl("ep_capacity_plan_create", TORCH_FN(ep_capacity_plan_create_autograd));
  m.impl("ep_capacity_plan", TORCH_FN(ep_capacity_plan_autograd));
  m.impl("ep_dispatch", TORCH_FN(ep_dispatch_autograd));
  m.impl("ep_combine", TORCH_FN(ep_combine_autograd));
}

}  // namespace groupmm_torch
