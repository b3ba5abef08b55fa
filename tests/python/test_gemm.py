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


def test_fp32_out_forward_and_dgrad(device):
    # out_dtype=float32 keeps the fp32 accumulator: no bf16 rounding of y or dx.
    x, w, b = inputs(device)
    splits = make_splits(COUNTS, device)
    b32 = b.float()
    y = ops.grouped_mm(x, w, splits, b32, out_dtype=torch.float32)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, ref_grouped_mm(x, w, COUNTS, b32), rtol=1e-5, atol=1e-5)
    assert not torch.equal(y, y.bfloat16().float())  # really not rounded to bf16
    dy = torch.randn(x.shape[0], N, device=device, dtype=x.dtype)
    dx = ops.grouped_mm_dgrad(dy, w, splits, out_dtype=torch.float32)
    ref_dx = torch.cat([c.float() @ w[g].float() for g, c in enumerate(torch.split(dy, COUNTS))])
    assert dx.dtype == torch.float32
    torch.testing.assert_close(dx, ref_dx, rtol=1e-5, atol=1e-5)
    if device.type == "cpu":  # the reference: the 16-bit result is the fp32 one rounded once
        y16 = ops.grouped_mm(x, w, splits, b)
        assert torch.equal(y16, ops.grouped_mm(x, w, splits, b32, torch.float32).bfloat16())


def test_fp32_out_bias_dtype_must_match(device):
    x, w, b = inputs(device)
    splits = make_splits(COUNTS, device)
    with pytest.raises(RuntimeError, match="grouped_gemm: bias.dtype=bf16 must equal out.dtype=fp32"):
        ops.grouped_mm(x, w, splits, b, out_dtype=torch.float32)  # bf16 bias, fp32 out
    with pytest.raises(RuntimeError, match="grouped_gemm: out.dtype=fp16 must be"):
        ops.grouped_mm(x, w, splits, out_dtype=torch.float16)  # neither x's dtype nor fp32


def test_fp32_out_gradients(device):
    x, w, b = inputs(device)
    splits = make_splits(COUNTS, device)
    leaves = [t.clone().requires_grad_() for t in (x, w, b.float())]
    y = ops.grouped_mm(leaves[0], leaves[1], splits, leaves[2], out_dtype=torch.float32)
    dy = torch.randn_like(y)
    y.backward(dy)
    # dgrad and wgrad take dy rounded to x's dtype; the bias gradient sums the fp32 dy.
    dy16 = dy.to(x.dtype)
    assert torch.equal(leaves[0].grad, ops.grouped_mm_dgrad(dy16, w, splits))
    assert torch.equal(leaves[1].grad, ops.grouped_mm_wgrad(dy16, x, splits))
    assert leaves[2].grad.dtype == torch.float32
    assert torch.equal(leaves[2].grad, ops.group_dbias(dy, splits))


def test_dbias_accumulate_into_fp32_main_grad(device):
    splits = make_splits(COUNTS, device)
    dy = torch.randn(sum(COUNTS), N, device=device, dtype=torch.bfloat16)
    main = torch.full((G, N), 0.25, device=device)
    ops.group_dbias_accumulate(dy, splits, main)
    ops.group_dbias_accumulate(dy, splits, main)
    once = ops.group_dbias(dy, splits, torch.float32)
    torch.testing.assert_close(main, 0.25 + 2 * once, rtol=1e-6, atol=1e-6)
    assert torch.all(main[1] == 0.25)  # a zero-row expert's bias grad is left unchanged


@pytest.mark.parametrize("deterministic_fill", [False, True])
def test_outputs_from_the_allocator(device, deterministic_fill):
    """The binding allocates outputs straight from the device's allocator (at::empty only under
    torch's deterministic fill of uninitialized memory): either way they land on the op's device
    and hold the op's values."""
    x, w, b = inputs(device)
    splits = make_splits(COUNTS, device)
    fill = torch.utils.deterministic.fill_uninitialized_memory
    old = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(deterministic_fill)
        torch.utils.deterministic.fill_uninitialized_memory = deterministic_fill
        y = ops.grouped_mm(x, w, splits, b)
        q = ops.group_quantize(x, splits, "mxfp8")
    finally:
        torch.use_deterministic_algorithms(old)
        torch.utils.deterministic.fill_uninitialized_memory = fill
    assert y.device == x.device and y.is_contiguous() and y.dtype == x.dtype
    assert_close(y, ref_grouped_mm(x, w, COUNTS, b))
    assert all(t.device == x.device for t in q)
    back = ops.group_dequantize(*q, splits, list(x.shape), "mxfp8")
    torch.testing.assert_close(back.float(), x.float(), rtol=0.07, atol=1e-2)
