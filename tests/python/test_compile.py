"""torch.compile(fullgraph=True): GroupedLinear + SwiGLU forward and backward trace without graph
breaks (fake kernels, autograd formulas) and give the eager values, with dynamic row counts."""

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
