"""Grouped GEMM ops: values and gradients against a pure-PyTorch reference, empty experts,
main_grad accumulation, bias gradient and offsets."""

import pytest
import torch

from conftest import assert_close, make_splits, ref_grouped_mm

ops = torch.ops.groupmm
COUNTS = [5, 0, 11, 3, 0, 9]  # empty experts in the middle and at the end of a run
G, K, N = len(COUNTS), 32, 24


def inputs(device, dtype=torch.bfloat16, bias=True):
    M = sum(COUNTS)
    x = torch.randn(M, K, device=device, dtype=dtype)
    w = torch.randn(G, N, K, device=device, dtype=dtype) / K**0.5
    b = torch.randn(G, N, device=device, dtype=dtype) if bias else None
    return x, w, b


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("splits_dtype", [torch.int32, torch.int64])
def test_forward_matches_reference(device, dtype, splits_dtype):
    x, w, b = inputs(device, dtype)
    splits = make_splits(COUNTS, device, splits_dtype)
    y = ops.grouped_mm(x, w, splits, b)
    assert y.shape == (x.shape[0], N) and y.dtype == dtype
    assert_close(y, ref_grouped_mm(x, w, COUNTS, b), dtype)


def test_gradients_match_reference(device):
    x, w, b = inputs(device)
    splits = make_splits(COUNTS, device)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    y = ops.grouped_mm(leaves[0], leaves[1], splits, leaves[2])
    dy = torch.randn_like(y)
    y.backward(dy)
    refs = [t.float().clone().requires_grad_() for t in (x, w, b)]
    ref_grouped_mm(refs[0], refs[1], COUNTS, refs[2]).backward(dy.float())
    for got, ref in zip(leaves, refs):
        assert_close(got.grad, ref.grad)
    # Experts 1 and 4 saw no rows: their weight and bias gradients are exactly zero.
    for g in (1, 4):
        assert torch.all(leaves[1].grad[g] == 0) and torch.all(leaves[2].grad[g] == 0)


def test_wgrad_accumulates_into_fp32_main_grad(device):
    x, w, _ = inputs(device, bias=False)
    splits = make_splits(COUNTS, device)
    dy = torch.randn(x.shape[0], N, device=device, dtype=x.dtype)
    once = ops.grouped_mm_wgrad(dy, x, splits, torch.float32)
    assert once.dtype == torch.float32 and once.shape == (G, N, K)
    main = torch.full((G, N, K), 0.5, device=device)
    ops.grouped_mm_wgrad_accumulate(dy, x, splits, main)
    ops.grouped_mm_wgrad_accumulate(dy, x, splits, main)
    torch.testing.assert_close(main, 0.5 + 2 * once, rtol=1e-5, atol=1e-5)
    assert torch.all(main[1] == 0.5)  # a zero-row expert's slice is left unchanged


def test_dbias_and_offsets(device):
    splits = make_splits(COUNTS, device)
    dy = torch.randn(sum(COUNTS), N, device=device)
    db = ops.group_dbias(dy, splits)
    ref = torch.stack([c.sum(0) for c in torch.split(dy, COUNTS)])
    torch.testing.assert_close(db, ref, rtol=1e-5, atol=1e-5)
    start, end = ops.group_offsets(splits)
    expected_end = torch.cumsum(splits, 0, dtype=splits.dtype)
    assert torch.equal(end, expected_end) and torch.equal(start, expected_end - splits)


def test_non_contiguous_inputs_are_handled(device):
    x, w, b = inputs(device)
    splits = make_splits(COUNTS, device)
    xt = x.t().contiguous().t()  # same values, column-major strides
    wt = w.transpose(1, 2).contiguous().transpose(1, 2)
    assert not xt.is_contiguous() and not wt.is_contiguous()
    assert torch.equal(ops.grouped_mm(xt, wt, splits, b), ops.grouped_mm(x, w, splits, b))


def test_empty_batch(device):
    x = torch.empty(0, K, device=device, dtype=torch.bfloat16)
    w = torch.randn(G, N, K, device=device, dtype=torch.bfloat16)
    splits = torch.zeros(G, dtype=torch.int32, device=device)
    assert ops.grouped_mm(x, w, splits).shape == (0, N)
    dw = ops.grouped_mm_wgrad(torch.empty(0, N, device=device, dtype=torch.bfloat16), x, splits)
    assert torch.all(dw == 0)
