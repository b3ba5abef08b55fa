"""groupmm.nn.MoE as gpt-oss's MoE layer (bias=True, activation=GPT_OSS_SWIGLU, from_gpt_oss):
against transformers' own GptOssMLP (values and every gradient, fp32 on the CPU; bf16 on either
device), from the checkpoint's MXFP4 blocks against the float64 layer of the decoded weights,
dropped tokens adding no bias, CUDA-graph replay with new tokens, and the refusals. Skipped
(reported) where transformers is not installed."""

import pytest
import torch

import groupmm
from groupmm.nn import GPT_OSS_SWIGLU, MoE, SwiGLU
from quant_ref import decode_e2m1

transformers = pytest.importorskip("transformers")
from transformers.models.gpt_oss import modeling_gpt_oss  # noqa: E402

ops = torch.ops.groupmm
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
H, F, E, K = 64, 32, 8, 2


def hf_layer(std=0.5, seed=0):
    """transformers' GptOssMLP with weights large enough that the clamp at 7 bites."""
    config = transformers.GptOssConfig(hidden_size=H, intermediate_size=F, num_local_experts=E,
                                       num_experts_per_tok=K, num_hidden_layers=1,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                       layer_types=["full_attention"])
    config._experts_implementation = "eager"  # transformers' own per-expert loop
    torch.manual_seed(seed)
    mlp = modeling_gpt_oss.GptOssMLP(config)
    with torch.no_grad():
        for p in mlp.parameters():
            p.normal_(0, std)
    return mlp


def hf_forward(mlp, x):
    out = mlp(x.unsqueeze(0))
    return (out[0] if isinstance(out, tuple) else out).squeeze(0)


def calc_diff(a, b):
    """1 - cosine similarity of the flattened tensors."""
    a, b = a.double().flatten(), b.double().flatten()
    return (1 - 2 * (a * b).sum() / (a * a + b * b).sum()).item()


def clamp_share(mlp, x):
    """The fraction of gate/up values the clamp changes (the test must exercise it)."""
    gu = torch.einsum("th,ehf->etf", x.float(), mlp.experts.gate_up_proj.float())
    return ((gu[..., ::2] > 7) | (gu[..., 1::2].abs() > 7)).float().mean().item()


def test_matches_transformers_values_and_gradients_cpu_fp32():
    mlp = hf_layer()
    moe = MoE.from_gpt_oss(mlp, dtype=torch.float32)
    assert moe.topk == K and moe.activation == GPT_OSS_SWIGLU
    x = torch.randn(40, H, requires_grad=True)
    assert clamp_share(mlp, x) > 0.02
    y, aux = moe(x)
    x_ref = x.detach().clone().requires_grad_()
    ref = hf_forward(mlp, x_ref)
    # fp32 sums in another order (the experts' GEMMs, the k rows' combine): relative to the scale.
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-5 * ref.abs().max().item())
    dy = torch.randn_like(y)
    ours = dict(x=x, router_w=moe.router.weight, router_b=moe.router.bias,
                gate_up=moe.gate_up.weight, gate_up_b=moe.gate_up.bias, down=moe.down.weight,
                down_b=moe.down_bias)
    theirs = dict(x=x_ref, router_w=mlp.router.weight, router_b=mlp.router.bias,
                  gate_up=mlp.experts.gate_up_proj, gate_up_b=mlp.experts.gate_up_proj_bias,
                  down=mlp.experts.down_proj, down_b=mlp.experts.down_proj_bias)
    got = dict(zip(ours, torch.autograd.grad(y, list(ours.values()), dy)))
    want = dict(zip(theirs, torch.autograd.grad(ref, list(theirs.values()), dy)))
    for name in ours:
        g, w = got[name], want[name]
        if name in ("gate_up", "down"):  # ours [E, out, in], gpt-oss's [E, in, out]
            w = w.transpose(1, 2)
        assert w.abs().max() > 0, name
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5 * w.abs().max().item(), msg=name)


def test_state_dict_with_prefix_is_the_module():
    mlp = hf_layer()
    state = {f"model.layers.3.mlp.{k}": v for k, v in mlp.state_dict().items()}
    a = MoE.from_gpt_oss(mlp, dtype=torch.float32)
    b = MoE.from_gpt_oss(state, K, prefix="model.layers.3.mlp.", dtype=torch.float32)
    x = torch.randn(16, H)
    with torch.no_grad():
        assert torch.equal(a(x)[0], b(x)[0])


def test_bf16_close_to_transformers(device):
    mlp = hf_layer(std=0.3)
    moe = MoE.from_gpt_oss(mlp, dtype=torch.bfloat16, device=device)
    x = torch.randn(64, H).to(torch.bfloat16)
    with torch.no_grad():
        y = moe(x.to(device))[0].float().cpu()
        ref = hf_forward(mlp, x.float())
    assert calc_diff(y, ref) < 1e-3


def mxfp4_state(mlp, seed=1):
    """gpt-oss's checkpoint layout of random MXFP4 experts (blocks [E, N, K/32, 16], E8M0 scales
    [E, N, K/32]) with mlp's router and biases; and the same layer with the decoded weights."""
    g = torch.Generator().manual_seed(seed)
    state = {k: v.detach().clone() for k, v in mlp.state_dict().items()
             if not k.endswith(("gate_up_proj", "down_proj"))}
    decoded = dict(state)
    for name, out, inn in (("gate_up_proj", 2 * F, H), ("down_proj", H, F)):
        blocks = torch.randint(0, 256, (E, out, inn // 32, 16), dtype=torch.uint8, generator=g)
        scales = torch.randint(120, 128, (E, out, inn // 32), dtype=torch.uint8, generator=g)
        state[f"experts.{name}_blocks"], state[f"experts.{name}_scales"] = blocks, scales
        w = decode_e2m1(blocks.view(E, out, inn // 2))  # float64 [E, out, in]
        w = w * torch.exp2(scales.double() - 127).repeat_interleave(32, dim=-1)
        decoded[f"experts.{name}"] = w.transpose(1, 2).float()  # gpt-oss's (in, out)
    return state, decoded


def test_mxfp4_checkpoint_against_the_decoded_layer(device):
    mlp = hf_layer(std=0.3)
    state, decoded = mxfp4_state(mlp)
    moe = MoE.from_gpt_oss(state, K, recipe="mxfp4_weight", dtype=torch.bfloat16, device=device)
    assert moe.gate_up.weight is None and moe.down.weight is None  # no 16-bit copy
    ref_moe = MoE.from_gpt_oss(decoded, K, dtype=torch.float32)
    x = torch.randn(48, H).to(torch.bfloat16)
    with torch.no_grad():
        y = moe(x.to(device))[0].float().cpu()
        ref = ref_moe(x.float())[0]
    # The weights are exact in both; x's bf16 products agree up to the activation's bf16 rounding.
    assert calc_diff(y, ref) < 1e-4


def test_dropped_tokens_add_no_down_bias():
    """capacity_factor: a dropped (token, expert) pair adds neither its rows nor its bias (the
    bias's mask and product are torch ops on either device: fp32 on the CPU checks them)."""
    mlp = hf_layer(std=0.3)
    moe = MoE.from_gpt_oss(mlp, dtype=torch.float32, capacity_factor=0.5)
    full = MoE.from_gpt_oss(mlp, dtype=torch.float32)
    with torch.no_grad():
        moe.down.weight.zero_()  # the output is then the routed down bias alone
        full.down.weight.zero_()
        x = torch.randn(32, H)
        y, y_all = moe(x)[0], full(x)[0]
        logits = full.router(x.float())
        top = logits.topk(K, dim=-1)
        w = top.values.softmax(-1)
        dest = ops.permute_plan(top.indices.int(), E, 1, moe_capacity_rows(32))[0]
        kept = (dest >= 0).float()
        ref = torch.einsum("tk,tkh->th", w * kept, full.down_bias[top.indices])
    assert (dest < 0).any() and (dest >= 0).any()
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y_all, torch.einsum("tk,tkh->th", w, full.down_bias[top.indices]),
                               rtol=1e-5, atol=1e-5)


def moe_capacity_rows(T):
    return groupmm.moe_capacity(T, K, E, 0.5)


@CUDA
def test_cuda_graph_replays_new_tokens():
    """A decode batch captured once: each replay with new tokens (new routings) equals eager."""
    mlp = hf_layer(std=0.3)
    state, _ = mxfp4_state(mlp)
    moe = MoE.from_gpt_oss(state, K, recipe="mxfp4_weight", device="cuda")
    x = torch.randn(8, H, device="cuda", dtype=torch.bfloat16)
    # Warm up on the capture stream (groupmm's Context for a stream is made on its first use
    # there; tests/python/test_cuda_graph.py).
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.no_grad():
        with torch.cuda.stream(stream):
            moe(x)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            y = moe(x)[0]
        for seed in range(5):
            torch.manual_seed(100 + seed)
            x.copy_(torch.randn_like(x) * (1 + seed))
            graph.replay()
            assert torch.equal(y, moe(x)[0]), seed


@pytest.mark.parametrize("kw,match", [
    (dict(bias=True, fused_gate_up=True), "fused_gate_up=True takes neither"),
    (dict(activation=GPT_OSS_SWIGLU, fused_gate_up=True), "fused_gate_up=True takes neither"),
    (dict(activation=SwiGLU(limit=0.0)), "limit None or finite and > 0"),
    (dict(activation=SwiGLU(alpha=float("inf"))), "alpha and up_offset finite"),
    (dict(activation=(1.0, None, 0.0, 1)), "interleaved a bool"),
])
def test_refused_settings(kw, match):
    with pytest.raises(ValueError, match=match):
        MoE(H, F, E, K, **kw)


def test_refused_states():
    mlp = hf_layer()
    state = mlp.state_dict()
    with pytest.raises(ValueError, match="topk is needed"):
        MoE.from_gpt_oss(state)
    with pytest.raises(ValueError, match="has no 'x.router.weight'"):
        MoE.from_gpt_oss(state, K, prefix="x.")
    bad = dict(state, **{"experts.down_proj": state["experts.down_proj"][:, :, :-1]})
    with pytest.raises(ValueError, match=r"'experts.down_proj' is \[8, 32, 63\]"):
        MoE.from_gpt_oss(bad, K)
    with pytest.raises(ValueError, match="bias=True and activation=GPT_OSS_SWIGLU"):
        MoE(H, F, E, K).import_gpt_oss(state)
    blocks, _ = mxfp4_state(mlp)
    with pytest.raises(ValueError, match="needs recipe='mxfp4_weight'"):
        MoE.from_gpt_oss(blocks, K)
    moe = MoE.from_gpt_oss(blocks, K, recipe="mxfp4_weight")
    with pytest.raises(ValueError, match="holds imported quantized weights"):
        moe.import_gpt_oss(state)


def test_plain_activation_object_is_the_default_block():
    """activation=SwiGLU() and bias=False are the block as before, bit for bit."""
    torch.manual_seed(3)
    a = MoE(H, F, E, K, dtype=torch.float32)
    b = MoE(H, F, E, K, dtype=torch.float32, activation=SwiGLU())
    b.load_state_dict(a.state_dict())
    x = torch.randn(16, H)
    with torch.no_grad():
        assert torch.equal(a(x)[0], b(x)[0])
