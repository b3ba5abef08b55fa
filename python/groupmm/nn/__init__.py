"""Autograd modules over torch.ops.groupmm."""

from .grouped_linear import GroupedLinear
from .moe import GPT_OSS_SWIGLU, MoE, SwiGLU

__all__ = ["GroupedLinear", "MoE", "SwiGLU", "GPT_OSS_SWIGLU"]
