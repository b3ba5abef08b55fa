"""Llama 4's MoE layer on groupmm: groupmm.nn.MoE.from_transformers(Llama4TextMoe) (the router
weight scaling the experts' input rows: router_on_input=True) against the layer's own forward,
and a tiny Llama 4 causal LM with its MoE layers replaced (groupmm.integrations.transformers.
replace_llama4_moe) against the original model: logits, loss, every gradient and generate()
(fp32 on the CPU; bf16 on CUDA where present). Skipped (reported) without transformers."""

import copy

import pytest
import torch

from groupmm.nn import MoE

transformers = pytest.importorskip("transformers")
from groupmm.integrations.transformers import Llama4MoE, replace_llama4_moe  # noqa: E402

CUDA = torch.cuda.is_available()


def make_model(topk=2, dtype=torch.float32, device="cpu"):
    cfg = transformers.Llama4TextConfig(
        vocab_size=128, hidden_size=64, intermediate_size=32, intermediate_size_mlp=48,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_local_experts=8, num_experts_per_tok=topk, moe_layers=[0, 1],
        max_position_embeddings=64, attention_chunk_size=64)
    torch.manual_seed(0)
    model = transformers.Llama4ForCausalLM(cfg)
    with torch.no_grad():  # init leaves the experts zero and the router near-tied: make them matter
        for name, p in model.named_parameters():
            if "feed_forward" in name:
                p.normal_(0, 0.5 if "router" in name else 0.3)
    return model.to(device=device, dtype=dtype)


def layer_and_input(topk, dtype=torch.float32, device="cpu", tokens=24):
    layer = make_model(topk, dtype, device).model.layers[-1].feed_forward
    x = torch.randn(tokens, 64, dtype=dtype, device=device)
    return layer, x


@pytest.mark.parametrize("topk", [1, 2])
def test_block_equals_the_layer(topk):
    layer, x = layer_and_input(topk)
    moe = MoE.from_transformers(layer)
    assert moe.router_on_input and moe.shared_up is not None
    x = x.requires_grad_()
    y, _ = moe(x)
    x_ref = x.detach().clone().requires_grad_()
    ref, _ = layer(x_ref)
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-5 * ref.abs().max().item())
    dy = torch.randn_like(y)
    params = [moe.router.weight, moe.gate_up.weight, moe.down.weight, moe.shared_up.weight]
    got = torch.autograd.grad(y, [x] + params, dy)
    want = torch.autograd.grad(ref, [x_ref, layer.router.weight, layer.experts.gate_up_proj,
                                     layer.experts.down_proj, layer.shared_expert.gate_proj.weight],
                               dy)
    # the layer's expert weights are stored (in, out): their gradients transposed; the shared
    # expert's gate rows are the first half of the block's shared_up
    want = [want[0], want[1], want[2].transpose(1, 2), want[3].transpose(1, 2), want[4]]
    got = list(got[:4]) + [got[4][:want[4].shape[0]]]
    for name, g, w in zip(("dx", "d router", "d gate_up", "d down", "d shared gate"), got, want):
        assert w.abs().max() > 0, name
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5 * w.abs().max().item(), msg=name)


def test_weight_on_the_input_is_not_on_the_output():
    """The same weights with the router weight inside the activation give another y: the test
    above could not pass with the block's default form."""
    layer, x = layer_and_input(2)
    moe = MoE.from_transformers(layer)
    other = copy.deepcopy(moe)
    other.router_on_input = False
    y, _ = moe(x)
    y_other, _ = other(x)
    assert (y - y_other).abs().max() > 1e-3 * y.abs().max()


def test_recompute_and_keep_give_the_same_gradients():
    layer, x = layer_and_input(2)
    grads = []
    for recompute in (True, False):
        moe = MoE.from_transformers(layer, recompute=recompute)
        xr = x.clone().requires_grad_()
        y, _ = moe(xr)
        y.square().sum().backward()
        grads.append([xr.grad, moe.router.weight.grad, moe.gate_up.weight.grad])
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_refusals():
    with pytest.raises(ValueError, match=r"router_on_input=True\): bias=True"):
        MoE(64, 32, 8, 2, router_on_input=True, bias=True, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"router_on_input=True\): fused_gate_up=True"):
        MoE(64, 32, 8, 2, router_on_input=True, fused_gate_up=True, dtype=torch.float32)
    layer, _ = layer_and_input(1)
    layer.experts.act_fn = torch.nn.GELU()
    with pytest.raises(NotImplementedError, match="Llama4TextMoe: the experts' activation is GELU"):
        MoE.from_transformers(layer)


def run(model, ids):
    model.zero_grad(set_to_none=True)
    out = model(ids, labels=ids)
    out.loss.backward()
    return out.logits.detach(), out.loss.detach(), {
        n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def calc_diff(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    return (1 - 2 * (a * b).sum() / (a * a + b * b).sum()).item()


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if CUDA else []))
def test_model_with_replaced_layers_matches(device):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    model = make_model(2, dtype, device)
    ids = torch.randint(0, 128, (2, 12), device=device)
    logits_e, loss_e, grads_e = run(model, ids)
    tokens_e = model.generate(ids[:1, :6], max_new_tokens=4, do_sample=False)
    ours = copy.deepcopy(model)
    assert replace_llama4_moe(ours) == 2
    assert all(isinstance(layer.feed_forward, Llama4MoE) for layer in ours.model.layers)
    logits_g, loss_g, grads_g = run(ours, ids)
    tokens_g = ours.generate(ids[:1, :6], max_new_tokens=4, do_sample=False)
    # the parameters the replacement keeps (attention, norms, embeddings) by their own names
    kept = [n for n in grads_e if "feed_forward" not in n]
    assert kept and all(n in grads_g for n in kept)
    if device == "cpu":
        torch.testing.assert_close(logits_g, logits_e, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(loss_g, loss_e, rtol=1e-5, atol=1e-6)
        for n in kept:
            torch.testing.assert_close(grads_g[n], grads_e[n], rtol=1e-4, atol=1e-6, msg=n)
        assert torch.equal(tokens_g, tokens_e)
    else:
        assert calc_diff(logits_g, logits_e) < 1e-3
        for n in kept:
            assert calc_diff(grads_g[n], grads_e[n]) < 1e-3, n


def test_quantized_recipe_close_to_bf16():
    """The input-weighted rows go through a quantized recipe's layers (fp8_current quantizes the
    weighted rows): y and dx within FP8's error of the bf16 block on the same weights (the bounds
    of the FP8 backend tests, test_hf_experts)."""
    layer, x = layer_and_input(2, dtype=torch.bfloat16, tokens=32)
    results = []
    for recipe in ("bf16", "fp8_current"):
        moe = MoE.from_transformers(layer, recipe=recipe)
        assert moe.router_on_input and moe.recipe == recipe
        xr = x.clone().requires_grad_()
        y, _ = moe(xr)
        y.float().square().sum().backward()
        results.append((y.detach(), xr.grad))
    (y_b, dx_b), (y_q, dx_q) = results
    assert 0 < calc_diff(y_q, y_b) < 5e-3 and 0 < calc_diff(dx_q, dx_b) < 1e-2


def test_example_trains_and_generates():
    """examples/hf_llama4_moe.py on the CPU: two train steps and generate() on the replaced
    model."""
    import importlib.util
    import os
    import sys
    examples = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
    spec = importlib.util.spec_from_file_location(
        "hf_llama4_moe", os.path.join(examples, "hf_llama4_moe.py"))
    example = importlib.util.module_from_spec(spec)
    sys.path.insert(0, examples)  # its shared loop, hf_train_generate.py, as a script finds it
    try:
        spec.loader.exec_module(example)
    finally:
        sys.path.remove(examples)
    losses = example.main(["--steps", "2", "--device", "cpu"])
    assert len(losses) == 2 and all(4 < loss < 8 for loss in losses)  # about ln(512) = 6.2
