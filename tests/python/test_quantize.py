"""Grouped quantize / dequantize: per-expert amax and scales against torch, round trips within the
format's precision, empty experts."""

import pytest
import torch

from conftest import make_splits

ops = torch.ops.groupmm
COUNTS = [32, 0, 64, 32]
K = 128


def activations(device):
    x = torch.randn(sum(COUNTS), K, device=device, dtype=torch.bfloat16)
    return x * torch.repeat_interleave(torch.tensor([1.0, 1.0, 8.0, 0.25], device=device),
                                       torch.tensor(COUNTS, device=device))[:, None]


def test_fp8_current_scales_are_per_expert(device):
    x = activations(device)
    data, scale_inv, cdata, cscale, amax = ops.group_quantize(x, make_splits(COUNTS, device),
                                                              "fp8_current")
    assert data.dtype == torch.float8_e4m3fn and data.shape == x.shape
    assert cdata.shape == (K, x.shape[0]) and cscale.numel() == 0
    ref_amax = torch.stack([c.float().abs().amax() if len(c) else torch.zeros((), device=device)
                            for c in torch.split(x, COUNTS)])
    torch.testing.assert_close(amax, ref_amax)
    expected = torch.where(ref_amax > 0, ref_amax / 448.0, torch.ones_like(ref_amax))
    torch.testing.assert_close(scale_inv, expected, rtol=1e-6, atol=0)
    # Expert 0's rows dequantize with its own scale.
    torch.testing.assert_close(data[:32].float() * scale_inv[0], x[:32].float(), rtol=0.07,
                               atol=1e-3)


@pytest.mark.parametrize("recipe,layout", [("fp8_current", "plain"), ("mxfp8", "plain"),
                                           ("mxfp8", "swizzled"), ("fp8_block", "plain")])
@pytest.mark.parametrize("from_columnwise", [False, True])
def test_round_trip(device, recipe, layout, from_columnwise):
    x = activations(device)
    splits = make_splits(COUNTS, device)
    q = ops.group_quantize(x, splits, recipe, scale_layout=layout)
    before = [t.view(torch.uint8).clone() for t in q]
    y = ops.group_dequantize(*q, splits, list(x.shape), recipe, scale_layout=layout,
                             from_columnwise=from_columnwise, out_dtype=torch.float32)
    # e4m3 keeps 3 mantissa bits: relative error <= 2^-4, plus the subnormal floor of a block.
    torch.testing.assert_close(y, x.float(), rtol=0.0625, atol=0.02)
    assert all(torch.equal(a.view(torch.uint8), b) for a, b in zip(q, before))  # inputs unchanged


@pytest.mark.parametrize("recipe,layout,weights", [
    ("mxfp8", "plain", False), ("mxfp8", "swizzled", False), ("fp8_block", "plain", False),
    ("fp8_block", "mn_major", False), ("fp8_block", "plain", True), ("fp8_block", "mn_major", True)])
def test_every_output_byte_is_written(device, recipe, layout, weights):
    """The core writes every byte of group_quantize's outputs when the splits cover all rows,
    including the scales' slack past the last expert's blocks (quantize.hpp), and the binding
    fills nothing: the bytes equal those written into buffers that torch's deterministic mode
    filled first (at::empty with fill_uninitialized_memory: NaN / max-value bytes)."""
    if weights:
        x, splits = torch.randn(3, 96, K, device=device, dtype=torch.bfloat16), None
    else:
        x, splits = activations(device), make_splits(COUNTS, device)
    kw = dict(scale_layout=layout, block_2d=weights)
    torch.empty(1 << 20, device=device, dtype=torch.uint8).fill_(0x5A)  # dirty freed memory
    plain = [t.view(torch.uint8).clone() for t in ops.group_quantize(x, splits, recipe, **kw)]
    fill = torch.utils.deterministic.fill_uninitialized_memory
    old = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        torch.utils.deterministic.fill_uninitialized_memory = True
        filled = ops.group_quantize(x, splits, recipe, **kw)
    finally:
        torch.use_deterministic_algorithms(old)
        torch.utils.deterministic.fill_uninitialized_memory = fill
    for a, b in zip(plain, filled):
        assert torch.equal(a, b.view(torch.uint8))


def test_weights_are_quantized_per_expert(device):
    w = torch.randn(3, 32, K, device=device, dtype=torch.bfloat16)
    w[1] *= 100
    q = ops.group_quantize(w, None, "mxfp8", direction="rowwise")
    y = ops.group_dequantize(*q, None, list(w.shape), "mxfp8", out_dtype=torch.float32)
    assert y.shape == w.shape
    torch.testing.assert_close(y, w.float(), rtol=0.0625, atol=0.02 * 100)


def test_unknown_recipe_is_a_value_error(device):
    x = activations(device)
    with pytest.raises(ValueError, match="recipe='nvfp8' must be"):
        ops.group_quantize(x, make_splits(COUNTS, device), "nvfp8")
