"""groupmm.nn.MoE.from_transformers on each MoE layer form transformers has that the block
expresses (Qwen3-MoE, Mixtral, OLMoE, gpt-oss, DeepSeek-V3): the block's output, dx and the
router's gradient against the layer's own forward (fp32 on the CPU, tiny random configs of
test_hf_experts); and the refusals, each naming the class and the reason. Skipped (reported)
where transformers is not installed."""

import pytest
import torch

from groupmm.nn import MoE

pytest.importorskip("transformers")
from test_hf_experts import make_model  # noqa: E402

FAMILIES = ["qwen3_moe", "mixtral", "olmoe", "gpt_oss", "deepseek_v3"]


def moe_layer(family, **overrides):
    model = make_model(family, **overrides)
    mlp = model.model.layers[-1].mlp  # (DeepSeek-V3's first layer is dense)
    with torch.no_grad():  # a router that decides: no near-ties in the top-k
        for name, p in mlp.named_parameters():
            if name.startswith(("gate.", "router.")):
                p.normal_(0, 0.5)
    return mlp


def layer_forward(mlp, x):
    out = mlp(x.unsqueeze(0))
    return (out[0] if isinstance(out, tuple) else out).reshape(x.shape)


@pytest.mark.parametrize("family", FAMILIES)
def test_block_equals_the_layer(family):
    mlp = moe_layer(family)
    moe = MoE.from_transformers(mlp)
    assert moe.router.weight.dtype == torch.float32
    x = torch.randn(24, mlp_hidden(mlp), requires_grad=True)
    y, _ = moe(x)
    x_ref = x.detach().clone().requires_grad_()
    ref = layer_forward(mlp, x_ref)
    scale = ref.abs().max().item()
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-5 * scale)
    dy = torch.randn_like(y)
    router = mlp.gate.weight if hasattr(mlp, "gate") else mlp.router.weight
    got = torch.autograd.grad(y, [x, moe.router.weight], dy)
    want = torch.autograd.grad(ref, [x_ref, router], dy)
    for name, g, w in zip(("dx", "d router"), got, want):
        assert w.abs().max() > 0, name
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5 * w.abs().max().item(), msg=name)


def mlp_hidden(mlp):
    return (mlp.gate.weight if hasattr(mlp, "gate") else mlp.router.weight).shape[1]


def test_dtype_device_and_recipe_follow_the_arguments():
    mlp = moe_layer("qwen3_moe")
    moe = MoE.from_transformers(mlp, dtype=torch.bfloat16, recipe="fp8_current")
    assert moe.gate_up.weight.dtype == torch.bfloat16 and moe.recipe == "fp8_current"
    assert torch.equal(moe.down.weight, mlp.experts.down_proj.detach().bfloat16())


def test_refusals():
    with pytest.raises(NotImplementedError, match="Qwen2MoeSparseMoeBlock: .*sigmoid gate"):
        MoE.from_transformers(moe_layer("qwen2_moe"))
    with pytest.raises(NotImplementedError, match="MixtralSparseMoeBlock: router jitter 0.1"):
        MoE.from_transformers(moe_layer("mixtral", router_jitter_noise=0.1))
    with pytest.raises(NotImplementedError, match="Linear: not a layer this block expresses"):
        MoE.from_transformers(torch.nn.Linear(4, 4))
    gelu = moe_layer("olmoe")
    gelu.experts.act_fn = torch.nn.GELU()
    with pytest.raises(NotImplementedError, match="activation is GELU"):
        MoE.from_transformers(gelu)
