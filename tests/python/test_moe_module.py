"""groupmm.nn.MoE against a pure-PyTorch MoE with the same weights: values and gradients (router
weight included), with a shared expert and padded experts."""

import pytest
import torch
import torch.nn.functional as F

import groupmm

T, H, FF, E, K = 24, 32, 16, 4, 2


def reference(moe, x):
    logits = x.float() @ moe.router.weight.float().t()
    w, ids = logits.softmax(-1).topk(K, dim=-1)
    w = w / w.sum(-1, keepdim=True)
    gate, up = moe.shared_up(x).float().chunk(2, -1)
    y = (F.silu(gate) * up) @ moe.shared_down.weight.float().t()
    for e in range(E):
        tok, j = (ids == e).nonzero(as_tuple=True)
        gate, up = (x[tok].float() @ moe.gate_up.weight[e].float().t()).chunk(2, -1)
        h = F.silu(gate) * up * w[tok, j, None]
        y = y.index_add(0, tok, h @ moe.down.weight[e].float().t())
    return y


@pytest.mark.parametrize("align", [1, 8])
def test_moe_matches_reference(device, align):
    moe = groupmm.nn.MoE(H, FF, E, K, shared_ffn_hidden=FF, align=align, device=device)
    x = torch.randn(T, H, device=device, dtype=torch.bfloat16, requires_grad=True)
    y, aux = moe(x)
    x_ref = x.detach().clone().requires_grad_()
    ref = reference(moe, x_ref)
    torch.testing.assert_close(y.float(), ref, rtol=3e-2, atol=3e-2)
    assert aux.shape == () and aux.item() == 0.0  # no loss coefficients
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, [x, moe.router.weight, moe.gate_up.weight], dy)
    refs = torch.autograd.grad(ref, [x_ref, moe.router.weight, moe.gate_up.weight], dy.float())
    for got, want in zip(grads, refs):
        torch.testing.assert_close(got.float(), want.float(), rtol=5e-2, atol=5e-2)


def test_aux_loss_has_gradient(device):
    moe = groupmm.nn.MoE(H, FF, E, K, aux_loss_coeff=0.1, z_loss_coeff=0.01, device=device)
    x = torch.randn(T, H, device=device, dtype=torch.bfloat16)
    _, aux = moe(x)
    assert aux.item() > 0
    (3 * aux).backward()
    g3 = moe.router.weight.grad.clone()
    moe.zero_grad()
    moe(x)[1].backward()
    # The loss terms' gradients scale with their upstream gradient (not assumed to be 1).
    torch.testing.assert_close(g3, 3 * moe.router.weight.grad, rtol=1e-2, atol=1e-6)
    assert moe.router.weight.grad.abs().sum() > 0
