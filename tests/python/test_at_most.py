"""The ops' at-most splits mode (splits_total='at_most'; weighted_swiglu's splits): sum(splits)
may stop short of the rows, and the rows past it belong to no expert.

Each op runs twice: exact on the first S = sum(splits) rows, and at-most on a buffer of M > S rows
whose tail is poisoned with a finite value that would change any reduction that read it. On the
valid rows the outputs must be exact mode's bit for bit, reductions over the rows (wgrad, dbias,
the per-expert quantization scales) too, and the output rows past S must not be written: torch's
deterministic mode fills the op's freshly allocated outputs (NaN for floating types, the same fill
for fp8 bytes), so an output row the op wrote shows finite values there. CPU.
"""

import contextlib

import pytest
import torch

import groupmm

ops = torch.ops.groupmm
POISON = 1000.0


@contextlib.contextmanager
def filled():
    """torch.empty fills new tensors (NaN / max int), so rows an op leaves alone are visible."""
    fill = torch.utils.deterministic.fill_uninitialized_memory
    old = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        torch.utils.deterministic.fill_uninitialized_memory = True
        yield
    finally:
        torch.use_deterministic_algorithms(old)
        torch.utils.deterministic.fill_uninitialized_memory = fill


def poisoned(t, S, value=POISON):
    """t with its rows from S on set to value (a new tensor)."""
    t = t.clone()
    t[S:] = value
    return t


def untouched(t):
    """Whether every element of t still holds torch's deterministic fill (compared as bytes)."""
    with filled():
        fill = torch.empty(t.shape, dtype=t.dtype)
    return torch.equal(t.contiguous().view(torch.uint8), fill.view(torch.uint8))


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


# splits [G] with a zero-row expert, their sum S, and the buffer's M > S rows
SPLITS, M = [32, 0, 64], 160
S = sum(SPLITS)


def splits_t():
    return torch.tensor(SPLITS, dtype=torch.int32)


# ---- 16-bit grouped GEMMs and dbias -------------------------------------------------------------

def test_grouped_mm_passes_and_dbias_at_most():
    G, N, K = len(SPLITS), 24, 40
    sp = splits_t()
    x = torch.randn(M, K).to(torch.bfloat16)
    dy = torch.randn(M, N).to(torch.bfloat16)
    w = torch.randn(G, N, K).to(torch.bfloat16)
    b = torch.randn(G, N).to(torch.bfloat16)
    xp, dyp = poisoned(x, S), poisoned(dy, S)
    with filled():
        y = ops.grouped_mm(xp, w, sp, b, splits_total="at_most")
        dx = ops.grouped_mm_dgrad(dyp, w, sp, splits_total="at_most")
        dw = ops.grouped_mm_wgrad(dyp, xp, sp, splits_total="at_most")
        db = ops.group_dbias(dyp, sp, torch.float32, splits_total="at_most")
    assert same(y[:S], ops.grouped_mm(x[:S], w, sp, b)) and untouched(y[S:])
    assert same(dx[:S], ops.grouped_mm_dgrad(dy[:S], w, sp)) and untouched(dx[S:])
    assert same(dw, ops.grouped_mm_wgrad(dy[:S], x[:S], sp))
    assert same(db, ops.group_dbias(dy[:S], sp, torch.float32))
    # The accumulating forms, into one main grad each, start from the same values.
    mg_w, mg_b = torch.randn(G, N, K), torch.randn(G, N)
    want_w, want_b = mg_w.clone(), mg_b.clone()
    ops.grouped_mm_wgrad_accumulate(dyp, xp, sp, mg_w, splits_total="at_most")
    ops.group_dbias_accumulate(dyp, sp, mg_b, splits_total="at_most")
    ops.grouped_mm_wgrad_accumulate(dy[:S], x[:S], sp, want_w)
    ops.group_dbias_accumulate(dy[:S], sp, want_b)
    assert same(mg_w, want_w) and same(mg_b, want_b)
    # exact mode refuses the short sum (a device fault, raised at once on the CPU)
    with pytest.raises(RuntimeError, match="sum of splits"):
        ops.grouped_mm(xp, w, sp)
    with pytest.raises(ValueError, match="splits_total='roughly'"):
        ops.grouped_mm(x, w, sp, splits_total="roughly")
    # at most: a sum above the rows is still a fault (checked on the device, raised on the CPU)
    with pytest.raises(RuntimeError, match="device fault in grouped_gemm"):
        ops.grouped_mm(x[:S - 1], w, sp, splits_total="at_most")


def test_grouped_mm_autograd_at_most():
    """The op's autograd formula passes the rule to dgrad, wgrad and dbias."""
    G, N, K = len(SPLITS), 16, 32
    sp = splits_t()
    w0 = torch.randn(G, N, K).to(torch.bfloat16)
    b0 = torch.randn(G, N).to(torch.bfloat16)
    x0 = torch.randn(M, K).to(torch.bfloat16)
    dy = torch.randn(M, N).to(torch.bfloat16)

    def run(x, dy, total):
        x, w, b = (t.clone().requires_grad_() for t in (x, w0, b0))
        y = ops.grouped_mm(x, w, sp, b, splits_total=total)
        y.backward(dy)
        return y.detach(), x.grad, w.grad, b.grad

    with filled():
        y, dx, dw, db = run(poisoned(x0, S), poisoned(dy, S), "at_most")
    ye, dxe, dwe, dbe = run(x0[:S], dy[:S], "exact")
    assert same(y[:S], ye) and same(dx[:S], dxe) and same(dw, dwe) and same(db, dbe)
    assert untouched(y[S:]) and untouched(dx[S:])


# ---- weighted SwiGLU ----------------------------------------------------------------------------

def test_weighted_swiglu_with_splits():
    F = 24
    sp = splits_t()
    gu = torch.randn(M, 2 * F).to(torch.bfloat16)
    prob = torch.rand(M)
    dout = torch.randn(M, F).to(torch.bfloat16)
    gup, pp, dp = poisoned(gu, S), poisoned(prob, S), poisoned(dout, S)
    with filled():
        h = ops.weighted_swiglu(gup, pp, sp)
        dgu, dprob = ops.weighted_swiglu_backward(dp, gup, pp, sp)
    assert same(h[:S], ops.weighted_swiglu(gu[:S], prob[:S])) and untouched(h[S:])
    dgu_e, dprob_e = ops.weighted_swiglu_backward(dout[:S], gu[:S], prob[:S])
    assert same(dgu[:S], dgu_e) and same(dprob[:S], dprob_e)
    assert untouched(dgu[S:]) and untouched(dprob[S:])
    # through autograd: the splits reach the backward
    a, p = gup.clone().requires_grad_(), pp.clone().requires_grad_()
    with filled():
        ops.weighted_swiglu(a, p, sp).backward(dp)
    assert same(a.grad[:S], dgu_e) and same(p.grad[:S], dprob_e)
    assert untouched(a.grad[S:]) and untouched(p.grad[S:])
    with pytest.raises(RuntimeError, match="device fault in weighted_swiglu"):
        ops.weighted_swiglu(gu[:S - 1], prob[:S - 1], sp)
    # without splits, the rows must be every expert's: a short sum does not apply
    assert same(ops.weighted_swiglu(gu, prob, None), ops.weighted_swiglu(gu, prob))


# ---- quantized operands -------------------------------------------------------------------------

@pytest.mark.parametrize("recipe", ["fp8_current", "fp8_block", "mxfp8"])
def test_quantized_gemms_at_most(recipe):
    G, N, K = len(SPLITS), 128, 128
    sp = splits_t()
    x = torch.randn(M, K).to(torch.bfloat16)
    dy = torch.randn(M, N).to(torch.bfloat16)
    w = torch.randn(G, N, K).to(torch.bfloat16)
    qw = list(ops.group_quantize(w, None, recipe, block_2d=recipe == "fp8_block"))
    xp, dyp = poisoned(x, S), poisoned(dy, S)
    at = dict(splits_total="at_most")
    with filled():
        qx = list(ops.group_quantize(xp, sp, recipe, **at))
        qdy = list(ops.group_quantize(dyp, sp, recipe, **at))
        y = ops.grouped_mm_fp8(qx, qw, sp, recipe, **at)
        dx = ops.grouped_mm_fp8_dgrad(qdy, qw, sp, recipe, **at)
        dw = ops.grouped_mm_fp8_wgrad(qdy, qx, sp, recipe, out_dtype=torch.float32, **at)
    qx_e = list(ops.group_quantize(x[:S], sp, recipe))
    qdy_e = list(ops.group_quantize(dy[:S], sp, recipe))
    # the quantized rows: the valid ones are exact mode's bytes, the tail's are not written
    assert same(qx[0][:S], qx_e[0]) and untouched(qx[0][S:])
    # the columnwise copy: per expert its transposed [K, m_g] block, at K * start_g
    cw, cw_e = qx[2].flatten(), qx_e[2].flatten()
    assert same(cw[:K * S], cw_e) and untouched(cw[K * S:])
    if recipe == "fp8_current":  # per-expert scales: the poisoned tail is in no expert's amax
        assert same(qx[1], qx_e[1]) and same(qx[4], qx_e[4])
    assert same(y[:S], ops.grouped_mm_fp8(qx_e, qw, sp, recipe)) and untouched(y[S:])
    assert same(dx[:S], ops.grouped_mm_fp8_dgrad(qdy_e, qw, sp, recipe)) and untouched(dx[S:])
    assert same(dw, ops.grouped_mm_fp8_wgrad(qdy_e, qx_e, sp, recipe, out_dtype=torch.float32))
    mg = torch.randn(G, N, K)
    want = mg.clone()
    ops.grouped_mm_fp8_wgrad_accumulate(qdy, qx, sp, recipe, mg, **at)
    ops.grouped_mm_fp8_wgrad_accumulate(qdy_e, qx_e, sp, recipe, want)
    assert same(mg, want)


# ---- GroupedLinear ------------------------------------------------------------------------------

@pytest.mark.parametrize("recipe", ["bf16", "fp8_current", "mxfp8"])
@pytest.mark.parametrize("delay_wgrad", [False, True])
def test_grouped_linear_at_most(recipe, delay_wgrad):
    G, N, K = len(SPLITS), 32, 64
    sp = splits_t()
    kw = dict(bias=recipe == "bf16", recipe=recipe, delay_wgrad=delay_wgrad)
    exact = groupmm.nn.GroupedLinear(G, K, N, **kw)
    at_most = groupmm.nn.GroupedLinear(G, K, N, **kw, splits_total="at_most")
    at_most.load_state_dict(exact.state_dict())
    assert "splits_total='at_most'" in repr(at_most)
    x = torch.randn(M, K).to(torch.bfloat16)
    dy = torch.randn(M, N).to(torch.bfloat16)

    def run(layer, x, dy):
        x = x.clone().requires_grad_()
        y = layer(x, sp)
        y.backward(dy)
        layer.backward_dw()
        return y.detach(), x.grad

    with filled():
        y, dx = run(at_most, poisoned(x, S), poisoned(dy, S))
    ye, dxe = run(exact, x[:S], dy[:S])
    assert same(y[:S], ye) and same(dx[:S], dxe) and untouched(y[S:]) and untouched(dx[S:])
    assert same(at_most.weight.grad, exact.weight.grad)
    if exact.bias is not None:
        assert same(at_most.bias.grad, exact.bias.grad)


@pytest.mark.parametrize("recipe", ["nvfp4", "mxfp4"])
def test_w4_gemm_at_most(recipe):
    """grouped_mm_w4 over a poisoned tail: the experts' rows equal exact mode's, the rest of y is
    never written, and expected_rows changes nothing on the CPU."""
    G, K, N = len(SPLITS), 64, 48
    sp = splits_t()
    w = (0.05 * torch.randn(G, N, K)).to(torch.bfloat16)
    qw = ops.group_quantize_w4(w, recipe)
    x = torch.randn(M, K).to(torch.bfloat16)
    b = torch.randn(G, N).to(torch.bfloat16)
    with filled():
        y = ops.grouped_mm_w4(poisoned(x, S), qw, sp, recipe, bias=b, splits_total="at_most",
                              expected_rows=S)
    ye = ops.grouped_mm_w4(x[:S], qw, sp, recipe, bias=b)
    assert same(y[:S], ye) and untouched(y[S:])
    with pytest.raises(RuntimeError,
                       match="expected_rows=5 must be 0, or with splits_total=at_most"):
        ops.grouped_mm_w4(x[:S], qw, sp, recipe, expected_rows=5)


@pytest.mark.parametrize("recipe", ["nvfp4_weight", "mxfp4_weight"])
def test_w4_grouped_linear_at_most(recipe):
    """The 4-bit weight recipes (forward only) take at-most splits as the training ones do."""
    G, K, N = len(SPLITS), 64, 48
    sp = splits_t()
    exact = groupmm.nn.GroupedLinear(G, K, N, recipe=recipe)
    at_most = groupmm.nn.GroupedLinear(G, K, N, recipe=recipe, splits_total="at_most",
                                       expected_rows=S)
    at_most.load_state_dict(exact.state_dict())
    x = torch.randn(M, K).to(torch.bfloat16)
    with torch.no_grad():
        with filled():
            y = at_most(poisoned(x, S), sp)
        ye = exact(x[:S], sp)
    assert same(y[:S], ye) and untouched(y[S:])


def test_grouped_linear_splits_total_checks():
    with pytest.raises(ValueError, match="splits_total='roughly' must be"):
        groupmm.nn.GroupedLinear(2, 32, 32, splits_total="roughly")
    with pytest.raises(ValueError, match="expected_rows=4 must be 0, or > 0 with"):
        groupmm.nn.GroupedLinear(2, 32, 32, recipe="mxfp4_weight", expected_rows=4)
