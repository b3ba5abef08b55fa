"""Serving from quantized checkpoints: GroupedLinear.import_fp8_block (DeepSeek-V3's FP8 weights
with their 128x128 block scale_inv) and import_mxfp4 (gpt-oss's MXFP4 blocks and scales).

The bit-exact check: a checkpoint written from groupmm's own quantization of a bf16 weight (the
same bytes a checkpoint would hold), imported, gives the output of the layer that quantizes that
bf16 weight itself, bit for bit; likewise through groupmm.nn.MoE with a shared expert. A checkpoint
quantized the way DeepSeek-V3's tools do (in torch here) runs against the fp32 product of its
dequantized weights. Then the refusals."""

import pytest
import torch

import groupmm  # noqa: F401
from groupmm.nn import MoE, GroupedLinear

ops = torch.ops.groupmm


def fp8_checkpoint(w):
    """(weight [G, N, K] e4m3, weight_scale_inv [G, N/128, K/128]) from groupmm's quantization."""
    G, N, K = w.shape
    data, scale_inv = ops.group_quantize(w, None, "fp8_block", block_2d=True)[:2]
    return data.view(G, N, K), scale_inv[: G * (N // 128)].view(G, N // 128, K // 128)


def mxfp4_checkpoint(w):
    """(blocks [G, N, K/32, 16], scales [G, N, K/32]) from groupmm's quantization."""
    data, scale_inv, _ = ops.group_quantize_w4(w, "mxfp4")
    return ops.export_mxfp4_weights(data, scale_inv)


def splits_of(device, *rows):
    return torch.tensor(rows, dtype=torch.int32, device=device)


@pytest.mark.parametrize("bias", [False, True])
def test_fp8_block_import_is_the_layers_own_quantization(device, bias):
    G, K, N = 3, 256, 384
    own = GroupedLinear(G, K, N, bias=bias, recipe="fp8_block", device=device)
    imp = GroupedLinear(G, K, N, bias=bias, recipe="fp8_block", device=device)
    with torch.no_grad():
        if bias:
            imp.bias.copy_(own.bias)
    imp.requires_grad_(False)
    imp.import_fp8_block(*fp8_checkpoint(own.weight.detach()))
    assert imp.imported and imp.weight is None
    x = torch.randn(80, K, dtype=torch.bfloat16, device=device)
    splits = splits_of(device, 32, 0, 48)
    with torch.no_grad():
        assert torch.equal(imp(x, splits), own(x, splits))


def test_mxfp4_import_is_the_layers_own_quantization(device):
    G, K, N = 4, 128, 72
    own = GroupedLinear(G, K, N, bias=True, recipe="mxfp4_weight", device=device)
    imp = GroupedLinear(G, K, N, bias=True, recipe="mxfp4_weight", device=device)
    with torch.no_grad():
        imp.bias.copy_(own.bias)
    imp.requires_grad_(False)
    imp.import_mxfp4(*mxfp4_checkpoint(own.weight.detach()))
    x = torch.randn(19, K, dtype=torch.bfloat16, device=device)
    splits = splits_of(device, 5, 0, 13, 1)
    with torch.no_grad():
        assert torch.equal(imp(x, splits), own(x, splits))


@pytest.mark.parametrize("recipe", ["fp8_block", "mxfp4_weight"])
def test_moe_serves_imported_experts(device, recipe):
    """The whole block (router, permute, experts, shared expert, unpermute) over imported expert
    and shared-expert weights equals the block quantizing the same bf16 weights itself."""
    H, F, E, k = 256, 128, 8, 2
    kw = dict(shared_ffn_hidden=128, recipe=recipe, device=device)
    torch.manual_seed(1)
    own = MoE(H, F, E, k, **kw)
    imp = MoE(H, F, E, k, **kw)
    imp.load_state_dict(own.state_dict())
    imp.requires_grad_(False)
    checkpoint = fp8_checkpoint if recipe == "fp8_block" else mxfp4_checkpoint
    load = "import_fp8_block" if recipe == "fp8_block" else "import_mxfp4"
    for name in ("gate_up", "down", "shared_up", "shared_down"):
        layer = getattr(own, name)
        w = layer.weight.detach()
        parts = checkpoint(w if w.dim() == 3 else w.unsqueeze(0))
        if w.dim() == 2:  # the shared expert's [N, K] layout, as its checkpoint stores it
            parts = [p[0] for p in parts]
        # read to the host, as a checkpoint loader does: the layer keeps them on its own device
        getattr(getattr(imp, name), load)(*[p.cpu() for p in parts])
        assert all(b.device.type == device.type for b in getattr(imp, name).buffers())
    x = torch.randn(48, H, dtype=torch.bfloat16, device=device)
    with torch.no_grad():
        assert torch.equal(imp(x)[0], own(x)[0])


def test_deepseek_style_checkpoint_against_its_dequantized_product(device):
    """scale_inv is the multiplier that dequantizes each 128x128 block (w = fp8 * scale_inv), as
    DeepSeek-V3's checkpoints define it: the layer's output is the product with those weights,
    up to x's own 1x128 FP8 rounding."""
    torch.manual_seed(2)
    G, N, K = 2, 256, 384
    w = torch.randn(G, N, K) * 0.05
    blocks = w.view(G, N // 128, 128, K // 128, 128)
    scale_inv = blocks.abs().amax(dim=(2, 4)) / 448
    q = (blocks / scale_inv[:, :, None, :, None]).view(G, N, K).to(torch.float8_e4m3fn)
    layer = GroupedLinear(G, K, N, bias=False, recipe="fp8_block", device=device)
    layer.import_fp8_block(q.to(device), scale_inv.to(device))
    x = torch.randn(64, K, dtype=torch.bfloat16)
    with torch.no_grad():
        y = layer(x.to(device), splits_of(device, 16, 48)).float().cpu()
    dq = (q.float().view(G, N // 128, 128, K // 128, 128) * scale_inv[:, :, None, :, None])
    dq = dq.view(G, N, K)
    ref = torch.cat([x[:16].float() @ dq[0].t(), x[16:].float() @ dq[1].t()])
    assert ((y - ref).norm() / ref.norm()).item() < 5e-2


def test_refusals():
    layer = GroupedLinear(2, 128, 128, bias=True, recipe="fp8_block")
    w, s = fp8_checkpoint(layer.weight.detach())
    with pytest.raises(ValueError, match="needs recipe='fp8_block'"):
        GroupedLinear(2, 128, 128, recipe="bf16").import_fp8_block(w, s)
    with pytest.raises(ValueError, match="needs recipe='mxfp4_weight'"):
        layer.import_mxfp4(w, s)
    with pytest.raises(ValueError, match="weight must be torch.float8_e4m3fn; got torch.bfloat16"):
        layer.import_fp8_block(w.to(torch.bfloat16), s)
    with pytest.raises(ValueError, match="weight_scale_inv must be torch.float32"):
        layer.import_fp8_block(w, s.double())
    with pytest.raises(ValueError, match=r"import_fp8_block: weight must be \[2, 128, 128\]"):
        layer.import_fp8_block(w[:1], s)
    with pytest.raises(ValueError, match=r"weight_scale_inv must be \[2, 1, 1\].*got \[2, 1\]"):
        layer.import_fp8_block(w, s[:, 0])
    layer.import_fp8_block(w, s)
    with pytest.raises(RuntimeError, match="already imported"):
        layer.import_fp8_block(w, s)
    with pytest.raises(RuntimeError, match="reset_parameters: the weights were imported"):
        layer.reset_parameters()
    x = torch.randn(16, 128, dtype=torch.bfloat16)
    splits = torch.tensor([16, 0], dtype=torch.int32)
    with pytest.raises(RuntimeError, match=r"forward only; run it under torch.no_grad\(\)"):
        layer(x, splits)  # the bias still requires grad
    layer.bias.requires_grad_(False)
    with pytest.raises(ValueError, match=r"x must be \[M, 128\] torch.bfloat16"):
        with torch.no_grad():
            layer(x.float(), splits)
    with torch.no_grad():
        assert layer(x, splits).shape == (16, 128)
