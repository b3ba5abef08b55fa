"""GroupedLinear: G experts' nn.Linear layers as one [G, N, K] weight and one grouped GEMM, in
16-bit or with a quantized recipe (FP8 training, 4-bit weight inference), with delayed wgrad and
fp32 main_grad accumulation."""

import math
import numbers

import torch

from .._meta import recipe_traits
from . import _checkpoint
from ._executors import _HighPrecision, _Quantized, _W4

ops = torch.ops.groupmm

TRAINING_RECIPES = ("bf16", "fp8_current", "fp8_block", "mxfp8")
INFERENCE_RECIPES = ("nvfp4_weight", "mxfp4_weight")
RECIPES = TRAINING_RECIPES + INFERENCE_RECIPES


def split_multiple(recipe):
    """The rows each expert's split must be a multiple of under a layer recipe (the core's
    recipe_traits(recipe).split_multiple; 1 for the 16-bit and the 4-bit weight recipes)."""
    return recipe_traits(recipe).split_multiple if recipe in TRAINING_RECIPES[1:] else 1


class _GroupedLinearFn(torch.autograd.Function):
    """The layer's forward through its executor (w_op: what prepare() made of weight; expected:
    the GEMMs' expected rows, capped); backward computes dx and db, and dW now or, with
    delay_wgrad, queues what wgrad needs for layer.backward_dw()."""

    @staticmethod
    def forward(ctx, x, weight, bias, splits, layer, w_op, recompute, expected):
        y, state = layer._exec.forward(x, w_op, bias, splits, expected)
        if recompute is not None:  # keep nothing of x: wgrad makes it again from recompute()
            state = (_Recomputed(recompute, layer._exec, splits), state[1])
        ctx.layer, ctx.state, ctx.expected = layer, state, expected
        ctx.save_for_backward(splits)
        return y

    @staticmethod
    def backward(ctx, dy):
        layer, state = ctx.layer, ctx.state
        (splits,) = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        expected = ctx.expected  # dgrad's rows and wgrad's reduction rows are x's rows
        dx, dy_kept = layer._exec.dgrad(dy, state, splits, need_x, expected)
        db = None
        if need_b:
            if layer.accumulate_into_main_grad:
                ops.group_dbias_accumulate(dy, splits, layer.bias.main_grad,
                                           splits_total=layer.splits_total)
            else:
                db = ops.group_dbias(dy, splits, splits_total=layer.splits_total)
        dw = None
        if need_w:
            if layer.delay_wgrad:
                layer._pending_wgrad.append((dy_kept, state, splits, expected))
            else:
                dw = layer._exec.wgrad(dy_kept, _resolved(state), splits, layer._main_grad(),
                                       expected)
        ctx.state = None
        return dx, dw, db, None, None, None, None, None


class _Recomputed:
    """The input half of an executor's state, made when wgrad needs it: recompute() gives x again
    (bit for bit the forward's, e.g. the permuted rows gathered once more), and the executor
    derives from it what wgrad reads (x, or its columnwise quantization)."""

    def __init__(self, recompute, executor, splits):
        self.recompute, self.executor, self.splits = recompute, executor, splits

    def get(self):
        with torch.no_grad():
            return self.executor.input_state(self.recompute(), self.splits)


def _resolved(state):
    return (state[0].get(), state[1]) if isinstance(state[0], _Recomputed) else state


def _check(cond, recipe, message):
    if not cond:
        raise ValueError(f"groupmm.nn.GroupedLinear(recipe='{recipe}'): {message}")


def _check_expected(expected_rows, splits_total, where):
    """expected_rows' rule (C++ GroupedLinearConfig's): 0, or > 0 with splits_total='at_most'."""
    if isinstance(expected_rows, bool) or not isinstance(expected_rows,
                                                         (numbers.Integral, torch.SymInt)):
        raise TypeError(f"{where}: expected_rows={expected_rows!r} must be an int")
    if not (expected_rows == 0 or (expected_rows > 0 and splits_total == "at_most")):
        raise ValueError(f"{where}: expected_rows={expected_rows} must be 0, or > 0 with "
                         "splits_total='at_most'")


class GroupedLinear(torch.nn.Module):
    """y_g = x_g W_g^T (+ b_g) for the rows of expert g (rows sorted by expert, `splits` [G] rows
    per expert on x's device).

    weight [G, N, K] (out, in) and bias [G, N] are initialized like G independent nn.Linear
    layers. dtype bfloat16 or float16 (float32 too on the CPU).

    recipe (what the three GEMMs run on; the C++ layer's recipes, bit for bit on the CPU):
      'bf16'          16-bit operands, fp32 accumulation (the default);
      'fp8_current'   FP8 with per-expert current scaling; 'fp8_block' DeepSeek-V3 1x128 / 128x128
                      blocks; 'mxfp8' MX blocks of 32 (training: forward quantizes x, the weights
                      are quantized once and reused until weight._version changes, backward
                      quantizes dy in grad_dtype, e4m3 or e5m2; pow2_scales for the FP8 recipes;
                      forward's is_first_microbatch keeps them across calls of a compiled graph;
                      high_precision_wgrad=True runs the weight gradient as the 16-bit GEMM of
                      the bf16 dy and x, forward and dgrad staying FP8, as TransformerEngine's
                      override_linear_precision=(False, False, True): x and dy are then quantized
                      rowwise only and backward keeps the 16-bit x instead of its FP8 columnwise
                      copy, which pays where the FP8 wgrad is no faster than the 16-bit one, e.g.
                      fp8_block on fine-grained experts; docs/performance.md).
                      bfloat16 layers; in/out features multiples of 16 (mxfp8: 32, fp8_block:
                      128); fp8_current and fp8_block: every split a multiple of 16 (pad
                      experts: MoE pads them by default); groupmm.recipe_traits(recipe) states
                      these rules as the C++ core does;
      'nvfp4_weight', 'mxfp4_weight'   inference with 4-bit weights (quantized once, cached like
                      the FP8 ones) x bf16 activations; backward raises. bfloat16 layers,
                      in_features a multiple of 32, out_features of 8.

    accumulate_into_main_grad: backward adds dW (and db) into weight.main_grad (and
    bias.main_grad), fp32 and zeroed here (zero them yourself between optimizer steps), Megatron
    style, and leaves .grad None.
    delay_wgrad: backward computes dx and db only and keeps what the weight gradient needs;
    backward_dw() then computes dW into weight.grad (added to it, as autograd does) or main_grad.
    Several backwards may queue before one backward_dw(). Hooks on weight.grad do not see it.

    splits_total (the C++ GroupedLinearConfig::splits_total): 'exact' (the default: sum(splits)
    == x.shape[0]) or 'at_most' (sum(splits) <= x.shape[0]: the rows past the sum belong to no
    expert and are neither read nor written: y's rows there, and dx's in backward, are left as
    allocated (uninitialized); a sum above the rows is a device fault). For buffers sized for a
    bound, such as expert-parallel capacity mode's. Every recipe (the 4-bit weight ones forward
    only, as always).

    expected_rows (the C++ GroupedLinearConfig::expected_rows; splits_total='at_most' only): the
    rows the splits are expected to sum to (e.g. T*k routed rows in expert parallelism's capacity
    buffer of R*C_e rows). Every GEMM of the layer (forward, dgrad, wgrad) gets it as its
    expected_rows, capped at the call's rows (min(expected_rows, x.shape[0])), and sizes its
    kernel choice by it instead of the buffer's rows: only which kernel runs changes, never which
    rows are read or written (on the CPU nothing changes). 0 (the default): the rows of each call.
    forward(..., expected_rows=) sets it for one call.

    A state dict of per-expert nn.Linear layers ("{prefix}{g}.weight", "{prefix}{g}.bias", as a
    ModuleList of them writes) loads directly; from_linears() builds one from the layers.

    Serving from quantized checkpoints: import_fp8_block() (DeepSeek-V3's FP8 weights and their
    128x128 block scale_inv) and import_mxfp4() (gpt-oss's MXFP4 blocks and scales) replace the
    16-bit weight by the checkpoint's bytes (kept as buffers: .to(), state_dict); the layer then
    runs forward only (no_grad), on the recipe's GEMM, with no 16-bit copy of the weights.
    """

    def __init__(self, experts, in_features, out_features, bias=True, dtype=torch.bfloat16,
                 device=None, accumulate_into_main_grad=False, recipe="bf16", delay_wgrad=False,
                 grad_dtype=torch.float8_e4m3fn, pow2_scales=False, splits_total="exact",
                 expected_rows=0, high_precision_wgrad=False):
        super().__init__()
        self.experts, self.in_features, self.out_features = experts, in_features, out_features
        self.accumulate_into_main_grad = accumulate_into_main_grad
        self.recipe, self.delay_wgrad = recipe, delay_wgrad
        self._exec = self._make_executor(recipe, dtype, grad_dtype, pow2_scales,
                                         bool(high_precision_wgrad))
        _check(splits_total in ("exact", "at_most"), recipe,
               f"splits_total='{splits_total}' must be 'exact' or 'at_most'")
        self.splits_total = self._exec.total = splits_total
        _check_expected(expected_rows, splits_total, f"groupmm.nn.GroupedLinear(recipe='{recipe}')")
        self.expected_rows = int(expected_rows)
        self._pending_wgrad = []
        kw = dict(dtype=dtype, device=device)
        self.weight = torch.nn.Parameter(torch.empty(experts, out_features, in_features, **kw))
        self.bias = torch.nn.Parameter(torch.empty(experts, out_features, **kw)) if bias else None
        self.reset_parameters()
        if accumulate_into_main_grad:
            for p in (self.weight, self.bias):
                if p is not None:
                    p.main_grad = torch.zeros_like(p, dtype=torch.float32)

    def _make_executor(self, recipe, dtype, grad_dtype, pow2_scales, hp_wgrad):
        _check(recipe in RECIPES, recipe, f"recipe must be one of {', '.join(RECIPES)}")
        _check(not hp_wgrad or (recipe != "bf16" and recipe not in INFERENCE_RECIPES), recipe,
               "high_precision_wgrad=True applies to the quantized training recipes "
               "(fp8_current, fp8_block, mxfp8)")
        K, N = self.in_features, self.out_features
        if recipe == "bf16":
            return _HighPrecision()
        _check(dtype == torch.bfloat16, recipe,
               f"dtype={dtype} must be torch.bfloat16 (quantized GEMMs take and write bf16)")
        # The core's rules for the recipe (groupmm::recipe_traits), as the C++ recipes read them.
        traits = recipe_traits(recipe.split("_")[0] if recipe in INFERENCE_RECIPES else recipe)
        k_mult, n_mult = traits.in_features_multiple, traits.out_features_multiple
        if recipe in INFERENCE_RECIPES:
            _check(K % k_mult == 0 and N % n_mult == 0, recipe, f"in_features={K} must be a "
                   f"multiple of {k_mult} and out_features={N} a multiple of {n_mult}")
            return _W4(recipe)
        _check(K % k_mult == 0 and N % k_mult == 0, recipe, f"in_features={K} and "
               f"out_features={N} must be multiples of {k_mult}")
        _check(grad_dtype in (torch.float8_e4m3fn, torch.float8_e5m2), recipe,
               f"grad_dtype={grad_dtype} must be torch.float8_e4m3fn or torch.float8_e5m2")
        _check(traits.e5m2_gradients or grad_dtype == torch.float8_e4m3fn, recipe,
               f"{recipe} gradients are float8_e4m3fn (the block GEMMs' operands)")
        return _Quantized(recipe, grad_dtype, pow2_scales, hp_wgrad)

    def reset_parameters(self):
        # nn.Linear's init per expert: kaiming_uniform(a=sqrt(5)) is U(-1/sqrt(K), 1/sqrt(K)).
        bound = 1.0 / math.sqrt(self.in_features) if self.in_features > 0 else 0.0
        if self.weight is None:
            raise RuntimeError(f"groupmm.nn.GroupedLinear(recipe='{self.recipe}'): reset_parameters: "
                               "the weights were imported from a quantized checkpoint")
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            if self.bias is not None:
                self.bias.uniform_(-bound, bound)

    # ---- quantized weights imported from a checkpoint (inference) --------------------------------

    def _set_imported(self, parts):
        self.weight = None  # the 16-bit weight is gone: forward reads the imported parts
        self._exec.weights.clear()
        for i, t in enumerate(parts):
            self.register_buffer(f"qweight_{i}", t)
        self._n_parts = len(parts)

    def _imported(self):
        return [getattr(self, f"qweight_{i}") for i in range(self._n_parts)]

    @torch.no_grad()
    def import_fp8_block(self, weight, weight_scale_inv):
        """DeepSeek-V3-style FP8 expert weights as checkpoints store them: weight [G, N, K]
        float8_e4m3fn (out, in), weight_scale_inv [G, ceil(N / 128), K / 128] float32, the
        dequantization multiplier of each 128x128 block (w = fp8 * scale_inv; fp8_block's own
        convention, so the bytes are used as they are). Layer recipe 'fp8_block'; forward then
        quantizes x in 1x128 blocks and runs the blockwise FP8 GEMM on these weights."""
        self._set_imported(_checkpoint.fp8_block_parts(self, weight, weight_scale_inv))

    @torch.no_grad()
    def import_mxfp4(self, blocks, scales):
        """gpt-oss's MXFP4 expert weights as its checkpoint stores them: blocks [G, N, K / 32, 16]
        uint8 (two e2m1 codes a byte, element 2j in the low nibble), scales [G, N, K / 32] uint8
        (E8M0 exponents). Layer recipe 'mxfp4_weight'; forward runs the 4-bit weight GEMM on them
        (groupmm.ops.import_mxfp4_weights' relayout, bit for bit the same numbers)."""
        self._set_imported(_checkpoint.mxfp4_parts(self, blocks, scales))

    @property
    def imported(self):
        """True when the weights are a checkpoint's quantized bytes (import_*): forward only."""
        return self.weight is None

    def forward(self, x, splits, is_first_microbatch=None, recompute_input=None,
                expected_rows=None):
        """x [M, K], splits [G] -> y [M, N]. is_first_microbatch (quantized recipes; ignored by
        'bf16'): None reuses the quantized weights until they change (eager) or quantizes them on
        every call (compiled); True quantizes them and keeps them; False reuses the kept ones.
        Pass True on an optimizer step's first micro-batch and False on the others: then a
        compiled step quantizes the weights once per optimizer step, as eager does.

        recompute_input (eager training): a callable that returns x again, bit for bit, when the
        weight gradient runs (in backward, or backward_dw with delay_wgrad); then the layer keeps
        nothing of x (nor its quantized copy) for backward, and its wgrad reads what the callable
        gives. The caller keeps what the callable needs (MoE: the block input and the routing, to
        gather the permuted rows again).

        expected_rows: this call's (and its backward's) expected rows instead of the layer's
        setting (None); the same rule (0, or > 0 with splits_total='at_most'), capped at M."""
        if expected_rows is not None:
            _check_expected(expected_rows, self.splits_total, "groupmm.nn.GroupedLinear.forward")
        if self.weight is None:
            return self._forward_imported(x, splits, expected_rows)
        w = self.weight
        if x.dim() != 2 or x.shape[1] != self.in_features or x.dtype != w.dtype:
            # Said here, from x's side: the ops would name the weight, or (quantized recipes)
            # quantize an input of another dtype without a word.
            raise ValueError(f"groupmm.nn.GroupedLinear.forward: x must be [M, "
                             f"{self.in_features}] {w.dtype} (the layer's in_features and "
                             f"dtype); got {list(x.shape)} {x.dtype}")
        expected = self._expected(x.shape[0], expected_rows)
        plain = self.recipe == "bf16" and not self.accumulate_into_main_grad
        weight = self._grouped(w)
        if recompute_input is not None and torch.compiler.is_compiling():
            raise RuntimeError("groupmm.nn.GroupedLinear: recompute_input is eager-only")
        if plain and not self.delay_wgrad and recompute_input is None:
            # The registered op's own autograd formula: traceable by torch.compile end to end.
            return ops.grouped_mm(x, weight, splits, self.bias, splits_total=self.splits_total,
                                  expected_rows=expected)
        w_op = self._exec.prepare(weight, is_first_microbatch)
        if not torch.is_grad_enabled():
            return self._exec.forward(x, w_op, self.bias, splits, expected)[0]
        if self.delay_wgrad and torch.compiler.is_compiling():
            raise RuntimeError(
                "groupmm.nn.GroupedLinear(delay_wgrad=True) is eager-only: its backward queues "
                "the wgrad operands for backward_dw() (a side effect that a compiled backward "
                "cannot make); compile the layer with delay_wgrad=False, or run it eagerly")
        return _GroupedLinearFn.apply(x, weight, self.bias, splits, self, w_op, recompute_input,
                                      expected)

    def _expected(self, rows, expected_rows=None):
        """The GEMMs' expected_rows for a call of `rows` rows: the layer's setting (or the call's),
        capped at the rows, as the C++ executors cap it (0 stays 0: the rows)."""
        return min(self.expected_rows if expected_rows is None else expected_rows, rows)

    def _forward_imported(self, x, splits, expected_rows):
        if x.dim() != 2 or x.shape[1] != self.in_features or x.dtype != torch.bfloat16:
            raise ValueError(f"groupmm.nn.GroupedLinear.forward: x must be [M, "
                             f"{self.in_features}] torch.bfloat16 (the layer's in_features; "
                             f"quantized recipes take bf16); got {list(x.shape)} {x.dtype}")
        if torch.is_grad_enabled() and (x.requires_grad or (
                self.bias is not None and self.bias.requires_grad)):
            raise RuntimeError(
                f"groupmm.nn.GroupedLinear(recipe='{self.recipe}'): the weights were imported "
                "from a quantized checkpoint (import_fp8_block / import_mxfp4): forward only; run "
                "it under torch.no_grad() (and set requires_grad=False on the bias)")
        expected = self._expected(x.shape[0], expected_rows)
        return self._exec.forward(x, self._imported(), self.bias, splits, expected)[0]

    @staticmethod
    def _grouped(t):
        """A parameter (or its main grad) as the grouped ops take it: [G, N, K] as it is, a one-group
        layer's [N, K] (MoE's shared expert) as a [1, N, K] view."""
        return t if t.dim() == 3 else t.unsqueeze(0)

    def backward_dw(self):
        """With delay_wgrad: computes the weight gradients that backward queued, in order, into
        weight.grad (or weight.main_grad). Without delay_wgrad there is nothing to do."""
        if not self.delay_wgrad:
            return
        if not self._pending_wgrad:
            raise RuntimeError("groupmm.nn.GroupedLinear.backward_dw: no wgrad is pending (call "
                               "backward first; each backward queues one)")
        pending, self._pending_wgrad = self._pending_wgrad, []
        for dy, state, splits, expected in pending:
            dw = self._exec.wgrad(dy, _resolved(state), splits, self._main_grad(), expected)
            if dw is not None:
                dw = dw.view_as(self.weight)
                self.weight.grad = dw if self.weight.grad is None else self.weight.grad + dw

    @property
    def wgrad_pending(self):
        return bool(self._pending_wgrad)

    def weights_changed(self):
        """Drops the cached quantized weights (they are also refreshed when weight._version
        changes; call this after writing weight.data directly, which does not bump it)."""
        cache = getattr(self._exec, "weights", None)
        if cache is not None:
            cache.clear()

    def _main_grad(self):
        return self._grouped(self.weight.main_grad) if self.accumulate_into_main_grad else None

    @classmethod
    def from_linears(cls, linears, **kwargs):
        """One GroupedLinear holding copies of the weights (and biases) of `linears`."""
        first = linears[0]
        m = cls(len(linears), first.in_features, first.out_features, bias=first.bias is not None,
                dtype=kwargs.pop("dtype", first.weight.dtype),
                device=kwargs.pop("device", first.weight.device), **kwargs)
        m.load_state_dict({f"{g}.{name}": p for g, lin in enumerate(linears)
                           for name, p in lin.state_dict().items()})
        return m

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # Per-expert keys ("{prefix}{g}.weight") are stacked into the grouped ones first.
        for name in ("weight", "bias"):
            keys = [f"{prefix}{g}.{name}" for g in range(self.experts)]
            if prefix + name not in state_dict and all(k in state_dict for k in keys):
                state_dict[prefix + name] = torch.stack([state_dict.pop(k) for k in keys])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self):
        return (f"experts={self.experts}, in_features={self.in_features}, "
                f"out_features={self.out_features}, bias={self.bias is not None}, "
                f"recipe='{self.recipe}', delay_wgrad={self.delay_wgrad}, "
                f"splits_total='{self.splits_total}', "
                + (f"expected_rows={self.expected_rows}, " if self.expected_rows else "")
                + f"accumulate_into_main_grad={self.accumulate_into_main_grad}")
