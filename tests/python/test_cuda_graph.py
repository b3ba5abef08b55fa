"""CUDA graphs: a GroupedLinear + SwiGLU forward + backward captured once replays correctly when
the routing (splits, on the device) changes, bit for bit against eager runs; so does a MoE step
with a capacity and the expert-bias update."""

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


def test_moe_step_with_expert_bias_update_replays():
    # A MoE training step (forward, backward, the aux-loss-free bias update) in one graph: each
    # replay routes new inputs, counts their tokens and moves the bias, as the same eager steps do.
    torch.manual_seed(7)
    moe = groupmm.nn.MoE(K, F, 8, 2, expert_bias=True, capacity_factor=1.25, device="cuda")
    twin = groupmm.nn.MoE(K, F, 8, 2, expert_bias=True, capacity_factor=1.25, device="cuda")
    twin.load_state_dict(moe.state_dict())
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def step(m, x):
        y, _ = m(x)
        grads = torch.autograd.grad(y.float().square().mean(), (x, m.gate_up.weight))
        m.update_expert_bias(0.01)
        return (y, *grads)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            step(moe, x)
            step(twin, x.detach().requires_grad_())
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        static = step(moe, x)
    twin.load_state_dict(moe.state_dict())  # the bias as the capture left it

    for _ in range(4):
        with torch.no_grad():
            x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        eager = step(twin, x.detach().requires_grad_())
        for got, want in zip(static, eager):
            assert torch.equal(got, want)
        assert torch.equal(moe.expert_bias, twin.expert_bias)
    assert moe.expert_bias.abs().sum() > 0
    groupmm.check()


def test_first_op_on_a_capturing_stream_is_refused_clearly():
    """groupmm makes a stream's state on its first op there, which capture forbids: that op is
    refused with the remedy (before any CUDA call, so the capture stays valid), and the stream
    then warms up and captures as usual."""
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(G, F, K, device="cuda", dtype=torch.bfloat16)
    splits = torch.tensor([24, 24, 24, 24], device="cuda", dtype=torch.int32)
    stream = torch.cuda.Stream()  # no groupmm op has run on it
    stream.wait_stream(torch.cuda.current_stream())
    with pytest.raises(RuntimeError, match="Warm up on the capture stream"):
        with torch.cuda.graph(torch.cuda.CUDAGraph(), stream=stream):
            torch.ops.groupmm.grouped_mm(x, w, splits)
    with torch.cuda.stream(stream):
        want = torch.ops.groupmm.grouped_mm(x, w, splits)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        y = torch.ops.groupmm.grouped_mm(x, w, splits)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, want)
