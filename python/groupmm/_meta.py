"""Fake (meta) kernels: output shapes and dtypes only, so torch.compile traces the ops.

Sizes follow the core's rule that they are host-known and never depend on split values; the shape
formulas of permute and quantize mirror moe_permuted_rows and group_quantize_shapes (opcheck
compares these against the real kernels).
"""

import collections
import functools
import inspect
import math

import torch


def _tensors(name, value):
    if isinstance(value, torch.Tensor):
        yield name, value
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _tensors(f"{name}[{i}]", v)


def _check_one_device(op, sig, args, kwargs):
    """The op kernels' rule (binding.cpp, Call::check_device), for a call that reaches a fake
    kernel because one of its tensors is on the meta device: torch dispatches a call that mixes
    real and meta tensors to the Meta kernel, which would return an uninitialized result. Fake
    tensors (torch.compile) carry their real device, so a compiled call is not affected."""
    try:
        named = sig.bind(*args, **kwargs).arguments.items()
    except TypeError:
        named = ((f"argument {i}", a) for i, a in enumerate(args))
    found = [t for n, v in named for t in _tensors(n, v)]
    if not any(t.device.type == "meta" for _, t in found):
        return
    device = found[0][1].device
    for name, t in found:
        if t.device != device:
            raise RuntimeError(f"groupmm.{op}: {name} is on {t.device} but the op runs on "
                               f"{device} (every tensor of one call on one device)")


def register_fake(qualname):
    """torch.library.register_fake, with the op kernels' one-device rule (_check_one_device)."""
    op = qualname.split("::")[-1]

    def wrap(fn):
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def fake(*args, **kwargs):
            _check_one_device(op, sig, args, kwargs)
            return fn(*args, **kwargs)
        return torch.library.register_fake(qualname)(fake)
    return wrap


def _empty(like, shape, dtype):
    return like.new_empty(shape, dtype=dtype)


# ---- recipe traits (the core's recipe_traits, quantize.hpp) ------------------------------------

RecipeTraits = collections.namedtuple("RecipeTraits", (
    "row_block", "col_block", "scale_dtype", "fp4", "gemm_k_multiple", "gemm_n_multiple",
    "split_multiple", "in_features_multiple", "out_features_multiple", "e5m2_gradients"))
_SCALE_DTYPES = {"fp32": torch.float32, "e8m0": torch.float8_e8m0fnu,
                 "fp8e4m3": torch.float8_e4m3fn}


def _read_traits(recipe):
    t = torch.ops.groupmm.recipe_traits(recipe)
    return RecipeTraits(*t[:2], _SCALE_DTYPES[t[2]], *t[3:])


# Read once, at import (fake kernels and compiled layers then read a dict, not an op).
_TRAITS = {r: _read_traits(r) for r in ("fp8_current", "fp8_block", "mxfp8", "nvfp4", "mxfp4")}


def recipe_traits(recipe):
    """The rules of a quantization recipe ('fp8_current', 'fp8_block', 'mxfp8', 'nvfp4',
    'mxfp4') as the C++ core states them (groupmm::recipe_traits): block sizes, the scale dtype,
    the GEMMs' N / K multiples, the rows per expert a quantized wgrad needs (split_multiple), the
    in / out features multiples of a GroupedLinear, and whether gradients may be e5m2."""
    if recipe not in _TRAITS:
        raise ValueError(f"groupmm.recipe_traits: recipe='{recipe}' must be one of "
                         f"{', '.join(_TRAITS)}")
    return _TRAITS[recipe]


@register_fake("groupmm::grouped_mm")
def _(x, w, splits, bias=None, out_dtype=None, splits_total="exact", expected_rows=0):
    return _empty(x, (x.shape[0], w.shape[1]), out_dtype or x.dtype)


@register_fake("groupmm::grouped_mm_dgrad")
def _(dy, w, splits, out_dtype=None, splits_total="exact", expected_rows=0):
    return _empty(dy, (dy.shape[0], w.shape[2]), out_dtype or dy.dtype)


@register_fake("groupmm::grouped_mm_wgrad")
def _(dy, x, splits, out_dtype=None, splits_total="exact", expected_rows=0):
    return _empty(dy, (splits.shape[0], dy.shape[1], x.shape[1]), out_dtype or dy.dtype)


@register_fake("groupmm::grouped_mm_wgrad_accumulate")
def _(dy, x, splits, main_grad, splits_total="exact", expected_rows=0):
    return None


@register_fake("groupmm::group_dbias")
def _(dy, splits, out_dtype=None, splits_total="exact"):
    return _empty(dy, (splits.shape[0], dy.shape[1]), out_dtype or dy.dtype)


@register_fake("groupmm::group_dbias_accumulate")
def _(dy, splits, main_grad, splits_total="exact"):
    return None


@register_fake("groupmm::group_offsets")
def _(splits):
    return torch.empty_like(splits), torch.empty_like(splits)


@register_fake("groupmm::swiglu")
def _(gate_up):
    return _empty(gate_up, (gate_up.shape[0], gate_up.shape[1] // 2), gate_up.dtype)


@register_fake("groupmm::swiglu_backward")
def _(dout, gate_up):
    return torch.empty_like(gate_up)


@register_fake("groupmm::weighted_swiglu")
def _(gate_up, prob, splits=None):
    return _empty(gate_up, (gate_up.shape[0], gate_up.shape[1] // 2), gate_up.dtype)


@register_fake("groupmm::weighted_swiglu_backward")
def _(dout, gate_up, prob, splits=None):
    return torch.empty_like(gate_up), _empty(prob, prob.shape, torch.float32)


@register_fake("groupmm::weighted_swiglu_ex")
def _(gate_up, prob, alpha=1.0, limit=None, up_offset=0.0, interleaved=False):
    return _empty(gate_up, (gate_up.shape[0], gate_up.shape[1] // 2), gate_up.dtype)


@register_fake("groupmm::weighted_swiglu_ex_backward")
def _(dout, gate_up, prob, alpha=1.0, limit=None, up_offset=0.0, interleaved=False):
    return torch.empty_like(gate_up), _empty(prob, prob.shape, torch.float32)


# The router's limits (groupmm/moe.hpp kRouterMaxExperts, kRouterMaxTopk).
ROUTER_MAX_EXPERTS, ROUTER_MAX_TOPK = 1024, 32


def check_router_sizes(op, experts, topk, experts_arg, topk_arg="topk"):
    """E and k of a router as the op kernel checks them (python/csrc/ops_moe.cpp, router_config),
    before anything is sized from them: ValueError naming `op` and the argument."""
    if not 1 <= experts <= ROUTER_MAX_EXPERTS:
        what = "" if experts_arg == "experts" else " (experts)"
        raise ValueError(f"groupmm.{op}: {experts_arg}={experts}{what} must be in "
                         f"[1, {ROUTER_MAX_EXPERTS}]")
    max_k = min(experts, ROUTER_MAX_TOPK)
    if not 1 <= topk <= max_k:
        raise ValueError(f"groupmm.{op}: {topk_arg}={topk} must be in [1, min(experts, "
                         f"{ROUTER_MAX_TOPK})] = [1, {max_k}]")


@register_fake("groupmm::router")
def _(logits, expert_bias, topk, score="softmax", n_group=1, topk_group=1, renormalize=False,
      scaling_factor=1.0, aux_loss_coeff=0.0, z_loss_coeff=0.0):
    T, E = logits.shape
    check_router_sizes("router", E, topk, "logits.shape[1]")
    return (_empty(logits, (T, topk), torch.int32), _empty(logits, (T, topk), torch.float32),
            _empty(logits, (E,), torch.int32), _empty(logits, (1,), torch.float32),
            _empty(logits, (1,), torch.float32))


@register_fake("groupmm::router_logits")
def _(x, w, bias=None):
    return _empty(x, (x.shape[0], w.shape[0]), torch.float32)


@register_fake("groupmm::router_logits_backward")
def _(d_logits, x, w):
    return torch.empty_like(x), torch.empty_like(w)


@register_fake("groupmm::router_backward")
def _(logits, expert_ids, counts, d_weights, *args):
    return torch.empty_like(logits, dtype=torch.float32)


def moe_capacity(tokens, topk, experts, capacity_factor):
    """Tokens each expert keeps under a capacity factor (the core's moe_capacity):
    ceil(capacity_factor * tokens * topk / experts), at least 1; 0 (dropless) for a factor <= 0."""
    if capacity_factor <= 0:
        return 0
    # The core's double arithmetic in its order: (factor * (T k)) / E, then ceil.
    return max(1, math.ceil(float(capacity_factor) * float(tokens * topk) / float(experts)))


def permuted_rows(tokens, topk, experts, align=1, capacity=0):
    """Rows of the permuted buffer (the core's moe_permuted_rows)."""
    kept_max = tokens * topk if capacity <= 0 else min(tokens * topk, experts * capacity)
    return -(-(kept_max + experts * (align - 1)) // align) * align


@register_fake("groupmm::permute_plan")
def _(expert_ids, experts, align=1, capacity=0):
    i32 = torch.int32
    return (torch.empty_like(expert_ids, dtype=i32), _empty(expert_ids, (experts,), i32),
            _empty(expert_ids, (experts,), i32), _empty(expert_ids, (experts,), i32))


def _rows(dest_row, splits, align, capacity):
    return permuted_rows(dest_row.shape[0], dest_row.shape[1], splits.shape[0], align, capacity)


@register_fake("groupmm::permute")
def _(x, dest_row, row_start, kept, splits, align, capacity, weights=None):
    R = _rows(dest_row, splits, align, capacity)
    return _empty(x, (R, x.shape[1]), x.dtype), _empty(x, (R if weights is not None else 0,),
                                                        torch.float32)


@register_fake("groupmm::gate_up_swiglu")
def _(x, dest_row, row_start, kept, splits, align, capacity, weights, w, pre_activation=False,
      config=""):
    R, F = _rows(dest_row, splits, align, capacity), w.shape[1] // 2
    return (_empty(x, (R, F), x.dtype), _empty(x, (R if pre_activation else 0, 2 * F), x.dtype),
            _empty(x, (R,), torch.float32))


@register_fake("groupmm::permute_backward")
def _(d_x_perm, dest_row, row_start, kept, splits, align, capacity, d_probs=None):
    T, k = dest_row.shape
    dw = (T, k) if d_probs is not None else (0, 0)
    return (_empty(d_x_perm, (T, d_x_perm.shape[1]), d_x_perm.dtype),
            _empty(d_x_perm, dw, torch.float32))


@register_fake("groupmm::unpermute")
def _(y_perm, dest_row, row_start, kept, splits, align, capacity, add=None, bias=None,
      expert_ids=None, weights=None):
    return _empty(y_perm, (dest_row.shape[0], y_perm.shape[1]), y_perm.dtype)


@register_fake("groupmm::unpermute_backward")
def _(dy, dest_row, row_start, kept, splits, align, capacity):
    return _empty(dy, (_rows(dest_row, splits, align, capacity), dy.shape[1]), dy.dtype)


def quantized_shapes(rows, K, G, recipe, fp8_dtype=None, direction="both", scale_layout="plain",
                     block_2d=False):
    """(shape, dtype) of data, scale_inv, columnwise_data, columnwise_scale_inv, amax
    (the core's group_quantize_shapes for fp8_current, fp8_block and mxfp8; (0,) = absent)."""
    dt = fp8_dtype or torch.float8_e4m3fn
    traits = recipe_traits(recipe)
    st, rb, cb = traits.scale_dtype, traits.row_block, traits.col_block
    absent = ((0,), torch.float32)
    data = scale = cdata = cscale = amax = absent
    fp8_2d = recipe == "fp8_block" and block_2d
    tiles = rows // 128 + G
    if direction in ("rowwise", "both"):
        data = ((rows, K), dt)
        if recipe == "fp8_block" and scale_layout == "mn_major":
            scale = ((K // rb, -(-(tiles if fp8_2d else rows) // 4) * 4), st)
        elif recipe == "fp8_block":
            scale = ((tiles, K // rb) if fp8_2d else (rows, K // rb), st)
        elif recipe == "mxfp8":
            swz = scale_layout == "swizzled"
            scale = ((rows + 127 * G, -(-(K // rb) // 4) * 4) if swz else (rows, K // rb), st)
    if direction in ("columnwise", "both"):
        cdata = ((K, rows), dt)
        if fp8_2d:
            cscale = ((tiles, K // rb), st)
        elif recipe != "fp8_current":
            swz = scale_layout == "swizzled"
            cscale = ((rows // cb + 4 * G, -(-K // 128) * 128) if swz else (rows // cb + G, K), st)
    if recipe == "fp8_current":
        scale = ((G,), torch.float32)
        amax = ((G,), torch.float32)
    return data, scale, cdata, cscale, amax


@register_fake("groupmm::group_quantize")
def _(input, splits, recipe, fp8_dtype=None, direction="both", scale_layout="plain",
      pow2_scales=False, block_2d=False, splits_total="exact"):
    G = splits.shape[0] if splits is not None else input.shape[0]
    K = input.shape[-1]
    rows = input.numel() // K
    specs = quantized_shapes(rows, K, G, recipe, fp8_dtype, direction, scale_layout, block_2d)
    return tuple(_empty(input, shape, dtype) for shape, dtype in specs)


@register_fake("groupmm::group_dequantize")
def _(data, scale_inv, columnwise_data, columnwise_scale_inv, amax, splits, shape, recipe,
      fp8_dtype=None, scale_layout="plain", block_2d=False, from_columnwise=False,
      out_dtype=None):
    like = columnwise_data if from_columnwise else data
    return _empty(like, tuple(shape), out_dtype or torch.bfloat16)


# ---- quantized grouped GEMMs (operands: the 5 tensors of group_quantize) ----------------------

def _absent(t):
    return t.dim() == 1 and t.shape[0] == 0


def quantized_dims(q):
    """(rows, cols) of the tensor a group_quantize output list was quantized from."""
    return tuple(q[0].shape) if not _absent(q[0]) else (q[2].shape[1], q[2].shape[0])


@register_fake("groupmm::grouped_mm_fp8")
def _(x, w, splits, recipe, scale_layout="plain", bias=None, fast_accum=False,
      splits_total="exact", expected_rows=0):
    return _empty(splits, (quantized_dims(x)[0], quantized_dims(w)[0] // splits.shape[0]),
                  torch.bfloat16)


@register_fake("groupmm::grouped_mm_fp8_dgrad")
def _(dy, w, splits, recipe, scale_layout="plain", splits_total="exact", expected_rows=0):
    return _empty(splits, (quantized_dims(dy)[0], quantized_dims(w)[1]), torch.bfloat16)


@register_fake("groupmm::grouped_mm_fp8_wgrad")
def _(dy, x, splits, recipe, scale_layout="plain", out_dtype=None, splits_total="exact",
      expected_rows=0):
    return _empty(splits, (splits.shape[0], quantized_dims(dy)[1], quantized_dims(x)[1]),
                  out_dtype or torch.bfloat16)


@register_fake("groupmm::grouped_mm_fp8_wgrad_accumulate")
def _(dy, x, splits, recipe, main_grad, scale_layout="plain", splits_total="exact",
      expected_rows=0):
    return None


# ---- 4-bit weights ------------------------------------------------------------------------------

def w4_scale_shape(G, N, K, recipe, scale_layout="plain"):
    """(shape, dtype) of the scale_inv of [G, N, K] weights in nvfp4 / mxfp4 (the core's
    group_quantize_shapes, rowwise)."""
    traits = recipe_traits(recipe)
    rows, cols = G * N, K // traits.row_block
    dtype = traits.scale_dtype
    if scale_layout == "swizzled":
        return (rows + 127 * G, -(-cols // 4) * 4), dtype
    return (rows, cols), dtype


@register_fake("groupmm::group_quantize_w4")
def _(w, recipe, scale_layout="plain"):
    G, N, K = w.shape
    shape, dtype = w4_scale_shape(G, N, K, recipe, scale_layout)
    return (_empty(w, (G, N, K // 2), torch.uint8), _empty(w, shape, dtype),
            _empty(w, (G,) if recipe == "nvfp4" else (0,), torch.float32))


@register_fake("groupmm::grouped_mm_w4")
def _(x, w, splits, recipe, scale_layout="plain", bias=None, path="automatic",
      splits_total="exact", expected_rows=0):
    return _empty(x, (x.shape[0], w[0].shape[1]), torch.bfloat16)


@register_fake("groupmm::import_mxfp4_weights")
def _(blocks, scales, scale_layout="plain"):
    G, N, nb, _ = blocks.shape
    shape, dtype = w4_scale_shape(G, N, 32 * nb, "mxfp4", scale_layout)
    return _empty(blocks, (G, N, 16 * nb), torch.uint8), _empty(blocks, shape, dtype)


@register_fake("groupmm::export_mxfp4_weights")
def _(data, scale_inv, scale_layout="plain"):
    G, N, half = data.shape
    return (_empty(data, (G, N, half // 16, 16), torch.uint8),
            _empty(data, (G, N, half // 16), torch.uint8))


@register_fake("groupmm::_core_grouped_linear")
def _(x, splits, weight, bias, dy, recipe="bf16", delay_wgrad=False, main_grad=False,
      grad_dtype=None, pow2_scales=False, high_precision_wgrad=False):
    G, N, K = weight.shape
    gdt = torch.float32 if main_grad else weight.dtype
    absent = _empty(x, (0,), torch.float32)
    if dy is None:
        return _empty(x, (x.shape[0], N), weight.dtype), absent, absent, absent
    return (_empty(x, (x.shape[0], N), weight.dtype), _empty(x, (x.shape[0], K), weight.dtype),
            _empty(x, (G, N, K), gdt), _empty(x, (G, N), gdt) if bias is not None else absent)


@register_fake("groupmm::_core_moe")
def _(x, router_weight, gate_up, down, shared_up, shared_down, dy, topk, score="softmax",
      renormalize=False, align=1, capacity_factor=0.0, recipe="bf16"):
    absent = _empty(x, (0,), torch.float32)
    y = _empty(x, x.shape, x.dtype)
    if dy is None:
        return (y,) + (absent,) * 6
    shared = [absent, absent]
    if shared_up is not None:
        shared = [_empty(x, (1, *w.shape), x.dtype) for w in (shared_up, shared_down)]
    return (y, _empty(x, x.shape, x.dtype), torch.empty_like(router_weight),
            torch.empty_like(gate_up), torch.empty_like(down), *shared)


@register_fake("groupmm::grouped_gemm")
def _(a, b, splits, gemm_pass, bias=None, out_dtype=None, splits_total="exact", zero_tail=False,
      expected_rows=0):
    if gemm_pass == "wgrad":
        shape = (splits.shape[0], a.shape[1], b.shape[1])
    else:
        shape = (a.shape[0], b.shape[1] if gemm_pass == "forward" else b.shape[2])
    return _empty(a, shape, out_dtype or a.dtype)
