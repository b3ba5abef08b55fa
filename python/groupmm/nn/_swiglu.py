"""The experts' activation of groupmm.nn.MoE: a SwiGLU in one of the forms
torch.ops.groupmm.weighted_swiglu_ex computes (gpt-oss's clamped one among them)."""

import math
import numbers
from typing import NamedTuple, Optional

import torch

ops = torch.ops.groupmm


class SwiGLU(NamedTuple):
    """The experts' activation, as torch.ops.groupmm.weighted_swiglu_ex computes it:
    g' = min(gate, limit), u' = clamp(up, -limit, limit), h = g' sigmoid(alpha g') (u' + up_offset),
    times the router weight. limit None: no clamp. interleaved: gate and up alternate columns of
    the gate_up output (gate = column 2i, up = 2i + 1, gpt-oss's layout), else gate is the first
    half. The defaults are the plain SwiGLU (torch.ops.groupmm.weighted_swiglu, bit for bit)."""
    alpha: float = 1.0
    limit: Optional[float] = None
    up_offset: float = 0.0
    interleaved: bool = False

    @property
    def plain(self):
        return self == SwiGLU()


# gpt-oss's experts (transformers' GptOssExperts._apply_gate).
GPT_OSS_SWIGLU = SwiGLU(alpha=1.702, limit=7.0, up_offset=1.0, interleaved=True)


def _activation(activation):
    """A checked SwiGLU from None, a SwiGLU or a tuple of its fields; raises ValueError."""
    if activation is None:
        return SwiGLU()
    try:
        a = SwiGLU(*activation)
    except TypeError:
        a = None
    ok = (a is not None and isinstance(a.interleaved, bool)
          and all(isinstance(v, numbers.Real) and math.isfinite(v) for v in (a.alpha, a.up_offset))
          and (a.limit is None or (isinstance(a.limit, numbers.Real) and math.isfinite(a.limit)
                                   and a.limit > 0)))
    if not ok:
        raise ValueError(f"groupmm.nn.MoE: activation={activation!r} must be a groupmm.nn.SwiGLU("
                         "alpha, limit, up_offset, interleaved): alpha and up_offset finite, limit "
                         "None or finite and > 0, interleaved a bool")
    return SwiGLU(float(a.alpha), None if a.limit is None else float(a.limit),
                  float(a.up_offset), a.interleaved)


def _weighted_swiglu(activation):
    """(op, its arguments after gate_up and prob) of the activation."""
    if activation.plain:
        return ops.weighted_swiglu, ()
    return ops.weighted_swiglu_ex, tuple(activation)
