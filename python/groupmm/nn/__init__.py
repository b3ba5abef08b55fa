"""Autograd modules over torch.ops.groupmm."""

from .grouped_linear import GroupedLinear
from ._swiglu import GPT_OSS_SWIGLU, SwiGLU
from .moe import MoE

__all__ = ["GroupedLinear", "MoE", "SwiGLU", "GPT_OSS_SWIGLU"]
