"""FP8 / MXFP8 grouped GEMMs over group_quantize's outputs: forward, dgrad, wgrad (and fp32
main_grad accumulation) against a pure-PyTorch dequantize-then-matmul reference (quant_ref.py),
empty experts, and the errors for operands quantized the wrong way."""

import pytest
import torch

import quant_ref
from conftest import make_splits

ops = torch.ops.groupmm
RECIPES = ["fp8_current", "fp8_block", "mxfp8"]
COUNTS = [32, 0, 48, 16, 0]  # multiples of 16 (wgrad reads 16-row aligned experts); empty experts
G, M, K, N = len(COUNTS), sum(COUNTS), 128, 128  # fp8_block needs multiples of 128


def quantize(t, splits, recipe, **kw):
    weight = splits is None
    return list(ops.group_quantize(t, splits, recipe, block_2d=weight and recipe == "fp8_block",
                                   **kw))


def assert_close_bf16(out, ref):
    # The reference sums exact products in float64; the op's result is rounded to bf16 once.
    torch.testing.assert_close(out.double(), ref, rtol=8e-3, atol=1e-2)


def assert_close_fp32(out, ref, device, recipe):
    """An fp32 result against the float64 reference. The CPU backend sums in fp32 (tight). Hopper's
    FP8 tensor cores accumulate with about 14 mantissa bits between the promotions to fp32 every
    128 of K (the C++ GPU tests' rule, tests/cuda/test_gemm_quantized_gpu.cpp): per expert, a
    relative error <= 5e-4 and no element off by more than 8x that of the expert's amax. mxfp8
    runs the bf16 engine on exact dequantized operands (2e-5)."""
    if torch.device(device).type == "cpu":
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4)
        return
    tol = 2e-5 if recipe == "mxfp8" else 5e-4
    for g in range(out.shape[0]):
        x, y = out[g].double(), ref[g]
        scale = y.norm().item()
        assert (x - y).norm().item() <= tol * scale + 1e-30, f"expert {g}: relative error"
        assert (x - y).abs().max().item() <= 8 * tol * y.abs().max().item() + 1e-30, f"expert {g}"


def operands(device):
    bf = dict(device=device, dtype=torch.bfloat16)
    x = torch.randn(M, K, **bf)
    w = torch.randn(G, N, K, **bf) / K**0.5
    dy = torch.randn(M, N, **bf)
    return x, w, dy, make_splits(COUNTS, device)


@pytest.mark.parametrize("recipe", RECIPES)
def test_forward_matches_dequantized_reference(device, recipe):
    x, w, _, splits = operands(device)
    bias = torch.randn(G, N, device=device, dtype=torch.bfloat16)
    qx, qw = quantize(x, splits, recipe), quantize(w, None, recipe)
    before = [t.view(torch.uint8).clone() for t in qx + qw]
    y = ops.grouped_mm_fp8(qx, qw, splits, recipe, bias=bias)
    assert y.shape == (M, N) and y.dtype == torch.bfloat16
    assert all(torch.equal(t.view(torch.uint8), b) for t, b in zip(qx + qw, before))
    cpu = [[t.cpu() for t in q] for q in (qx, qw)]
    xr = quant_ref.dequantize(cpu[0], COUNTS, recipe)
    wr = quant_ref.dequantize(cpu[1], [N] * G, recipe, weight=True).view(G, N, K)
    assert_close_bf16(y.cpu(), quant_ref.grouped_mm(xr, wr, COUNTS, bias.cpu()))
    # The quantization error itself is small against the unquantized product.
    exact = quant_ref.grouped_mm(x.cpu(), w.cpu(), COUNTS, bias.cpu())
    assert (y.cpu().double() - exact).norm() / exact.norm() < 0.1


@pytest.mark.parametrize("recipe", RECIPES)
def test_dgrad_reads_the_columnwise_weights(device, recipe):
    _, w, dy, splits = operands(device)
    qdy, qw = quantize(dy, splits, recipe), quantize(w, None, recipe)
    dx = ops.grouped_mm_fp8_dgrad(qdy, qw, splits, recipe)
    assert dx.shape == (M, K) and dx.dtype == torch.bfloat16
    cpu = [[t.cpu() for t in q] for q in (qdy, qw)]
    dyr = quant_ref.dequantize(cpu[0], COUNTS, recipe)
    wr = quant_ref.dequantize(cpu[1], [N] * G, recipe, columnwise=True, weight=True)
    ref = quant_ref.grouped_mm(dyr, wr.view(G, N, K).transpose(1, 2), COUNTS)
    assert_close_bf16(dx.cpu(), ref)


@pytest.mark.parametrize("recipe", RECIPES)
def test_wgrad_and_main_grad_accumulation(device, recipe):
    x, _, dy, splits = operands(device)
    qdy = quantize(dy, splits, recipe, fp8_dtype=torch.float8_e5m2 if recipe != "fp8_block"
                   else None)
    qx = quantize(x, splits, recipe)
    dw = ops.grouped_mm_fp8_wgrad(qdy, qx, splits, recipe, out_dtype=torch.float32)
    assert dw.shape == (G, N, K) and dw.dtype == torch.float32
    cpu = [[t.cpu() for t in q] for q in (qdy, qx)]
    ref = quant_ref.grouped_wgrad(quant_ref.dequantize(cpu[0], COUNTS, recipe, columnwise=True),
                                  quant_ref.dequantize(cpu[1], COUNTS, recipe, columnwise=True),
                                  COUNTS)
    assert_close_fp32(dw.cpu().double(), ref, device, recipe)
    for g in (1, 4):
        assert torch.all(dw[g] == 0)  # zero-row experts get dW = 0
    dw16 = ops.grouped_mm_fp8_wgrad(qdy, qx, splits, recipe)  # bf16 by default
    assert dw16.dtype == torch.bfloat16
    torch.testing.assert_close(dw16.float(), dw, rtol=8e-3, atol=1e-2)
    main = torch.full((G, N, K), 0.5, device=device)
    ops.grouped_mm_fp8_wgrad_accumulate(qdy, qx, splits, recipe, main)
    ops.grouped_mm_fp8_wgrad_accumulate(qdy, qx, splits, recipe, main)
    torch.testing.assert_close(main, 0.5 + 2 * dw, rtol=1e-5, atol=1e-4)
    assert torch.all(main[1] == 0.5)  # ... and leave an accumulated slice unchanged


def test_fast_accum_is_an_fp8_current_forward_option(device):
    x, w, dy, splits = operands(device)
    qx, qw = quantize(x, splits, "fp8_current"), quantize(w, None, "fp8_current")
    fast = ops.grouped_mm_fp8(qx, qw, splits, "fp8_current", fast_accum=True)
    assert_close_bf16(fast.cpu(), ops.grouped_mm_fp8(qx, qw, splits, "fp8_current").cpu().double())
    qx, qw = quantize(x, splits, "mxfp8"), quantize(w, None, "mxfp8")
    with pytest.raises(RuntimeError, match="fast_accum is an option of the fp8_current forward"):
        ops.grouped_mm_fp8(qx, qw, splits, "mxfp8", fast_accum=True)


def test_swizzled_mxfp8_operands(device):
    x, w, _, splits = operands(device)
    plain = ops.grouped_mm_fp8(quantize(x, splits, "mxfp8"), quantize(w, None, "mxfp8"), splits,
                               "mxfp8")
    swz = ops.grouped_mm_fp8(quantize(x, splits, "mxfp8", scale_layout="swizzled"),
                             quantize(w, None, "mxfp8", scale_layout="swizzled"), splits, "mxfp8",
                             "swizzled")
    assert torch.equal(plain, swz)


def test_operands_quantized_the_wrong_way_are_refused(device):
    x, w, _, splits = operands(device)
    qx = quantize(x, splits, "fp8_block")
    w_1d = list(ops.group_quantize(w, None, "fp8_block"))  # 1x128 blocks: not the weights' recipe
    with pytest.raises(ValueError, match=r"grouped_mm_fp8: w\[1\] \(scale_inv\) has shape "
                       r"\[640, 1\] but group_quantize\(recipe='fp8_block'.*block_2d=True"):
        ops.grouped_mm_fp8(qx, w_1d, splits, "fp8_block")
    with pytest.raises(TypeError, match=r"x\[1\] \(scale_inv\) has dtype Float8_e8m0fnu but"):
        ops.grouped_mm_fp8(quantize(x, splits, "mxfp8"), quantize(w, None, "mxfp8"), splits,
                           "fp8_current")
    with pytest.raises(ValueError, match="x must be the 5 tensors group_quantize returns"):
        ops.grouped_mm_fp8(qx[:3], quantize(w, None, "fp8_block"), splits, "fp8_block")
    with pytest.raises(ValueError, match="recipe='nvfp4' must be 'fp8_current', 'fp8_block' or"):
        ops.grouped_mm_fp8(qx, quantize(w, None, "fp8_block"), splits, "nvfp4")
    rowwise_only = quantize(w, None, "mxfp8", direction="rowwise")
    with pytest.raises(RuntimeError, match="grouped_gemm: b \\(W, columnwise\\) has no columnwise"):
        ops.grouped_mm_fp8_dgrad(quantize(x[:, :N], splits, "mxfp8"), rowwise_only, splits,
                                 "mxfp8")


@pytest.mark.parametrize("recipe", ["fp8_current", "fp8_block"])
def test_unaligned_split_is_a_device_fault(recipe):
    counts = [24, 8, 0, 16, 16]  # 24 and 8: not multiples of 16
    x = torch.randn(sum(counts), K, dtype=torch.bfloat16)
    dy = torch.randn(sum(counts), N, dtype=torch.bfloat16)
    splits = make_splits(counts, "cpu")
    qx, qdy = quantize(x, splits, recipe), quantize(dy, splits, recipe)
    with pytest.raises(RuntimeError, match="device fault in grouped_gemm.*alignment rule"):
        ops.grouped_mm_fp8_wgrad(qdy, qx, splits, recipe)
