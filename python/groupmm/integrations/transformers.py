"""The "groupmm" experts backend of Hugging Face transformers.

    import groupmm.integrations.transformers  # registers (or call register())
    model = AutoModelForCausalLM.from_config(cfg, experts_implementation="groupmm")

transformers (>= 5) runs the experts of its MoE families through `ExpertsInterface`
(`transformers.integrations.moe`): a class decorated with `@use_experts_implementation` calls the
function registered under `config._experts_implementation` with (hidden_states [T, H],
top_k_index [T, k], top_k_weights [T, k]). This backend computes it with groupmm's ops, autograd
included: permute_plan -> permute (the router weights become per-row probs) -> grouped_mm
(gate_up, + its bias) -> weighted_swiglu (the router weight applied inside the activation;
weighted_swiglu_ex for the clamped forms: gpt-oss, MiniMax-M3, DeepSeek-V4, ...) -> grouped_mm
(down) -> unpermute (a fixed-order fp32 sum of each token's k rows, + the routed down bias).

Keys: "groupmm" (the recipe given to register(), "bf16" by default: the model's own dtype, fp32
too on the CPU) and "groupmm_<recipe>" for every recipe of groupmm.nn.GroupedLinear:
fp8_current, fp8_block, mxfp8 (training and inference: bf16 models, expert sizes multiples of
16 / 128 / 32; each expert's rows padded to 16), nvfp4_weight, mxfp4_weight (inference: 4-bit
weights quantized once and cached, forward only).

What an experts class needs (checked on its first call; NotImplementedError otherwise): a gate
(has_gate), an activation that is SwiGLU in one of the forms weighted_swiglu_ex computes (checked
numerically against the class's own `_apply_gate` once per class), expert ids in [0, E) (no
expert-parallel sentinels). Transposed weights (gpt-oss: [E, in, out]) are read as they are in
bf16 (the grouped GEMM's passes that take that layout: _InOutLinear); the quantized recipes
quantize from a [E, out, in] copy, made on each call that records a graph and, without grad, once
per weight version and kept.
"""

import torch

import groupmm  # noqa: F401  (loads the ops)
from groupmm.nn.grouped_linear import (INFERENCE_RECIPES, RECIPES, _GroupedLinearFn, _Quantized,
                                       _W4, split_multiple)

ops = torch.ops.groupmm

KEY = "groupmm"
_default_recipe = "bf16"


# ---- the activation of an experts class ---------------------------------------------------------

# Classes whose `_apply_gate` is a clamped SwiGLU: (alpha, limit, up_offset) read from the module.
# Each is still checked against the class's own _apply_gate before first use.
_FORMS = {
    "GptOssExperts": lambda m: (m.alpha, m.limit, 1.0),
    "OpenAIPrivacyFilterExperts": lambda m: (m.alpha, m.limit, 1.0),
    "MiniMaxM3VLExperts": lambda m: (m.swiglu_alpha, m.swiglu_limit, 1.0),
    "DeepseekV4Experts": lambda m: (1.0, m.limit, 0.0),
    "Glm5NextExperts": lambda m: (1.0, m.swiglu_limit, 0.0),
    "HYV4Experts": lambda m: (1.0, m.swiglu_limit, 0.0),
}


def _form_of(module):
    """(alpha, limit or None, up_offset, interleaved) of the module's gate, or raises."""
    cls = type(module)
    name = cls.__name__
    if not getattr(module, "has_gate", True):
        raise NotImplementedError(
            f"groupmm experts backend: {name} has no gate (has_gate=False: act(x W_up^T) W_down^T); "
            "groupmm's expert activation is the (weighted) SwiGLU; use another experts_implementation")
    interleaved = not getattr(module, "is_concatenated", True)
    from transformers.integrations.moe import _default_apply_gate
    own_gate = getattr(cls, "_apply_gate", _default_apply_gate)
    if own_gate is _default_apply_gate:
        form = (1.0, None, 0.0, interleaved)
    else:
        owner = next((c.__name__ for c in cls.__mro__ if "_apply_gate" in c.__dict__), name)
        if owner not in _FORMS and name not in _FORMS:
            raise NotImplementedError(
                f"groupmm experts backend: {name}._apply_gate is not a SwiGLU form groupmm computes "
                "(weighted_swiglu_ex: min(g, limit) * sigmoid(alpha * min(g, limit)) * "
                "(clamp(u, -limit, limit) + up_offset))")
        alpha, limit, offset = _FORMS.get(name, _FORMS.get(owner))(module)
        form = (float(alpha), None if limit is None else float(limit), float(offset), interleaved)
    _check_form(module, form)
    return form


def _check_form(module, form):
    """The form against the class's own gate on a probe (once per class): catches an activation
    other than SiLU, or a gate formula that changed in transformers."""
    cls = type(module)
    if cls.__dict__.get("_groupmm_form_checked") == form:
        return
    gen = torch.Generator().manual_seed(0)
    probe = torch.randn(8, 32, generator=gen, dtype=torch.float64) * 6
    with torch.no_grad():
        ref = module._apply_gate(probe.to(torch.float32)).double()
        got = ops.weighted_swiglu_ex(probe.float(), torch.ones(8), *form).double()
    if ref.shape != got.shape or not torch.allclose(got, ref, rtol=1e-4, atol=1e-5):
        raise NotImplementedError(
            f"groupmm experts backend: {cls.__name__}'s gate (activation {getattr(module, 'act_fn', None)!r}) "
            f"is not the SwiGLU form {form} (alpha, limit, up_offset, interleaved) that groupmm "
            "computes")
    cls._groupmm_form_checked = form


# ---- expert weights in groupmm's layout ([E, out, in]) --------------------------------------------

def _weight(module, name):
    w = getattr(module, name)
    if not getattr(module, "is_transposed", False):
        return w
    wt = w.transpose(1, 2)  # [E, out, in], a view: the op copies it to contiguous memory
    if (torch.is_grad_enabled() and w.requires_grad) or torch.compiler.is_compiling():
        return wt
    cache = module.__dict__.setdefault("_groupmm_weights", {})
    key = (w._version, w.data_ptr(), w.device, w.dtype)
    hit = cache.get(name)
    if hit is None or hit[0] != key:
        hit = cache[name] = (key, wt.contiguous())
    return hit[1]


class _Layer:
    """What groupmm.nn.GroupedLinear's autograd function reads of its layer, for a quantized recipe
    over a weight the experts module owns."""

    accumulate_into_main_grad = False
    delay_wgrad = False
    bias = None
    splits_total = "exact"

    def __init__(self, recipe):
        self._exec = _W4(recipe) if recipe in INFERENCE_RECIPES else _Quantized(
            recipe, torch.float8_e4m3fn, False)

    def _main_grad(self):
        return None


class _InOutLinear(torch.autograd.Function):
    """y [R, out] = x_e w_e (+ b_e) per expert over rows grouped by splits, for a weight stored
    [E, in, out] (transposed: gpt-oss). Each pass runs the grouped GEMM kernel that reads that
    layout as it is, so the weight is never copied: forward is the core's dgrad pass (dy W with
    W [G, N, K] row-major), dx its forward pass (dy W^T), dW [E, in, out] its wgrad pass; the bias
    is added after the GEMM (the core's GEMM bias is a forward-pass feature) and its gradient is
    group_dbias (a fixed-order sum, no atomics)."""

    @staticmethod
    def forward(ctx, x, w, bias, splits):
        y = ops.grouped_gemm(x, w, splits, "dgrad", None, None, "exact", False)
        if bias is not None:
            y = y + bias.repeat_interleave(splits, dim=0, output_size=x.shape[0])
        ctx.save_for_backward(x, w, splits)
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, splits = ctx.saved_tensors
        dy = dy.contiguous()
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dx = ops.grouped_gemm(dy, w, splits, "forward", None, None, "exact", False) if need_x else None
        dw = ops.grouped_gemm(x, dy, splits, "wgrad", None, None, "exact", False) if need_w else None
        db = ops.group_dbias(dy, splits) if ctx.has_bias and need_b else None
        return dx, dw, db, None


def _linear(module, recipe, x, name, bias, splits):
    if recipe == "bf16" and getattr(module, "is_transposed", False):
        return _InOutLinear.apply(x, getattr(module, name), bias, splits)
    w = _weight(module, name)
    if recipe == "bf16":
        return ops.grouped_mm(x, w, splits, bias)
    layers = module.__dict__.setdefault("_groupmm_layers", {})
    layer = layers.get((name, recipe))
    if layer is None:
        layer = layers[(name, recipe)] = _Layer(recipe)
    w_op = layer._exec.prepare(w, None)
    if not torch.is_grad_enabled():
        return layer._exec.forward(x, w_op, bias, splits)[0]
    return _GroupedLinearFn.apply(x, w, bias, splits, layer, w_op, None, 0)


# ---- the experts forward -------------------------------------------------------------------------

def experts_forward(module, hidden_states, top_k_index, top_k_weights, recipe=None):
    """The experts of `module` (a transformers class decorated with @use_experts_implementation)
    over hidden_states [T, H] routed by top_k_index / top_k_weights [T, k] -> [T, H]."""
    recipe = recipe or _default_recipe
    form = module.__dict__.get("_groupmm_form")
    if form is None:
        form = module.__dict__["_groupmm_form"] = _form_of(module)
    alpha, limit, up_offset, interleaved = form
    E, align = module.num_experts, split_multiple(recipe)
    x = hidden_states
    ids = top_k_index.to(torch.int32)
    plan = ops.permute_plan(ids, E, align, 0)
    splits = plan[3]
    x_perm, probs = ops.permute(x, *plan, align, 0, top_k_weights.float())
    gu_bias = module.gate_up_proj_bias if module.has_bias else None
    gu = _linear(module, recipe, x_perm, "gate_up_proj", gu_bias, splits)
    if (alpha, limit, up_offset, interleaved) == (1.0, None, 0.0, False):
        h = ops.weighted_swiglu(gu, probs)
    else:
        h = ops.weighted_swiglu_ex(gu, probs, alpha, limit, up_offset, interleaved)
    y_perm = _linear(module, recipe, h, "down_proj", None, splits)
    # sum_j w_tj b_down[e_tj]: the router weight multiplies the down bias too (the weight is
    # applied in the activation, before the down GEMM, so the GEMM's own bias would be
    # unweighted); unpermute adds it after the k rows.
    routed = (module.down_proj_bias, ids, top_k_weights.float()) if module.has_bias else ()
    return ops.unpermute(y_perm, *plan, align, 0, None, *routed)


def _keyed(recipe):
    def forward(module, hidden_states, top_k_index, top_k_weights):
        return experts_forward(module, hidden_states, top_k_index, top_k_weights, recipe)

    forward.__name__ = f"groupmm_{recipe}_experts_forward"
    return forward


def register(recipe="bf16"):
    """Adds "groupmm" (with `recipe`) and "groupmm_<recipe>" for every recipe to transformers'
    experts interface; returns the key "groupmm". Called on import with "bf16"."""
    global _default_recipe
    if recipe not in RECIPES:
        raise ValueError(f"groupmm.integrations.transformers.register: recipe='{recipe}' must be "
                         f"one of {', '.join(RECIPES)}")
    from transformers.integrations.moe import ExpertsInterface
    _default_recipe = recipe
    ExpertsInterface.register(KEY, experts_forward)
    for r in RECIPES:
        ExpertsInterface.register(f"{KEY}_{r}", _keyed(r))
    return KEY


# ---- Llama 4: its MoE layer replaced whole ------------------------------------------------------

class Llama4MoE(torch.nn.Module):
    """A Llama 4 decoder layer's feed_forward on groupmm: `moe` (a groupmm.nn.MoE built by
    MoE.from_transformers from the layer's Llama4TextMoe) over the flattened tokens, returning
    (y in the input's shape, the block's router loss) where Llama4TextMoe returns (y, router
    logits); the decoder layer keeps the first."""

    def __init__(self, moe):
        super().__init__()
        self.moe = moe

    def forward(self, hidden_states):
        y, aux = self.moe(hidden_states.reshape(-1, hidden_states.shape[-1]))
        return y.view(hidden_states.shape), aux


def replace_llama4_moe(model, **kw):
    """Replaces every Llama4TextMoe in `model` (transformers' Llama 4, whose Llama4TextExperts
    run their own bmm over every expert and do not go through the experts interface) by
    Llama4MoE(groupmm.nn.MoE.from_transformers(layer, **kw)): the same routing (sigmoid of the
    top-k logits scaling the experts' inputs) and weights, the shared expert included, on groupmm's
    ops; kw goes to from_transformers (recipe, dtype, align, recompute, ...). The model's state
    dict then holds the blocks' keys (`feed_forward.moe.router.weight`, ...), not Llama 4's.
    Returns the number of layers replaced."""
    from groupmm.nn import MoE
    targets = [(parent, name, child) for parent in model.modules()
               for name, child in parent.named_children()
               if type(child).__name__ == "Llama4TextMoe"]
    for parent, name, child in targets:
        setattr(parent, name, Llama4MoE(MoE.from_transformers(child, **kw)))
    return len(targets)


register()

__all__ = ["register", "experts_forward", "KEY", "Llama4MoE", "replace_llama4_moe"]
