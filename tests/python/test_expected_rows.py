"""The grouped GEMMs' expected_rows (splits_total='at_most' only): the rows the splits are expected
to sum to, by which the CUDA heuristic sizes its kernel choice instead of the buffer's rows
(gemm.hpp, GroupedGemmArgs / QuantizedGemmArgs::expected_rows). Only which kernel runs may change
(never which rows are read or written); on the CPU nothing does.

Here: every grouped GEMM op takes it and the core validates it (its errors name the op and the
value); the op's autograd formula passes it on to backward's GEMMs (a dispatch mode records what
reaches the kernels); the results are the same bits with it and without; torch.compile traces it.
CPU."""

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
