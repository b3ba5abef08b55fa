"""groupmm.nn.MoE(ep_group=...): expert parallelism over a torch.distributed process group.

CPU: 2 and 4 gloo processes (loopback, file:// rendezvous, bounded joins) against the one-rank
block on the global tokens (rank 0's, then rank 1's, ...; the same global weights, the experts
sharded). Bit for bit, as tests/cpu/test_moe_ep.cpp: y, dx, the local experts' weight grads (the
experts see their rows in the one-rank order); within a tolerance: the replicated parameters'
grads (router, shared expert) summed over the ranks (each rank sums only its tokens, so the fp32
order differs). Throughput and capacity mode, fp32 and bf16, a quantized recipe (padded experts),
delayed wgrad, a rank without tokens, capacity overflow reported and deterministic, and a rank
that fails: its peers get an error instead of waiting. R = 1 in this process (gloo), with the op
level and the configuration checks. GPU over groupmm's NCCL communicator: R = 1 in this process
against the block without EP, capacity mode captured in a CUDA graph and replayed with new
routing; where the machine has several GPUs, one process per GPU (R = 2 and 4 as there are GPUs)
against the one-rank block, as the CPU cases.
"""

import datetime
import json
import os
import tempfile
import time
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import groupmm
from conftest import GemmLog

ops = torch.ops.groupmm
E, K = 8, 3


# ---- the cases (run by every rank) --------------------------------------------------------------

def _blocks(world, dtype, recipe, shared, delay_wgrad, score, mode, capacity, capacity_factor,
            hidden, ffn, device="cpu", group=None):
    """The one-rank block and this rank's EP block with the same global weights."""
    kw = dict(shared_ffn_hidden=shared, score=score, renormalize=True, scaling_factor=1.25,
              recipe=recipe, delay_wgrad=delay_wgrad, dtype=dtype, device=device)
    ref = groupmm.nn.MoE(hidden, ffn, E, K, **kw)
    ep = groupmm.nn.MoE(hidden, ffn, E, K, **kw, ep_group=group or dist.group.WORLD,
                        ep_mode=mode, ep_capacity=capacity, capacity_factor=capacity_factor)
    e0, el = ep.first_expert, ep.local_experts
    assert el == E // world and ep.gate_up.weight.shape[0] == el
    with torch.no_grad():
        ep.router.weight.copy_(ref.router.weight)
        ep.gate_up.weight.copy_(ref.gate_up.weight[e0:e0 + el])
        ep.down.weight.copy_(ref.down.weight[e0:e0 + el])
        if shared:
            for a, b in ((ep.shared_up, ref.shared_up), (ep.shared_down, ref.shared_down)):
                a.weight.copy_(b.weight)
    return ref, ep


def _step(block, x, dy):
    x = x.detach().clone().requires_grad_()
    y, _ = block(x)
    y.backward(dy)
    block.backward_dw()
    return y.detach(), x.grad


def _rel(a, b):
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def case_matches_one_rank(rank, world, *, tokens, dtype="float32", recipe="bf16", shared=6,
                          delay_wgrad=False, score="softmax", mode="throughput", capacity=None,
                          capacity_factor=0.0, hidden=16, ffn=8, seed=0, device="cpu"):
    dtype = getattr(torch, dtype)
    torch.manual_seed(seed)
    ref, ep = _blocks(world, dtype, recipe, shared, delay_wgrad, score, mode, capacity,
                      capacity_factor, hidden, ffn, device=device)
    x_all = torch.randn(sum(tokens), hidden).to(device=device, dtype=dtype)
    dy_all = torch.randn(sum(tokens), hidden).to(device=device, dtype=dtype)
    y_ref, dx_ref = _step(ref, x_all, dy_all)
    off, T = sum(tokens[:rank]), tokens[rank]
    y, dx = _step(ep, x_all[off:off + T], dy_all[off:off + T])
    e0, el = ep.first_expert, ep.local_experts
    same = {"y": (y, y_ref[off:off + T]), "dx": (dx, dx_ref[off:off + T]),
            "gate_up dW": (ep.gate_up.weight.grad, ref.gate_up.weight.grad[e0:e0 + el]),
            "down dW": (ep.down.weight.grad, ref.down.weight.grad[e0:e0 + el])}
    for what, (got, want) in same.items():
        assert torch.equal(got, want), f"{what}: not bit for bit (rel {_rel(got, want):.3g})"
    assert ep.ep_overflow is None, ep.ep_overflow
    # Replicated parameters: this rank's share; their sum over the ranks is the one-rank grad.
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    pairs = [(ep.router, ref.router)]
    if shared:
        pairs += [(ep.shared_up, ref.shared_up), (ep.shared_down, ref.shared_down)]
    for a, b in pairs:
        g = a.weight.grad.float().clone()
        dist.all_reduce(g)
        assert _rel(g, b.weight.grad) <= tol, f"{type(a).__name__} dW: rel {_rel(g, b.weight.grad)}"


def _device_overflow(device):
    """The capacity drop the last steps reported on `device` (groupmm.check raises it), or None."""
    try:
        groupmm.check(device)
    except Exception as e:  # noqa: BLE001  (the core's error type)
        return str(e)
    return None


def case_overflow(rank, world, *, tokens, seed=0, device="cpu"):
    torch.manual_seed(seed)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    _, ep = _blocks(world, dtype, "bf16", 16, False, "softmax", "capacity", (1, 0), 0.0,
                    16, 8, device=device)
    x = torch.randn(sum(tokens), 16)[sum(tokens[:rank]):][:tokens[rank]].to(device, dtype)
    dy = torch.randn_like(x)
    first = _step(ep, x, dy)
    report = ep.ep_overflow if device == "cpu" else _device_overflow(device)
    assert report is not None and "ep_dispatch" in report, report
    ep.zero_grad()
    again = _step(ep, x, dy)  # a drop is deterministic: the same bits
    if device != "cpu":
        assert _device_overflow(device) is not None
    for a, b in zip(first, again):
        assert torch.isfinite(a).all() and torch.equal(a, b)


def case_rank_fails(rank, world, **_):
    """Rank 1 raises before the step; rank 0's step must end with an error, not wait."""
    torch.manual_seed(0)
    _, ep = _blocks(world, torch.float32, "bf16", 0, False, "softmax", "throughput", None, 0.0,
                    16, 8)
    if rank == 1:
        raise RuntimeError("rank 1 fails on purpose")
    start = time.monotonic()
    try:
        ep(torch.randn(4, 16))
    except Exception as e:  # noqa: BLE001  (whatever the process group raises)
        first = str(e).splitlines()[0][:160] if str(e) else ""
        return f"released after {time.monotonic() - start:.1f} s: {type(e).__name__}: {first}"
    raise AssertionError("rank 0's step completed without its peer")


def _capacity_twins(factor, tokens, seed, device):
    """A capacity-mode block, a twin with its weights, and its input and output gradient."""
    torch.manual_seed(seed)
    H, F = 128, 64
    kw = dict(shared_ffn_hidden=64, device=device, ep_group=dist.group.WORLD,
              ep_mode="capacity", capacity_factor=factor)
    moe = groupmm.nn.MoE(H, F, E, K, **kw)
    twin = groupmm.nn.MoE(H, F, E, K, **kw)
    twin.load_state_dict(moe.state_dict())
    x = torch.randn(tokens, H, device=device, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(tokens, H, device=device, dtype=torch.bfloat16)
    return moe, twin, x, dy


def _replays_equal_eager(moe, twin, x, dy, reseed):
    """Captures moe's forward + backward once (plan fill, exchanges, experts) and replays it with
    new tokens (new routing; reseed(i) before replay i's tokens) against eager steps of twin."""
    def step(m, x):
        y, _ = m(x)
        return (y, *torch.autograd.grad(y, (x, m.gate_up.weight, m.router.weight), dy))

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # the plans, the Contexts and the connections are made here
            step(moe, x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        static = step(moe, x)
    for i in range(3):
        reseed(i)
        with torch.no_grad():
            x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        eager = step(twin, x.detach().requires_grad_())
        for what, got, want in zip(("y", "dx", "gate_up dW", "router dW"), static, eager):
            assert torch.equal(got, want), f"replay {i}: {what} (rel {_rel(got, want):.3g})"


def case_capacity_graph_replays(rank, world, *, tokens, seed=0, device="cuda"):
    """Every rank captures its capacity step once and replays it with new tokens (new routing on
    every rank): the replays' collectives pair up across the ranks as the eager ones do."""
    moe, twin, x, dy = _capacity_twins(float(world), tokens[rank], seed, device)
    _replays_equal_eager(moe, twin, x, dy,
                         lambda i: torch.manual_seed(seed + 100 * (i + 1) + rank))
    groupmm.check(device)


CASES = {f.__name__: f for f in (case_matches_one_rank, case_overflow, case_rank_fails,
                                  case_capacity_graph_replays)}


def _worker(rank, world, init, cases, out, pg_timeout, gpus):
    torch.set_num_threads(1)
    results = {}
    try:
        if gpus:  # one GPU a rank: the cases' tensors on cuda:rank
            torch.cuda.set_device(rank)
        dist.init_process_group("cpu:gloo,cuda:nccl" if gpus else "gloo", init_method=init,
                                rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=pg_timeout))
        for name, fn, kw in cases:
            if gpus:
                kw = dict(kw, device=f"cuda:{rank}")
            try:
                results[name] = CASES[fn](rank, world, **kw) or "ok"
            except AssertionError as e:
                raise AssertionError(f"rank {rank}, case '{name}': {e}") from e
    except BaseException as e:
        results["error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
        raise
    finally:
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


def run_ranks(world, cases, timeout=120, pg_timeout=30, gpus=False):
    """Runs the cases on `world` gloo processes (gpus: one process per GPU, the cases' tensors on
    it, EP over NCCL); returns (each rank's results, exit codes). Processes still alive after
    `timeout` seconds are killed and reported as hung."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{os.path.join(tmp, 'rendezvous')}"
        procs = [ctx.Process(target=_worker, args=(r, world, init, cases, tmp, pg_timeout, gpus))
                 for r in range(world)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        assert not hung, f"ranks {hung} did not finish within {timeout} s"
        results = []
        for r in range(world):
            path = os.path.join(tmp, f"rank{r}.json")
            results.append(json.load(open(path)) if os.path.exists(path) else {})
        return results, [p.exitcode for p in procs]


def ep_cases(world):
    uneven = [0 if r == 1 else 5 + 3 * r for r in range(world)]  # rank 1 has no tokens
    even = [6] * world
    big = max(uneven)
    return [
        ("fp32 throughput", "case_matches_one_rank", dict(tokens=uneven)),
        ("fp32 capacity", "case_matches_one_rank",
         dict(tokens=uneven, mode="capacity", capacity=(big, 0), seed=1)),
        ("bf16 sigmoid delayed wgrad throughput", "case_matches_one_rank",
         dict(tokens=even, dtype="bfloat16", score="sigmoid", delay_wgrad=True, seed=2)),
        ("bf16 capacity_factor", "case_matches_one_rank",
         dict(tokens=even, dtype="bfloat16", mode="capacity", capacity_factor=float(world),
              seed=3)),
        # Per-tensor current scaling of the shared expert (one group of the rank's T tokens)
        # depends on the batch, so its output is not the one-rank block's: no shared expert here.
        ("fp8_current throughput (align 16)", "case_matches_one_rank",
         dict(tokens=[16] * world, dtype="bfloat16", recipe="fp8_current", hidden=32, ffn=16,
              shared=0, seed=4)),
        ("fp8_current capacity (align 16, zero tail rows)", "case_matches_one_rank",
         dict(tokens=[16] * world, dtype="bfloat16", recipe="fp8_current", hidden=32, ffn=16,
              shared=0, mode="capacity", capacity=(16, 0), seed=6)),
        ("mxfp8 capacity", "case_matches_one_rank",
         dict(tokens=[16] * world, dtype="bfloat16", recipe="mxfp8", hidden=32, ffn=32,
              shared=32, mode="capacity", capacity=(16, 0), seed=5)),
        ("overflow", "case_overflow", dict(tokens=even)),
    ]


@pytest.mark.parametrize("world", [2, 4])
def test_ep_over_gloo_matches_one_rank(world):
    results, codes = run_ranks(world, ep_cases(world))
    for r, (res, code) in enumerate(zip(results, codes)):
        assert code == 0 and "error" not in res, f"rank {r}: {res.get('error', code)}"
        assert all(v == "ok" for v in res.values()), res


def test_a_failing_rank_releases_its_peers():
    results, codes = run_ranks(2, [("fails", "case_rank_fails", {})], timeout=60, pg_timeout=20)
    assert codes[1] != 0 and "rank 1 fails on purpose" in results[1]["error"]
    assert codes[0] == 0 and results[0]["fails"].startswith("released"), results[0]


# ---- one rank in this process -------------------------------------------------------------------

@pytest.fixture(scope="module")
def world1():
    """A one-rank default process group (gloo for CPU tensors, NCCL for CUDA ones when there is
    a GPU), made here unless the process already has one."""
    made = not dist.is_initialized()
    if made:
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        with tempfile.NamedTemporaryFile(delete=False) as f:
            path = f.name
        os.unlink(path)
        dist.init_process_group(backend, init_method=f"file://{path}", rank=0, world_size=1)
    yield dist.group.WORLD
    if made:
        dist.destroy_process_group()


def test_ops_one_rank(world1):
    g = groupmm.nn.moe_ep.ep_group(world1, "cpu")
    assert (g.rank(), g.size(), g.backend(), g.device()) == (0, 1, "gloo", "cpu")
    assert "communicator" in g.describe()
    T, H = 7, 16
    ids = torch.randint(0, E, (T, K), dtype=torch.int32)
    w = torch.rand(T, K)
    x = torch.randn(T, H)
    plan = ops.ep_dispatch_plan(g, ids, E, H)
    assert plan.mode() == "throughput" and plan.rows() == T * K and plan.local_experts() == E
    assert int(plan.splits().sum()) == T * K
    # One rank: the dispatch is moe_permute's dropless permutation, the combine its unpermute.
    pmap = ops.permute_plan(ids, E, 1, 0)
    xg, probs = ops.ep_dispatch(plan, x, w)
    xp, pp = ops.permute(x, *pmap, 1, 0, w)
    assert torch.equal(xg, xp) and torch.equal(probs, pp)
    assert torch.equal(ops.ep_combine(plan, xg), ops.unpermute(xp, *pmap, 1, 0))
    y = ops.ep_combine(plan, xg, w)  # weighted: sum_j w[t, j] * row, fp32
    want = torch.stack([sum(w[t, j] * x[t] for j in range(K)) for t in range(T)])
    torch.testing.assert_close(y, want, rtol=1e-6, atol=1e-6)
    # Capacity plans: a pool entry is in use while a graph refers to it.
    cap = ops.ep_capacity_plan_create(g, ids, E, H, T, 0, torch.float32)
    ops.ep_capacity_plan(cap, ids)
    assert cap.mode() == "capacity" and cap.rows() == T * K and not cap.in_use()
    xr = x.clone().requires_grad_()
    out, probs = ops.ep_dispatch(cap, xr, w)
    assert cap.in_use()  # the autograd node's lease
    del out, probs
    assert not cap.in_use()
    # A budget with a tail (2 T K entries for T K): zeroed by default, left unwritten without
    # zero_tail; the entries' rows and the combine are the same either way.
    for zero_tail in (True, False):
        tail = ops.ep_capacity_plan_create(g, ids, E, H, T, 2 * T * K, torch.float32, zero_tail)
        ops.ep_capacity_plan(tail, ids)
        assert tail.rows() == 2 * T * K and int(tail.splits_at_most().sum()) == T * K
        xg, probs = ops.ep_dispatch(tail, x, w)
        assert torch.equal(xg[:T * K], xp) and torch.equal(probs[:T * K], pp)
        if zero_tail:
            assert not xg[T * K:].any() and not probs[T * K:].any()
        assert torch.equal(ops.ep_combine(tail, xg), ops.unpermute(xp, *pmap, 1, 0))


def test_configuration_checks(world1):
    with pytest.raises(ValueError, match="ep_mode='exact' must be"):
        groupmm.nn.MoE(16, 8, E, K, dtype=torch.float32, ep_group=world1, ep_mode="exact")
    with pytest.raises(ValueError, match="capacity_factor=1.5 must be 0"):
        groupmm.nn.MoE(16, 8, E, K, dtype=torch.float32, ep_group=world1, capacity_factor=1.5)
    with pytest.raises(ValueError, match="needs capacity_factor > 0"):
        groupmm.nn.MoE(16, 8, E, K, dtype=torch.float32, ep_group=world1, ep_mode="capacity")
    assert groupmm.nn.moe_ep.capacity_from_factor(16, 8, 4, 1.25) == (16, 40)
    assert groupmm.nn.moe_ep.capacity_from_factor(0, 8, 4, 1.25) == (1, 1)


def test_one_rank_equals_the_block(world1):
    # R = 1 on gloo: no reordering anywhere, so every grad (router's too) is the block's.
    torch.manual_seed(0)
    for mode, cf in (("throughput", 0.0), ("capacity", 1.0)):
        ref, ep = _blocks(1, torch.float32, "bf16", 6, False, "softmax", mode, None, cf, 16, 8,
                          group=world1)
        x, dy = torch.randn(9, 16), torch.randn(9, 16)
        for a, b in zip(_step(ref, x, dy), _step(ep, x, dy)):
            assert torch.equal(a, b), mode
        for name, p in ref.named_parameters():
            assert torch.equal(p.grad, dict(ep.named_parameters())[name].grad), (mode, name)


class _PoisonedTail:
    """torch.ops.groupmm as moe_ep sees it, except that ep_dispatch's received rows past the
    entries (capacity mode's zero tail: plan.splits_at_most() sums to the entries) and their
    probs come back NaN. A step that computes the tail then carries NaN into the experts' weight
    gradients (dW = dy^T x over every row, dy's tail rows being 0); one that leaves it out does
    not. The host read of the sum is the test's, not the module's."""

    def __getattr__(self, name):
        return getattr(ops, name)

    @staticmethod
    def ep_dispatch(plan, x, weights=None):
        xg, probs = ops.ep_dispatch(plan, x, weights)
        entries = int(plan.splits_at_most().sum())
        assert entries < xg.shape[0], "the budget must leave a tail for this test"
        rows = torch.arange(xg.shape[0]) < entries
        nan = float("nan")
        return (torch.where(rows.unsqueeze(1), xg, torch.full_like(xg, nan)),
                torch.where(rows, probs, torch.full_like(probs, nan)))


@pytest.mark.parametrize("recipe,dtype,hidden,ffn,shared", [
    ("bf16", torch.float32, 16, 8, 6), ("bf16", torch.bfloat16, 16, 8, 0),
    ("fp8_current", torch.bfloat16, 32, 16, 0), ("fp8_block", torch.bfloat16, 128, 128, 0),
    ("mxfp8", torch.bfloat16, 32, 32, 32)])
def test_capacity_mode_leaves_the_padding_rows_out(world1, monkeypatch, recipe, dtype, hidden,
                                                   ffn, shared):
    """Capacity factor 2 on one rank: half the received buffer is padding. Poisoned with NaN, it
    changes nothing (y, dx and every gradient are the clean step's bits): the experts neither read
    nor compute it. The control puts the expert layers back to exact splits (the whole buffer,
    as before the at-most mode), and the poison then reaches the weight gradients."""
    torch.manual_seed(7)
    T = 16
    _, ep = _blocks(1, dtype, recipe, shared, False, "softmax", "capacity", None, 2.0, hidden, ffn,
                    group=world1)
    assert ep.gate_up.splits_total == ep.down.splits_total == "at_most"
    x, dy = torch.randn(T, hidden).to(dtype), torch.randn(T, hidden).to(dtype)

    def step():
        ep.zero_grad(set_to_none=True)
        y, dx = _step(ep, x, dy)
        return [y, dx] + [p.grad for p in ep.parameters()]

    clean = step()
    monkeypatch.setattr(groupmm.nn.moe_ep, "ops", _PoisonedTail())
    for a, b in zip(step(), clean):
        assert torch.equal(a, b) and torch.isfinite(a.float()).all()
    for layer in (ep.gate_up, ep.down):  # the control: the tail computed again
        layer.splits_total = layer._exec.total = "exact"
    control = step()
    assert not all(torch.isfinite(g.float()).all() for g in control), \
        "with exact splits the poisoned tail should have reached a gradient"


class _W4Calls:
    """torch.ops.groupmm as the layers' executors see it, recording the keyword arguments of each
    4-bit weight GEMM."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return getattr(ops, name)

    def grouped_mm_w4(self, *args, **kw):
        self.calls.append(kw)
        return ops.grouped_mm_w4(*args, **kw)


@pytest.mark.parametrize("recipe", ["nvfp4_weight", "mxfp4_weight"])
def test_capacity_mode_w4_experts_leave_the_padding_rows_out(world1, monkeypatch, recipe):
    """The 4-bit weight recipes (serving: forward only) in capacity mode: both expert GEMMs run
    with at-most splits and expect T k rows, and a NaN tail of the received buffer changes
    nothing in y (the clean step's bits, finite)."""
    torch.manual_seed(7)
    T, hidden, ffn = 16, 64, 32
    _, ep = _blocks(1, torch.bfloat16, recipe, 0, False, "softmax", "capacity", None, 2.0, hidden,
                    ffn, group=world1)
    assert ep.gate_up.splits_total == ep.down.splits_total == "at_most"
    x = torch.randn(T, hidden).to(torch.bfloat16)
    with torch.no_grad():
        clean, _ = ep(x)
        calls = _W4Calls()
        monkeypatch.setattr(groupmm.nn._executors, "ops", calls)
        monkeypatch.setattr(groupmm.nn.moe_ep, "ops", _PoisonedTail())
        y, _ = ep(x)
    assert torch.equal(y, clean) and torch.isfinite(y.float()).all()
    assert len(calls.calls) == 2
    for kw in calls.calls:
        assert kw["splits_total"] == "at_most" and kw["expected_rows"] == T * K, kw


@pytest.mark.parametrize("recipe,dtype,hidden,ffn,shared,factor", [
    ("bf16", torch.float32, 16, 8, 6, 2.0), ("bf16", torch.bfloat16, 16, 8, 6, 0.5),
    ("fp8_current", torch.bfloat16, 32, 16, 0, 2.0), ("mxfp8", torch.bfloat16, 32, 32, 32, 2.0)])
def test_capacity_mode_expects_t_k_rows(world1, monkeypatch, recipe, dtype, hidden, ffn, shared,
                                        factor):
    """The expert layers' GEMMs (forward, dgrad, wgrad of gate_up and down) expect T k rows, as
    nn::MoE's capacity layers expect max_tokens * topk, capped at the received buffer's rows
    (factor 2: the budget holds 2 T k rows; 0.5: half of T k); the shared expert's expect their
    rows (0). y, dx and every gradient are the bits of the same step with no expected rows."""
    torch.manual_seed(7)
    T = 16
    _, ep = _blocks(1, dtype, recipe, shared, False, "softmax", "capacity", None, factor, hidden,
                    ffn, group=world1)
    x, dy = torch.randn(T, hidden).to(dtype), torch.randn(T, hidden).to(dtype)

    def step():
        ep.zero_grad(set_to_none=True)
        log = GemmLog()
        with log:
            y, dx = _step(ep, x, dy)
        return [y, dx] + [p.grad for p in ep.parameters()], log.calls

    got, calls = step()
    entries = groupmm.nn.moe_ep.capacity_from_factor(T, K, 1, factor)[1]
    rows = entries if ep.align == 1 else None  # padded experts: more rows than the budget
    expected = T * K if rows is None else min(T * K, rows)
    experts = [c for c in calls if c[1] != 0]
    assert len(experts) == 6 and {e for _, e in experts} == {expected}, calls
    assert len(calls) - len(experts) == (6 if shared else 0), calls
    monkeypatch.setattr(groupmm.nn.GroupedLinear, "_expected", lambda self, rows, e=None: 0)
    control, calls = step()
    assert {e for _, e in calls} == {0}
    for a, b in zip(got, control):
        assert torch.equal(a, b)


def test_group_arguments(world1):
    # A CPU group borrows gloo and takes no NCCL id; the id op gives NCCL's 128 bytes, or says
    # the build has no NCCL (CPU-only builds).
    with pytest.raises(ValueError, match="nccl_id is for a CUDA group"):
        torch.classes.groupmm.EpGroup(world1.group_name, "cpu", torch.zeros(128, dtype=torch.uint8))
    with pytest.raises(ValueError, match="must be cpu or cuda"):
        torch.classes.groupmm.EpGroup(world1.group_name, "meta", None)
    try:
        uid = ops.ep_nccl_unique_id()
    except NotImplementedError as e:
        assert "built without NCCL" in str(e)
    else:
        assert uid.dtype == torch.uint8 and uid.shape == (128,) and uid.device.type == "cpu"


def test_plan_splits_at_most(world1):
    g = groupmm.nn.moe_ep.ep_group(world1, "cpu")
    T, H = 7, 16
    ids = torch.randint(0, E, (T, K), dtype=torch.int32)
    cap = ops.ep_capacity_plan_create(g, ids, E, H, T, 2 * T * K, torch.float32)
    ops.ep_capacity_plan(cap, ids)
    full, at_most = cap.splits(), cap.splits_at_most()
    assert cap.rows() == 2 * T * K and cap.in_use()  # the splits tensors hold the plan
    assert int(full.sum()) == cap.rows() and int(at_most.sum()) == T * K
    assert torch.equal(full[:-1], at_most[:-1])
    del full, at_most
    assert not cap.in_use()
    plan = ops.ep_dispatch_plan(g, ids, E, H)  # throughput mode: no tail, the same splits
    assert torch.equal(plan.splits(), plan.splits_at_most())


# ---- GPU: one device --------------------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available() or not dist.is_nccl_available(),
                          reason="needs a CUDA GPU and NCCL")


@cuda
def test_nccl_group_one_rank(world1):
    g = groupmm.nn.moe_ep.ep_group(world1, "cuda")
    assert (g.rank(), g.size(), g.backend(), g.device()) == (0, 1, "nccl", "cuda:0")
    assert "communicator groupmm made" in g.describe()
    # The unique id is NCCL's 128 bytes, and a CUDA group refuses to be made without one.
    uid = ops.ep_nccl_unique_id()
    assert uid.dtype == torch.uint8 and uid.shape == (128,) and uid.device.type == "cpu"
    with pytest.raises(ValueError, match="needs nccl_id"):
        torch.classes.groupmm.EpGroup(world1.group_name, "cuda:0", None)
    with pytest.raises(ValueError, match="nccl_id must be a CPU uint8 tensor of 128 bytes"):
        torch.classes.groupmm.EpGroup(world1.group_name, "cuda:0", uid[:64])
    with pytest.raises(ValueError, match="nccl_id is for a CUDA group"):
        torch.classes.groupmm.EpGroup(world1.group_name, "cpu", uid)
    # An exchange over it: one rank's dispatch is moe_permute's permutation.
    T, H = 37, 64
    ids = torch.randint(0, E, (T, K), dtype=torch.int32, device="cuda")
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
    plan = ops.ep_dispatch_plan(g, ids, E, H)
    xg, _ = ops.ep_dispatch(plan, x, None)
    xp, _ = ops.permute(x, *ops.permute_plan(ids, E, 1, 0), 1, 0, None)
    assert torch.equal(xg, xp)
    groupmm.check()


@cuda
@pytest.mark.parametrize("recipe", ["bf16", "fp8_current"])
@pytest.mark.parametrize("mode", ["throughput", "capacity"])
def test_nccl_one_rank_equals_the_block(world1, recipe, mode):
    torch.manual_seed(0)
    H, F, T = 128, 64, 256
    ref, ep = _blocks(1, torch.bfloat16, recipe, 64, False, "softmax", mode, None,
                      2.0 if mode == "capacity" else 0.0, H, F, device="cuda", group=world1)
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    for a, b in zip(_step(ref, x, dy), _step(ep, x, dy)):
        assert torch.equal(a, b)
    for name, p in ref.named_parameters():
        assert torch.equal(p.grad, dict(ep.named_parameters())[name].grad), name
    groupmm.check()


@cuda
def test_nccl_capacity_step_replays_in_a_cuda_graph(world1):
    # The capacity block's forward and backward captured once (plan fill, exchanges, experts),
    # replayed with new tokens (new routing) against eager steps of a twin with the same weights.
    moe, twin, x, dy = _capacity_twins(2.0, 256, 0, "cuda")
    _replays_equal_eager(moe, twin, x, dy, lambda i: None)
    groupmm.check()


def gpu_cases(world):
    uneven = [0 if r == 1 else 40 + 24 * r for r in range(world)]  # rank 1 has no tokens
    even = [64] * world
    big = max(uneven)
    gpu = dict(dtype="bfloat16", hidden=128, ffn=64, shared=64)
    return [
        ("bf16 throughput", "case_matches_one_rank", dict(tokens=uneven, **gpu)),
        ("bf16 capacity", "case_matches_one_rank",
         dict(tokens=uneven, mode="capacity", capacity=(big, 0), seed=1, **gpu)),
        ("bf16 sigmoid delayed wgrad capacity_factor", "case_matches_one_rank",
         dict(tokens=even, score="sigmoid", delay_wgrad=True, mode="capacity",
              capacity_factor=float(world), seed=2, **gpu)),
        ("fp8_current throughput", "case_matches_one_rank",
         dict(tokens=even, recipe="fp8_current", seed=3, **dict(gpu, shared=0))),
        ("fp8_block capacity", "case_matches_one_rank",
         dict(tokens=even, recipe="fp8_block", mode="capacity", capacity=(64, 0), seed=4,
              **dict(gpu, hidden=256, ffn=128, shared=0))),
        ("mxfp8 capacity", "case_matches_one_rank",
         dict(tokens=even, recipe="mxfp8", mode="capacity", capacity=(64, 0), seed=5, **gpu)),
        ("overflow", "case_overflow", dict(tokens=even)),
        ("capacity step replayed in a CUDA graph", "case_capacity_graph_replays",
         dict(tokens=even, seed=6)),
    ]


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2
                    or not dist.is_nccl_available(), reason="needs 2 CUDA GPUs and NCCL")
@pytest.mark.parametrize("world", [2, 4])
def test_ep_over_nccl_matches_one_rank(world):
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs; {torch.cuda.device_count()} visible")
    results, codes = run_ranks(world, gpu_cases(world), timeout=300, pg_timeout=120, gpus=True)
    for r, (res, code) in enumerate(zip(results, codes)):
        assert code == 0 and "error" not in res, f"rank {r}: {res.get('error', code)}"
        assert all(v == "ok" for v in res.values()), res
