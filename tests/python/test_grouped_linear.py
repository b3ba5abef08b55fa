"""groupmm.nn.GroupedLinear: the same values and gradients as per-expert nn.Linear layers,
loading their weights, fp32 main_grad accumulation."""

import torch

import groupmm
from conftest import assert_close, make_splits

COUNTS = [4, 0, 7, 5]
G, K, N = len(COUNTS), 32, 16


def linears(device, dtype=torch.bfloat16):
    return torch.nn.ModuleList(torch.nn.Linear(K, N, device=device, dtype=dtype)
                               for _ in range(G))


def per_expert(lins, x):
    return torch.cat([lin(c) for lin, c in zip(lins, torch.split(x, COUNTS))])


def test_matches_per_expert_linears(device):
    lins = linears(device)
    layer = groupmm.nn.GroupedLinear.from_linears(lins)
    x = torch.randn(sum(COUNTS), K, device=device, dtype=torch.bfloat16)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    y = layer(xa, make_splits(COUNTS, device))
    ref = per_expert(lins, xb)
    assert_close(y, ref)
    dy = torch.randn_like(y)
    y.backward(dy)
    ref.backward(dy)
    assert_close(xa.grad, xb.grad)
    for g, lin in enumerate(lins):
        assert_close(layer.weight.grad[g], lin.weight.grad)
        assert_close(layer.bias.grad[g], lin.bias.grad)


def test_load_state_dict_of_a_module_list_of_linears(device):
    lins = linears(device)
    layer = groupmm.nn.GroupedLinear(G, K, N, device=device)
    layer.load_state_dict(lins.state_dict())
    for g, lin in enumerate(lins):
        assert torch.equal(layer.weight[g], lin.weight) and torch.equal(layer.bias[g], lin.bias)
    again = groupmm.nn.GroupedLinear(G, K, N, device=device)
    again.load_state_dict(layer.state_dict())  # its own keys load as usual
    assert torch.equal(again.weight, layer.weight)


def test_init_is_nn_linear_like(device):
    layer = groupmm.nn.GroupedLinear(G, 256, N, dtype=torch.float32, device=device)
    bound = 1 / 256**0.5
    assert layer.weight.abs().max() <= bound and layer.weight.abs().max() > 0.9 * bound
    assert not torch.equal(layer.weight[0], layer.weight[1])


def test_main_grad_accumulates_in_fp32(device):
    layer = groupmm.nn.GroupedLinear(G, K, N, bias=False, device=device,
                                     accumulate_into_main_grad=True)
    x = torch.randn(sum(COUNTS), K, device=device, dtype=torch.bfloat16)
    splits = make_splits(COUNTS, device)
    dy = torch.randn(sum(COUNTS), N, device=device, dtype=torch.bfloat16)
    for _ in range(2):
        layer(x, splits).backward(dy)
    assert layer.weight.grad is None and layer.weight.main_grad.dtype == torch.float32
    once = torch.ops.groupmm.grouped_mm_wgrad(dy, x, splits, torch.float32)
    torch.testing.assert_close(layer.weight.main_grad, 2 * once)
