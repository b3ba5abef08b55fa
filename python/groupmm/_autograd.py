"""Autograd formulas of the differentiable ops, registered on the ops themselves, so the raw
torch.ops.groupmm calls are differentiable in eager mode and under torch.compile alike."""

import torch
from torch.library import register_autograd

ops = torch.ops.groupmm


def _mm_setup(ctx, inputs, output):
    x, w, splits, bias, _out_dtype = inputs
    ctx.save_for_backward(x, w, splits)
    ctx.bias_dtype = bias.dtype if bias is not None else None


def _mm_backward(ctx, dy):
    x, w, splits = ctx.saved_tensors
    need = ctx.needs_input_grad
    # The bias gradient sums the upstream gradient as it comes (fp32 with out_dtype=float32);
    # the GEMMs take both operands in one dtype, so an fp32 dy is rounded to x's for them.
    db = None
    if ctx.bias_dtype is not None and need[3]:
        db = ops.group_dbias(dy, splits, ctx.bias_dtype)
    dy = dy.to(x.dtype)
    dx = ops.grouped_mm_dgrad(dy, w, splits) if need[0] else None
    dw = ops.grouped_mm_wgrad(dy, x, splits) if need[1] else None
    return dx, dw, None, db, None


register_autograd("groupmm::grouped_mm", _mm_backward, setup_context=_mm_setup)


def _swiglu_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _swiglu_backward(ctx, dout):
    (gate_up,) = ctx.saved_tensors
    return ops.swiglu_backward(dout, gate_up)


register_autograd("groupmm::swiglu", _swiglu_backward, setup_context=_swiglu_setup)


def _wswiglu_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _wswiglu_backward(ctx, dout):
    gate_up, prob = ctx.saved_tensors
    return ops.weighted_swiglu_backward(dout, gate_up, prob)


register_autograd("groupmm::weighted_swiglu", _wswiglu_backward, setup_context=_wswiglu_setup)


def _map_setup(ctx, inputs, output):
    # (x, dest_row, row_start, kept, splits, align, capacity, extra)
    ctx.save_for_backward(*inputs[1:5])
    ctx.align, ctx.capacity = inputs[5], inputs[6]
    ctx.has_extra = inputs[7] is not None


def _permute_backward(ctx, d_x_perm, d_probs):
    m = ctx.saved_tensors
    dx, dw = ops.permute_backward(d_x_perm, *m, ctx.align, ctx.capacity,
                                  d_probs if ctx.has_extra else None)
    return (dx, None, None, None, None, None, None, dw if ctx.has_extra else None)


register_autograd("groupmm::permute", _permute_backward, setup_context=_map_setup)


def _unpermute_backward(ctx, dy):
    m = ctx.saved_tensors
    dy_perm = ops.unpermute_backward(dy, *m, ctx.align, ctx.capacity)
    return (dy_perm, None, None, None, None, None, None, dy if ctx.has_extra else None)


register_autograd("groupmm::unpermute", _unpermute_backward, setup_context=_map_setup)


def _router_setup(ctx, inputs, output):
    logits, _bias, _topk, *cfg = inputs
    ids, _w, counts, _aux, _z = output
    ctx.save_for_backward(logits, ids, counts)
    ctx.cfg = cfg  # score, n_group, topk_group, renormalize, scaling_factor, aux, z coefficients


def _router_backward(ctx, _d_ids, d_weights, _d_counts, d_aux, d_z):
    # The core differentiates sum(d_weights * weights) + aux_loss + z_loss, the losses with
    # gradient 1; each loss term is taken on its own here and scaled by its upstream gradient.
    logits, ids, counts = ctx.saved_tensors
    *head, aux_c, z_c = ctx.cfg
    if d_weights is None:
        d_weights = logits.new_zeros(ids.shape)
    d_logits = ops.router_backward(logits, ids, counts, d_weights, *head, 0.0, 0.0)
    zero = torch.zeros_like(d_weights)
    if aux_c != 0.0 and d_aux is not None:
        d_logits = d_logits + d_aux * ops.router_backward(logits, ids, counts, zero, *head, aux_c, 0.0)
    if z_c != 0.0 and d_z is not None:
        d_logits = d_logits + d_z * ops.router_backward(logits, ids, counts, zero, *head, 0.0, z_c)
    return (d_logits,) + (None,) * 9


register_autograd("groupmm::router", _router_backward, setup_context=_router_setup)
