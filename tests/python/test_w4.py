"""4-bit expert weights: group_quantize_w4 (nvfp4, mxfp4), the 4-bit weight grouped GEMM against
a pure-PyTorch decode-then-matmul reference (quant_ref.py), and the MXFP4 checkpoint relayout."""

import pytest
import torch

import quant_ref
from conftest import make_splits

ops = torch.ops.groupmm
COUNTS = [5, 0, 12, 3]  # decode-sized experts, one empty
G, K, N = len(COUNTS), 64, 32


def exact_mxfp4_weights(device):
    """Weights every element of which is an e2m1 value times its block's power-of-two scale, with
    a 6 in every block (so the block's e8m0 exponent is exactly that power): MXFP4 holds them
    exactly, and quantizing them gives back these codes and exponents."""
    codes = torch.randint(0, 16, (G, N, K), device=device)
    codes[..., ::32] = 7  # +6 somewhere in each block of 32
    mag = quant_ref.E2M1.to(device)[codes & 7]
    vals = torch.where(codes >= 8, -mag, mag)
    exps = torch.randint(-6, 4, (G, N, K // 32), device=device).float()
    return (vals * torch.exp2(exps).repeat_interleave(32, dim=-1)).to(torch.bfloat16)


def test_mxfp4_quantize_is_exact_on_representable_weights(device):
    w = exact_mxfp4_weights(device)
    data, scale, global_scale = ops.group_quantize_w4(w, "mxfp4")
    assert data.dtype == torch.uint8 and data.shape == (G, N, K // 2)
    assert scale.dtype == torch.float8_e8m0fnu and scale.shape == (G * N, K // 32)
    assert global_scale.numel() == 0
    back = quant_ref.dequantize_w4([data.cpu(), scale.cpu()], "mxfp4")
    assert torch.equal(back, w.cpu().double())


def test_nvfp4_quantize_round_trip(device):
    w = torch.randn(G, N, K, device=device, dtype=torch.bfloat16)
    w[1] *= 50  # per-expert global scales
    data, scale, global_scale = ops.group_quantize_w4(w, "nvfp4")
    assert scale.dtype == torch.float8_e4m3fn and scale.shape == (G * N, K // 16)
    assert global_scale.shape == (G,)
    amax = w.float().abs().amax(dim=(1, 2))
    torch.testing.assert_close(global_scale, 448 * 6 / amax)  # S_enc = 2688 / amax_g
    back = quant_ref.dequantize_w4([data.cpu(), scale.cpu(), global_scale.cpu()], "nvfp4")
    # e2m1 keeps 1 mantissa bit: within a quarter of the 16-element block's amax.
    blocks = w.cpu().double().view(G, N, K // 16, 16)
    err = (back.view_as(blocks) - blocks).abs().amax(-1)
    assert torch.all(err <= 0.25 * blocks.abs().amax(-1) + 1e-6)


@pytest.mark.parametrize("recipe", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("path", ["automatic", "decode", "prefill", "fused"])
def test_w4_gemm_matches_decoded_reference(device, recipe, path):
    x = torch.randn(sum(COUNTS), K, device=device, dtype=torch.bfloat16)
    w = torch.randn(G, N, K, device=device, dtype=torch.bfloat16) / K**0.5
    bias = torch.randn(G, N, device=device, dtype=torch.bfloat16)
    splits = make_splits(COUNTS, device)
    qw = list(ops.group_quantize_w4(w, recipe))
    before = [t.view(torch.uint8).clone() for t in qw]
    y = ops.grouped_mm_w4(x, qw, splits, recipe, bias=bias, path=path)
    assert all(torch.equal(t.view(torch.uint8), b) for t, b in zip(qw, before))
    assert y.shape == (sum(COUNTS), N) and y.dtype == torch.bfloat16
    wr = quant_ref.dequantize_w4([t.cpu() for t in qw], recipe)
    ref = quant_ref.grouped_mm(x.cpu(), wr, COUNTS, bias.cpu())
    torch.testing.assert_close(y.cpu().double(), ref, rtol=8e-3, atol=1e-2)


@pytest.mark.parametrize("recipe", ["nvfp4", "mxfp4"])
def test_swizzled_scales_give_the_same_product(device, recipe):
    x = torch.randn(sum(COUNTS), K, device=device, dtype=torch.bfloat16)
    w = torch.randn(G, N, K, device=device, dtype=torch.bfloat16)
    splits = make_splits(COUNTS, device)
    plain = ops.grouped_mm_w4(x, list(ops.group_quantize_w4(w, recipe)), splits, recipe)
    qs = list(ops.group_quantize_w4(w, recipe, "swizzled"))
    assert qs[1].shape == (G * N + 127 * G, -(-(K // (16 if recipe == "nvfp4" else 32)) // 4) * 4)
    assert torch.equal(ops.grouped_mm_w4(x, qs, splits, recipe, "swizzled"), plain)


def test_mxfp4_checkpoint_import_export(device):
    w = exact_mxfp4_weights(device)
    data, scale, _ = ops.group_quantize_w4(w, "mxfp4")
    # A checkpoint's tensors: blocks [G, N, K/32, 16] and scales [G, N, K/32] of uint8.
    blocks, scales = ops.export_mxfp4_weights(data, scale)
    assert blocks.shape == (G, N, K // 32, 16) and blocks.dtype == torch.uint8
    assert scales.shape == (G, N, K // 32) and scales.dtype == torch.uint8
    assert torch.equal(blocks.flatten(), data.flatten())  # the same bytes: a relayout
    assert torch.equal(scales.flatten(), scale.view(torch.uint8).flatten())
    for layout in ("plain", "swizzled"):
        d2, s2 = ops.import_mxfp4_weights(blocks, scales, layout)
        ref = ops.group_quantize_w4(w, "mxfp4", layout)  # importing = quantizing the values
        assert torch.equal(d2, ref[0])
        assert torch.equal(s2.view(torch.uint8), ref[1].view(torch.uint8))
        b3, s3 = ops.export_mxfp4_weights(d2, s2, layout)
        assert torch.equal(b3, blocks) and torch.equal(s3, scales)


def test_imported_checkpoint_multiplies_as_its_values(device):
    # Arbitrary checkpoint bytes (exponents kept near 2^0 so that the products stay finite).
    blocks = torch.randint(0, 256, (G, N, K // 32, 16), dtype=torch.uint8, device=device)
    scales = torch.randint(120, 130, (G, N, K // 32), dtype=torch.uint8, device=device)
    qw = list(ops.import_mxfp4_weights(blocks, scales))
    x = torch.randn(sum(COUNTS), K, device=device, dtype=torch.bfloat16)
    y = ops.grouped_mm_w4(x, qw, make_splits(COUNTS, device), "mxfp4")
    codes = quant_ref.decode_e2m1(blocks.cpu().view(G, N, K // 2))
    wr = codes * torch.exp2(scales.cpu().double() - 127).repeat_interleave(32, dim=-1)
    ref = quant_ref.grouped_mm(x.cpu(), wr, COUNTS)
    torch.testing.assert_close(y.cpu().double(), ref, rtol=8e-3, atol=ref.abs().max() * 4e-3)


def test_w4_errors_name_the_op_and_argument(device):
    w = torch.randn(G, N, K, device=device, dtype=torch.bfloat16)
    x = torch.randn(sum(COUNTS), K, device=device, dtype=torch.bfloat16)
    splits = make_splits(COUNTS, device)
    nv = list(ops.group_quantize_w4(w, "nvfp4"))
    with pytest.raises(ValueError, match="group_quantize_w4: recipe='mxfp8' must be 'nvfp4' or"):
        ops.group_quantize_w4(w, "mxfp8")
    with pytest.raises(ValueError, match=r"grouped_mm_w4: w must be \[data, scale_inv, "
                       "global_scale\\]"):
        ops.grouped_mm_w4(x, nv[:2], splits, "nvfp4")
    with pytest.raises(TypeError, match=r"w\[1\] \(scale_inv\) has dtype Float8_e4m3fn but "
                       r"group_quantize_w4\(recipe='mxfp4'"):
        ops.grouped_mm_w4(x, nv, splits, "mxfp4")
    with pytest.raises(RuntimeError, match="grouped_gemm: x.dtype=fp16 must be bf16"):
        ops.grouped_mm_w4(x.half(), nv, splits, "nvfp4")
    with pytest.raises(ValueError, match="path='fast' must be 'automatic', 'decode', 'prefill' or 'fused'"):
        ops.grouped_mm_w4(x, nv, splits, "nvfp4", path="fast")
    with pytest.raises(RuntimeError, match="group_quantize.*K=24"):
        ops.group_quantize_w4(w[..., :24].contiguous(), "nvfp4")
    blocks = torch.zeros(G, N, K // 32, 16, dtype=torch.uint8, device=device)
    with pytest.raises(ValueError, match=r"import_mxfp4_weights: scales must be uint8 \[G, N, "
                       r"K/32\] = \[4, 32, 2\]"):
        ops.import_mxfp4_weights(blocks, torch.zeros(G, N, 3, dtype=torch.uint8, device=device))
    with pytest.raises(TypeError, match="import_mxfp4_weights: blocks has dtype Char; expected "
                       "uint8"):
        ops.import_mxfp4_weights(blocks.to(torch.int8), torch.zeros(G, N, 2, dtype=torch.uint8,
                                                                    device=device))
