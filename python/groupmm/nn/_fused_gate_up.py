"""groupmm.nn.MoE's fused gate_up projection (fused_gate_up=True): the settings it takes and
torch.ops.groupmm.gate_up_swiglu with the autograd function for gate_up layers that take their
weight gradient themselves (delay_wgrad, main_grad)."""

import torch

from ._recompute import again as _again
from .grouped_linear import _Recomputed, _resolved

ops = torch.ops.groupmm


_FUSED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check(*, recipe="bf16", ep_group=None, dtype, device, hidden, ffn_hidden, experts):
    """The settings fused_gate_up takes (the C++ MoEConfig::fused_gate_up's rules: the
    high-precision recipe, no expert parallelism; on CUDA what moe_gate_up_swiglu_supported
    takes). Raises ValueError naming the conflicting setting."""
    def refuse(what):
        raise ValueError(f"groupmm.nn.MoE(fused_gate_up=True): {what}")
    if recipe != "bf16":
        refuse(f"recipe='{recipe}' must be 'bf16' (the fused gate_up projection runs the "
               "high-precision GEMM; the quantized and 4-bit recipes run the separate ops)")
    if ep_group is not None:
        refuse("ep_group must be None (expert parallelism moves the permuted rows between "
               "ranks: there is no permuted copy of x to skip)")
    if dtype not in _FUSED_DTYPES:
        refuse(f"dtype={dtype} must be torch.bfloat16, torch.float16 or torch.float32 (CPU)")
    if device is not None and torch.device(device).type == "cuda":
        if dtype == torch.float32:
            refuse("dtype=torch.float32 runs on the CPU only (the CUDA kernel takes bf16 / fp16)")
        if hidden % 8 or ffn_hidden % 64 or experts > 1024:
            refuse(f"hidden={hidden}, ffn_hidden={ffn_hidden}, experts={experts}: the CUDA "
                   "kernel needs hidden % 8 == 0, ffn_hidden % 64 == 0 and experts <= 1024")


class _FusedGateUpFn(torch.autograd.Function):
    """gate_up_swiglu for a gate_up layer that takes its weight gradient itself (delay_wgrad:
    queued for backward_dw(); accumulate_into_main_grad: added into main_grad). Backward is the op's
    C++ formula (ops_autograd_moe.cpp) op for op, with the wgrad run by the layer's executor on the
    permuted rows of x, gathered when it runs: in backward_dw() with recompute (nothing kept but
    the block input and the routing), else in backward (kept until backward_dw())."""

    @staticmethod
    def forward(ctx, x, weights, w, dest_row, row_start, kept, splits, align, cap, layer, again):
        h, gu, probs = ops.gate_up_swiglu(x, dest_row, row_start, kept, splits, align, cap,
                                          weights, w, True)
        ctx.save_for_backward(x, w, gu, probs, dest_row, row_start, kept, splits)
        ctx.align, ctx.cap, ctx.layer, ctx.again = align, cap, layer, again
        ctx.set_materialize_grads(False)  # an unused output adds nothing (no zeros)
        return h, gu, probs

    @staticmethod
    def backward(ctx, dh, d_gu, d_probs):
        x, w, gu, probs, *plan = ctx.saved_tensors
        layer, align, cap, splits = ctx.layer, ctx.align, ctx.cap, plan[3]
        need_x, need_weights, need_w = ctx.needs_input_grad[:3]
        dgu = dprobs = None
        if dh is not None:
            dgu, dprobs = ops.weighted_swiglu_backward(dh, gu, probs)
        if d_gu is not None:
            dgu = d_gu if dgu is None else dgu + d_gu
        if d_probs is not None:
            dprobs = d_probs if dprobs is None else dprobs + d_probs
        dx = dweights = None
        expected = layer._expected(gu.shape[0])
        if need_x or (need_weights and dprobs is not None):
            if need_x and dgu is not None:
                dxp, _ = layer._exec.dgrad(dgu, (None, w), splits, True, expected)
            else:  # d weights only: permute's backward reads no row of it
                dxp = x.new_zeros(gu.shape[0], x.shape[1])
            dx, dweights = ops.permute_backward(dxp, *plan, align, cap,
                                                dprobs if need_weights else None)
            dx = dx if need_x else None
            dweights = dweights if need_weights and dprobs is not None else None
        dw = None
        if need_w and dgu is not None:
            xd = x.detach()
            if ctx.again and layer.delay_wgrad:
                rows = _Recomputed(_again(ops.permute, xd, *plan, align, cap, part=0),
                                   layer._exec, splits)
            else:
                rows = layer._exec.input_state(ops.permute(xd, *plan, align, cap)[0], splits)
            state = (rows, w)
            if layer.delay_wgrad:
                layer._pending_wgrad.append((dgu, state, splits, expected))
            else:
                dw = layer._exec.wgrad(dgu, _resolved(state), splits, layer._main_grad(),
                                       expected)
        return dx, dweights, dw, None, None, None, None, None, None, None, None


def gate_up_swiglu(moe, x, plan, cap, weights, again):
    """h, the pre-activation and probs from torch.ops.groupmm.gate_up_swiglu (x gathered
    inside the GEMM, no permuted copy of x): through the op's own autograd formula, or, when
    the gate_up layer handles its weight gradient itself (delay_wgrad, main_grad), through
    _FusedGateUpFn, which hands it the wgrad's operands."""
    layer = moe.gate_up
    w = layer.weight
    if x.is_cuda:
        check(dtype=x.dtype, device=x.device, hidden=w.shape[2], ffn_hidden=w.shape[1] // 2,
              experts=w.shape[0])
    if not torch.is_grad_enabled():  # inference: no pre-activation kept
        return ops.gate_up_swiglu(x, *plan, moe.align, cap, weights, w)
    if not (layer.delay_wgrad or layer.accumulate_into_main_grad):
        # The registered op's formula: no Python in backward, traceable by torch.compile.
        return ops.gate_up_swiglu(x, *plan, moe.align, cap, weights, w, True)
    if layer.delay_wgrad and torch.compiler.is_compiling():
        raise RuntimeError(
            "groupmm.nn.MoE(fused_gate_up=True, delay_wgrad=True) is eager-only: its backward "
            "queues the gate_up wgrad operands for backward_dw() (a side effect that a "
            "compiled backward cannot make); compile with delay_wgrad=False")
    return _FusedGateUpFn.apply(x, weights, w, *plan, moe.align, cap, layer, again)
