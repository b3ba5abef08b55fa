// ops_autograd.cpp: the autograd formulas of the differentiable ops (grouped_mm, swiglu,
// weighted_swiglu (and _ex); the MoE block's router, permute, unpermute and gate_up_swiglu are in
// ops_autograd_moe.cpp), registered in C++ for the Autograd key, and the Autograd kernels of the
// non-differentiable ones (quantize, dequantize, plans, offsets).
//
// Each kernel takes the fast path when no graph is recorded (grad mode off, or no input that
// requires grad): one redispatch below autograd to the CPU / CUDA kernel (or to the fake kernel
// under torch.compile's tracing), with no Python and no graph node. Otherwise a
// torch::autograd::Function records a node whose backward calls the existing backward ops
// (grouped_mm_dgrad, router_backward, ...) through the dispatcher, so the joint graph that
// AOTAutograd traces and the CUDA graphs captured around a step see those ops as they are.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <string>

#include "autograd.hpp"

namespace groupmm_torch {
namespace {

using MmSig = Tensor(const Tensor&, const Tensor&, const Tensor&, const OptTensor&, OptDtype,
                     c10::string_view, int64_t);
using DbiasSig = Tensor(const Tensor&, const Tensor&, OptDtype, c10::string_view);
using SwigluSig = Tensor(const Tensor&);
using SwigluBwdSig = Tensor(const Tensor&, const Tensor&);
using WSwigluSig = Tensor(const Tensor&, const Tensor&, const OptTensor&);
using WSwigluBwdSig = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                                 const OptTensor&);
// ---- grouped_mm ---------------------------------------------------------------------------------

struct GroupedMm : torch::autograd::Function<GroupedMm> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& w,
                        const Tensor& splits, const OptTensor& bias, OptDtype out_dtype,
                        c10::string_view splits_total, int64_t expected_rows) {
    ctx->save_for_backward({x, w, splits});
    const bool has_bias = bias.has_value() && bias->defined();
    ctx->saved_data["bias_dtype"] = has_bias ? static_cast<int64_t>(bias->scalar_type()) : -1;
    ctx->saved_data["splits_total"] = std::string(splits_total);
    ctx->saved_data["expected_rows"] = expected_rows;
    const at::AutoDispatchBelowADInplaceOrView guard;
    return GROUPMM_OP("grouped_mm", MmSig)
        .call(x, w, splits, bias, out_dtype, splits_total, expected_rows);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &x = saved[0], &w = saved[1], &splits = saved[2];
    Tensor dy = grads[0];
    const int64_t bias_dtype = ctx->saved_data["bias_dtype"].toInt();
    // at_most: every pass leaves the rows past sum(splits) alone (dx's are not written). dgrad's
    // rows and wgrad's reduction rows are x's rows: the same expected rows (as nn::GroupedLinear).
    const std::string total = ctx->saved_data["splits_total"].toStringRef();
    const int64_t expected = ctx->saved_data["expected_rows"].toInt();
    Tensor dx, dw, db;
    if (!dy.defined()) return {dx, dw, Tensor(), db, Tensor(), Tensor(), Tensor()};
    // The bias gradient sums the upstream gradient as it comes (fp32 with out_dtype=float32);
    // the GEMMs take both operands in one dtype, so an fp32 dy is rounded to x's for them.
    if (bias_dtype >= 0 && ctx->needs_input_grad(3))
      db = GROUPMM_OP("group_dbias", DbiasSig)
               .call(dy, splits, static_cast<at::ScalarType>(bias_dtype), total);
    if (dy.scalar_type() != x.scalar_type()) dy = dy.to(x.scalar_type());
    if (ctx->needs_input_grad(0))
      dx = GROUPMM_OP("grouped_mm_dgrad", MmGradSig)
               .call(dy, w, splits, std::nullopt, total, expected);
    if (ctx->needs_input_grad(1))
      dw = GROUPMM_OP("grouped_mm_wgrad", MmGradSig)
               .call(dy, x, splits, std::nullopt, total, expected);
    return {dx, dw, Tensor(), db, Tensor(), Tensor(), Tensor()};
  }
};

Tensor grouped_mm_autograd(c10::DispatchKeySet ks, const Tensor& x, const Tensor& w,
                           const Tensor& splits, const OptTensor& bias, OptDtype out_dtype,
                           c10::string_view splits_total, int64_t expected_rows) {
  if (!records({&x, &w}) && !records(bias))
    return below_autograd(GROUPMM_OP("grouped_mm", MmSig), ks, x, w, splits, bias, out_dtype,
                          splits_total, expected_rows);
  return GroupedMm::apply(x, w, splits, bias, out_dtype, splits_total, expected_rows);
}

// ---- swiglu, weighted_swiglu --------------------------------------------------------------------

struct Swiglu : torch::autograd::Function<Swiglu> {
  static Tensor forward(AutogradContext* ctx, const Tensor& gate_up) {
    ctx->save_for_backward({gate_up});
    const at::AutoDispatchBelowADInplaceOrView guard;
    return GROUPMM_OP("swiglu", SwigluSig).call(gate_up);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return {Tensor()};
    const auto saved = ctx->get_saved_variables();
    return {GROUPMM_OP("swiglu_backward", SwigluBwdSig).call(grads[0], saved[0])};
  }
};

Tensor swiglu_autograd(c10::DispatchKeySet ks, const Tensor& gate_up) {
  if (!records({&gate_up})) return below_autograd(GROUPMM_OP("swiglu", SwigluSig), ks, gate_up);
  return Swiglu::apply(gate_up);
}

struct WeightedSwiglu : torch::autograd::Function<WeightedSwiglu> {
  static Tensor forward(AutogradContext* ctx, const Tensor& gate_up, const Tensor& prob,
                        const OptTensor& splits) {
    const bool has_splits = splits.has_value() && splits->defined();
    ctx->save_for_backward({gate_up, prob, has_splits ? *splits : Tensor()});
    const at::AutoDispatchBelowADInplaceOrView guard;
    return GROUPMM_OP("weighted_swiglu", WSwigluSig).call(gate_up, prob, splits);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return {Tensor(), Tensor(), Tensor()};
    const auto saved = ctx->get_saved_variables();
    const OptTensor splits = saved[2].defined() ? OptTensor(saved[2]) : std::nullopt;
    auto [dgu, dprob] = GROUPMM_OP("weighted_swiglu_backward", WSwigluBwdSig)
                            .call(grads[0], saved[0], saved[1], splits);
    return {dgu, dprob, Tensor()};
  }
};

Tensor weighted_swiglu_autograd(c10::DispatchKeySet ks, const Tensor& gate_up, const Tensor& prob,
                                const OptTensor& splits) {
  if (!records({&gate_up, &prob}))
    return below_autograd(GROUPMM_OP("weighted_swiglu", WSwigluSig), ks, gate_up, prob, splits);
  return WeightedSwiglu::apply(gate_up, prob, splits);
}

using WSwigluExSig = Tensor(const Tensor&, const Tensor&, double, std::optional<double>, double,
                            bool);
using WSwigluExBwdSig = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                                   double, std::optional<double>, double, bool);

struct WeightedSwigluEx : torch::autograd::Function<WeightedSwigluEx> {
  static Tensor forward(AutogradContext* ctx, const Tensor& gate_up, const Tensor& prob,
                        double alpha, std::optional<double> limit, double up_offset,
                        bool interleaved) {
    ctx->save_for_backward({gate_up, prob});
    auto& d = ctx->saved_data;
    d["alpha"] = alpha;
    d["limit"] = limit ? c10::IValue(*limit) : c10::IValue();
    d["up_offset"] = up_offset;
    d["interleaved"] = interleaved;
    const at::AutoDispatchBelowADInplaceOrView guard;
    return GROUPMM_OP("weighted_swiglu_ex", WSwigluExSig)
        .call(gate_up, prob, alpha, limit, up_offset, interleaved);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(6);
    if (!grads[0].defined()) return out;
    const auto saved = ctx->get_saved_variables();
    auto& d = ctx->saved_data;
    const std::optional<double> limit =
        d["limit"].isNone() ? std::nullopt : std::optional<double>(d["limit"].toDouble());
    auto [dgu, dprob] = GROUPMM_OP("weighted_swiglu_ex_backward", WSwigluExBwdSig)
                            .call(grads[0], saved[0], saved[1], d["alpha"].toDouble(), limit,
                                  d["up_offset"].toDouble(), d["interleaved"].toBool());
    out[0] = dgu;
    out[1] = dprob;
    return out;
  }
};

Tensor weighted_swiglu_ex_autograd(c10::DispatchKeySet ks, const Tensor& gate_up,
                                   const Tensor& prob, double alpha, std::optional<double> limit,
                                   double up_offset, bool interleaved) {
  if (!records({&gate_up, &prob}))
    return below_autograd(GROUPMM_OP("weighted_swiglu_ex", WSwigluExSig), ks, gate_up, prob, alpha,
                          limit, up_offset, interleaved);
  return WeightedSwigluEx::apply(gate_up, prob, alpha, limit, up_offset, interleaved);
}

// ---- the non-differentiable ops --------------------------------------------------------------

// Quantized tensors, plans and offsets carry no gradient. Their Autograd kernel only steps below
// autograd (torch's rule for a non-differentiable op): without one, every call ran the
// dispatcher's boxed autograd fallback, the arguments and outputs boxed into IValues (host time of
// each call). Outputs never require grad (fp8 / e8m0 / integer data, and scales of a constant).
template <const char* kName, class Sig>
struct NonDifferentiable;
template <const char* kName, class R, class... A>
struct NonDifferentiable<kName, R(A...)> {
  static R call(c10::DispatchKeySet ks, A... args) {
    static const auto op =
        c10::Dispatcher::singleton().findSchemaOrThrow(kName, "").template typed<R(A...)>();
    return below_autograd(op, ks, std::forward<A>(args)...);
  }
};

using QuantizeSig = Tensors5(const Tensor&, const OptTensor&, c10::string_view, OptDtype,
                             c10::string_view, c10::string_view, bool, bool, c10::string_view);
using DequantizeSig = Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                             const Tensor&, const OptTensor&, c10::ArrayRef<int64_t>,
                             c10::string_view, OptDtype, c10::string_view, bool, bool, OptDtype);
using QuantizeW4Sig = Tensors3(const Tensor&, c10::string_view, c10::string_view);
using CheckpointSig = Tensors2(const Tensor&, const Tensor&, c10::string_view);
using OffsetsSig = Tensors2(const Tensor&);
using PermutePlanSig = Tensors4(const Tensor&, int64_t, int64_t, int64_t);

constexpr char kGroupQuantize[] = "groupmm::group_quantize";
constexpr char kGroupDequantize[] = "groupmm::group_dequantize";
constexpr char kGroupQuantizeW4[] = "groupmm::group_quantize_w4";
constexpr char kImportMxfp4[] = "groupmm::import_mxfp4_weights";
constexpr char kExportMxfp4[] = "groupmm::export_mxfp4_weights";
constexpr char kGroupOffsets[] = "groupmm::group_offsets";
constexpr char kPermutePlan[] = "groupmm::permute_plan";

}  // namespace

TORCH_LIBRARY_IMPL(groupmm, Autograd, m) {
  m.impl("group_quantize", TORCH_FN((NonDifferentiable<kGroupQuantize, QuantizeSig>::call)));
  m.impl("group_dequantize", TORCH_FN((NonDifferentiable<kGroupDequantize, DequantizeSig>::call)));
  m.impl("group_quantize_w4", TORCH_FN((NonDifferentiable<kGroupQuantizeW4, QuantizeW4Sig>::call)));
  m.impl("import_mxfp4_weights", TORCH_FN((NonDifferentiable<kImportMxfp4, CheckpointSig>::call)));
  m.impl("export_mxfp4_weights", TORCH_FN((NonDifferentiable<kExportMxfp4, CheckpointSig>::call)));
  m.impl("group_offsets", TORCH_FN((NonDifferentiable<kGroupOffsets, OffsetsSig>::call)));
  m.impl("permute_plan", TORCH_FN((NonDifferentiable<kPermutePlan, PermutePlanSig>::call)));
  m.impl("grouped_mm", TORCH_FN(grouped_mm_autograd));
  m.impl("swiglu", TORCH_FN(swiglu_autograd));
  m.impl("weighted_swiglu", TORCH_FN(weighted_swiglu_autograd));
  m.impl("weighted_swiglu_ex", TORCH_FN(weighted_swiglu_ex_autograd));
}

}  // namespace groupmm_torch
