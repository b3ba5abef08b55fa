"""The grouped GEMMs' expected_rows (splits_total='at_most' only): the rows the splits are expected
to sum to, by which the CUDA heuristic sizes its kernel choice instead of the buffer's rows
(gemm.hpp, GroupedGemmArgs / QuantizedGemmArgs::expected_rows). Only which kernel runs may change
(never which rows are read or written); on the CPU nothing does.

Here: every grouped GEMM op takes it and the core validates it (its errors name the op and the
value); the op's autograd formula and groupmm.nn.GroupedLinear pass it on to every GEMM, backward's
included, capped at the call's rows as the C++ layer caps it (a dispatch mode records what reaches
the kernels); the results are the same bits with it and without; torch.compile traces it. The
expert-parallel block's use of it is test_moe_ep.py's. CPU."""

import re

import pytest
import torch

import groupmm
from conftest import GemmLog

ops = torch.ops.groupmm

# splits [G] with a zero-row expert, their sum S, and the buffer's M > S rows
SPLITS, M = [32, 0, 64], 160
S = sum(SPLITS)
AT = dict(splits_total="at_most")


def splits_t():
    return torch.tensor(SPLITS, dtype=torch.int32)


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def core_error(value, rows):
    """The core's message for a bad expected_rows (gemm.cpp, quantized.cpp)."""
    return re.escape(f"grouped_gemm: expected_rows={value} must be 0, or with "
                     f"splits_total=at_most in [1, M_total={rows}]")


# ---- the ops ------------------------------------------------------------------------------------

def gemm_calls(recipe):
    """{name: fn(rows, **kw)} for every grouped GEMM op over a buffer of `rows` rows (S of them the
    experts'), the output returned (or the accumulated main grad)."""
    G, N, K = len(SPLITS), 32, 64
    torch.manual_seed(3)
    sp = splits_t()
    x = torch.randn(M, K).to(torch.bfloat16)
    dy = torch.randn(M, N).to(torch.bfloat16)
    w = torch.randn(G, N, K).to(torch.bfloat16)
    b = torch.randn(G, N).to(torch.bfloat16)
    mg = torch.randn(G, N, K)
    if recipe == "bf16":
        def accumulate(rows, **kw):
            out = mg.clone()
            ops.grouped_mm_wgrad_accumulate(dy[:rows], x[:rows], sp, out, **kw)
            return out
        return {
            "grouped_mm": lambda rows, **kw: ops.grouped_mm(x[:rows], w, sp, b, **kw),
            "grouped_mm_dgrad": lambda rows, **kw: ops.grouped_mm_dgrad(dy[:rows], w, sp, **kw),
            "grouped_mm_wgrad": lambda rows, **kw: ops.grouped_mm_wgrad(dy[:rows], x[:rows], sp,
                                                                        torch.float32, **kw),
            "grouped_mm_wgrad_accumulate": accumulate,
            "grouped_gemm forward": lambda rows, **kw: ops.grouped_gemm(x[:rows], w, sp, "forward",
                                                                       **kw),
            "grouped_gemm dgrad": lambda rows, **kw: ops.grouped_gemm(dy[:rows], w, sp, "dgrad",
                                                                     **kw),
            "grouped_gemm wgrad": lambda rows, **kw: ops.grouped_gemm(dy[:rows], x[:rows], sp,
                                                                     "wgrad", **kw),
        }
    N = K = 128
    x = torch.randn(M, K).to(torch.bfloat16)
    dy = torch.randn(M, N).to(torch.bfloat16)
    w = torch.randn(G, N, K).to(torch.bfloat16)
    mg = torch.randn(G, N, K)
    qw = list(ops.group_quantize(w, None, recipe, block_2d=recipe == "fp8_block"))

    def q(t, rows):  # the activation's first `rows` rows quantized (the experts' S rows read)
        return list(ops.group_quantize(t[:rows], sp, recipe, **AT))

    def accumulate(rows, **kw):
        out = mg.clone()
        ops.grouped_mm_fp8_wgrad_accumulate(q(dy, rows), q(x, rows), sp, recipe, out, **kw)
        return out
    return {
        "grouped_mm_fp8": lambda rows, **kw: ops.grouped_mm_fp8(q(x, rows), qw, sp, recipe, **kw),
        "grouped_mm_fp8_dgrad": lambda rows, **kw: ops.grouped_mm_fp8_dgrad(q(dy, rows), qw, sp,
                                                                            recipe, **kw),
        "grouped_mm_fp8_wgrad": lambda rows, **kw: ops.grouped_mm_fp8_wgrad(
            q(dy, rows), q(x, rows), sp, recipe, out_dtype=torch.float32, **kw),
        "grouped_mm_fp8_wgrad_accumulate": accumulate,
    }


def valid_rows(out):
    """The part of an op's output its splits define (forward / dgrad: the experts' S rows)."""
    return out[:S] if out.shape[0] == M else out


@pytest.mark.parametrize("recipe", ["bf16", "fp8_current", "fp8_block", "mxfp8"])
def test_ops_give_the_same_bits(recipe):
    for name, call in gemm_calls(recipe).items():
        base = valid_rows(call(M, **AT))
        for e in (1, S, M):
            assert same(valid_rows(call(M, **AT, expected_rows=e)), base), (name, e)


def test_positional_after_splits_total():
    """The argument comes after splits_total (grouped_gemm's after zero_tail): every call that
    was valid stays valid."""
    sp = splits_t()
    x, w = torch.randn(M, 64).to(torch.bfloat16), torch.randn(3, 32, 64).to(torch.bfloat16)
    y = ops.grouped_mm(x, w, sp, None, None, "at_most")
    assert same(ops.grouped_mm(x, w, sp, None, None, "at_most", S)[:S], y[:S])
    y = ops.grouped_gemm(x, w, sp, "forward", None, None, "at_most", True)
    assert same(ops.grouped_gemm(x, w, sp, "forward", None, None, "at_most", True, S), y)


@pytest.mark.parametrize("recipe", ["bf16", "fp8_current", "mxfp8"])
def test_ops_bad_values_raise_from_the_core(recipe):
    """Negative, > 0 with exact splits, past the rows: the core's error, naming the value and the
    rows (wgrad's M is its reduction rows, the same rows)."""
    for name, call in gemm_calls(recipe).items():
        with pytest.raises(RuntimeError, match=core_error(-1, M)):
            call(M, **AT, expected_rows=-1)
        with pytest.raises(RuntimeError, match=core_error(M + 1, M)):
            call(M, **AT, expected_rows=M + 1)
        with pytest.raises(RuntimeError, match=core_error(8, S)):
            call(S, splits_total="exact", expected_rows=8)
        with pytest.raises(RuntimeError, match=core_error(8, S)):
            call(S, expected_rows=8)  # exact is the default
        assert same(call(S, splits_total="exact", expected_rows=0), call(S)), name


def test_autograd_formula_passes_it_to_dgrad_and_wgrad():
    G, N, K = len(SPLITS), 16, 32
    sp = splits_t()
    w0 = torch.randn(G, N, K).to(torch.bfloat16)
    b0 = torch.randn(G, N).to(torch.bfloat16)
    x0 = torch.randn(M, K).to(torch.bfloat16)
    dy = torch.randn(M, N).to(torch.bfloat16)

    def run(e):
        x, w, b = (t.clone().requires_grad_() for t in (x0, w0, b0))
        log = GemmLog()
        with log:
            y = ops.grouped_mm(x, w, sp, b, **AT, expected_rows=e)
            y.backward(dy)
        return [y.detach()[:S], x.grad[:S], w.grad, b.grad], log.calls

    base, calls = run(0)
    assert calls == [("grouped_mm", 0), ("grouped_mm_dgrad", 0), ("grouped_mm_wgrad", 0)]
    got, calls = run(S)
    assert calls == [("grouped_mm", S), ("grouped_mm_dgrad", S), ("grouped_mm_wgrad", S)]
    assert all(same(a, b) for a, b in zip(got, base))


def test_compiled_op_reaches_the_core():
    G, N, K = len(SPLITS), 16, 32
    sp = splits_t()
    x = torch.randn(M, K).to(torch.bfloat16).requires_grad_()
    w = torch.randn(G, N, K).to(torch.bfloat16).requires_grad_()

    def step(e):
        return lambda x, w: ops.grouped_mm(x, w, sp, **AT, expected_rows=e).float().sum()

    torch._dynamo.reset()

    grads = torch.autograd.grad(torch.compile(step(S), fullgraph=True)(x, w), [x, w])
    want = torch.autograd.grad(step(0)(x, w), [x, w])
    assert same(grads[0][:S], want[0][:S]) and same(grads[1], want[1])
    with pytest.raises(RuntimeError, match=core_error(M + 1, M)):
        torch.compile(step(M + 1), fullgraph=True)(x, w)


# ---- GroupedLinear ------------------------------------------------------------------------------

def linear_step(layer, x, dy, sp, **kw):
    """y, dx and the parameter gradients of one step (delayed wgrad run), with the GEMM calls."""
    x = x.clone().requires_grad_()
    log = GemmLog()
    with log:
        y = layer(x, sp, **kw)
        y.backward(dy)
        layer.backward_dw()
    grads = [p.main_grad if layer.accumulate_into_main_grad else p.grad
             for p in (layer.weight, layer.bias) if p is not None]
    return [y.detach()[:S], x.grad[:S]] + grads, log.calls


@pytest.mark.parametrize("recipe,main_grad,delay_wgrad", [
    ("bf16", False, False), ("bf16", True, False), ("bf16", False, True),
    ("fp8_current", False, False), ("fp8_block", False, True), ("mxfp8", True, False)])
@pytest.mark.parametrize("expected", [S, 1000])
def test_grouped_linear_passes_it_capped_and_gives_the_same_bits(recipe, main_grad, delay_wgrad,
                                                                 expected):
    """Every GEMM of a step (forward, dgrad, wgrad: the delayed one too) gets min(expected_rows,
    rows), as the C++ executors pass it; y, dx and the gradients are the bits of expected_rows=0."""
    G, K, N = len(SPLITS), 128, 128
    kw = dict(bias=recipe == "bf16", recipe=recipe, delay_wgrad=delay_wgrad,
              accumulate_into_main_grad=main_grad, splits_total="at_most")
    plain = groupmm.nn.GroupedLinear(G, K, N, **kw)
    layer = groupmm.nn.GroupedLinear(G, K, N, **kw, expected_rows=expected)
    layer.load_state_dict(plain.state_dict())
    assert layer.expected_rows == expected and f"expected_rows={expected}" in repr(layer)
    assert "expected_rows" not in repr(plain)
    sp = splits_t()
    x, dy = torch.randn(M, K).to(torch.bfloat16), torch.randn(M, N).to(torch.bfloat16)
    base, base_calls = linear_step(plain, x, dy, sp)
    got, calls = linear_step(layer, x, dy, sp)
    assert all(same(a, b) for a, b in zip(got, base))
    assert len(calls) == 3 and {c[0].replace("_fp8", "").replace("_accumulate", "")
                                for c in calls} == {"grouped_mm", "grouped_mm_dgrad",
                                                    "grouped_mm_wgrad"}, calls
    assert {e for _, e in base_calls} == {0}
    assert {e for _, e in calls} == {min(expected, M)}, calls
    # forward's expected_rows= for one call: its value, capped, reaches that step's GEMMs only
    layer.zero_grad()
    if main_grad:
        for p in (layer.weight, layer.bias):
            if p is not None:
                p.main_grad.zero_()
    _, calls = linear_step(layer, x, dy, sp, expected_rows=40)
    assert {e for _, e in calls} == {40}
    _, calls = linear_step(layer, x[:100], dy[:100], sp, expected_rows=150)
    assert {e for _, e in calls} == {100}


def test_grouped_linear_checks():
    with pytest.raises(ValueError, match=re.escape(
            "groupmm.nn.GroupedLinear(recipe='bf16'): expected_rows=8 must be 0, or > 0 with "
            "splits_total='at_most'")):
        groupmm.nn.GroupedLinear(2, 16, 16, expected_rows=8)
    with pytest.raises(ValueError, match="expected_rows=-2 must be 0"):
        groupmm.nn.GroupedLinear(2, 16, 16, splits_total="at_most", expected_rows=-2)
    with pytest.raises(TypeError, match=r"expected_rows=2\.5 must be an int"):
        groupmm.nn.GroupedLinear(2, 16, 16, splits_total="at_most", expected_rows=2.5)
    with pytest.raises(TypeError, match="expected_rows=True must be an int"):
        groupmm.nn.GroupedLinear(2, 16, 16, splits_total="at_most", expected_rows=True)
    exact = groupmm.nn.GroupedLinear(2, 16, 16)
    x, sp = torch.randn(8, 16).to(torch.bfloat16), torch.tensor([3, 5], dtype=torch.int32)
    with pytest.raises(ValueError, match=re.escape(
            "groupmm.nn.GroupedLinear.forward: expected_rows=4 must be 0, or > 0 with "
            "splits_total='at_most'")):
        exact(x, sp, expected_rows=4)
    assert same(exact(x, sp, expected_rows=0), exact(x, sp))
    at_most = groupmm.nn.GroupedLinear(2, 16, 16, splits_total="at_most", expected_rows=4)
    with pytest.raises(ValueError, match="expected_rows=-1 must be 0"):
        at_most(x, sp, expected_rows=-1)


@pytest.mark.parametrize("recipe,backend", [("bf16", "aot_eager"), ("bf16", "inductor"),
                                            ("mxfp8", "aot_eager")])
def test_grouped_linear_compiles(recipe, backend):
    """fullgraph with dynamic rows: the capped expected rows (a guard on the rows) and a per-call
    value computed from the rows trace (an int argument: the graph specializes on its value) and
    give eager's values."""
    torch._dynamo.reset()  # each case compiles `step` anew
    G, K, N = len(SPLITS), 32, 32
    layer = groupmm.nn.GroupedLinear(G, K, N, recipe=recipe, bias=recipe == "bf16",
                                     splits_total="at_most", expected_rows=S)

    def step(x, sp):
        return (layer(x, sp).float().square().mean() +
                layer(x, sp, expected_rows=x.shape[0] // 2).float().mean())

    compiled = torch.compile(step, fullgraph=True, dynamic=True, backend=backend)
    for rows in (M, S + 8, S):  # the layer's expected rows within, and capped at, the rows
        x = torch.randn(rows, K).to(torch.bfloat16).requires_grad_()
        sp = splits_t()
        got = torch.autograd.grad(compiled(x, sp), [x, layer.weight])
        want = torch.autograd.grad(step(x, sp), [x, layer.weight])
        torch.testing.assert_close(got[0][:S], want[0][:S], rtol=1e-2, atol=1e-3)
        torch.testing.assert_close(got[1], want[1], rtol=1e-2, atol=1e-3)
