// autograd.hpp: what the Autograd kernels of the ops share (ops_autograd*.cpp,
// ops_ep_autograd.cpp): the type names, the typed dispatcher handle of an op, whether a call
// records a graph node, and the fast path below autograd.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>

#include <initializer_list>
#include <optional>
#include <tuple>
#include <utility>

namespace groupmm_torch {

// The names the formulas share.
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Tensor = at::Tensor;
using OptTensor = std::optional<at::Tensor>;
using OptDtype = std::optional<at::ScalarType>;
using Tensors2 = std::tuple<Tensor, Tensor>;
using Tensors3 = std::tuple<Tensor, Tensor, Tensor>;
using Tensors4 = std::tuple<Tensor, Tensor, Tensor, Tensor>;
using Tensors5 = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>;
// grouped_mm_dgrad / grouped_mm_wgrad (a, b, splits, out_dtype, splits_total, expected_rows)
using MmGradSig = Tensor(const Tensor&, const Tensor&, const Tensor&, OptDtype, c10::string_view,
                         int64_t);

// The typed handle of groupmm::<name> (looked up once per call site).
#define GROUPMM_OP(name, ...)                                                                      \
  ([]() -> const c10::TypedOperatorHandle<__VA_ARGS__>& {                                          \
    static const auto h =                                                                          \
        c10::Dispatcher::singleton().findSchemaOrThrow("groupmm::" name, "").typed<__VA_ARGS__>(); \
    return h;                                                                                      \
  }())

// Whether a graph node is to be recorded (what Function::apply decides, decided up front so the
// common inference / no_grad call skips building one).
inline bool records(std::initializer_list<const at::Tensor*> ts) {
  if (!at::GradMode::is_enabled()) return false;
  for (const at::Tensor* t : ts)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}
inline bool records(const std::optional<at::Tensor>& t) {
  return t.has_value() && records({&*t});
}

// The fast path: the op below autograd (the guard also keeps the kernel's own at:: calls there).
template <class Sig, class... Args>
auto below_autograd(const c10::TypedOperatorHandle<Sig>& op, c10::DispatchKeySet ks,
                    Args&&... args) {
  const at::AutoDispatchBelowADInplaceOrView guard;
  return op.redispatch(ks & c10::after_ADInplaceOrView_keyset, std::forward<Args>(args)...);
}

}  // namespace groupmm_torch
