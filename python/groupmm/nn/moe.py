"""MoE: router -> permute -> grouped SwiGLU experts -> unpermute (+ a shared expert), every stage a
groupmm op; differentiable end to end (router weight included)."""

import math

import torch
import torch.nn.functional as F

from .._meta import moe_capacity
from .grouped_linear import GroupedLinear

ops = torch.ops.groupmm


class MoE(torch.nn.Module):
    """y [T, H] = sum_j w_tj * expert_{e_tj}(x_t) (+ shared expert(x_t)), top-k routing.

    Each expert is SwiGLU(x W_gate_up^T) W_down^T with gate_up [2F, H] and down [H, F]; the router
    weight w_tj is applied inside the activation (weighted SwiGLU). forward returns (y, aux),
    aux = the load-balancing loss + the z-loss (zero when their coefficients are). align pads each
    expert's rows. Router options as torch.ops.groupmm.router (n_group / topk_group: DeepSeek-V3's
    group-limited routing; scaling_factor multiplies the weights).

    expert_bias: DeepSeek-V3's auxiliary-loss-free balancing. A buffer `expert_bias` [E] fp32
    (starts at 0, not a parameter) is added to the scores for the top-k selection only (the
    weights stay the unbiased scores). Each training forward adds its tokens per expert to the
    buffer `tokens_per_expert` [E] fp32; update_expert_bias(rate) then moves every bias by `rate`
    toward balance and restarts the count (call it after the optimizer step; all-reduce
    tokens_per_expert first under data or expert parallelism, as the counts are this rank's).

    capacity_factor > 0: each expert keeps its first ceil(capacity_factor * T k / E) tokens in
    token order (groupmm.moe_capacity) and drops the rest (their rows add nothing to y); 0 is
    dropless.

    recipe and delay_wgrad go to both expert GroupedLinears (see there); the FP8 recipes need every
    split a multiple of 16, so align defaults to 16 for them (it must be a multiple of 16).
    backward_dw() runs both layers' delayed weight gradients.
    """

    def __init__(self, hidden, ffn_hidden, experts, topk, *, shared_ffn_hidden=0, score="softmax",
                 renormalize=True, aux_loss_coeff=0.0, z_loss_coeff=0.0, n_group=1, topk_group=1,
                 scaling_factor=1.0, expert_bias=False, capacity_factor=0.0, align=None,
                 recipe="bf16", delay_wgrad=False, dtype=torch.bfloat16, device=None):
        super().__init__()
        fp8 = recipe in ("fp8_current", "fp8_block", "mxfp8")
        align = (16 if fp8 else 1) if align is None else align
        if fp8 and align % 16 != 0:
            raise ValueError(f"groupmm.nn.MoE(recipe='{recipe}'): align={align} must be a "
                             "multiple of 16 (the FP8 wgrad GEMMs read 16-row aligned experts)")
        if not (math.isfinite(capacity_factor) and capacity_factor >= 0):
            raise ValueError(f"groupmm.nn.MoE: capacity_factor={capacity_factor} must be finite "
                             "and >= 0 (0 = dropless)")
        self.experts, self.topk, self.align = experts, topk, align
        self.capacity_factor = float(capacity_factor)
        # torch.ops.groupmm.router's arguments after topk, positional (no keyword parsing per call).
        self.router_cfg = (score, n_group, topk_group, renormalize, scaling_factor,
                           aux_loss_coeff, z_loss_coeff)
        kw = dict(dtype=dtype, device=device)
        self.router = torch.nn.Linear(hidden, experts, bias=False, **kw)
        # Selection-only bias and the load it balances: buffers (state_dict), not parameters.
        f32 = dict(dtype=torch.float32, device=device)
        self.register_buffer("expert_bias", torch.zeros(experts, **f32) if expert_bias else None)
        self.register_buffer("tokens_per_expert",
                             torch.zeros(experts, **f32) if expert_bias else None)
        lkw = dict(kw, bias=False, recipe=recipe, delay_wgrad=delay_wgrad)
        self.gate_up = GroupedLinear(experts, hidden, 2 * ffn_hidden, **lkw)
        self.down = GroupedLinear(experts, ffn_hidden, hidden, **lkw)
        self.shared_up = self.shared_down = None
        if shared_ffn_hidden:
            self.shared_up = torch.nn.Linear(hidden, 2 * shared_ffn_hidden, bias=False, **kw)
            self.shared_down = torch.nn.Linear(shared_ffn_hidden, hidden, bias=False, **kw)

    def forward(self, x, is_first_microbatch=None):
        """x [T, H] -> (y [T, H], aux). is_first_microbatch goes to the expert layers (quantized
        recipes: when their weights are quantized, see GroupedLinear.forward)."""
        # fp32 logits from the 16-bit inputs, as the core's router expects.
        logits = F.linear(x.float(), self.router.weight.float())
        ids, weights, counts, aux, z = ops.router(logits, self.expert_bias, self.topk,
                                                  *self.router_cfg)
        if self.tokens_per_expert is not None and self.training and torch.is_grad_enabled():
            with torch.no_grad():  # on the device: no sync (counts are before any capacity drop)
                self.tokens_per_expert.add_(counts)
        cap = moe_capacity(x.shape[0], self.topk, self.experts, self.capacity_factor)
        plan = ops.permute_plan(ids, self.experts, self.align, cap)
        splits = plan[3]
        x_perm, probs = ops.permute(x, *plan, self.align, cap, weights)
        h = ops.weighted_swiglu(self.gate_up(x_perm, splits, is_first_microbatch), probs)
        y_perm = self.down(h, splits, is_first_microbatch)
        shared = None
        if self.shared_up is not None:
            shared = self.shared_down(ops.swiglu(self.shared_up(x)))
        y = ops.unpermute(y_perm, *plan, self.align, cap, shared)
        return y, (aux + z).squeeze(0)

    @torch.no_grad()
    def update_expert_bias(self, rate):
        """Auxiliary-loss-free balancing (DeepSeek-V3): each expert's selection bias moves by
        `rate`, up for an expert that received fewer tokens than the mean since the last update,
        down for one that received more (unchanged at the mean); then tokens_per_expert restarts
        from 0. In place on the device, no sync (graph safe)."""
        if self.expert_bias is None:
            raise RuntimeError("groupmm.nn.MoE.update_expert_bias: the block has no expert bias "
                               "(construct it with expert_bias=True)")
        load = self.tokens_per_expert
        self.expert_bias.add_(torch.sign(load.mean() - load), alpha=rate)
        load.zero_()

    def backward_dw(self):
        """With delay_wgrad: the experts' queued weight gradients (GroupedLinear.backward_dw)."""
        self.gate_up.backward_dw()
        self.down.backward_dw()
