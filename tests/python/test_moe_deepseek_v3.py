"""groupmm.nn.MoE.from_deepseek_v3: DeepSeek-V3's MoE layer (sigmoid group-limited routing with the
e_score_correction_bias, scaled weights, routed and shared experts) against transformers' own
DeepseekV3MoE (values and every gradient, fp32 on the CPU), from the released checkpoint's
per-expert FP8 keys against the layer of their dequantized weights, and the refusals. Skipped
(reported) where transformers is not installed."""

import pytest
import torch

from groupmm.nn import MoE

transformers = pytest.importorskip("transformers")
from transformers.models.deepseek_v3 import modeling_deepseek_v3  # noqa: E402

H, F, E, K = 64, 32, 8, 2


def hf_layer(seed=0, **kw):
    config = transformers.DeepseekV3Config(
        hidden_size=H, moe_intermediate_size=F, n_routed_experts=E, n_shared_experts=1,
        num_experts_per_tok=K, n_group=2, topk_group=1, routed_scaling_factor=2.5,
        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4, **kw)
    config._experts_implementation = "eager"  # transformers' own per-expert loop
    torch.manual_seed(seed)
    layer = modeling_deepseek_v3.DeepseekV3MoE(config)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.3)
        layer.gate.e_score_correction_bias.normal_(0, 0.1)  # the selection must depend on it
    return layer


def calc_diff(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    return (1 - 2 * (a * b).sum() / (a * a + b * b).sum()).item()


def test_matches_transformers_values_and_gradients_cpu_fp32():
    layer = hf_layer()
    moe = MoE.from_deepseek_v3(layer, dtype=torch.float32)
    assert (moe.topk, moe.router_cfg[:5]) == (K, ("sigmoid", 2, 1, True, 2.5))
    x = torch.randn(40, H, requires_grad=True)
    y, _ = moe(x)
    x_ref = x.detach().clone().requires_grad_()
    ref = layer(x_ref.unsqueeze(0)).squeeze(0)
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-5 * ref.abs().max().item())
    # The correction bias steers the selection: without it the output differs.
    with torch.no_grad():
        saved = moe.expert_bias.clone()
        moe.expert_bias.zero_()
        assert not torch.allclose(moe(x)[0], ref, rtol=1e-3, atol=1e-3)
        moe.expert_bias.copy_(saved)
    dy = torch.randn_like(y)
    sh = layer.shared_experts
    ours = dict(x=x, router=moe.router.weight, gate_up=moe.gate_up.weight, down=moe.down.weight,
                shared_up=moe.shared_up.weight, shared_down=moe.shared_down.weight)
    theirs = dict(x=x_ref, router=layer.gate.weight, gate_up=layer.experts.gate_up_proj,
                  down=layer.experts.down_proj, shared_up=None, shared_down=sh.down_proj.weight)
    want_params = [t if t is not None else sh.gate_proj.weight for t in theirs.values()]
    got = torch.autograd.grad(y, list(ours.values()), dy)
    want = list(torch.autograd.grad(ref, want_params + [sh.up_proj.weight], dy))
    want[list(theirs).index("shared_up")] = torch.cat((want[4], want[-1]))  # [gate; up]
    for name, g, w in zip(ours, got, want):
        assert w.abs().max() > 0, name
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5 * w.abs().max().item(), msg=name)


def fp8_checkpoint(seed=1, E=4, H=256, F=128, Fs=128):
    """The released checkpoint's keys for one layer: e4m3 weights per expert with the 128x128
    block weight_scale_inv (amax / 448, as DeepSeek's tools write it); and the same keys with the
    dequantized fp32 weights."""
    g = torch.Generator().manual_seed(seed)
    fp8, deq = {}, {}

    def put(key, rows, cols):
        w = torch.randn(rows, cols, generator=g) * 0.05
        blocks = w.view(rows // 128, 128, cols // 128, 128)
        s = blocks.abs().amax(dim=(1, 3)) / 448
        q = (blocks / s[:, None, :, None]).view(rows, cols).to(torch.float8_e4m3fn)
        fp8[key], fp8[key + "_scale_inv"] = q, s
        deq[key] = (q.float().view(rows // 128, 128, cols // 128, 128)
                    * s[:, None, :, None]).view(rows, cols)

    for e in range(E):
        put(f"experts.{e}.gate_proj.weight", F, H)
        put(f"experts.{e}.up_proj.weight", F, H)
        put(f"experts.{e}.down_proj.weight", H, F)
    put("shared_experts.gate_proj.weight", Fs, H)
    put("shared_experts.up_proj.weight", Fs, H)
    put("shared_experts.down_proj.weight", H, Fs)
    # A router weight bf16 holds exactly, scores away from sigmoid's saturation: both blocks
    # select the same experts.
    router = (torch.randn(E, H, generator=g) * 0.02).bfloat16().float()
    bias = torch.randn(E, generator=g) * 0.01
    for d in (fp8, deq):
        d["gate.weight"], d["gate.e_score_correction_bias"] = router, bias
    return fp8, deq


def test_fp8_checkpoint_against_its_dequantized_layer(device):
    fp8, deq = fp8_checkpoint()
    routing = dict(n_group=2, topk_group=2, scaling_factor=2.5)
    moe = MoE.from_deepseek_v3(fp8, 2, recipe="fp8_block", device=device, **routing)
    assert moe.gate_up.weight is None and moe.shared_up.weight is None  # no 16-bit copy
    ref_moe = MoE.from_deepseek_v3(deq, 2, dtype=torch.float32, **routing)
    x = torch.randn(64, 256).to(torch.bfloat16)
    with torch.no_grad():
        y = moe(x.to(device))[0].float().cpu()
        ref = ref_moe(x.float())[0]
    # x's own 1x128 FP8 rounding (the weights are the same numbers).
    assert calc_diff(y, ref) < 2e-3


def test_stacked_and_per_expert_keys_load_the_same_block():
    layer = hf_layer()
    a = MoE.from_deepseek_v3(layer, dtype=torch.float32)
    state = {k: v for k, v in layer.state_dict().items() if not k.startswith("experts.")}
    gu, dn = layer.experts.gate_up_proj.detach(), layer.experts.down_proj.detach()
    for e in range(E):
        state[f"experts.{e}.gate_proj.weight"] = gu[e, :F]
        state[f"experts.{e}.up_proj.weight"] = gu[e, F:]
        state[f"experts.{e}.down_proj.weight"] = dn[e]
    b = MoE.from_deepseek_v3({f"p.{k}": v for k, v in state.items()}, K, prefix="p.", n_group=2,
                             topk_group=1, scaling_factor=2.5, dtype=torch.float32)
    x = torch.randn(16, H)
    with torch.no_grad():
        assert torch.equal(a(x)[0], b(x)[0])


def test_refusals():
    fp8, _ = fp8_checkpoint(F=128)
    with pytest.raises(ValueError, match="topk is needed"):
        MoE.from_deepseek_v3(fp8)
    with pytest.raises(ValueError, match="needs recipe='fp8_block'"):
        MoE.from_deepseek_v3(fp8, 2)
    bad = dict(fp8)
    bad["experts.1.up_proj.weight"] = bad["experts.1.up_proj.weight"][:, :128]
    with pytest.raises(ValueError, match=r"'experts.1.up_proj.weight' is \[128, 128\]"):
        MoE.from_deepseek_v3(bad, 2, recipe="fp8_block")
    no_bias = {k: v for k, v in fp8.items() if k != "gate.e_score_correction_bias"}
    moe = MoE.from_deepseek_v3(no_bias, 2, recipe="fp8_block")
    assert moe.expert_bias is None
    with pytest.raises(ValueError, match="build it with expert_bias=True"):
        moe.import_deepseek_v3(fp8)
