"""groupmm.nn.GroupedLinear recipes against the C++ nn::GroupedLinear (the _core_grouped_linear
hook runs the core layer on the same weights and inputs): bit for bit on the CPU, recipe by
recipe, with bias, fp32 main grads and delayed wgrad; the weight cache; inference recipes refuse
backward."""

import pytest
import torch

import groupmm
from conftest import make_splits

ops = torch.ops.groupmm
COUNTS = [32, 0, 16, 48]  # multiples of 16 (the FP8 wgrad), one empty expert
G, K, N = len(COUNTS), 128, 128
TRAINING = ["bf16", "fp8_current", "fp8_block", "mxfp8"]


def layer_and_inputs(recipe, device="cpu", bias=True, **kw):
    torch.manual_seed(3)
    layer = groupmm.nn.GroupedLinear(G, K, N, bias=bias, recipe=recipe, device=device, **kw)
    x = torch.randn(sum(COUNTS), K, device=device, dtype=torch.bfloat16)
    dy = torch.randn(sum(COUNTS), N, device=device, dtype=torch.bfloat16)
    return layer, x, dy, make_splits(COUNTS, device)


def package_step(layer, x, dy, splits):
    xg = x.clone().requires_grad_()
    y = layer(xg, splits)
    y.backward(dy)
    layer.backward_dw()  # no-op without delay_wgrad
    main = layer.accumulate_into_main_grad
    dw = layer.weight.main_grad if main else layer.weight.grad
    db = None if layer.bias is None else (layer.bias.main_grad if main else layer.bias.grad)
    return y, xg.grad, dw, db


def core_step(layer, x, dy, splits, **kw):
    return ops._core_grouped_linear(x, splits, layer.weight.detach(),
                                    None if layer.bias is None else layer.bias.detach(), dy,
                                    layer.recipe, layer.delay_wgrad,
                                    layer.accumulate_into_main_grad, **kw)


def assert_same_bits(got, want):
    for name, g, w in zip(("y", "dx", "dw", "db"), got, want):
        if g is None:
            assert w.numel() == 0, name
            continue
        assert g.dtype == w.dtype and g.shape == w.shape, name
        assert torch.equal(g, w), f"{name} differs from the C++ layer"


@pytest.mark.parametrize("recipe", TRAINING)
@pytest.mark.parametrize("main_grad,delay", [(False, False), (True, False), (False, True)])
def test_training_recipe_matches_the_core_layer(recipe, main_grad, delay):
    layer, x, dy, splits = layer_and_inputs(recipe, accumulate_into_main_grad=main_grad,
                                            delay_wgrad=delay)
    assert_same_bits(package_step(layer, x, dy, splits), core_step(layer, x, dy, splits))


@pytest.mark.parametrize("recipe", ["fp8_current", "mxfp8"])
def test_e5m2_gradients_and_pow2_scales_match_the_core_layer(recipe):
    kw = dict(grad_dtype=torch.float8_e5m2, pow2_scales=recipe == "fp8_current")
    layer, x, dy, splits = layer_and_inputs(recipe, **kw)
    got = package_step(layer, x, dy, splits)
    assert_same_bits(got, core_step(layer, x, dy, splits, **kw))
    e4m3 = package_step(layer_and_inputs(recipe)[0], x, dy, splits)
    assert not torch.equal(got[1], e4m3[1])  # the option changes dx: it was really applied


@pytest.mark.parametrize("recipe", TRAINING[1:])
@pytest.mark.parametrize("main_grad,delay", [(False, False), (True, False), (False, True)])
def test_high_precision_wgrad_matches_the_core_layer(recipe, main_grad, delay):
    kw = dict(high_precision_wgrad=True, accumulate_into_main_grad=main_grad, delay_wgrad=delay)
    layer, x, dy, splits = layer_and_inputs(recipe, **kw)
    got = package_step(layer, x, dy, splits)
    assert_same_bits(got, core_step(layer, x, dy, splits, high_precision_wgrad=True))


@pytest.mark.parametrize("recipe", TRAINING[1:])
def test_high_precision_wgrad_is_the_bf16_wgrad(device, recipe):
    # y, dx: the FP8 layer's; dW: the bf16 layer's (the same 16-bit GEMM of the same dy and x);
    # db: every recipe's. Bit for bit, on the CPU and on the GPU.
    hp, x, dy, splits = layer_and_inputs(recipe, device, high_precision_wgrad=True)
    fp8 = groupmm.nn.GroupedLinear(G, K, N, recipe=recipe, device=device)
    bf16 = groupmm.nn.GroupedLinear(G, K, N, device=device)
    for other in (fp8, bf16):
        other.load_state_dict(hp.state_dict())
    got, q, h = (package_step(m, x, dy, splits) for m in (hp, fp8, bf16))
    assert torch.equal(got[0], q[0]) and torch.equal(got[1], q[1])
    assert torch.equal(got[2], h[2]) and not torch.equal(got[2], q[2])
    assert torch.equal(got[3], h[3])


def test_high_precision_wgrad_needs_a_quantized_training_recipe():
    for recipe in ("bf16", "mxfp4_weight"):
        with pytest.raises(ValueError, match=f"recipe='{recipe}'\\): high_precision_wgrad=True "
                           "applies to the quantized training recipes"):
            groupmm.nn.GroupedLinear(G, K, N, recipe=recipe, high_precision_wgrad=True)
    with pytest.raises(ValueError, match="high_precision_wgrad=True needs recipe fp8_current"):
        layer, x, dy, splits = layer_and_inputs("bf16")
        core_step(layer, x, dy, splits, high_precision_wgrad=True)
    moe = groupmm.nn.MoE(K, N, G, 2, recipe="fp8_block", high_precision_wgrad=True)
    for layer in (moe.gate_up, moe.down):
        assert layer._exec.hp_wgrad and layer._exec.direction == "rowwise"


@pytest.mark.parametrize("recipe", ["nvfp4_weight", "mxfp4_weight"])
def test_inference_recipe_matches_the_core_layer_and_refuses_backward(recipe):
    layer, x, _, splits = layer_and_inputs(recipe)
    with torch.no_grad():
        y = layer(x, splits)
    want = ops._core_grouped_linear(x, splits, layer.weight.detach(), layer.bias.detach(), None,
                                    recipe)
    assert torch.equal(y, want[0]) and want[1].numel() == 0
    out = layer(x.clone().requires_grad_(), splits)
    with pytest.raises(RuntimeError, match=f"GroupedLinear\\(recipe='{recipe}'\\): backward is "
                       "not supported: an inference recipe"):
        out.sum().backward()


@pytest.mark.parametrize("recipe", TRAINING[1:])
def test_quantized_recipes_track_the_bf16_layer(recipe):
    layer, x, dy, splits = layer_and_inputs(recipe)
    ref = groupmm.nn.GroupedLinear(G, K, N, device="cpu")
    ref.load_state_dict(layer.state_dict())
    for got, want in zip(package_step(layer, x, dy, splits), package_step(ref, x, dy, splits)):
        rel = (got.float() - want.float()).norm() / want.float().norm()
        assert rel < 0.1, rel  # FP8 / MXFP8 error, far from a wrong scale or layout


def test_weights_are_quantized_once_until_they_change():
    layer, x, _, splits = layer_and_inputs("fp8_current")
    with torch.no_grad():
        y1 = layer(x, splits)
        cached = layer._exec.weights.get(layer.weight)
        assert layer(x, splits) is not None and layer._exec.weights.get(layer.weight) is cached
        layer.weight.mul_(2)  # an optimizer step bumps weight._version
        y2 = layer(x, splits)
    assert layer._exec.weights.get(layer.weight) is not cached
    fresh = groupmm.nn.GroupedLinear(G, K, N, recipe="fp8_current", device="cpu")
    fresh.load_state_dict(layer.state_dict())
    with torch.no_grad():
        assert torch.equal(y2, fresh(x, splits)) and not torch.equal(y1, y2)


@pytest.mark.parametrize("recipe", ["fp8_current", "mxfp8", "nvfp4_weight"])
def test_is_first_microbatch_keeps_the_quantized_weights(recipe):
    layer, x, _, splits = layer_and_inputs(recipe)
    with pytest.raises(RuntimeError, match="is_first_microbatch=False needs quantized weights"):
        layer(x, splits, is_first_microbatch=False)
    with torch.no_grad():
        y1 = layer(x, splits, is_first_microbatch=True)
        kept = layer._exec.weights.get(layer.weight, False)
        assert torch.equal(layer(x, splits, is_first_microbatch=False), y1)
        assert layer._exec.weights.get(layer.weight, False) is kept  # reused, not remade
        assert torch.equal(layer(x, splits), y1)  # None: the weights did not change, ...
        assert layer._exec.weights.get(layer.weight, False) is kept  # ... so none were remade
        layer.weight.mul_(2)  # an optimizer step
        # False after a change would use stale weights: eager refuses
        with pytest.raises(RuntimeError, match="is_first_microbatch=False, but the weights"):
            layer(x, splits, is_first_microbatch=False)
        y2 = layer(x, splits, is_first_microbatch=True)
        assert layer._exec.weights.get(layer.weight, False) is not kept
        assert torch.equal(layer(x, splits, is_first_microbatch=False), y2)
    fresh = groupmm.nn.GroupedLinear(G, K, N, recipe=recipe, device="cpu")
    fresh.load_state_dict(layer.state_dict())
    with torch.no_grad():
        assert torch.equal(y2, fresh(x, splits)) and not torch.equal(y1, y2)


def test_is_first_microbatch_in_training_and_bf16():
    # Two micro-batches of a quantized layer (True, then False) give the gradients of two plain
    # calls; the bf16 recipe takes the argument and ignores it.
    for recipe in ("fp8_block", "bf16"):
        a, x, dy, splits = layer_and_inputs(recipe)
        b = groupmm.nn.GroupedLinear(G, K, N, recipe=recipe, device="cpu")
        b.load_state_dict(a.state_dict())
        for first in (True, False):
            xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
            a(xa, splits, is_first_microbatch=first).backward(dy)
            b(xb, splits).backward(dy)
            assert torch.equal(xa.grad, xb.grad)
        assert torch.equal(a.weight.grad, b.weight.grad) and torch.equal(a.bias.grad, b.bias.grad)


@pytest.mark.parametrize("recipe", ["bf16", "fp8_block"])
def test_delayed_wgrad_queues_micro_batches(device, recipe):
    plain, x, dy, splits = layer_and_inputs(recipe, device)
    delayed = groupmm.nn.GroupedLinear(G, K, N, recipe=recipe, delay_wgrad=True, device=device)
    delayed.load_state_dict(plain.state_dict())
    for _ in range(2):  # two micro-batches, one backward_dw
        xs = [x.clone().requires_grad_() for _ in range(2)]
        plain(xs[0], splits).backward(dy)
        delayed(xs[1], splits).backward(dy)
        assert torch.equal(xs[0].grad, xs[1].grad)  # dx (and db) right away
    assert delayed.weight.grad is None and delayed.wgrad_pending
    assert torch.equal(delayed.bias.grad, plain.bias.grad)
    delayed.backward_dw()
    assert not delayed.wgrad_pending
    assert torch.equal(delayed.weight.grad, plain.weight.grad)
    with pytest.raises(RuntimeError, match="backward_dw: no wgrad is pending"):
        delayed.backward_dw()


def test_recipe_constraints_are_checked_at_construction():
    with pytest.raises(ValueError, match=r"recipe='fp8_block'\): in_features=64 and "
                       "out_features=128 must be multiples of 128"):
        groupmm.nn.GroupedLinear(G, 64, 128, recipe="fp8_block")
    with pytest.raises(ValueError, match=r"recipe='mxfp8'\): dtype=torch.float16 must be "
                       "torch.bfloat16"):
        groupmm.nn.GroupedLinear(G, K, N, recipe="mxfp8", dtype=torch.float16)
    with pytest.raises(ValueError, match="fp8_block gradients are float8_e4m3fn"):
        groupmm.nn.GroupedLinear(G, K, N, recipe="fp8_block", grad_dtype=torch.float8_e5m2)
    with pytest.raises(ValueError, match="recipe must be one of bf16, fp8_current"):
        groupmm.nn.GroupedLinear(G, K, N, recipe="int8")
    with pytest.raises(ValueError, match=r"MoE\(recipe='fp8_current'\): align=8 must be a "
                       "multiple of 16"):
        groupmm.nn.MoE(K, N, G, 2, recipe="fp8_current", align=8)


def test_recipe_traits_come_from_the_core():
    # torch.ops.groupmm.recipe_traits is the core's table; the layers' rules follow it.
    t = ops.recipe_traits("mxfp8")
    assert t == (32, 32, "e8m0", False, 16, 16, 1, 32, 32, True)
    want = {"fp8_current": (16, 16), "fp8_block": (128, 16), "mxfp8": (32, 1),
            "nvfp4": (32, 1), "mxfp4": (32, 1)}
    for recipe, (features, split) in want.items():
        traits = groupmm.recipe_traits(recipe)
        assert (traits.in_features_multiple, traits.split_multiple) == (features, split), recipe
    assert groupmm.recipe_traits("nvfp4").scale_dtype == torch.float8_e4m3fn
    assert groupmm.recipe_traits("nvfp4").out_features_multiple == 8
    with pytest.raises(ValueError, match="recipe='bf16' must be one of fp8_current"):
        groupmm.recipe_traits("bf16")
    with pytest.raises(ValueError, match="recipe='int8' must be 'fp8_current'"):
        ops.recipe_traits("int8")
    for recipe in TRAINING[1:]:
        m = groupmm.recipe_traits(recipe).in_features_multiple
        groupmm.nn.GroupedLinear(G, 2 * m, m, recipe=recipe)
        with pytest.raises(ValueError, match=f"must be multiples of {m}"):
            groupmm.nn.GroupedLinear(G, m // 2, m, recipe=recipe)


def test_fp8_moe_trains_with_delayed_wgrad():
    torch.manual_seed(0)
    moe = groupmm.nn.MoE(128, 128, 4, 2, recipe="mxfp8", delay_wgrad=True)
    x = torch.randn(32, 128, dtype=torch.bfloat16, requires_grad=True)
    y, _ = moe(x)
    y.float().square().mean().backward()
    assert moe.gate_up.weight.grad is None and x.grad is not None
    moe.backward_dw()
    assert moe.gate_up.weight.grad.abs().sum() > 0 and moe.down.weight.grad.abs().sum() > 0
