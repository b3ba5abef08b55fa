"""groupmm.nn.MoE against a pure-PyTorch MoE with the same weights: values and gradients (router
weight included), with a shared expert, padded experts, the selection-only expert bias and its
update, and a capacity that drops tokens; against the C++ nn::MoE (the _core_moe hook), which it
composes like; and fused_gate_up=True against the separate ops, bit for bit."""

import pytest
import torch
import torch.nn.functional as F

import groupmm

ops = torch.ops.groupmm
T, H, FF, E, K = 24, 32, 16, 4, 2


def reference(moe, x, bias=None, capacity=0):
    """The block from torch ops: softmax scores, top-k of the scores (+ the selection-only bias),
    renormalized unbiased weights; with a capacity, each expert keeps its first `capacity`
    (token, slot) pairs in token order."""
    logits = x.float() @ moe.router.weight.float().t()
    scores = logits.softmax(-1)
    ids = (scores if bias is None else scores + bias).topk(K, dim=-1).indices
    w = scores.gather(1, ids)
    w = w / w.sum(-1, keepdim=True)
    if capacity:
        ids, seen = ids.clone(), [0] * E  # (the gather above keeps ids for its backward)
        for t in range(x.shape[0]):
            for j in range(K):
                e = int(ids[t, j])
                if seen[e] >= capacity:
                    ids[t, j] = -1  # dropped
                seen[e] += 1
    y = torch.zeros(x.shape[0], H, device=x.device)
    if moe.shared_up is not None:
        gate, up = moe.shared_up(x).float().chunk(2, -1)
        y = (F.silu(gate) * up) @ moe.shared_down.weight.float().t()
    for e in range(E):
        tok, j = (ids == e).nonzero(as_tuple=True)
        gate, up = (x[tok].float() @ moe.gate_up.weight[e].float().t()).chunk(2, -1)
        h = F.silu(gate) * up * w[tok, j, None]
        y = y.index_add(0, tok, h @ moe.down.weight[e].float().t())
    return y


def check_values_and_grads(moe, x, ref_fn):
    y, _ = moe(x)
    x_ref = x.detach().clone().requires_grad_()
    ref = ref_fn(x_ref)
    torch.testing.assert_close(y.float(), ref, rtol=3e-2, atol=3e-2)
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, [x, moe.router.weight, moe.gate_up.weight], dy)
    refs = torch.autograd.grad(ref, [x_ref, moe.router.weight, moe.gate_up.weight], dy.float())
    for got, want in zip(grads, refs):
        torch.testing.assert_close(got.float(), want.float(), rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("align", [1, 8])
def test_moe_matches_reference(device, align):
    moe = groupmm.nn.MoE(H, FF, E, K, shared_ffn_hidden=FF, align=align, device=device)
    x = torch.randn(T, H, device=device, dtype=torch.bfloat16, requires_grad=True)
    _, aux = moe(x)
    assert aux.shape == () and aux.item() == 0.0  # no loss coefficients
    check_values_and_grads(moe, x, lambda xr: reference(moe, xr))


def test_expert_bias_steers_selection_not_weights(device):
    moe = groupmm.nn.MoE(H, FF, E, K, expert_bias=True, device=device)
    assert "expert_bias" in moe.state_dict() and "tokens_per_expert" in moe.state_dict()
    assert not any(p is moe.expert_bias for p in moe.parameters())
    # A bias past the scores' range picks experts 1 and 3 for every token; the weights are still
    # the unbiased scores of those two, renormalized.
    moe.expert_bias.copy_(torch.tensor([0.0, 2.0, 0.0, 2.0]))
    x = torch.randn(T, H, device=device, dtype=torch.bfloat16, requires_grad=True)
    check_values_and_grads(moe, x, lambda xr: reference(moe, xr, bias=moe.expert_bias))
    # The training forward counted its tokens (before any capacity); eval and no_grad do not.
    want = torch.tensor([0.0, T, 0.0, T], device=device)
    assert torch.equal(moe.tokens_per_expert, want)
    with torch.no_grad():
        moe(x)
    moe.eval()
    moe(x)
    assert torch.equal(moe.tokens_per_expert, want)


def test_update_expert_bias(device):
    moe = groupmm.nn.MoE(H, FF, E, K, expert_bias=True, device=device)
    moe.tokens_per_expert.copy_(torch.tensor([5.0, 1.0, 3.0, 3.0]))  # mean 3
    moe.expert_bias.copy_(torch.tensor([0.5, 0.0, -0.25, 0.0]))
    moe.update_expert_bias(0.125)
    # over the mean: down by the rate; under: up; at the mean: unchanged
    assert torch.equal(moe.expert_bias.cpu(), torch.tensor([0.375, 0.125, -0.25, 0.0]))
    assert torch.equal(moe.tokens_per_expert.cpu(), torch.zeros(E))
    plain = groupmm.nn.MoE(H, FF, E, K, device=device)
    assert plain.expert_bias is None and "expert_bias" not in plain.state_dict()
    with pytest.raises(RuntimeError, match="update_expert_bias: .*expert_bias=True"):
        plain.update_expert_bias(0.1)


def test_expert_bias_balances_a_skewed_router(device):
    # The router weight sends most of 64 tokens to expert 0 (top-1); updates of the bias spread
    # them to about the mean, 16 (20 seeds: 37-50 at first, 16-20.5 after 50 updates).
    torch.manual_seed(5)
    moe = groupmm.nn.MoE(H, FF, E, 1, expert_bias=True, device=device)
    x = torch.randn(64, H, device=device, dtype=torch.bfloat16)
    with torch.no_grad():
        moe.router.weight[0] += x.float().mean(0).to(moe.router.weight.dtype) * 3
    most = []
    for _ in range(60):
        moe(x)
        most.append(moe.tokens_per_expert.max().item())
        moe.update_expert_bias(0.01)
    assert most[0] >= 36 and sum(most[-10:]) / 10 <= 24, most


def test_capacity_drops_overflow_in_token_order(device):
    cf = 0.5
    cap = groupmm.moe_capacity(T, K, E, cf)
    assert cap == 6  # ceil(0.5 * 24 * 2 / 4)
    assert groupmm.moe_capacity(T, K, E, 0.0) == 0 and groupmm.moe_capacity(1, 1, 64, 0.01) == 1
    moe = groupmm.nn.MoE(H, FF, E, K, shared_ffn_hidden=FF, capacity_factor=cf, align=4,
                         device=device)
    x = torch.randn(T, H, device=device, dtype=torch.bfloat16, requires_grad=True)
    logits = x.detach().float() @ moe.router.weight.float().t()
    loads = torch.bincount(logits.topk(K, -1).indices.flatten().cpu(), minlength=E)
    assert loads.max() > cap  # the capacity bites
    check_values_and_grads(moe, x, lambda xr: reference(moe, xr, capacity=cap))
    with pytest.raises(ValueError, match="capacity_factor=-1.0 must be finite and >= 0"):
        groupmm.nn.MoE(H, FF, E, K, capacity_factor=-1.0)


def core_block(moe, x, dy, **kw):
    """The C++ nn::MoE on the same weights and inputs (the _core_moe hook): y, dx and the weight
    grads (router, gate_up, down, shared_up, shared_down)."""
    shared = [None if m is None else m.weight.detach() for m in (moe.shared_up, moe.shared_down)]
    return ops._core_moe(x, moe.router.weight.detach(), moe.gate_up.weight.detach(),
                         moe.down.weight.detach(), *shared, dy, moe.topk, align=moe.align,
                         capacity_factor=moe.capacity_factor, recipe=moe.recipe, **kw)


@pytest.mark.parametrize("recipe,align,cf", [("bf16", 1, 0.0), ("bf16", 8, 0.5),
                                             ("fp8_current", 16, 0.0), ("mxfp8", 1, 0.0)])
def test_moe_matches_the_core_block(recipe, align, cf):
    # The package's block composes like nn::MoE (router_logits, router, permute, the expert and
    # shared-expert GroupedLinears, unpermute): y and every weight gradient bit for bit on the
    # CPU; dx up to the order autograd sums x's three gradient contributions in (moe.py).
    torch.manual_seed(1)
    moe = groupmm.nn.MoE(64, 32, 4, 2, shared_ffn_hidden=32, renormalize=True, align=align,
                         capacity_factor=cf, recipe=recipe)
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    dy = torch.randn(32, 64, dtype=torch.bfloat16)
    xg = x.clone().requires_grad_()
    y, _ = moe(xg)
    y.backward(dy)
    want = core_block(moe, x, dy, renormalize=True)
    assert torch.equal(y, want[0]), "y differs from the C++ block"
    params = [moe.router, moe.gate_up, moe.down, moe.shared_up, moe.shared_down]
    names = ["router", "gate_up", "down", "shared_up", "shared_down"]
    for name, m, w in zip(names, params, want[2:]):
        assert torch.equal(m.weight.grad, w.view_as(m.weight)), f"d{name} differs"
    torch.testing.assert_close(xg.grad.float(), want[1].float(), rtol=1e-2, atol=1e-2)


def test_aux_loss_has_gradient(device):
    moe = groupmm.nn.MoE(H, FF, E, K, aux_loss_coeff=0.1, z_loss_coeff=0.01, device=device)
    x = torch.randn(T, H, device=device, dtype=torch.bfloat16)
    _, aux = moe(x)
    assert aux.item() > 0
    (3 * aux).backward()
    g3 = moe.router.weight.grad.clone()
    moe.zero_grad()
    moe(x)[1].backward()
    # The loss terms' gradients scale with their upstream gradient (not assumed to be 1). The
    # router GEMM's backward rounds d_logits to x's dtype first (moe_router_logits_backward, as
    # nn::MoE): equal up to that rounding, relative to the gradient's scale.
    scale = g3.abs().max().item()
    torch.testing.assert_close(g3, 3 * moe.router.weight.grad, rtol=1e-2, atol=1e-2 * scale)
    assert moe.router.weight.grad.abs().sum() > 0


# ---- recompute: what backward keeps ---------------------------------------------------------

class _OpCounter(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the groupmm ops dispatched while active."""

    def __init__(self):
        super().__init__()
        self.calls = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name()
        self.calls[name] = self.calls.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def _step(recipe, delay, shared, recompute, device, count=False):
    torch.manual_seed(3)
    h, f = (128, 128) if recipe == "fp8_block" else (64, 32)
    moe = groupmm.nn.MoE(h, f, 8, 2, shared_ffn_hidden=f if shared else 0, recipe=recipe,
                         delay_wgrad=delay, recompute=recompute, device=device)
    x = torch.randn(64, h, dtype=torch.bfloat16, device=device, requires_grad=True)
    y, aux = moe(x)
    counter = _OpCounter()
    with counter if count else torch.enable_grad():
        (y.float().square().sum() + aux).backward()
        moe.backward_dw()
    return [x.grad] + [p.grad for p in moe.parameters()], counter.calls


@pytest.mark.parametrize("recipe", ["bf16", "fp8_current", "fp8_block", "mxfp8"])
@pytest.mark.parametrize("delay,shared", [(False, False), (True, True)])
def test_recompute_gives_the_same_gradients(device, recipe, delay, shared):
    kept, _ = _step(recipe, delay, shared, False, device)
    again, calls = _step(recipe, delay, shared, True, device, count=True)
    for a, b in zip(kept, again):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.equal(a, b)
    # backward made the permuted rows and the activations again (once each)
    assert calls.get("groupmm::permute") == 1
    assert calls.get("groupmm::weighted_swiglu") == 1
    assert calls.get("groupmm::swiglu", 0) == (1 if shared else 0)


def test_recompute_refuses_an_input_written_in_place():
    moe = groupmm.nn.MoE(64, 32, 8, 2)
    x = torch.randn(64, 64, dtype=torch.bfloat16, requires_grad=True)
    x_leaf = x.detach()
    y, _ = moe(x)
    x_leaf.add_(1.0)  # the block input changes before backward
    with pytest.raises(RuntimeError, match="modified in place between forward and backward"):
        y.float().sum().backward()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("recipe", ["bf16", "fp8_current"])
def test_recompute_keeps_neither_permuted_rows_nor_activations(recipe):
    """Bytes the forward leaves allocated for backward (y freed), Qwen3-30B-A3B's ratios
    (F = 3/8 H, k = 8): recompute drops the permuted rows and the SwiGLU output (or their
    columnwise FP8 copies)."""
    T, h, f, e, k = 2048, 256, 96, 16, 8

    def kept(recompute):
        torch.manual_seed(0)
        moe = groupmm.nn.MoE(h, f, e, k, recipe=recipe, recompute=recompute, device="cuda")
        x = torch.randn(T, h, dtype=torch.bfloat16, device="cuda", requires_grad=True)
        moe(x)  # the quantized weights cached, the workspaces grown
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        y, aux = moe(x)
        torch.cuda.synchronize()
        out = torch.cuda.memory_allocated() - base - y.numel() * y.element_size()
        del y, aux
        return out

    rows = T * k  # permuted rows (no padding at align 1; FP8 pads each expert to 16 rows)
    elem = 2 if recipe == "bf16" else 1
    dropped = rows * h * elem + rows * f * elem
    with_, without = kept(True), kept(False)
    assert with_ <= without - 0.9 * dropped, (with_, without, dropped)


# ---- fused_gate_up: gate_up_swiglu in place of permute -> gate_up -> weighted_swiglu ----------

def _fused_pair_step(fused, device, T, *, dtype=torch.bfloat16, main_grad=False, x_grad=True,
                     skew=False, **kw):
    """y, dx, aux and every parameter's gradient (main_grad: gate_up's fp32 main grad) of one
    training step, with the weight gradients delay_wgrad queued run by backward_dw()."""
    torch.manual_seed(3)
    h, f, e, k = 64, 64, 8, 2  # the CUDA kernel's sizes (hidden % 8, ffn_hidden % 64)
    moe = groupmm.nn.MoE(h, f, e, k, aux_loss_coeff=0.01, z_loss_coeff=0.001, dtype=dtype,
                         device=device, fused_gate_up=fused, expert_bias=skew, **kw)
    if skew:  # the selection bias sends every token to experts 2 and 5: six experts without rows
        moe.expert_bias.copy_(torch.tensor([0, 0, 3.0, 0, 0, 3.0, 0, 0], device=device))
    if main_grad:
        moe.gate_up.accumulate_into_main_grad = True
        moe.gate_up.weight.main_grad = torch.zeros_like(moe.gate_up.weight, dtype=torch.float32)
    x = torch.randn(T, h, dtype=dtype, device=device, requires_grad=x_grad)
    y, aux = moe(x)
    (y.float().square().sum() + aux).backward()
    moe.backward_dw()
    out = [y.detach(), aux.detach(), x.grad] + [p.grad for p in moe.parameters()]
    return out + ([moe.gate_up.weight.main_grad] if main_grad else [])


def _assert_same(fused, unfused):
    assert len(fused) == len(unfused)
    for i, (a, b) in enumerate(zip(fused, unfused)):
        assert (a is None) == (b is None), f"output {i}: {a is None} vs {b is None}"
        if a is not None:
            assert torch.equal(a, b), f"output {i} differs"


FUSED_CASES = {
    "plain": dict(T=37),
    "T1": dict(T=1),
    "shared_align8": dict(T=40, shared_ffn_hidden=64, align=8),
    "capacity": dict(T=48, capacity_factor=0.5, align=4),
    "zero_row_experts": dict(T=24, skew=True),
    "x_no_grad": dict(T=16, x_grad=False),
    "delay": dict(T=37, shared_ffn_hidden=64, delay_wgrad=True),
    "delay_keep": dict(T=37, delay_wgrad=True, recompute=False),
    "keep": dict(T=37, recompute=False, capacity_factor=0.75),
    "main_grad": dict(T=37, main_grad=True),
    "main_grad_delay": dict(T=37, main_grad=True, delay_wgrad=True, recompute=False),
    "fp16": dict(T=37, dtype=torch.float16, shared_ffn_hidden=64),
    "fp32": dict(T=37, dtype=torch.float32),
}


@pytest.mark.parametrize("case", list(FUSED_CASES))
def test_fused_gate_up_equals_the_separate_ops(device, case):
    """fused_gate_up=True against the same block with the separate ops: y, aux, dx and every
    parameter gradient bit for bit, padded experts, a capacity, experts without rows, T=1,
    delayed wgrad and main grads included (on CUDA the fused kernel's sums are the grouped GEMM's,
    moe.hpp)."""
    kw = dict(FUSED_CASES[case])
    if device.type == "cuda" and kw.get("dtype") == torch.float32:
        pytest.skip("the CUDA kernel takes bf16 / fp16")
    _assert_same(_fused_pair_step(True, device, **kw), _fused_pair_step(False, device, **kw))


def test_fused_gate_up_inference(device):
    torch.manual_seed(0)
    x = torch.randn(37, 64, dtype=torch.bfloat16, device=device)
    outs = []
    for fused in (True, False):
        torch.manual_seed(3)
        moe = groupmm.nn.MoE(64, 64, 8, 2, shared_ffn_hidden=64, device=device,
                             fused_gate_up=fused)
        with torch.no_grad():
            outs.append(moe(x)[0])
    assert torch.equal(*outs)


def _graph_nodes(t):
    """The names of the autograd nodes behind t."""
    seen, todo, names = set(), [t.grad_fn], []
    while todo:
        n = todo.pop()
        if n is None or n in seen:
            continue
        seen.add(n)
        names.append(n.name())
        todo.extend(f for f, _ in n.next_functions)
    return names


def test_fused_gate_up_backward_gathers_the_rows_once(device):
    """What backward runs: one gather of the permuted rows (gate_up's wgrad), one weighted SwiGLU
    (recompute: the down layer's input), the op's own formula (no Python Function) without
    delay_wgrad."""
    torch.manual_seed(3)
    moe = groupmm.nn.MoE(64, 64, 8, 2, device=device, fused_gate_up=True)
    x = torch.randn(32, 64, dtype=torch.bfloat16, device=device, requires_grad=True)
    y, aux = moe(x)
    assert any("GateUpSwiglu" in n for n in _graph_nodes(y))
    assert not any("_FusedGateUpFn" in n for n in _graph_nodes(y))
    counter = _OpCounter()
    with counter:
        (y.float().square().sum() + aux).backward()
    calls = counter.calls
    assert calls.get("groupmm::permute") == 1
    assert calls.get("groupmm::weighted_swiglu") == 1
    assert calls.get("groupmm::gate_up_swiglu", 0) == 0
    assert calls.get("groupmm::grouped_mm_wgrad") == 2  # gate_up, down


@pytest.mark.parametrize("kw,match", [
    (dict(recipe="fp8_current"), r"recipe='fp8_current' must be 'bf16'"),
    (dict(recipe="mxfp8"), r"recipe='mxfp8' must be 'bf16'"),
    (dict(recipe="nvfp4_weight"), r"recipe='nvfp4_weight' must be 'bf16'"),
    (dict(ep_group=object()), r"ep_group must be None"),
    (dict(dtype=torch.float64), r"dtype=torch.float64 must be torch.bfloat16"),
    (dict(device="cuda", dtype=torch.float32), r"float32 runs on the CPU only"),
    (dict(device="cuda", ffn=48), r"ffn_hidden=48.*ffn_hidden % 64 == 0"),
    (dict(device="cuda", hidden=60), r"hidden=60.*hidden % 8 == 0"),
])
def test_fused_gate_up_refuses_other_settings(kw, match):
    # Said at construction (before any parameter is made: the CUDA cases run without a GPU).
    hidden, ffn = kw.pop("hidden", 64), kw.pop("ffn", 64)
    with pytest.raises(ValueError, match=r"groupmm.nn.MoE\(fused_gate_up=True\): .*" + match):
        groupmm.nn.MoE(hidden, ffn, 4, 2, fused_gate_up=True, **kw)
