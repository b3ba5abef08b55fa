"""The recipe executors of groupmm.nn.GroupedLinear: what its forward, dgrad and wgrad run for
each recipe (16-bit, FP8 and MXFP8 training, 4-bit weight inference)."""

import torch

ops = torch.ops.groupmm

# ---- recipe executors ---------------------------------------------------------------------------
# One per recipe, mirroring the C++ layer's executors (src/nn/grouped_linear.cpp,
# quantized_recipe.cpp, w4_recipe.cpp) op for op, with the same quantize configs, so that on the
# CPU the package gives the core layer's results bit for bit (tests/python/test_recipes.py checks
# it against the core layer itself). Each keeps, at forward, only what its wgrad reads.
# prepare(weight, first) gives the weight operand forward reads (the quantized copies, from the
# cache); it runs outside the layer's autograd.Function, where a compiled graph may store state.
# `expected` (forward, dgrad, wgrad): the GEMMs' expected_rows for the call, already capped at its
# rows (GroupedLinear._expected): their kernel choice only, as the C++ executors pass it.

class _HighPrecision:
    """bf16/fp16 (fp32 on the CPU) operands straight into the grouped GEMMs."""

    total = "exact"  # the layer's splits_total, passed to every op over the grouped rows

    def prepare(self, weight, first):
        return weight

    def forward(self, x, weight, bias, splits, expected=0):
        y = ops.grouped_mm(x, weight, splits, bias, splits_total=self.total,
                           expected_rows=expected)
        return y, (x, weight)

    def dgrad(self, dy, state, splits, need_dx, expected=0):
        _x, weight = state
        dx = (ops.grouped_mm_dgrad(dy, weight, splits, splits_total=self.total,
                                   expected_rows=expected) if need_dx else None)
        return dx, dy

    def wgrad(self, dy, state, splits, main_grad, expected=0):
        # M is the reduction rows here, dy's (x's) rows: the same expected rows as forward's.
        x, _weight = state
        if main_grad is not None:
            ops.grouped_mm_wgrad_accumulate(dy, x, splits, main_grad, splits_total=self.total,
                                            expected_rows=expected)
            return None
        return ops.grouped_mm_wgrad(dy, x, splits, splits_total=self.total,
                                    expected_rows=expected)

    def input_state(self, x, splits):
        """What wgrad reads of x (state[0]), made again from a recomputed x."""
        return x


def _columnwise(q):
    """The parts of a group_quantize output that a wgrad GEMM reads (the columnwise copy; fp8_current
    keeps its per-expert scale_inv, which serves both copies). The rowwise copy is dropped."""
    none = q[0].new_empty(0, dtype=torch.float32)
    per_expert_scale = q[1].dim() == 1 and q[1].numel() > 0
    return [none, q[1] if per_expert_scale else none, q[2], q[3], q[4]]


class _WeightCache:
    """The quantized weights, made once and reused.

    first (forward's is_first_microbatch) None: reused until weight._version (an optimizer step, a
    load_state_dict, any in-place write) or the tensor itself changes; a compiled graph cannot read
    those, so there the weights are quantized in the graph on every call. True: quantized now and
    kept (a compiled graph stores them as its outputs). False: the kept copies, whatever the weight
    holds now (eager raises where it can tell the weight changed since they were made)."""

    def __init__(self, recipe, quantize):
        self._recipe, self._quantize, self._key, self._q = recipe, quantize, None, None

    def get(self, weight, first=None):
        compiling = torch.compiler.is_compiling()
        if first is False:
            if self._q is None:
                raise RuntimeError(
                    f"groupmm.nn.GroupedLinear(recipe='{self._recipe}'): is_first_microbatch="
                    "False needs quantized weights kept by an earlier forward (pass True on the "
                    "first micro-batch after the weights change)")
            if not compiling and self._key is not None and self._key != self._key_of(weight):
                raise RuntimeError(
                    f"groupmm.nn.GroupedLinear(recipe='{self._recipe}'): is_first_microbatch="
                    "False, but the weights changed since they were quantized (an optimizer step "
                    "or an in-place write): pass True on the first micro-batch after a change")
            return self._q
        if first is None and compiling:
            return list(self._quantize(weight.detach()))  # nothing kept across graph calls
        key = None if compiling else self._key_of(weight)
        if first or key != self._key:
            self._q, self._key = list(self._quantize(weight.detach())), key
        return self._q

    @staticmethod
    def _key_of(weight):
        return (weight._version, weight.data_ptr(), weight.device)

    def clear(self):
        self._key = self._q = None


class _CachedWeights:
    """An executor whose weight operand is its cached quantized copies (self.weights)."""

    def prepare(self, weight, first):
        return self.weights.get(weight, first)


class _Quantized(_CachedWeights):
    """fp8_current, fp8_block, mxfp8 (quantized_recipe.cpp): x and dy quantized in both directions
    (rowwise for forward / dgrad, columnwise kept for wgrad), W in both (128x128 blocks for
    fp8_block), plain scales; dy in grad_dtype. high_precision_wgrad: x and dy rowwise only, and
    wgrad is the 16-bit one (_HighPrecision's) on the bf16 x and dy."""

    total = "exact"  # the layer's splits_total (activations and the GEMMs over them)

    def __init__(self, recipe, grad_dtype, pow2_scales, high_precision_wgrad=False):
        self.recipe, self.grad_dtype, self.pow2 = recipe, grad_dtype, pow2_scales
        self.hp_wgrad = high_precision_wgrad
        self.direction = "rowwise" if high_precision_wgrad else "both"
        self.weights = _WeightCache(recipe, self._quantize_weights)

    def _quantize_weights(self, w):
        return ops.group_quantize(w, None, self.recipe, pow2_scales=self.pow2,
                                  block_2d=self.recipe == "fp8_block")

    def forward(self, x, qw, bias, splits, expected=0):
        qx = ops.group_quantize(x, splits, self.recipe, direction=self.direction,
                                pow2_scales=self.pow2, splits_total=self.total)
        y = ops.grouped_mm_fp8(list(qx), qw, splits, self.recipe, bias=bias,
                               splits_total=self.total, expected_rows=expected)
        return y, (x if self.hp_wgrad else _columnwise(qx), qw)

    def input_state(self, x, splits):
        if self.hp_wgrad:
            return x
        # The same quantization of the same x: the same bytes as forward's columnwise copy.
        return _columnwise(ops.group_quantize(x, splits, self.recipe, pow2_scales=self.pow2,
                                              splits_total=self.total))

    def dgrad(self, dy, state, splits, need_dx, expected=0):
        _qx, qw = state
        qdy = ops.group_quantize(dy, splits, self.recipe, self.grad_dtype,
                                 direction=self.direction, pow2_scales=self.pow2,
                                 splits_total=self.total)
        dx = (ops.grouped_mm_fp8_dgrad(list(qdy), qw, splits, self.recipe,
                                       splits_total=self.total, expected_rows=expected)
              if need_dx else None)
        return dx, dy if self.hp_wgrad else _columnwise(qdy)

    def wgrad(self, qdy, state, splits, main_grad, expected=0):
        if self.hp_wgrad:  # qdy and state[0] are the bf16 dy and x: the 16-bit wgrad (self.total)
            return _HighPrecision.wgrad(self, qdy, state, splits, main_grad, expected)
        qx, _qw = state
        kw = dict(splits_total=self.total, expected_rows=expected)
        if main_grad is not None:
            if self.recipe == "mxfp8" and torch.compiler.is_compiling():
                # Inductor does not functionalize a mutating op that reads float8_e8m0fnu
                # tensors (the MX scales); the fp32 dW added in place gives the same sums.
                main_grad.add_(ops.grouped_mm_fp8_wgrad(qdy, qx, splits, self.recipe,
                                                        out_dtype=torch.float32, **kw))
                return None
            ops.grouped_mm_fp8_wgrad_accumulate(qdy, qx, splits, self.recipe, main_grad, **kw)
            return None
        return ops.grouped_mm_fp8_wgrad(qdy, qx, splits, self.recipe, out_dtype=torch.bfloat16,
                                        **kw)


class _W4(_CachedWeights):
    """nvfp4_weight, mxfp4_weight (w4_recipe.cpp): the weights quantized once (rowwise, plain
    scales), the 4-bit weight GEMM; forward only."""

    total = "exact"  # the layer's splits_total (the GEMM's rule over the grouped rows)

    def __init__(self, recipe):
        self.name, self.format = recipe, recipe.split("_")[0]
        self.weights = _WeightCache(recipe, self._quantize_weights)

    def _quantize_weights(self, w):
        return ops.group_quantize_w4(w, self.format)

    def forward(self, x, qw, bias, splits, expected=0):
        return ops.grouped_mm_w4(x, qw, splits, self.format, bias=bias, splits_total=self.total,
                                 expected_rows=expected), None

    def dgrad(self, dy, state, splits, need_dx, expected=0):
        raise RuntimeError(
            f"groupmm.nn.GroupedLinear(recipe='{self.name}'): backward is not supported: an "
            "inference recipe (forward only, weights held in 4 bits); train with recipe 'bf16', "
            "'fp8_current', 'fp8_block' or 'mxfp8'")

    wgrad = dgrad
