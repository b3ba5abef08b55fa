"""MoE: router -> permute -> grouped SwiGLU experts -> unpermute (+ a shared expert), every stage a
groupmm op; differentiable end to end (router weight included).

The block composes like the C++ nn::MoE (src/nn/moe.cpp), op for op: router_logits (the core's
moe_router_logits), router, permute_plan, permute, the gate_up GroupedLinear, weighted_swiglu, the
down GroupedLinear, the shared expert as two one-group GroupedLinears in the block's recipe around
swiglu, and unpermute adding its output; on the CPU a forward gives nn::MoE's y bit for bit
(tests/python/test_moe_module.py checks it against the core block, through the _core_moe hook).
Deliberate differences, each for autograd or for torch's conventions:
  - the backward is autograd's: the gradient of x from its three uses (permute, the shared expert,
    the router logits) is summed by autograd, in x's dtype, where nn::MoE accumulates it inside
    moe_permute_backward and moe_router_logits_backward: dx may differ in the last bit;
  - forward returns (y, aux) and the loss terms get the gradient the caller's loss gives them;
    nn::MoE adds their gradient with weight 1 in backward;
  - with delay_wgrad only the expert and shared-expert weight gradients wait for backward_dw();
    the router weight's comes with backward (nn::MoE delays it too);
  - parameters are initialized by torch's RNG (as nn.Linear does), not by fill_uniform's seed; the
    shared expert's weights are stored [N, K] as nn.Linear stores them (nn::MoE: [1, N, K]);
  - the selection-only expert bias is updated here (tokens_per_expert, update_expert_bias);
    nn::MoE exposes the buffer and leaves the update to the caller;
  - align defaults to the recipe's split_multiple (groupmm.recipe_traits; nn::MoE's pad_align
    defaults to 1 and is the caller's to set);
  - bias=True and activation= (gpt-oss's expert biases, router bias and clamped SwiGLU;
    from_gpt_oss / import_gpt_oss load its layer) are this module's own: nn::MoE has neither.
Expert parallelism (ep_group=, nn::MoE's MoEConfig::ep) is in moe_ep.py. fused_gate_up=True runs
permute, the gate_up GroupedLinear and weighted_swiglu as one op, gate_up_swiglu (nn::MoE's
MoEConfig::fused_gate_up), with the same results bit for bit.
"""

import math
import numbers

import torch

from .._meta import check_router_sizes, moe_capacity
from . import _fused_gate_up as _fused, _loaders, moe_ep
from ._swiglu import _activation, _weighted_swiglu
from ._recompute import again as _again
from .grouped_linear import GroupedLinear, split_multiple

ops = torch.ops.groupmm


class _SharedLinear(GroupedLinear):
    """A linear of the shared expert: one group holding every token (splits = [T]), as nn::MoE's
    shared expert runs, with the weight stored [N, K] (nn.Linear's layout and state dict)."""

    def __init__(self, in_features, out_features, **kw):
        super().__init__(1, in_features, out_features, bias=False, **kw)
        self.weight = torch.nn.Parameter(self.weight.detach()[0].clone())

    def forward(self, x, is_first_microbatch=None, recompute_input=None):
        splits = torch.full((1,), x.shape[0], dtype=torch.int32, device=x.device)
        return super().forward(x, splits, is_first_microbatch, recompute_input)


def _permute_weighted(x, *args):
    """permute's rows times their router weight (router_on_input): the weight rounded to x's dtype,
    then the product (transformers' Llama4TextMoe order). Padding rows stay zero."""
    rows, probs = ops.permute(x, *args)
    return rows * probs.to(rows.dtype).unsqueeze(1)


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

    recompute (eager training; on by default): backward keeps the block input, the routing and the
    gate_up output, and makes the rest again when the weight gradients need it: the permuted rows
    (gathered from x once more, for gate_up's wgrad) and the SwiGLU outputs (from the kept gate_up
    outputs, for down's wgrad and the shared expert's). Gradients are bit for bit those of
    recompute=False, which keeps those tensors instead (about 8 + 3 more T*H 16-bit rows on
    Qwen3-30B-A3B's shapes, k=8, for a gather and an activation pass more in backward). A compiled
    forward keeps them (the recomputation is eager-only).

    fused_gate_up (default False): the gate_up projection and the weighted SwiGLU run as one op,
    torch.ops.groupmm.gate_up_swiglu (the C++ MoEConfig::fused_gate_up: x gathered through the
    row map inside the GEMM, the activation in its epilogue), so forward makes no permuted copy of
    x; backward gathers the permuted rows for gate_up's wgrad (whatever recompute says: they are
    never kept from forward, except with delay_wgrad and recompute=False, where backward gathers
    them and keeps them for backward_dw()). y, dx and every gradient are bit for bit those of
    fused_gate_up=False. Recipe 'bf16' only, dtype bfloat16 / float16 (float32 on the CPU), no
    expert parallelism; on CUDA hidden % 8 == 0, ffn_hidden % 64 == 0 and experts <= 1024 (an
    sm_90 device); other settings raise ValueError at construction. The gate_up layer's weight is
    read directly (its own forward, and forward hooks on it, do not run); its delay_wgrad and
    accumulate_into_main_grad are honoured. torch.compile traces it (delay_wgrad excepted, as for
    the layers).

    router_on_input (default False): the router weight scales each expert's input row instead of
    its activation, as Llama 4 routes: expert(w_tj x_t) where the block computes w_tj expert(x_t).
    With a SwiGLU the two differ (the weight passes the nonlinearity). The permuted rows are
    multiplied by their router weight, rounded to x's dtype first (as transformers' Llama4TextMoe
    does), before the gate_up layer, and the activation is the plain SwiGLU; d weight comes from
    that product. Needs the plain activation, bias=False, fused_gate_up=False and no ep_group
    (ValueError otherwise). from_transformers() builds Llama 4's layer (Llama4TextMoe: sigmoid of
    the top-k logits, no renormalization, a shared expert).

    bias (default False): the biases of gpt-oss's layer. The router gets a bias [E] (router.bias,
    added to the fp32 logits), gate_up a bias [E, 2F] (gate_up.bias, added by its GEMM) and down a
    bias [E, H] (down_bias), which is weighted by the router weight like the rest of the expert's
    output: y_t gets sum_j w_tj b_down[e_tj] (unpermute adds it after the k rows, fused products in
    fp32; a dropped (t, j) adds nothing). activation (a SwiGLU, default the plain one) is
    the experts' activation: GPT_OSS_SWIGLU is gpt-oss's clamped form on interleaved gate/up
    columns. from_gpt_oss() builds gpt-oss's layer from transformers' GptOssMLP or its state dict,
    with the 16-bit weights or the checkpoint's MXFP4 blocks (recipe 'mxfp4_weight'); the router
    (softmax over the top-k logits) is score='softmax' with renormalize=True. Both need ep_group
    None and fused_gate_up False (ValueError otherwise). from_deepseek_v3() builds DeepSeek-V3's
    layer (score='sigmoid', group-limited, expert_bias from its e_score_correction_bias, a shared
    expert) from transformers' DeepseekV3MoE or a state dict, with 16-bit weights or the release's
    FP8 ones (recipe 'fp8_block').

    recipe, delay_wgrad and high_precision_wgrad go to the expert GroupedLinears and the shared
    expert's (see there); fp8_current and fp8_block need every split a multiple of 16
    (recipe_traits(recipe).split_multiple), so align defaults to it (and must be a multiple of
    it), and a training forward with a shared expert needs T a multiple of it too (the shared
    expert is one group of T rows). backward_dw() runs the delayed weight gradients.

    Expert parallelism (ep_group = a torch.distributed ProcessGroup of R ranks; docs/
    expert_parallelism.md): the experts are sharded over the group's ranks, rank r holding the
    global experts [r E/R, (r+1) E/R) (gate_up and down then have E/R groups; first_expert and
    local_experts say which); the router and the shared expert are on every rank (their gradients
    are this rank's tokens' share: all-reduce them as data parallelism does). Each forward and
    backward is a collective of the group: every rank runs them, in the same order. The exchanges
    use the process group's own communicator for CPU tensors (gloo), and for CUDA tensors an NCCL
    communicator groupmm makes for the group's ranks when the block first runs on a device.
    ep_mode='throughput' (dropless; exact per-peer counts, read on the host: not graph safe) or
    'capacity' (a fixed budget per pair of ranks, graph safe: ep_capacity=(rows_per_peer,
    entries_per_peer), or from capacity_factor > 0 as groupmm.nn.moe_ep.capacity_from_factor says,
    which needs the same T on every rank; tokens over the budget are dropped, reported on the CPU
    in ep_overflow and on CUDA by groupmm.check()). capacity_factor is the per-peer budget's
    factor in capacity mode and must be 0 in throughput mode. In capacity mode the expert layers
    and the activation run over the rows received only (splits_total='at_most' over the plan's
    splits_at_most(): the budget's padding rows are neither read nor computed; the 4-bit weight
    recipes excepted), and their GEMMs expect T*k rows, not the budget's (expected_rows, as
    nn::MoE's: the kernel choice only). With recompute, the dispatched rows are kept (recomputing
    them would repeat the exchange).
    """

    def __init__(self, hidden, ffn_hidden, experts, topk, *, shared_ffn_hidden=0, score="softmax",
                 renormalize=True, aux_loss_coeff=0.0, z_loss_coeff=0.0, n_group=1, topk_group=1,
                 scaling_factor=1.0, expert_bias=False, capacity_factor=0.0, align=None,
                 recipe="bf16", delay_wgrad=False, recompute=True, dtype=torch.bfloat16,
                 device=None, ep_group=None, ep_mode="throughput", ep_capacity=None,
                 fused_gate_up=False, bias=False, activation=None, router_on_input=False,
                 high_precision_wgrad=False):
        super().__init__()
        self.recompute = bool(recompute)
        self.fused_gate_up = bool(fused_gate_up)
        self.activation = _activation(activation)
        self.router_on_input = bool(router_on_input)
        if self.router_on_input:
            conflict = [what for what, on in (
                ("bias=True", bool(bias)),
                (f"activation={self.activation}", not self.activation.plain),
                ("fused_gate_up=True", self.fused_gate_up),
                ("ep_group", ep_group is not None)) if on]
            if conflict:
                raise ValueError(f"groupmm.nn.MoE(router_on_input=True): {', '.join(conflict)}: "
                                 "the input-weighted form takes the plain SwiGLU without biases, "
                                 "the separate ops and no expert parallelism")
        gpt_oss_form = bool(bias) or not self.activation.plain
        if gpt_oss_form and (ep_group is not None or self.fused_gate_up):
            what = "ep_group" if ep_group is not None else "fused_gate_up=True"
            raise ValueError(f"groupmm.nn.MoE(bias={bool(bias)}, activation={self.activation}): "
                             f"{what} takes neither expert biases nor another activation than the "
                             "plain SwiGLU (bias=False, activation=None)")
        if self.fused_gate_up:
            _fused.check(recipe=recipe, ep_group=ep_group, dtype=dtype, device=device,
                         hidden=hidden, ffn_hidden=ffn_hidden, experts=experts)
        split = split_multiple(recipe)
        align = split if align is None else align
        if align % split != 0:
            raise ValueError(f"groupmm.nn.MoE(recipe='{recipe}'): align={align} must be a "
                             f"multiple of {split} (the FP8 wgrad GEMMs read {split}-row aligned "
                             "experts)")
        if not (math.isfinite(capacity_factor) and capacity_factor >= 0):
            raise ValueError(f"groupmm.nn.MoE: capacity_factor={capacity_factor} must be finite "
                             "and >= 0 (0 = dropless)")
        # The core's router limits (groupmm/moe.hpp RouterConfig), said here before any op runs.
        for name, v in (("experts", experts), ("topk", topk)):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise TypeError(f"groupmm.nn.MoE: {name}={v!r} must be an int")
        check_router_sizes("nn.MoE", experts, topk, "experts")
        self.experts, self.topk, self.align = experts, topk, align
        self.recipe, self.split_multiple = recipe, split
        self.capacity_factor = float(capacity_factor)
        # torch.ops.groupmm.router's arguments after topk, positional (no keyword parsing per call).
        self.router_cfg = (score, n_group, topk_group, renormalize, scaling_factor,
                           aux_loss_coeff, z_loss_coeff)
        kw = dict(dtype=dtype, device=device)
        self.router = torch.nn.Linear(hidden, experts, bias=bool(bias), **kw)
        # Selection-only bias and the load it balances: buffers (state_dict), not parameters.
        f32 = dict(dtype=torch.float32, device=device)
        self.register_buffer("expert_bias", torch.zeros(experts, **f32) if expert_bias else None)
        self.register_buffer("tokens_per_expert",
                             torch.zeros(experts, **f32) if expert_bias else None)
        self.ep = None
        if ep_group is not None:
            self.ep = moe_ep.ExpertParallel(ep_group, experts, ep_mode, self.capacity_factor,
                                            ep_capacity)
        local = experts if self.ep is None else self.ep.local_experts
        lkw = dict(kw, bias=False, recipe=recipe, delay_wgrad=delay_wgrad,
                   high_precision_wgrad=high_precision_wgrad)
        if self.ep is not None:  # capacity mode: the experts compute the received rows only
            lkw["splits_total"] = self.ep.splits_total(recipe)
        self.gate_up = GroupedLinear(local, hidden, 2 * ffn_hidden, **dict(lkw, bias=bool(bias)))
        self.down = GroupedLinear(local, ffn_hidden, hidden, **lkw)
        # down's bias is weighted by the router weight (the weight is applied in the activation,
        # before the down GEMM, whose own bias would be unweighted): the block adds it.
        self.down_bias = None
        if bias:
            self.down_bias = torch.nn.Parameter(torch.empty(local, hidden, **kw))
            with torch.no_grad():  # as GroupedLinear's bias: nn.Linear's bound for fan-in F
                self.down_bias.uniform_(-1 / math.sqrt(ffn_hidden), 1 / math.sqrt(ffn_hidden))
        self.shared_up = self.shared_down = None
        if shared_ffn_hidden:
            skw = dict(kw, recipe=recipe, delay_wgrad=delay_wgrad,
                       high_precision_wgrad=high_precision_wgrad)
            self.shared_up = _SharedLinear(hidden, 2 * shared_ffn_hidden, **skw)
            self.shared_down = _SharedLinear(shared_ffn_hidden, hidden, **skw)

    def forward(self, x, is_first_microbatch=None):
        """x [T, H] -> (y [T, H], aux). is_first_microbatch goes to the expert layers (quantized
        recipes: when their weights are quantized, see GroupedLinear.forward)."""
        shared_on = self.shared_up is not None
        w = self.router.weight
        if x.dim() != 2 or x.shape[1] != w.shape[1] or x.dtype != w.dtype:
            raise ValueError(f"groupmm.nn.MoE.forward: x must be [T, {w.shape[1]}] {w.dtype} (the "
                             f"block's hidden size and dtype); got {list(x.shape)} {x.dtype}")
        if shared_on and self.split_multiple > 1 and torch.is_grad_enabled():
            T = x.shape[0]
            if T % self.split_multiple != 0:
                raise ValueError(
                    f"groupmm.nn.MoE(recipe='{self.recipe}'): x.shape[0]={T} must be a multiple "
                    f"of {self.split_multiple} with a shared expert in training (its one-group "
                    f"wgrad reads {self.split_multiple}-row aligned splits)")
        again = self.recompute and torch.is_grad_enabled() and not torch.compiler.is_compiling()
        if self.ep is not None:
            return moe_ep.forward(self, x, is_first_microbatch, again)
        # fp32 logits from the 16-bit inputs (the core's moe_router_logits, as nn::MoE's router),
        # the router bias added to each fp32 sum inside the op.
        logits = ops.router_logits(x, self.router.weight, self.router.bias)
        ids, weights, counts, aux, z = ops.router(logits, self.expert_bias, self.topk,
                                                  *self.router_cfg)
        if self.tokens_per_expert is not None and self.training and torch.is_grad_enabled():
            with torch.no_grad():  # on the device: no sync (counts are before any capacity drop)
                self.tokens_per_expert.add_(counts)
        cap = moe_capacity(x.shape[0], self.topk, self.experts, self.capacity_factor)
        plan = ops.permute_plan(ids, self.experts, self.align, cap)
        splits = plan[3]
        act, act_args = _weighted_swiglu(self.activation)
        if self.fused_gate_up:
            h, gu, probs = _fused.gate_up_swiglu(self, x, plan, cap, weights, again)
            act_in = (gu, probs, *act_args)
        elif self.router_on_input:  # the weight on the rows: the plain SwiGLU after gate_up
            x_in = _permute_weighted(x, *plan, self.align, cap, weights)
            rx = _again(_permute_weighted, x, *plan, self.align, cap, weights) if again else None
            gu = self.gate_up(x_in, splits, is_first_microbatch, recompute_input=rx)
            act, act_in = ops.swiglu, (gu,)
            h = act(*act_in)
        else:
            x_perm, probs = ops.permute(x, *plan, self.align, cap, weights)
            rx = _again(ops.permute, x, *plan, self.align, cap, weights, part=0) if again else None
            gu = self.gate_up(x_perm, splits, is_first_microbatch, recompute_input=rx)
            act_in = (gu, probs, *act_args)
            h = act(*act_in)
        rh = _again(act, *act_in) if again else None
        y_perm = self.down(h, splits, is_first_microbatch, recompute_input=rh)
        add = None
        if shared_on:
            sgu = self.shared_up(x, is_first_microbatch)
            rs = _again(ops.swiglu, sgu) if again else None
            add = self.shared_down(ops.swiglu(sgu), is_first_microbatch, recompute_input=rs)
        # gpt-oss's down bias, weighted by the router weight: added by unpermute over the kept pairs.
        routed = () if self.down_bias is None else (self.down_bias, ids, weights)
        y = ops.unpermute(y_perm, *plan, self.align, cap, add, *routed)
        return y, self._router_loss(aux, z)

    def _router_loss(self, aux, z):
        """aux + z as a 0-d tensor. A loss whose coefficient is 0 is written 0 by the router op and
        gets no gradient from it, so the other is returned alone (no add launched: decode
        batches)."""
        aux_c, z_c = self.router_cfg[5], self.router_cfg[6]
        return (aux if z_c == 0 else z if aux_c == 0 else aux + z).squeeze(0)

    @property
    def local_experts(self):
        """The experts this rank holds (all of them without expert parallelism)."""
        return self.experts if self.ep is None else self.ep.local_experts

    @property
    def first_expert(self):
        """The global id of this rank's first expert (0 without expert parallelism)."""
        return 0 if self.ep is None else self.ep.first_expert

    @property
    def ep_overflow(self):
        """Capacity mode on the CPU: the drops of the last forward (the status message: which
        peer needed how many rows or entries), or None. On CUDA, groupmm.check() raises them."""
        return None if self.ep is None else self.ep.last_overflow

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
        """With delay_wgrad: the experts' and the shared expert's queued weight gradients
        (GroupedLinear.backward_dw)."""
        for layer in (self.gate_up, self.down, self.shared_up, self.shared_down):
            if layer is not None:
                layer.backward_dw()

    @classmethod
    def from_transformers(cls, layer, *, dtype=None, device=None, **kw):
        """The block equal to a transformers MoE layer (a decoder layer's `mlp`), its weights
        copied: GptOssMLP (from_gpt_oss), DeepseekV3MoE (from_deepseek_v3), Llama4TextMoe (a
        decoder layer's `feed_forward`: router_on_input=True, score='sigmoid' without
        renormalization, the shared expert), and the softmax top-k
        blocks Qwen3MoeSparseMoeBlock, MixtralSparseMoeBlock and OlmoeSparseMoeBlock (router
        `gate` [E, H] without bias, softmax scores, the top-k weights renormalized as the layer's
        norm_topk_prob says (Mixtral: always), experts.gate_up_proj [E, 2F, H] with gate rows
        first, experts.down_proj [E, H, F], SiLU). dtype and device default to the layer's; other
        keywords go to the constructor (recipe, align, capacity_factor, ...). Refused
        (NotImplementedError naming the class and the reason): other classes, Qwen2-MoE's gated
        shared expert, another activation than SiLU, Mixtral's router jitter in training."""
        return _loaders.from_transformers(cls, layer, dtype, device, **kw)

    @classmethod
    def from_gpt_oss(cls, source, topk=None, *, prefix="", recipe="bf16", dtype=torch.bfloat16,
                     device=None, **kw):
        """gpt-oss's MoE layer as a block: source is transformers' GptOssMLP (its top-k and its
        experts' alpha and limit are read from it) or a state dict with its keys (after `prefix`,
        e.g. "model.layers.0.mlp."; topk then given). The experts come as 16-bit weights or as the
        checkpoint's MXFP4 blocks and scales (recipe 'mxfp4_weight'): see import_gpt_oss. Other
        keywords go to the constructor (capacity_factor, align, recompute, delay_wgrad, ...)."""
        return _loaders.from_gpt_oss(cls, source, topk, prefix, recipe, dtype, device, **kw)

    @torch.no_grad()
    def import_gpt_oss(self, state, prefix=""):
        """Copies gpt-oss's layer into this block (built with bias=True and GPT_OSS_SWIGLU, as
        from_gpt_oss builds it). state: a state dict of transformers' GptOssMLP or of the
        checkpoint, after `prefix`:
          router.weight [E, H], router.bias [E];
          experts.gate_up_proj_bias [E, 2F], experts.down_proj_bias [E, H];
          experts.gate_up_proj [E, H, 2F] and experts.down_proj [E, F, H] (16-bit, stored
            (in, out): transposed here to the layers' [E, out, in]), or the checkpoint's MXFP4
            experts.gate_up_proj_blocks [E, 2F, H / 32, 16] with experts.gate_up_proj_scales
            [E, 2F, H / 32] and experts.down_proj_blocks [E, H, F / 32, 16] with
            experts.down_proj_scales [E, H, F / 32] (uint8: E2M1 pairs and E8M0 exponents; recipe
            'mxfp4_weight', imported as GroupedLinear.import_mxfp4 does, bit for bit).
        Shapes are checked against the block (ValueError naming the key)."""
        return _loaders.import_gpt_oss(self, state, prefix)

    @classmethod
    def from_deepseek_v3(cls, source, topk=None, *, n_group=1, topk_group=1, scaling_factor=1.0,
                         renormalize=True, prefix="", recipe="bf16", dtype=torch.bfloat16,
                         device=None, **kw):
        """DeepSeek-V3's MoE layer as a block: its router (sigmoid scores, group-limited top-k
        selected with the e_score_correction_bias, the unbiased weights renormalized and scaled),
        the routed experts and the shared expert. source is transformers' DeepseekV3MoE (the
        routing settings are read from its gate) or a state dict with its keys or the released
        checkpoint's (after `prefix`, e.g. "model.layers.3.mlp."; topk, n_group, topk_group,
        scaling_factor and renormalize then given as the model's config has them: 8, 8, 4, 2.5,
        True for DeepSeek-V3). The experts come as 16-bit weights or as the checkpoint's FP8
        weights with their 128x128 block scales (recipe 'fp8_block'): see import_deepseek_v3.
        Other keywords go to the constructor."""
        return _loaders.from_deepseek_v3(cls, source, topk, n_group, topk_group, scaling_factor,
                                         renormalize, prefix, recipe, dtype, device, **kw)

    @torch.no_grad()
    def import_deepseek_v3(self, state, prefix=""):
        """Copies DeepSeek-V3's layer into this block (built as from_deepseek_v3 builds it).
        state: a state dict of transformers' DeepseekV3MoE or of the released checkpoint, after
        `prefix`:
          gate.weight [E, H]; gate.e_score_correction_bias [E] (into expert_bias; the block needs
            expert_bias=True when the state has it, and the state needs it when the block has it);
          the routed experts, either stacked as transformers holds them, experts.gate_up_proj
            [E, 2F, H] (gate rows first) and experts.down_proj [E, H, F], or one expert a key as
            the checkpoint stores them, experts.{e}.{gate,up,down}_proj.weight ([F, H], [F, H],
            [H, F]): 16-bit, or float8_e4m3fn with their .weight_scale_inv ([F / 128, H / 128],
            [H / 128, F / 128] fp32, the dequantization multiplier of each 128x128 block; recipe
            'fp8_block', whose layers take multiples of 128 only, so no block mixes gate and up
            rows; imported as GroupedLinear.import_fp8_block does, the bytes as they are);
          shared_experts.{gate,up,down}_proj.weight (+ .weight_scale_inv), when the block has a
            shared expert.
        Shapes are checked against the block (ValueError naming the key)."""
        return _loaders.import_deepseek_v3(self, state, prefix)
