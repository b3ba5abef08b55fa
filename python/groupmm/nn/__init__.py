"""Autograd modules over torch.ops.groupmm."""

from .grouped_linear import GroupedLinear
from .moe import MoE

__all__ = ["GroupedLinear", "MoE"]
