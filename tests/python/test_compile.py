"""torch.compile(fullgraph=True): GroupedLinear + SwiGLU forward and backward trace without graph
breaks (fake kernels, autograd formulas) and give the eager values, with dynamic row counts; the
layer's quantized recipes and main grads too, and the MoE block (fused_gate_up too); delay_wgrad
is eager-only."""

import pytest
import torch

import groupmm
from conftest import make_splits

G, K, F = 4, 32, 16


def mlp(device):
    torch.manual_seed(1)
    up = groupmm.nn.GroupedLinear(G, K, 2 * F, device=device)
    down = groupmm.nn.GroupedLinear(G, F, K, bias=False, device=device)

    def step(x, splits):
        h = torch.ops.groupmm.swiglu(up(x, splits))
        return down(h, splits).float().square().mean()

    return step, [up.weight, up.bias, down.weight]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_fullgraph_forward_backward_matches_eager(device, backend):
    step, params = mlp(device)
    compiled = torch.compile(step, fullgraph=True, dynamic=True, backend=backend)
    for counts in ([3, 0, 9, 4], [10, 2, 0, 7]):  # a new M and a new routing: no recompile break
        x = torch.randn(sum(counts), K, device=device, dtype=torch.bfloat16, requires_grad=True)
        splits = make_splits(counts, device)
        grads_c = torch.autograd.grad(compiled(x, splits), [x, *params])
        grads_e = torch.autograd.grad(step(x, splits), [x, *params])
        for c, e in zip(grads_c, grads_e):
            torch.testing.assert_close(c, e, rtol=1e-2, atol=1e-3)


def layer_grads(step, layer, x, splits, main_grad):
    """loss, dx and the parameters' gradients after two steps (main grads accumulate; the second
    step reuses what the first one cached)."""
    x = x.detach().clone().requires_grad_()
    for _ in range(2):
        loss = step(layer, x, splits)
        loss.backward()
    params = [layer.weight, layer.bias]
    return [loss.detach(), x.grad] + [p.main_grad if main_grad else p.grad for p in params]


def layer_step(layer, x, splits):
    return layer(x, splits).float().square().mean()


@pytest.mark.parametrize("recipe,main_grad,backend", [
    ("fp8_current", False, "aot_eager"), ("fp8_block", False, "aot_eager"),
    ("mxfp8", False, "aot_eager"), ("bf16", True, "aot_eager"), ("mxfp8", True, "aot_eager"),
    ("mxfp8", False, "inductor"), ("bf16", True, "inductor"), ("mxfp8", True, "inductor"),
    ("fp8_block", True, "inductor")])
def test_fullgraph_recipes_and_main_grad_match_eager(device, recipe, main_grad, backend):
    # The quantized recipes go through the layer's autograd.Function; compiled, the weights are
    # quantized in the graph on every call (the eager weight cache holds state across calls).
    torch._dynamo.reset()  # each case compiles layer_step for a new layer
    splits = make_splits([16, 0, 32, 16], device)
    x = torch.randn(64, 128, device=device, dtype=torch.bfloat16)
    grads = []
    for step in (layer_step, torch.compile(layer_step, fullgraph=True, backend=backend)):
        torch.manual_seed(2)
        layer = groupmm.nn.GroupedLinear(G, 128, 128, recipe=recipe, device=device,
                                         accumulate_into_main_grad=main_grad)
        grads.append(layer_grads(step, layer, x, splits, main_grad))
    eager, compiled = grads
    # The loss's own float reduction may differ by an ulp under inductor; the groupmm ops' results
    # (every gradient) are the eager ones bit for bit. Except: compiled mxfp8 main grads add an
    # fp32 dW (inductor cannot take the accumulating op's MX scales), exact on the CPU; the CUDA
    # GEMM may sum its partial products with main_grad in another order.
    torch.testing.assert_close(compiled[0], eager[0])
    exact = device.type == "cpu" or not (recipe == "mxfp8" and main_grad and backend == "inductor")
    for c, e in zip(compiled[1:], eager[1:]):
        if exact:
            assert torch.equal(c, e)
        else:
            torch.testing.assert_close(c, e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_first_microbatch_keeps_the_quantized_weights(device, backend):
    # Compiled with is_first_microbatch=True, the layer quantizes the weights and keeps them (the
    # graph's outputs); with False it reads them back instead of quantizing: a weight change in
    # between shows in a True or None call, not in a False one. Values and gradients are eager's.
    torch._dynamo.reset()
    splits = make_splits([16, 0, 32, 16], device)
    x = torch.randn(64, 128, device=device, dtype=torch.bfloat16)
    layers = []
    for _ in range(2):  # the compiled one and its eager twin
        torch.manual_seed(4)
        layers.append(groupmm.nn.GroupedLinear(G, 128, 128, recipe="fp8_current", device=device))

    def run(fn, layer, first):
        xg = x.clone().requires_grad_()
        layer.zero_grad()
        loss = fn(layer, xg, first)
        loss.backward()
        return [loss.detach(), xg.grad, layer.weight.grad, layer.bias.grad]

    def step(layer, x, first):
        return layer(x, splits, is_first_microbatch=first).float().square().mean()

    compiled = torch.compile(step, fullgraph=True, backend=backend)
    got = [run(compiled, layers[0], True)]
    want = [run(step, layers[1], True)]
    for layer in layers:
        with torch.no_grad():
            layer.weight.mul_(-0.5)  # not re-quantized by a False call
    got.append(run(compiled, layers[0], False))
    want.append(run(step, layers[1], None))  # eager None: the version changed, re-quantized
    assert torch.equal(got[1][1], got[0][1])  # dx from the kept (old) weights: as before
    got.append(run(compiled, layers[0], None))  # quantized in the graph: the new weights
    assert not torch.equal(got[2][1], got[0][1])
    torch.testing.assert_close(got[2][0], want[1][0])
    for c, e in zip(got[2][1:], want[1][1:]):
        assert torch.equal(c, e)
    for c, e in zip(got[0][1:], want[0][1:]):
        assert torch.equal(c, e)


def test_delay_wgrad_is_eager_only(device):
    layer = groupmm.nn.GroupedLinear(G, K, F, delay_wgrad=True, device=device)
    x = torch.randn(16, K, device=device, dtype=torch.bfloat16, requires_grad=True)
    splits = make_splits([4, 4, 0, 8], device)
    with pytest.raises(Exception, match="eager-only"):
        torch.compile(lambda x, s: layer(x, s), fullgraph=True, backend="aot_eager")(x, splits)
    # Without fullgraph the layer runs eagerly at a graph break, and the delay works.
    torch._dynamo.reset()
    y = torch.compile(lambda x, s: layer(x, s).sum(), backend="aot_eager")(x, splits)
    y.backward()
    assert layer.wgrad_pending and layer.weight.grad is None
    layer.backward_dw()
    assert layer.weight.grad is not None


@pytest.mark.parametrize("recipe,balancing", [("bf16", False), ("mxfp8", False), ("bf16", True)])
def test_fullgraph_moe_matches_eager(device, recipe, balancing):
    # router, permute_plan, permute, weighted SwiGLU, unpermute and a shared expert, with both
    # router losses: every C++ autograd formula under AOTAutograd's tracing. balancing: the
    # selection-only expert bias, its token count (a buffer written in the graph) and a capacity.
    torch._dynamo.reset()
    torch.manual_seed(3)
    extra = dict(expert_bias=True, capacity_factor=0.75) if balancing else {}
    moe = groupmm.nn.MoE(64, 32, 4, 2, shared_ffn_hidden=32, aux_loss_coeff=0.01,
                         z_loss_coeff=0.001, recipe=recipe, device=device, **extra)
    if balancing:
        moe.expert_bias.copy_(torch.tensor([0.0, 0.1, -0.05, 0.02]))
    x = torch.randn(16, 64, device=device, dtype=torch.bfloat16, requires_grad=True)

    def step(x):
        y, aux = moe(x)
        return y.float().square().mean() + aux

    results = []
    for fn in (step, torch.compile(step, fullgraph=True, backend="aot_eager")):
        moe.zero_grad()
        x.grad = None
        fn(x).backward()
        results.append([x.grad.clone()] + [p.grad.clone() for p in moe.parameters()])
        if balancing:
            results[-1].append(moe.tokens_per_expert.clone())
            moe.tokens_per_expert.zero_()
    for c, e in zip(*results):
        assert torch.equal(c, e)
    if balancing:
        assert results[0][-1].sum() == 16 * 2  # every (token, slot), counted once per step


@pytest.mark.parametrize("mode", ["plain", "balancing", "main_grad"])
def test_fullgraph_moe_fused_gate_up_matches_eager(device, mode):
    # fused_gate_up: gate_up_swiglu's C++ formula under AOTAutograd's tracing (its fake kernel and
    # the backward ops' ones); main_grad: the block's Python Function handing the wgrad to the
    # layer. The compiled fused block gives the eager unfused block's loss and gradients bit for
    # bit, over two steps (main grads accumulate).
    extra = dict(expert_bias=True, capacity_factor=0.75, align=4) if mode == "balancing" else {}
    x = None
    results = []
    for fused, compiled in ((False, False), (True, False), (True, True)):
        torch._dynamo.reset()
        torch.manual_seed(3)
        moe = groupmm.nn.MoE(64, 64, 4, 2, shared_ffn_hidden=32, aux_loss_coeff=0.01,
                             z_loss_coeff=0.001, device=device, fused_gate_up=fused, **extra)
        if mode == "balancing":
            moe.expert_bias.copy_(torch.tensor([0.0, 0.1, -0.05, 0.02]))
        if mode == "main_grad":
            w = moe.gate_up.weight
            moe.gate_up.accumulate_into_main_grad = True
            w.main_grad = torch.zeros_like(w, dtype=torch.float32)
        if x is None:
            x = torch.randn(16, 64, device=device, dtype=torch.bfloat16, requires_grad=True)

        def step(x):
            y, aux = moe(x)
            return y.float().square().mean() + aux

        fn = torch.compile(step, fullgraph=True, backend="aot_eager") if compiled else step
        x.grad = None
        for _ in range(2):
            loss = fn(x)
            loss.backward()
        grads = [p.grad for p in moe.parameters()]
        if mode == "main_grad":
            grads.append(moe.gate_up.weight.main_grad)
        results.append([loss.detach(), x.grad.clone()] + [g if g is None else g.clone()
                                                          for g in grads])
    for got in results[1:]:
        for c, e in zip(got, results[0]):
            assert (c is None) == (e is None)
            assert c is None or torch.equal(c, e)


def test_moe_fused_gate_up_delay_wgrad_is_eager_only(device):
    torch._dynamo.reset()
    moe = groupmm.nn.MoE(64, 64, 4, 2, device=device, fused_gate_up=True, delay_wgrad=True)
    x = torch.randn(16, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(Exception, match=r"fused_gate_up=True, delay_wgrad=True\) is eager-only"):
        torch.compile(lambda x: moe(x)[0], fullgraph=True, backend="aot_eager")(x)
