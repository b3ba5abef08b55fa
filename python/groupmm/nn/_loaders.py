"""The bodies of groupmm.nn.MoE's loaders (from_transformers, from_gpt_oss / import_gpt_oss,
from_deepseek_v3 / import_deepseek_v3; their contracts are the MoE methods' docstrings): a
model's MoE-layer state checked key by key against the block and copied or imported into it."""

import torch

from ._swiglu import GPT_OSS_SWIGLU


class _State:
    """A model's MoE-layer state dict seen through a key prefix, with shape checks."""

    def __init__(self, state, prefix, model):
        self.state, self.prefix, self.model = state, prefix, model

    @classmethod
    def of_layer(cls, loader, state, prefix, model, topk, usual_topk):
        """The state MoE.<loader> builds from; a state dict carries no top-k, so it is needed."""
        if topk is None:
            raise ValueError(f"groupmm.nn.MoE.{loader}: topk is needed with a state dict ({model} "
                             f"routes each token to {usual_topk} experts)")
        return cls(state, prefix, model)

    def __contains__(self, key):
        return self.prefix + key in self.state

    def __getitem__(self, key):
        return self.state[self.prefix + key]

    def check(self, key, shape):
        name = self.prefix + key
        if name not in self.state:
            raise ValueError(f"groupmm.nn.MoE: the {self.model} state has no '{name}'")
        t = self.state[name]
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise ValueError(f"groupmm.nn.MoE: {self.model}'s '{name}' is {list(t.shape)}; this "
                             f"block takes {list(shape)}")
        return t


def _copy_weight(layer, w, name):
    """A 16-bit weight into layer (its own dtype and device; a quantized recipe's cached copy is
    keyed on the weight's version, so it is made again)."""
    if layer.weight is None:
        raise ValueError(f"groupmm.nn.MoE: {name}: the layer holds imported quantized weights; "
                         "16-bit weights go into a new block")
    layer.weight.copy_(w)


def _load(layer, state, key, shape):
    _copy_weight(layer, state.check(key, shape), state.prefix + key)


def _load_stacked(layer, state, weights, keys, one=False):
    """Per-expert weights [N, K] (gate and up already concatenated) into layer: 16-bit ones
    copied, float8_e4m3fn ones imported with the 128x128 scale_inv of each key, concatenated the
    same way (fp8_block's layers take only multiples of 128 rows and columns, so no scale block
    mixes gate and up rows)."""
    if weights[0].dtype != torch.float8_e4m3fn:
        w = torch.stack(weights)
        _copy_weight(layer, w[0] if one else w, state.prefix + keys[0])
        return
    scales = [state.check(k + "_scale_inv", None) for k in keys]
    per = len(keys) // len(weights)
    scales = [torch.cat(scales[i * per:(i + 1) * per]) for i in range(len(weights))]
    w, s = torch.stack(weights), torch.stack(scales)
    layer.import_fp8_block(w[0] if one else w, s[0] if one else s)


# transformers' MoE blocks of the plain form (softmax top-k router without bias, SwiGLU experts
# stored [E, 2F, H] / [E, H, F], no shared expert): from_transformers copies them as they are.
_SOFTMAX_TOPK_BLOCKS = ("Qwen3MoeSparseMoeBlock", "MixtralSparseMoeBlock", "OlmoeSparseMoeBlock")


def from_transformers(cls, layer, dtype, device, **kw):
    name = type(layer).__name__
    first = next(layer.parameters())
    dtype = first.dtype if dtype is None else dtype
    device = first.device if device is None else device
    if name == "GptOssMLP":
        return cls.from_gpt_oss(layer, dtype=dtype, device=device, **kw)
    if name == "DeepseekV3MoE":
        return cls.from_deepseek_v3(layer, dtype=dtype, device=device, **kw)

    def refuse(why):
        raise NotImplementedError(f"groupmm.nn.MoE.from_transformers: {name}: {why}")
    if name == "Llama4TextMoe":
        return _from_llama4(cls, layer, refuse, dtype, device, **kw)
    if name not in _SOFTMAX_TOPK_BLOCKS:
        refuse("not a layer this block expresses (GptOssMLP, DeepseekV3MoE, Llama4TextMoe, "
               f"{', '.join(_SOFTMAX_TOPK_BLOCKS)})" + (
                   "; Qwen2-MoE's shared expert is scaled by a sigmoid gate of its own, which "
                   "the block's shared expert has not" if name == "Qwen2MoeSparseMoeBlock"
                   else ""))
    gate, experts = layer.gate, layer.experts
    act = type(getattr(experts, "act_fn", None)).__name__
    if act not in ("SiLU", "SiLUActivation"):
        refuse(f"the experts' activation is {act}; the block's is SwiGLU (SiLU)")
    if getattr(layer, "jitter_noise", 0):
        refuse(f"router jitter {layer.jitter_noise} (training noise on the router's input) is "
               "not a feature of the block; set router_jitter_noise=0")
    E, H = gate.weight.shape
    F = experts.gate_up_proj.shape[1] // 2
    if tuple(experts.gate_up_proj.shape) != (E, 2 * F, H) or \
            tuple(experts.down_proj.shape) != (E, H, F):
        refuse(f"expert weights {list(experts.gate_up_proj.shape)} and "
               f"{list(experts.down_proj.shape)}; the block takes [E, 2F, H] and [E, H, F]")
    renormalize = bool(getattr(gate, "norm_topk_prob", True))
    moe = cls(H, F, E, int(gate.top_k), score="softmax", renormalize=renormalize, dtype=dtype,
              device=device, **kw)
    with torch.no_grad():
        moe.router.weight.copy_(gate.weight)
        _copy_weight(moe.gate_up, experts.gate_up_proj, f"{name}.experts.gate_up_proj")
        _copy_weight(moe.down, experts.down_proj, f"{name}.experts.down_proj")
    return moe


def _from_llama4(cls, layer, refuse, dtype, device, **kw):
    """Llama 4's layer: router [E, H] without bias, the top-k logits' sigmoids as weights (no
    renormalization) scaling the experts' input rows, experts stored (in, out): gate_up_proj
    [E, H, 2F] (gate columns first) and down_proj [E, F, H], a shared SwiGLU expert added."""
    experts, router, shared = layer.experts, layer.router, layer.shared_expert
    for what, act in (("experts'", experts.act_fn), ("shared expert's", shared.activation_fn)):
        if type(act).__name__ not in ("SiLU", "SiLUActivation"):
            refuse(f"the {what} activation is {type(act).__name__}; the block's is SwiGLU (SiLU)")
    if router.bias is not None:
        refuse("a router bias (Llama 4's router has none)")
    E, H = router.weight.shape
    F = experts.gate_up_proj.shape[2] // 2
    Fs = shared.gate_proj.weight.shape[0]
    if tuple(experts.gate_up_proj.shape) != (E, H, 2 * F) or \
            tuple(experts.down_proj.shape) != (E, F, H):
        refuse(f"expert weights {list(experts.gate_up_proj.shape)} and "
               f"{list(experts.down_proj.shape)}; Llama 4's are [E, H, 2F] and [E, F, H]")
    moe = cls(H, F, E, int(layer.top_k), shared_ffn_hidden=Fs, score="sigmoid",
              renormalize=False, router_on_input=True, dtype=dtype, device=device, **kw)
    name = type(layer).__name__
    with torch.no_grad():
        moe.router.weight.copy_(router.weight)
        _copy_weight(moe.gate_up, experts.gate_up_proj.transpose(1, 2),
                     f"{name}.experts.gate_up_proj")
        _copy_weight(moe.down, experts.down_proj.transpose(1, 2), f"{name}.experts.down_proj")
        _copy_weight(moe.shared_up, torch.cat((shared.gate_proj.weight, shared.up_proj.weight)),
                     f"{name}.shared_expert.gate_proj / up_proj")
        _copy_weight(moe.shared_down, shared.down_proj.weight, f"{name}.shared_expert.down_proj")
    return moe


def from_gpt_oss(cls, source, topk, prefix, recipe, dtype, device, **kw):
    form = GPT_OSS_SWIGLU
    if isinstance(source, torch.nn.Module):
        router, experts = getattr(source, "router", None), getattr(source, "experts", None)
        if topk is None:
            topk = getattr(router, "top_k", None)
        if experts is not None and hasattr(experts, "alpha"):
            form = form._replace(alpha=float(experts.alpha), limit=float(experts.limit))
        source = source.state_dict()
    state = _State.of_layer("from_gpt_oss", source, prefix, "gpt-oss", topk, 4)
    E, H = state.check("router.weight", None).shape
    F = state.check("experts.gate_up_proj_bias", None).shape[-1] // 2
    moe = cls(H, F, E, topk, score="softmax", renormalize=True, bias=True, activation=form,
              recipe=recipe, dtype=dtype, device=device, **kw)
    moe.import_gpt_oss(state)
    return moe


def import_gpt_oss(moe, state, prefix):
    if not isinstance(state, _State):
        state = _State(state, prefix, "gpt-oss")
    if moe.down_bias is None or moe.activation != GPT_OSS_SWIGLU._replace(
            alpha=moe.activation.alpha, limit=moe.activation.limit):
        raise ValueError("groupmm.nn.MoE.import_gpt_oss: the block must be built with "
                         "bias=True and activation=GPT_OSS_SWIGLU (MoE.from_gpt_oss does)")
    E, H, F = moe.local_experts, moe.gate_up.in_features, moe.down.in_features
    state.check("router.weight", (E, H))
    state.check("router.bias", (E,))
    state.check("experts.gate_up_proj_bias", (E, 2 * F))
    state.check("experts.down_proj_bias", (E, H))
    moe.router.weight.copy_(state["router.weight"])
    moe.router.bias.copy_(state["router.bias"])
    moe.gate_up.bias.copy_(state["experts.gate_up_proj_bias"])
    moe.down_bias.copy_(state["experts.down_proj_bias"])
    for layer, name, out, inn in ((moe.gate_up, "gate_up_proj", 2 * F, H),
                                  (moe.down, "down_proj", H, F)):
        key = f"experts.{name}"
        if key + "_blocks" in state:
            blocks = state.check(key + "_blocks", (E, out, inn // 32, 16))
            scales = state.check(key + "_scales", (E, out, inn // 32))
            layer.import_mxfp4(blocks, scales)
        else:  # (in, out) -> [E, out, in]
            _copy_weight(layer, state.check(key, (E, inn, out)).transpose(1, 2),
                         state.prefix + key)


def from_deepseek_v3(cls, source, topk, n_group, topk_group, scaling_factor, renormalize,
                     prefix, recipe, dtype, device, **kw):
    if isinstance(source, torch.nn.Module):
        gate = source.gate
        topk = gate.top_k if topk is None else topk
        n_group, topk_group = int(gate.num_group), int(gate.topk_group)
        scaling_factor = float(gate.routed_scaling_factor)
        renormalize = bool(gate.norm_topk_prob)
        source = source.state_dict()
    state = _State.of_layer("from_deepseek_v3", source, prefix, "DeepSeek-V3", topk, 8)
    E, H = state.check("gate.weight", None).shape
    if "experts.gate_up_proj" in state:
        F = state["experts.gate_up_proj"].shape[1] // 2
    else:
        F = state.check("experts.0.gate_proj.weight", None).shape[0]
    shared = ("shared_experts.gate_proj.weight" in state
              and state["shared_experts.gate_proj.weight"].shape[0])
    moe = cls(H, F, E, topk, shared_ffn_hidden=shared or 0, score="sigmoid",
              renormalize=renormalize, n_group=n_group, topk_group=topk_group,
              scaling_factor=scaling_factor,
              expert_bias="gate.e_score_correction_bias" in state, recipe=recipe, dtype=dtype,
              device=device, **kw)
    moe.import_deepseek_v3(state)
    return moe


def import_deepseek_v3(moe, state, prefix):
    if not isinstance(state, _State):
        state = _State(state, prefix, "DeepSeek-V3")
    E, H, F = moe.local_experts, moe.gate_up.in_features, moe.down.in_features
    moe.router.weight.copy_(state.check("gate.weight", (E, H)))
    has_bias = "gate.e_score_correction_bias" in state
    if has_bias != (moe.expert_bias is not None):
        raise ValueError(f"groupmm.nn.MoE.import_deepseek_v3: the state "
                         f"{'has' if has_bias else 'has no'} '{state.prefix}gate."
                         f"e_score_correction_bias' and the block "
                         f"{'has no' if has_bias else 'has an'} expert_bias (build it with "
                         f"expert_bias={has_bias})")
    if has_bias:
        moe.expert_bias.copy_(state.check("gate.e_score_correction_bias", (E,)))
    if "experts.gate_up_proj" in state:
        _load(moe.gate_up, state, "experts.gate_up_proj", (E, 2 * F, H))
        _load(moe.down, state, "experts.down_proj", (E, H, F))
    else:
        keys = [[f"experts.{e}.{p}_proj.weight" for e in range(E)]
                for p in ("gate", "up", "down")]
        gate, up, down = ([state.check(k, shape) for k in ks]
                          for ks, shape in zip(keys, ((F, H), (F, H), (H, F))))
        _load_stacked(moe.gate_up, state, [torch.cat(p) for p in zip(gate, up)],
                      [k for pair in zip(*keys[:2]) for k in pair])
        _load_stacked(moe.down, state, down, keys[2])
    if moe.shared_up is not None:
        Fs = moe.shared_down.in_features
        keys = [f"shared_experts.{p}_proj.weight" for p in ("gate", "up", "down")]
        gate, up, down = (state.check(k, shape) for k, shape in
                          zip(keys, ((Fs, H), (Fs, H), (H, Fs))))
        _load_stacked(moe.shared_up, state, [torch.cat((gate, up))], keys[:2], one=True)
        _load_stacked(moe.shared_down, state, [down], keys[2:], one=True)
