// ops_autograd_moe.cpp: the autograd formulas of the MoE block's ops (router_logits, router,
// permute, unpermute, gate_up_swiglu), registered in C++ for the Autograd key as ops_autograd.cpp's
// (its header says how: a fast path below autograd when no graph is recorded, else a
// torch::autograd::Function whose backward calls the backward ops through the dispatcher).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <string>

#include "autograd.hpp"

namespace groupmm_torch {
namespace {

using WSwigluBwdSig = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                                 const OptTensor&);
using LogitsSig = Tensor(const Tensor&, const Tensor&, const OptTensor&);
using LogitsBwdSig = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&);
using Router5 = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>;
using RouterSig = Router5(const Tensor&, const OptTensor&, int64_t, c10::string_view, int64_t,
                          int64_t, bool, double, double, double);
using RouterBwdSig = Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                            c10::string_view, int64_t, int64_t, bool, double, double, double);
using PermuteSig = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                              const Tensor&, const Tensor&, int64_t, int64_t,
                                              const OptTensor&);
using UnpermuteSig = Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                            const Tensor&, int64_t, int64_t, const OptTensor&, const OptTensor&,
                            const OptTensor&, const OptTensor&);
using UnpermuteBwdSig = Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                               const Tensor&, int64_t, int64_t);

// ---- router -------------------------------------------------------------------------------------

// d bias = the fp32 column sums of d_logits, in the bias's dtype (what autograd gave the add of a
// promoted bias before the op took it).
struct RouterLogits : torch::autograd::Function<RouterLogits> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& w,
                        const OptTensor& bias) {
    ctx->save_for_backward({x, w});
    if (bias.has_value() && bias->defined())
      ctx->saved_data["bias_dtype"] = static_cast<int64_t>(bias->scalar_type());
    const at::AutoDispatchBelowADInplaceOrView guard;
    return GROUPMM_OP("router_logits", LogitsSig).call(x, w, bias);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return {Tensor(), Tensor(), Tensor()};
    const auto saved = ctx->get_saved_variables();
    auto [dx, dw] =
        GROUPMM_OP("router_logits_backward", LogitsBwdSig).call(grads[0], saved[0], saved[1]);
    // needs_input_grad counts the defined tensor arguments only (the bias's edge is 2 when given);
    // the returned list is by argument position.
    Tensor db;
    if (ctx->saved_data.count("bias_dtype") != 0 && ctx->needs_input_grad(2))
      db = grads[0].sum(0).to(static_cast<at::ScalarType>(ctx->saved_data["bias_dtype"].toInt()));
    return {ctx->needs_input_grad(0) ? dx : Tensor(), ctx->needs_input_grad(1) ? dw : Tensor(), db};
  }
};

Tensor router_logits_autograd(c10::DispatchKeySet ks, const Tensor& x, const Tensor& w,
                              const OptTensor& bias) {
  if (!records({&x, &w}) && !records(bias))
    return below_autograd(GROUPMM_OP("router_logits", LogitsSig), ks, x, w, bias);
  return RouterLogits::apply(x, w, bias);
}

struct Router : torch::autograd::Function<Router> {
  static variable_list forward(AutogradContext* ctx, const Tensor& logits,
                               const OptTensor& expert_bias, int64_t topk, c10::string_view score,
                               int64_t n_group, int64_t topk_group, bool renormalize,
                               double scaling_factor, double aux_loss_coeff, double z_loss_coeff) {
    Router5 out;
    {
      const at::AutoDispatchBelowADInplaceOrView guard;
      out = GROUPMM_OP("router", RouterSig)
                .call(logits, expert_bias, topk, score, n_group, topk_group, renormalize,
                      scaling_factor, aux_loss_coeff, z_loss_coeff);
    }
    auto& [ids, weights, counts, aux, z] = out;
    ctx->save_for_backward({logits, ids, counts});
    ctx->mark_non_differentiable({ids, counts});
    // The backward handles an unused output itself (no zero tensors made for it).
    ctx->set_materialize_grads(false);
    auto& d = ctx->saved_data;
    d["score"] = std::string(score);
    d["n_group"] = n_group;
    d["topk_group"] = topk_group;
    d["renormalize"] = renormalize;
    d["scaling_factor"] = scaling_factor;
    d["aux"] = aux_loss_coeff;
    d["z"] = z_loss_coeff;
    return {ids, weights, counts, aux, z};
  }
  // The core differentiates sum(d_weights * weights) + aux_loss + z_loss, the losses with
  // gradient 1; each loss term is taken on its own here and scaled by its upstream gradient.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &logits = saved[0], &ids = saved[1], &counts = saved[2];
    auto& d = ctx->saved_data;
    const std::string score = d["score"].toStringRef();
    const int64_t n_group = d["n_group"].toInt(), topk_group = d["topk_group"].toInt();
    const bool renormalize = d["renormalize"].toBool();
    const double scaling = d["scaling_factor"].toDouble();
    const double aux_c = d["aux"].toDouble(), z_c = d["z"].toDouble();
    const Tensor &d_weights = grads[1], &d_aux = grads[3], &d_z = grads[4];
    const auto& bwd = GROUPMM_OP("router_backward", RouterBwdSig);
    Tensor zero_d_weights;  // made once, when a term needs it
    auto zero = [&]() -> const Tensor& {
      if (!zero_d_weights.defined()) zero_d_weights = at::zeros(ids.sizes(), logits.options());
      return zero_d_weights;
    };
    Tensor d_logits = bwd.call(logits, ids, counts, d_weights.defined() ? d_weights : zero(), score,
                               n_group, topk_group, renormalize, scaling, 0.0, 0.0);
    if (aux_c != 0.0 && d_aux.defined())
      d_logits = d_logits.add(d_aux.mul(bwd.call(logits, ids, counts, zero(), score, n_group,
                                                 topk_group, renormalize, scaling, aux_c, 0.0)));
    if (z_c != 0.0 && d_z.defined())
      d_logits = d_logits.add(d_z.mul(bwd.call(logits, ids, counts, zero(), score, n_group,
                                               topk_group, renormalize, scaling, 0.0, z_c)));
    variable_list out(10);
    out[0] = d_logits;
    return out;
  }
};

Router5 router_autograd(c10::DispatchKeySet ks, const Tensor& logits, const OptTensor& expert_bias,
                        int64_t topk, c10::string_view score, int64_t n_group, int64_t topk_group,
                        bool renormalize, double scaling_factor, double aux_loss_coeff,
                        double z_loss_coeff) {
  if (!records({&logits}))
    return below_autograd(GROUPMM_OP("router", RouterSig), ks, logits, expert_bias, topk, score,
                          n_group, topk_group, renormalize, scaling_factor, aux_loss_coeff,
                          z_loss_coeff);
  auto o = Router::apply(logits, expert_bias, topk, score, n_group, topk_group, renormalize,
                         scaling_factor, aux_loss_coeff, z_loss_coeff);
  return {o[0], o[1], o[2], o[3], o[4]};
}

// ---- permute, unpermute -------------------------------------------------------------------------

// The permute map's tensors (dest_row, row_start, kept, splits) and sizes, kept for backward.
void save_map(AutogradContext* ctx, const Tensor& dest_row, const Tensor& row_start,
              const Tensor& kept, const Tensor& splits, int64_t align, int64_t capacity,
              bool has_extra) {
  ctx->save_for_backward({dest_row, row_start, kept, splits});
  ctx->saved_data["align"] = align;
  ctx->saved_data["capacity"] = capacity;
  ctx->saved_data["has_extra"] = has_extra;
}

struct Permute : torch::autograd::Function<Permute> {
  static variable_list forward(AutogradContext* ctx, const Tensor& x, const Tensor& dest_row,
                               const Tensor& row_start, const Tensor& kept, const Tensor& splits,
                               int64_t align, int64_t capacity, const OptTensor& weights) {
    const bool has_w = weights.has_value() && weights->defined();
    save_map(ctx, dest_row, row_start, kept, splits, align, capacity, has_w);
    const at::AutoDispatchBelowADInplaceOrView guard;
    auto [xp, probs] = GROUPMM_OP("permute", PermuteSig)
                           .call(x, dest_row, row_start, kept, splits, align, capacity, weights);
    if (!has_w) ctx->mark_non_differentiable({probs});
    return {xp, probs};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto m = ctx->get_saved_variables();
    const int64_t align = ctx->saved_data["align"].toInt();
    const int64_t capacity = ctx->saved_data["capacity"].toInt();
    const bool has_w = ctx->saved_data["has_extra"].toBool();
    auto [dx, dw] = GROUPMM_OP("permute_backward", PermuteSig)
                        .call(grads[0], m[0], m[1], m[2], m[3], align, capacity,
                              has_w ? OptTensor(grads[1]) : std::nullopt);
    variable_list out(8);
    out[0] = dx;
    if (has_w) out[7] = dw;
    return out;
  }
};

std::tuple<Tensor, Tensor> permute_autograd(c10::DispatchKeySet ks, const Tensor& x,
                                            const Tensor& dest_row, const Tensor& row_start,
                                            const Tensor& kept, const Tensor& splits, int64_t align,
                                            int64_t capacity, const OptTensor& weights) {
  if (!records({&x}) && !records(weights))
    return below_autograd(GROUPMM_OP("permute", PermuteSig), ks, x, dest_row, row_start, kept,
                          splits, align, capacity, weights);
  auto o = Permute::apply(x, dest_row, row_start, kept, splits, align, capacity, weights);
  return {o[0], o[1]};
}

bool present(const OptTensor& t) {
  return t.has_value() && t->defined();
}

struct Unpermute : torch::autograd::Function<Unpermute> {
  static Tensor forward(AutogradContext* ctx, const Tensor& y_perm, const Tensor& dest_row,
                        const Tensor& row_start, const Tensor& kept, const Tensor& splits,
                        int64_t align, int64_t capacity, const OptTensor& add,
                        const OptTensor& bias, const OptTensor& expert_ids,
                        const OptTensor& weights) {
    const bool routed = present(bias);
    if (routed) {
      ctx->save_for_backward({dest_row, row_start, kept, splits, *bias, *expert_ids, *weights});
      ctx->saved_data["align"] = align;
      ctx->saved_data["capacity"] = capacity;
      ctx->saved_data["has_extra"] = present(add);
    } else {
      save_map(ctx, dest_row, row_start, kept, splits, align, capacity, present(add));
    }
    ctx->saved_data["routed"] = routed;
    const at::AutoDispatchBelowADInplaceOrView guard;
    return GROUPMM_OP("unpermute", UnpermuteSig)
        .call(y_perm, dest_row, row_start, kept, splits, align, capacity, add, bias, expert_ids,
              weights);
  }
  // The routed bias's gradients in fp32 from dense products, so that no sum runs in an
  // unspecified order: d bias = W^T dy with W [T, E] the kept pairs' weights (a token's ids are
  // distinct, as the router's: no two scattered adds meet), d weights[t, j] = <dy[t],
  // bias[e_tj]> for a kept pair, else 0.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(11);
    const Tensor& dy = grads[0];
    if (!dy.defined()) return out;
    const auto m = ctx->get_saved_variables();
    out[0] = GROUPMM_OP("unpermute_backward", UnpermuteBwdSig)
                 .call(dy, m[0], m[1], m[2], m[3], ctx->saved_data["align"].toInt(),
                       ctx->saved_data["capacity"].toInt());
    if (ctx->saved_data["has_extra"].toBool()) out[7] = dy;
    if (!ctx->saved_data["routed"].toBool()) return out;
    const Tensor &bias = m[4], &ids = m[5], &w = m[6];
    const Tensor keep = m[0].ge(0), g = dy.to(at::kFloat);
    // needs_input_grad counts the defined tensor arguments only (y_perm, the map's four, add when
    // given, bias, expert_ids, weights); the returned list is by argument position.
    const size_t bias_edge = ctx->saved_data["has_extra"].toBool() ? 6 : 5;
    if (ctx->needs_input_grad(bias_edge)) {
      const Tensor dense =
          at::zeros({ids.size(0), bias.size(0)}, g.options())
              .scatter_add(1, ids.to(at::kLong), w.masked_fill(keep.logical_not(), 0));
      out[8] = dense.t().mm(g).to(bias.scalar_type());
    }
    if (ctx->needs_input_grad(bias_edge + 2)) {
      const Tensor rows = bias.index_select(0, ids.flatten().to(at::kLong))
                              .view({ids.size(0), ids.size(1), bias.size(1)})
                              .to(at::kFloat);
      out[10] = at::bmm(rows, g.unsqueeze(-1)).squeeze(-1).masked_fill(keep.logical_not(), 0);
    }
    return out;
  }
};

Tensor unpermute_autograd(c10::DispatchKeySet ks, const Tensor& y_perm, const Tensor& dest_row,
                          const Tensor& row_start, const Tensor& kept, const Tensor& splits,
                          int64_t align, int64_t capacity, const OptTensor& add,
                          const OptTensor& bias, const OptTensor& expert_ids,
                          const OptTensor& weights) {
  if (!records({&y_perm}) && !records(add) && !records(bias) && !records(weights))
    return below_autograd(GROUPMM_OP("unpermute", UnpermuteSig), ks, y_perm, dest_row, row_start,
                          kept, splits, align, capacity, add, bias, expert_ids, weights);
  return Unpermute::apply(y_perm, dest_row, row_start, kept, splits, align, capacity, add, bias,
                          expert_ids, weights);
}

// ---- gate_up_swiglu -----------------------------------------------------------------------------

// The fused gate_up projection (permute -> grouped_mm -> weighted_swiglu as one kernel-layer op).
// Its backward is the composition's, op for op, so the gradients are bit for bit those of the
// separate ops: weighted_swiglu_backward from the pre-activation and probs (both kept from
// forward), the gate_up dgrad into the permuted rows and permute's backward (the k-way sum into x's
// rows, d probs gathered into d weights), and the wgrad over the permuted rows of x, gathered here
// with permute: forward made no permuted copy, and keeping one would undo what the fusion saves.
// The pre-activation is what backward reads, so a call that records a graph must ask forward to
// write it (pre_activation=True); recomputing it in backward would cost a second gate_up GEMM.
using GateUpSwigluSig = Tensors3(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                 const Tensor&, int64_t, int64_t, const Tensor&, const Tensor&,
                                 bool, c10::string_view);

struct GateUpSwiglu : torch::autograd::Function<GateUpSwiglu> {
  static variable_list forward(AutogradContext* ctx, const Tensor& x, const Tensor& dest_row,
                               const Tensor& row_start, const Tensor& kept, const Tensor& splits,
                               int64_t align, int64_t capacity, const Tensor& weights,
                               const Tensor& w, bool pre_activation, c10::string_view config) {
    Tensors3 out;
    {
      const at::AutoDispatchBelowADInplaceOrView guard;
      out = GROUPMM_OP("gate_up_swiglu", GateUpSwigluSig)
                .call(x, dest_row, row_start, kept, splits, align, capacity, weights, w,
                      pre_activation, config);
    }
    auto& [h, gu, probs] = out;
    ctx->save_for_backward({x, w, gu, probs, dest_row, row_start, kept, splits});
    ctx->saved_data["align"] = align;
    ctx->saved_data["capacity"] = capacity;
    // An output without a gradient stays undefined (no zeros added to the others' sums).
    ctx->set_materialize_grads(false);
    return {h, gu, probs};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(11);
    const auto s = ctx->get_saved_variables();
    const Tensor &x = s[0], &w = s[1], &gu = s[2], &probs = s[3];
    const Tensor &dest_row = s[4], &row_start = s[5], &kept = s[6], &splits = s[7];
    const int64_t align = ctx->saved_data["align"].toInt();
    const int64_t capacity = ctx->saved_data["capacity"].toInt();
    Tensor dgu, dprobs;
    if (grads[0].defined())
      std::tie(dgu, dprobs) = GROUPMM_OP("weighted_swiglu_backward", WSwigluBwdSig)
                                  .call(grads[0], gu, probs, std::nullopt);
    // gate_up and probs used past the activation too: their gradients add, as autograd would add
    // them at the composition's intermediate tensors.
    if (grads[1].defined()) dgu = dgu.defined() ? dgu.add(grads[1]) : grads[1];
    if (grads[2].defined()) dprobs = dprobs.defined() ? dprobs.add(grads[2]) : grads[2];
    // needs_input_grad counts the tensor arguments only (weights is the 6th, w the 7th); the
    // returned list has a slot for every argument.
    const bool need_x = ctx->needs_input_grad(0), need_weights = ctx->needs_input_grad(5);
    const bool need_w = ctx->needs_input_grad(6);
    if (need_x || (need_weights && dprobs.defined())) {
      // permute's backward takes the permuted rows' gradient with d probs; with x not needing one
      // (d weights only) zeros stand in for it, cheaper than the dgrad GEMM they replace.
      Tensor dxp = need_x && dgu.defined() ? GROUPMM_OP("grouped_mm_dgrad", MmGradSig)
                                                 .call(dgu, w, splits, std::nullopt, "exact", 0)
                                           : at::zeros({gu.size(0), x.size(1)}, x.options());
      auto [dx, dweights] =
          GROUPMM_OP("permute_backward", PermuteSig)
              .call(dxp, dest_row, row_start, kept, splits, align, capacity,
                    need_weights && dprobs.defined() ? OptTensor(dprobs) : std::nullopt);
      if (need_x) out[0] = dx;
      if (need_weights && dprobs.defined()) out[7] = dweights;
    }
    if (need_w && dgu.defined()) {
      const Tensor xp = std::get<0>(
          GROUPMM_OP("permute", PermuteSig)
              .call(x, dest_row, row_start, kept, splits, align, capacity, std::nullopt));
      out[8] =
          GROUPMM_OP("grouped_mm_wgrad", MmGradSig).call(dgu, xp, splits, std::nullopt, "exact", 0);
    }
    return out;
  }
};

Tensors3 gate_up_swiglu_autograd(c10::DispatchKeySet ks, const Tensor& x, const Tensor& dest_row,
                                 const Tensor& row_start, const Tensor& kept, const Tensor& splits,
                                 int64_t align, int64_t capacity, const Tensor& weights,
                                 const Tensor& w, bool pre_activation, c10::string_view config) {
  if (!records({&x, &weights, &w}))
    return below_autograd(GROUPMM_OP("gate_up_swiglu", GateUpSwigluSig), ks, x, dest_row, row_start,
                          kept, splits, align, capacity, weights, w, pre_activation, config);
  TORCH_CHECK(pre_activation,
              "groupmm.gate_up_swiglu: pre_activation=False, but x, weights or w requires grad: "
              "the backward reads the pre-activation (the gate_up output), so pass "
              "pre_activation=True to train through the op (or run it under torch.no_grad() / "
              "torch.inference_mode() for inference)");
  auto o = GateUpSwiglu::apply(x, dest_row, row_start, kept, splits, align, capacity, weights, w,
                               pre_activation, config);
  return {o[0], o[1], o[2]};
}

}  // namespace

TORCH_LIBRARY_IMPL(groupmm, Autograd, m) {
  m.impl("gate_up_swiglu", TORCH_FN(gate_up_swiglu_autograd));
  m.impl("router_logits", TORCH_FN(router_logits_autograd));
  m.impl("router", TORCH_FN(router_autograd));
  m.impl("permute", TORCH_FN(permute_autograd));
  m.impl("unpermute", TORCH_FN(unpermute_autograd));
}

}  // namespace groupmm_torch
