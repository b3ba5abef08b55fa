"""SwiGLU, router and permute / unpermute against pure-PyTorch references, gradients included."""

import pytest
import torch
import torch.nn.functional as F

import groupmm
from conftest import assert_close

ops = torch.ops.groupmm
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def ref_swiglu(gate_up):
    gate, up = gate_up.float().chunk(2, dim=-1)
    return F.silu(gate) * up


def test_swiglu_values_and_grads(device):
    gate_up = torch.randn(10, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
    out = ops.swiglu(gate_up)
    ref_in = gate_up.detach().float().requires_grad_()
    ref = ref_swiglu(ref_in)
    assert_close(out, ref)
    dout = torch.randn_like(out)
    out.backward(dout)
    ref.backward(dout.float())
    assert_close(gate_up.grad, ref_in.grad)


def test_weighted_swiglu_values_and_grads(device):
    gate_up = torch.randn(10, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
    prob = torch.rand(10, device=device, requires_grad=True)
    out = ops.weighted_swiglu(gate_up, prob)
    refs = [t.detach().float().requires_grad_() for t in (gate_up, prob)]
    ref = ref_swiglu(refs[0]) * refs[1][:, None]
    assert_close(out, ref)
    dout = torch.randn_like(out)
    out.backward(dout)
    ref.backward(dout.float())
    assert_close(gate_up.grad, refs[0].grad)
    torch.testing.assert_close(prob.grad, refs[1].grad, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("T", [1, 5, 40])  # on CUDA: the one-kernel path up to 16 tokens, cuBLAS above
def test_router_logits_bias_values_and_grads(device, T):
    E, H = 24, 72
    bf = dict(device=device, dtype=torch.bfloat16)
    x = torch.randn(T, H, **bf, requires_grad=True)
    w = (torch.randn(E, H, **bf) * 0.1).requires_grad_()
    b = torch.randn(E, **bf, requires_grad=True)
    out = ops.router_logits(x, w, b)
    assert out.dtype == torch.float32
    refs = [t.detach().float().requires_grad_() for t in (x, w, b)]
    ref = refs[0] @ refs[1].t() + refs[2]
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # without the bias: the same sums, the bias not added
    torch.testing.assert_close(ops.router_logits(x, w) + b.float(), out, rtol=0, atol=1e-6)
    dl = torch.randn_like(out)
    out.backward(dl)
    ref.backward(dl.bfloat16().float())  # dx and dw round d_logits to x's dtype first
    assert b.grad.dtype == torch.bfloat16
    torch.testing.assert_close(b.grad, dl.sum(0).bfloat16())
    torch.testing.assert_close(x.grad.float(), refs[0].grad, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(w.grad.float(), refs[1].grad, rtol=2e-2, atol=2e-2)
    with pytest.raises(RuntimeError, match=r"moe_router_logits: bias.shape\[0\]=3 must equal 24"):
        ops.router_logits(x, w, torch.zeros(3, **bf))


def ref_gpt_oss_gate(gate_up, alpha, limit, up_offset, interleaved):
    """transformers' GptOssExperts._apply_gate (interleaved) / the halves form of the others."""
    g, u = (gate_up[..., ::2], gate_up[..., 1::2]) if interleaved else gate_up.chunk(2, dim=-1)
    if limit is not None:
        g, u = g.clamp(max=limit), u.clamp(min=-limit, max=limit)
    return (u + up_offset) * g * torch.sigmoid(g * alpha)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("form", [(1.702, 7.0, 1.0, True), (1.702, 7.0, 1.0, False),
                                  (1.0, 3.0, 0.0, False), (0.5, None, 0.0, True)],
                         ids=["gpt_oss", "gpt_oss_halves", "clamp_only", "alpha_interleaved"])
def test_weighted_swiglu_ex_values_and_grads(device, dtype, form):
    # Scale 6: many values beyond the clamp; 24 = 3 vectors of 8 bf16 (the vectorized path), 10
    # rows; odd I = 5 below runs the scalar path.
    for I in (24, 5):
        gate_up = (torch.randn(10, 2 * I, device=device) * 6).to(dtype).requires_grad_()
        prob = torch.rand(10, device=device, requires_grad=True)
        out = ops.weighted_swiglu_ex(gate_up, prob, *form)
        refs = [t.detach().float().requires_grad_() for t in (gate_up, prob)]
        ref = ref_gpt_oss_gate(refs[0], *form) * refs[1][:, None]
        assert_close(out, ref, dtype)
        dout = torch.randn_like(out)
        out.backward(dout)
        ref.backward(dout.float())
        assert_close(gate_up.grad, refs[0].grad, dtype)
        tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
        torch.testing.assert_close(prob.grad, refs[1].grad, rtol=tol, atol=tol)


def test_weighted_swiglu_ex_default_form_is_weighted_swiglu(device):
    gate_up = torch.randn(33, 48, device=device, dtype=torch.bfloat16)
    prob = torch.rand(33, device=device)
    assert torch.equal(ops.weighted_swiglu_ex(gate_up, prob), ops.weighted_swiglu(gate_up, prob))
    dout = torch.randn(33, 24, device=device, dtype=torch.bfloat16)
    a = ops.weighted_swiglu_ex_backward(dout, gate_up, prob)
    b = ops.weighted_swiglu_backward(dout, gate_up, prob)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@CUDA
@pytest.mark.parametrize("interleaved", [True, False])
def test_weighted_swiglu_ex_cuda_matches_cpu(interleaved):
    """The kernel against the CPU reference (within an ulp of bf16: the device sigmoid)."""
    gate_up = torch.randn(4097, 2 * 2880 // 8, dtype=torch.bfloat16) * 6
    prob = torch.rand(4097)
    dout = torch.randn(4097, 2880 // 8, dtype=torch.bfloat16)
    form = (1.702, 7.0, 1.0, interleaved)
    cpu = [ops.weighted_swiglu_ex(gate_up, prob, *form),
           *ops.weighted_swiglu_ex_backward(dout, gate_up, prob, *form)]
    dev = [ops.weighted_swiglu_ex(gate_up.cuda(), prob.cuda(), *form),
           *ops.weighted_swiglu_ex_backward(dout.cuda(), gate_up.cuda(), prob.cuda(), *form)]
    for c, d in zip(cpu, dev):
        torch.testing.assert_close(d.cpu().float(), c.float(), rtol=1 / 128, atol=1e-5)


def test_weighted_swiglu_ex_errors():
    gate_up, prob = torch.randn(4, 16), torch.rand(4)
    with pytest.raises(Exception, match=r"weighted_swiglu_forward: form.limit=-1 must be > 0"):
        ops.weighted_swiglu_ex(gate_up, prob, 1.0, -1.0)
    with pytest.raises(Exception, match=r"weighted_swiglu_backward: form.alpha=inf must be finite"):
        ops.weighted_swiglu_ex_backward(torch.randn(4, 8), gate_up, prob, float("inf"))


@pytest.mark.parametrize("renormalize", [False, True])
def test_router_matches_softmax_topk(device, renormalize):
    T, E, k = 12, 8, 2
    logits = torch.randn(T, E, device=device)
    ids, w, counts, _, _ = ops.router(logits, None, k, renormalize=renormalize)
    probs = logits.softmax(-1)
    ref_w, ref_ids = probs.topk(k, dim=-1)
    if renormalize:
        ref_w = ref_w / ref_w.sum(-1, keepdim=True)
    assert torch.equal(ids.long(), ref_ids)
    torch.testing.assert_close(w, ref_w, rtol=1e-5, atol=1e-6)
    assert torch.equal(counts.long(), torch.bincount(ref_ids.flatten(), minlength=E))


def test_router_backward_matches_autograd(device):
    T, E, k = 12, 8, 2
    logits = torch.randn(T, E, device=device)
    ids, _, counts, _, _ = ops.router(logits, None, k, renormalize=True)
    dw = torch.randn(T, k, device=device)
    d_logits = ops.router_backward(logits, ids, counts, dw, renormalize=True)
    ref_in = logits.clone().requires_grad_()
    w = ref_in.softmax(-1).gather(1, ids.long())
    (w / w.sum(-1, keepdim=True) * dw).sum().backward()
    torch.testing.assert_close(d_logits, ref_in.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("align", [1, 4])
def test_permute_unpermute_round_trip_and_grads(device, align):
    T, E, k, H = 10, 4, 2, 16
    ids = torch.stack([torch.randperm(E, device=device)[:k] for _ in range(T)]).int()
    ids[:, 0] = 2  # expert 2 gets every token, some others none
    plan = ops.permute_plan(ids, E, align, 0)
    dest_row, row_start, kept, splits = plan
    R = groupmm.permuted_rows(T, k, E, align)
    assert int(splits.sum()) == R
    assert torch.equal(kept.long(), torch.bincount(ids.long().flatten(), minlength=E))
    x = torch.randn(T, H, device=device, dtype=torch.bfloat16, requires_grad=True)
    weights = torch.rand(T, k, device=device, requires_grad=True)
    xp, probs = ops.permute(x, *plan, align, 0, weights)
    assert xp.shape == (R, H)
    d = dest_row.long()
    assert torch.equal(xp[d[:, 0]], x.detach()) and torch.equal(xp[d[:, 1]], x.detach())
    assert torch.equal(probs[d], weights.detach())
    y = ops.unpermute(xp * 2, *plan, align, 0, x)  # each token: k copies of 2x, plus x
    assert_close(y, x.detach().float() * (2 * k + 1))
    (y.float().sum() + (probs * torch.arange(R, device=device)).sum()).backward()
    assert_close(x.grad, torch.full_like(x.grad, 2 * k + 1))
    torch.testing.assert_close(weights.grad, d.float())


@pytest.mark.parametrize("capacity,with_add", [(0, False), (3, True)])
def test_unpermute_routed_bias_values_and_grads(device, capacity, with_add):
    """unpermute's routed bias (gpt-oss's down bias): y[t] = the k rows + sum over the kept (t, j)
    of w_tj bias[e_tj] (+ add); a dropped pair adds neither. Gradients of y_perm, add, bias and
    weights against the float64 formula."""
    T, E, k, H = 23, 6, 2, 24
    torch.manual_seed(1)
    ids = torch.stack([torch.randperm(E, device=device)[:k] for _ in range(T)]).int()
    ids[:8, 0] = 4  # expert 4 over its capacity when there is one
    plan = ops.permute_plan(ids, E, 1, capacity)
    keep = (plan[0] >= 0).double()
    assert capacity == 0 or not bool(keep.all())
    R = int(plan[3].sum())
    yp = torch.randn(R, H, device=device, requires_grad=True)
    bias = torch.randn(E, H, device=device, requires_grad=True)
    w = torch.rand(T, k, device=device, requires_grad=True)
    add = torch.randn(T, H, device=device, requires_grad=True) if with_add else None
    y = ops.unpermute(yp, *plan, 1, capacity, add, bias, ids, w)
    d = plan[0].long().clamp_min(0)
    leaves = [t.detach().double().requires_grad_() for t in (yp, bias, w)]
    ref = ((leaves[0][d] + leaves[2][..., None] * leaves[1][ids.long()]) * keep[..., None]).sum(1)
    if with_add:
        ref_add = add.detach().double().requires_grad_()
        ref = ref + ref_add
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)
    dy = torch.randn_like(y)
    y.backward(dy)
    ref.backward(dy.double())
    for got, want, name in ((yp.grad, leaves[0].grad, "y_perm"), (bias.grad, leaves[1].grad, "bias"),
                            (w.grad, leaves[2].grad, "weights")):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5, msg=name)
    if with_add:
        torch.testing.assert_close(add.grad.double(), ref_add.grad, rtol=1e-6, atol=1e-6)
    with pytest.raises(Exception, match="routed.bias, routed.expert_ids and routed.weights go together"):
        ops.unpermute(yp.detach(), *plan, 1, capacity, None, bias.detach(), ids)


@pytest.mark.parametrize("align,capacity,pre", [(1, 0, True), (16, 0, False), (1, 3, True)])
def test_gate_up_swiglu_equals_the_separate_ops(device, align, capacity, pre):
    """The kernel-layer op (x gathered inside the GEMM, the activation in its epilogue) is bit for
    bit permute -> grouped_mm -> weighted_swiglu, padding and capacity drops included."""
    T, E, k, H, F = 37, 8, 2, 64, 64
    torch.manual_seed(0)
    ids = torch.stack([torch.randperm(E, device=device)[:k] for _ in range(T)]).int()
    ids[:5, 0] = 3  # expert 3 over its capacity when there is one
    weights = torch.rand(T, k, device=device)
    x = torch.randn(T, H, device=device, dtype=torch.bfloat16)
    w = (torch.randn(E, 2 * F, H, device=device) * H ** -0.5).to(torch.bfloat16)
    plan = ops.permute_plan(ids, E, align, capacity)
    h, gu, probs = ops.gate_up_swiglu(x, *plan, align, capacity, weights, w, pre)
    xp, probs_ref = ops.permute(x, *plan, align, capacity, weights)
    gu_ref = ops.grouped_mm(xp, w, plan[3])
    h_ref = ops.weighted_swiglu(gu_ref, probs_ref)
    assert torch.equal(h, h_ref) and torch.equal(probs, probs_ref)
    if pre:
        assert torch.equal(gu, gu_ref)
    else:
        assert gu.shape == (0, 2 * F)


def _gate_up_case(device, dtype, align, capacity, T=37):
    E, k, H, F = 8, 2, 64, 64
    torch.manual_seed(0)
    ids = torch.stack([torch.randperm(E, device=device)[:k] for _ in range(T)]).int()
    ids[: min(5, T), 0] = 3  # expert 3 over its capacity when there is one
    ids[ids == 6] = 5  # expert 6 has no rows
    plan = ops.permute_plan(ids, E, align, capacity)
    x = torch.randn(T, H, device=device, dtype=dtype)
    weights = torch.rand(T, k, device=device)
    w = (torch.randn(E, 2 * F, H, device=device) * H ** -0.5).to(dtype)
    return plan, x, weights, w


def _gate_up_grads(fused, plan, align, capacity, x, weights, w, need, extra):
    """h and the gradients of the inputs in `need` (names of x, weights, w), through the fused op
    or the separate ops; extra: the loss also reads the pre-activation and probs."""
    leaves = {n: t.clone().requires_grad_(n in need) for n, t in
              (("x", x), ("weights", weights), ("w", w))}
    x, weights, w = leaves["x"], leaves["weights"], leaves["w"]
    if fused:
        h, gu, probs = ops.gate_up_swiglu(x, *plan, align, capacity, weights, w, True)
    else:
        xp, probs = ops.permute(x, *plan, align, capacity, weights)
        gu = ops.grouped_mm(xp, w, plan[3])
        h = ops.weighted_swiglu(gu, probs)
    gen = torch.Generator(device=x.device).manual_seed(1)
    loss = (h.float() * torch.randn(h.shape, device=x.device, generator=gen)).sum()
    if extra:
        loss = loss + (gu.float() * torch.randn(gu.shape, device=x.device, generator=gen)).sum() \
            + (probs * torch.randn(probs.shape, device=x.device, generator=gen)).sum()
    grads = torch.autograd.grad(loss, [leaves[n] for n in need])
    return h.detach(), dict(zip(need, grads))


@pytest.mark.parametrize("align,capacity", [(1, 0), (16, 0), (1, 3)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("need", [("x", "weights", "w"), ("x",), ("weights",), ("w",),
                                  ("weights", "w")], ids="-".join)
def test_gate_up_swiglu_gradients_equal_the_separate_ops(device, align, capacity, dtype, need):
    """The op's backward (ops_autograd.cpp) composes the separate ops' backwards: dx, d weights
    and dW bit for bit those of permute -> grouped_mm -> weighted_swiglu, for any subset of the
    inputs requiring grad (padding rows, capacity drops and an empty expert included)."""
    if device.type == "cuda" and dtype == torch.float32:
        pytest.skip("the CUDA kernel takes bf16 / fp16")
    plan, x, weights, w = _gate_up_case(device, dtype, align, capacity)
    fused = _gate_up_grads(True, plan, align, capacity, x, weights, w, need, False)
    sep = _gate_up_grads(False, plan, align, capacity, x, weights, w, need, False)
    assert torch.equal(fused[0], sep[0])
    for n in need:
        assert torch.equal(fused[1][n], sep[1][n]), f"d{n} differs"


@pytest.mark.parametrize("T", [1, 37])
def test_gate_up_swiglu_outputs_past_the_activation(device, T):
    """The pre-activation and probs used in the loss too (their gradients add to the
    activation's); T=1: one token."""
    plan, x, weights, w = _gate_up_case(device, torch.bfloat16, 1, 0, T=T)
    need = ("x", "weights", "w")
    fused = _gate_up_grads(True, plan, 1, 0, x, weights, w, need, True)
    sep = _gate_up_grads(False, plan, 1, 0, x, weights, w, need, True)
    for n in need:
        assert torch.equal(fused[1][n], sep[1][n]), f"d{n} differs"


def test_gate_up_swiglu_training_needs_the_pre_activation(device):
    T, E, k, H, F = 4, 2, 1, 64, 64
    ids = torch.zeros(T, k, dtype=torch.int32, device=device)
    plan = ops.permute_plan(ids, E, 1, 0)
    x = torch.randn(T, H, device=device, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(E, 2 * F, H, device=device, dtype=torch.bfloat16)
    weights = torch.ones(T, k, device=device)
    with pytest.raises(RuntimeError, match=r"groupmm.gate_up_swiglu: pre_activation=False, but "
                                           r"x, weights or w requires grad.*pass "
                                           r"pre_activation=True"):
        ops.gate_up_swiglu(x, *plan, 1, 0, weights, w)
    with torch.no_grad():
        h, _, _ = ops.gate_up_swiglu(x, *plan, 1, 0, weights, w)
    assert h.shape == (T * k, F) and not h.requires_grad
    h, gu, probs = ops.gate_up_swiglu(x, *plan, 1, 0, weights, w, True)
    assert h.requires_grad and "GateUpSwiglu" in h.grad_fn.name()
    assert gu.shape == (T * k, 2 * F)
