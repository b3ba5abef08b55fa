"""Shared fixtures: the devices to run on (cuda is reported as skipped where there is none) and a
pure-PyTorch reference of the grouped GEMM.

Without torch only the tests that need none are collected (TORCH_FREE); the rest are left out,
so `python3 -m pytest tests/python` still checks the performance document on any machine."""

import os

import pytest

TORCH_FREE = {"test_perf_doc.py"}

try:
    import torch
except ImportError:
    torch = None
    collect_ignore = sorted(f for f in os.listdir(os.path.dirname(__file__))
                            if f.startswith("test_") and f.endswith(".py") and f not in TORCH_FREE)

if torch is not None:
    import groupmm  # noqa: F401  (fails loudly: a missing or stale build is an error, not a skip)

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(torch is None or not torch.cuda.is_available(),
                                                  reason="needs a CUDA GPU")),
]


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)


@pytest.fixture(autouse=True)
def _seed():
    if torch is not None:
        torch.manual_seed(0)


def make_splits(counts, device, dtype=None):
    return torch.tensor(counts, dtype=dtype or torch.int32, device=device)


def ref_grouped_mm(x, w, counts, bias=None, dtype=None):
    """y_g = x_g W_g^T (+ b_g) in dtype, expert by expert (host counts: test only)."""
    dtype = dtype or torch.float32
    outs, start = [], 0
    for g, m in enumerate(counts):
        y = x[start:start + m].to(dtype) @ w[g].to(dtype).t()
        if bias is not None:
            y = y + bias[g].to(dtype)
        outs.append(y)
        start += m
    return torch.cat(outs)


def assert_close(actual, expected, dtype=None):
    dtype = dtype or torch.bfloat16
    tol = {torch.bfloat16: 2e-2, torch.float16: 2e-3, torch.float32: 1e-5}[dtype]
    torch.testing.assert_close(actual.float(), expected.float(), rtol=tol, atol=tol)


if torch is not None:
    from torch.utils._python_dispatch import TorchDispatchMode

    class GemmLog(TorchDispatchMode):
        """Records (op, expected_rows) of every groupmm op with an expected_rows argument (the
        grouped GEMMs) that reaches the kernels: below autograd, so backward's GEMMs too."""

        def __init__(self):
            super().__init__()
            self.calls = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            schema = func._schema
            names = [a.name for a in schema.arguments]
            if schema.name.startswith("groupmm::") and "expected_rows" in names:
                bound = dict(zip(names, args), **kwargs)
                self.calls.append((schema.name.split("::")[1], bound.get("expected_rows", 0)))
            return func(*args, **kwargs)
