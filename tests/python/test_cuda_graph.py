"""CUDA graphs: a GroupedLinear + SwiGLU forward + backward captured once replays correctly when
the routing (splits, on the device) changes, bit for bit against eager runs."""

import pytest
import torch

import groupmm

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
G, K, F, M = 4, 64, 32, 96


def test_graph_replays_with_new_routing():
    up = groupmm.nn.GroupedLinear(G, K, 2 * F, device="cuda")
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(M, F, device="cuda", dtype=torch.bfloat16)
    splits = torch.tensor([24, 24, 24, 24], device="cuda", dtype=torch.int32)

    def step():
        y = torch.ops.groupmm.swiglu(up(x, splits))
        return (y, *torch.autograd.grad(y, (x, up.weight, up.bias), dy))

    # Warm up on the capture stream: the first call of a kernel on a Context sets its attributes,
    # and groupmm's Context for a stream is created on first use there.
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        static = step()

    for counts in ([24, 24, 24, 24], [0, 90, 0, 6], [96, 0, 0, 0], [1, 2, 3, 90]):
        splits.copy_(torch.tensor(counts))
        graph.replay()
        torch.cuda.synchronize()
        eager = step()
        for got, want in zip(static, eager):
            assert torch.equal(got, want), counts
    groupmm.check()
