"""groupmm for PyTorch: grouped GEMM, quantization and MoE ops as torch.ops.groupmm.*, and the
autograd modules groupmm.nn.GroupedLinear / groupmm.nn.MoE.

Every op has a CPU kernel (the core's reference backend) and a CUDA kernel (the sm_90a backend,
on torch's current stream, outputs and workspace from torch's allocator), a fake kernel for
torch.compile, and, where differentiable, an autograd formula. Per-expert row counts (`splits`,
int32/int64 [G]) stay on the tensors' device and are never read on the host.

Bad split values cannot be seen on the host without a sync: on the CPU each op raises them at
once; on CUDA the kernels clamp, record the fault, and `groupmm.check(device)` raises it.
"""

import os

import torch

_here = os.path.dirname(os.path.abspath(__file__))
_lib = os.path.join(_here, "libgroupmm_torch.so")
if not os.path.exists(_lib):
    raise ImportError(
        f"groupmm: the extension {_lib} is not built. From the repository root: "
        "`bash scripts/install_python.sh` installs the package into .venv/ (then run "
        ".venv/bin/python), or `bash scripts/build_python.sh` builds it in place (then "
        "PYTHONPATH=python).")

from ._build_info import TORCH_VERSION as _BUILT_FOR  # noqa: E402

if _BUILT_FOR != torch.__version__:
    # torch's C++ ABI changes between releases: a mismatch fails later in obscure ways.
    raise ImportError(f"groupmm: the extension was built against torch {_BUILT_FOR}, but torch "
                      f"{torch.__version__} is imported; rebuild it with this torch.")

torch.ops.load_library(_lib)

from . import _meta  # noqa: E402,F401  (fake kernels; the autograd ones are in the .so)
from ._meta import moe_capacity, permuted_rows, recipe_traits  # noqa: E402,F401
from . import nn  # noqa: E402,F401
from ._dropin import grouped_mm, scaled_grouped_mm  # noqa: E402,F401

ops = torch.ops.groupmm


def check(device=None):
    """Raises the first device fault (bad splits, bad expert ids) recorded by groupmm's kernels on
    `device` (default: the current CUDA device) and torch's current stream there; synchronizes
    that stream. Outside captured or compiled regions."""
    device = torch.device(device if device is not None else "cuda")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"groupmm.check: device='{device}' must be a cuda or cpu device (groupmm "
                         "runs on those)")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("groupmm.check: no CUDA device is available (torch.cuda.is_available() "
                           "is False); on the CPU every op raises its fault when it runs")
    ops.check_status(torch.empty(0, device=device))


def empty_cache():
    """Returns to the driver the device memory groupmm's own pools keep for its internal buffers
    (expert-parallel plans and staging, workspaces) that no live buffer uses, as
    torch.cuda.empty_cache() does for torch's allocator. The pools keep freed memory for reuse, so
    that a step that synchronizes (the throughput EP plan) does not map its buffers again every
    step; the tensors groupmm's ops return come from torch's allocator and are not affected."""
    ops.empty_cache()


__all__ = ["ops", "nn", "check", "empty_cache", "moe_capacity", "permuted_rows", "recipe_traits",
           "grouped_mm", "scaled_grouped_mm"]
