"""Shared fixtures: the devices to run on (cuda is reported as skipped where there is none) and a
pure-PyTorch reference of the grouped GEMM."""

import pytest

torch = pytest.importorskip("torch")
import groupmm  # noqa: E402,F401  (fails loudly: a missing or stale build is an error, not a skip)

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs a CUDA GPU")),
]


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def make_splits(counts, device, dtype=torch.int32):
    return torch.tensor(counts, dtype=dtype, device=device)


def ref_grouped_mm(x, w, counts, bias=None, dtype=torch.float32):
    """y_g = x_g W_g^T (+ b_g) in dtype, expert by expert (host counts: test only)."""
    outs, start = [], 0
    for g, m in enumerate(counts):
        y = x[start:start + m].to(dtype) @ w[g].to(dtype).t()
        if bias is not None:
            y = y + bias[g].to(dtype)
        outs.append(y)
        start += m
    return torch.cat(outs)


def assert_close(actual, expected, dtype=torch.bfloat16):
    tol = {torch.bfloat16: 2e-2, torch.float16: 2e-3, torch.float32: 1e-5}[dtype]
    torch.testing.assert_close(actual.float(), expected.float(), rtol=tol, atol=tol)
