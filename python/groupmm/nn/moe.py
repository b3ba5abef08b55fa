"""MoE: router -> permute -> grouped SwiGLU experts -> unpermute (+ a shared expert), every stage a
groupmm op; differentiable end to end (router weight included)."""

import torch
import torch.nn.functional as F

from .grouped_linear import GroupedLinear

ops = torch.ops.groupmm


class MoE(torch.nn.Module):
    """y [T, H] = sum_j w_tj * expert_{e_tj}(x_t) (+ shared expert(x_t)), top-k routing.

    Each expert is SwiGLU(x W_gate_up^T) W_down^T with gate_up [2F, H] and down [H, F]; the router
    weight w_tj is applied inside the activation (weighted SwiGLU). forward returns (y, aux),
    aux = the load-balancing loss + the z-loss (zero when their coefficients are). align pads each
    expert's rows; dropless routing. Router options as torch.ops.groupmm.router (n_group /
    topk_group: DeepSeek-V3's group-limited routing; scaling_factor multiplies the weights).

    recipe and delay_wgrad go to both expert GroupedLinears (see there); the FP8 recipes need every
    split a multiple of 16, so align defaults to 16 for them (it must be a multiple of 16).
    backward_dw() runs both layers' delayed weight gradients.
    """

    def __init__(self, hidden, ffn_hidden, experts, topk, *, shared_ffn_hidden=0, score="softmax",
                 renormalize=True, aux_loss_coeff=0.0, z_loss_coeff=0.0, n_group=1, topk_group=1,
                 scaling_factor=1.0, align=None, recipe="bf16", delay_wgrad=False,
                 dtype=torch.bfloat16, device=None):
        super().__init__()
        fp8 = recipe in ("fp8_current", "fp8_block", "mxfp8")
        align = (16 if fp8 else 1) if align is None else align
        if fp8 and align % 16 != 0:
            raise ValueError(f"groupmm.nn.MoE(recipe='{recipe}'): align={align} must be a "
                             "multiple of 16 (the FP8 wgrad GEMMs read 16-row aligned experts)")
        self.experts, self.topk, self.align = experts, topk, align
        # torch.ops.groupmm.router's arguments after topk, positional (no keyword parsing per call).
        self.router_cfg = (score, n_group, topk_group, renormalize, scaling_factor,
                           aux_loss_coeff, z_loss_coeff)
        kw = dict(dtype=dtype, device=device)
        self.router = torch.nn.Linear(hidden, experts, bias=False, **kw)
        lkw = dict(kw, bias=False, recipe=recipe, delay_wgrad=delay_wgrad)
        self.gate_up = GroupedLinear(experts, hidden, 2 * ffn_hidden, **lkw)
        self.down = GroupedLinear(experts, ffn_hidden, hidden, **lkw)
        self.shared_up = self.shared_down = None
        if shared_ffn_hidden:
            self.shared_up = torch.nn.Linear(hidden, 2 * shared_ffn_hidden, bias=False, **kw)
            self.shared_down = torch.nn.Linear(shared_ffn_hidden, hidden, bias=False, **kw)

    def forward(self, x):
        # fp32 logits from the 16-bit inputs, as the core's router expects.
        logits = F.linear(x.float(), self.router.weight.float())
        ids, weights, _counts, aux, z = ops.router(logits, None, self.topk, *self.router_cfg)
        plan = ops.permute_plan(ids, self.experts, self.align, 0)
        splits = plan[3]
        x_perm, probs = ops.permute(x, *plan, self.align, 0, weights)
        h = ops.weighted_swiglu(self.gate_up(x_perm, splits), probs)
        y_perm = self.down(h, splits)
        shared = None
        if self.shared_up is not None:
            shared = self.shared_down(ops.swiglu(self.shared_up(x)))
        y = ops.unpermute(y_perm, *plan, self.align, 0, shared)
        return y, (aux + z).squeeze(0)

    def backward_dw(self):
        """With delay_wgrad: the experts' queued weight gradients (GroupedLinear.backward_dw)."""
        self.gate_up.backward_dw()
        self.down.backward_dw()
