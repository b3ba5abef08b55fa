"""Autograd modules over torch.ops.groupmm."""

from .grouped_linear import GroupedLinear

__all__ = ["GroupedLinear"]
