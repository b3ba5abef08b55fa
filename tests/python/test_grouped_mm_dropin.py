"""groupmm.grouped_mm against torch._grouped_mm's own tests, ported from pytorch/pytorch:
test/test_matmul_cuda.py (test_grouped_gemm_2d_2d, _2d_3d, _3d_3d, _3d_2d: strided and transposed
operands, a zero-size group; test_grouped_gemm_compiled: unaligned sizes in 8-padded storage,
empty groups) and test/inductor's grouped GEMM test with changing offsets (one compiled graph,
new offs values). On the CPU the reference is the tests' own loop of matmuls (groupmm runs its
reference backend); on CUDA also torch._grouped_mm itself. Then what the drop-in adds: offs[-1]
short of the grouped extent, and groupmm.scaled_grouped_mm's per-expert FP8 and its refusals.
"""

import pytest
import torch

import groupmm
from groupmm import _dropin

DTYPES = [torch.bfloat16, torch.float32, torch.float16]


def check_grouped(alist, blist, gOlist, agradlist, bgradlist, outlist):
    """PyTorch's grouped_mm_helper: each group against torch.mm(a, b.t()) and its gradients."""
    for a, b, gO, agrad, bgrad, out in zip(alist, blist, gOlist, agradlist, bgradlist, outlist):
        a = a.clone().detach().requires_grad_()
        b = b.clone().detach().requires_grad_()
        out_ref = torch.mm(a, b.t())
        out_ref.backward(gO)
        torch.testing.assert_close(out, out_ref)
        if agrad is not None:
            torch.testing.assert_close(agrad, a.grad)
            torch.testing.assert_close(bgrad, b.grad)


@pytest.fixture(params=["groupmm", "torch"])
def impl(request, device):
    """groupmm.grouped_mm everywhere; torch._grouped_mm too on CUDA (the tests hold for both)."""
    if request.param == "torch" and device.type != "cuda":
        pytest.skip("torch._grouped_mm is compared on CUDA")
    return groupmm.grouped_mm if request.param == "groupmm" else torch._grouped_mm


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b_row_major", [False, True])
@pytest.mark.parametrize("a_row_major", [False, True])
@pytest.mark.parametrize("strided", [False, True])
def test_grouped_gemm_2d_2d(device, impl, strided, a_row_major, b_row_major, dtype):
    m, n, k, n_groups = 16, 32, 64, 4
    if a_row_major:
        a = torch.randn(m, k * n_groups + k * int(strided), device=device,
                        dtype=dtype)[:, :k * n_groups]
    else:
        a = torch.randn(k * n_groups + k * int(strided), m, device=device,
                        dtype=dtype).t()[:, :k * n_groups]
    if b_row_major:
        b = torch.randn(n, k * n_groups + k * int(strided), device=device,
                        dtype=dtype)[:, :k * n_groups]
    else:
        b = torch.randn(k * n_groups + k * int(strided), n, device=device,
                        dtype=dtype).t()[:, :k * n_groups]
    a.requires_grad_(True)
    b.requires_grad_(True)
    offs = torch.arange(k, n_groups * k + 1, k, device=device, dtype=torch.int32)
    out = impl(a, b.t(), offs=offs, out_dtype=dtype)
    gO = torch.rand_like(out)
    out.backward(gO)
    offs_cpu = offs.cpu()
    alist, blist, agradlist, bgradlist = [], [], [], []
    start = 0
    for i in range(n_groups):
        alist.append(a[:, start:offs_cpu[i]])
        blist.append(b[:, start:offs_cpu[i]])
        agradlist.append(a.grad[:, start:offs_cpu[i]])
        bgradlist.append(b.grad[:, start:offs_cpu[i]])
        start = offs_cpu[i]
    check_grouped(alist, blist, gO, agradlist, bgradlist, out)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b_row_major", [False, True])
@pytest.mark.parametrize("a_row_major", [False, True])
@pytest.mark.parametrize("strided", [False, True])
def test_grouped_gemm_2d_3d(device, impl, strided, a_row_major, b_row_major, dtype):
    s_int = int(strided)
    m, n, k, n_groups = 16, 32, 64, 4
    if a_row_major:
        a = torch.randn(m * n_groups, k * (1 + s_int), device=device, dtype=dtype)[:, :k]
    else:
        a = torch.randn(k, (m + 2 * s_int) * n_groups, device=device,
                        dtype=dtype).t()[:m * n_groups, :]
    if b_row_major:
        b = torch.randn(n_groups * (1 + s_int), n, k * (1 + s_int), device=device,
                        dtype=dtype)[::(1 + s_int), :, :k]
    else:
        b = torch.randn(n_groups * (1 + s_int), k * (1 + s_int), n, device=device,
                        dtype=dtype).transpose(-2, -1)[::(1 + s_int), :, :k]
    a.requires_grad_(True)
    b.requires_grad_(True)
    a_contig = a if a_row_major else a.t()
    assert a_contig.is_contiguous() is not strided
    b_contig = b if b_row_major else b.transpose(-2, -1)
    assert b_contig.is_contiguous() is not strided
    for check_zero_size in (False, True):
        a.grad = None
        b.grad = None
        offs = torch.arange(m, n_groups * m + 1, m, device=device, dtype=torch.int32)
        if check_zero_size:
            offs[0] = offs[1]
        out = impl(a, b.transpose(-2, -1), offs=offs, out_dtype=dtype)
        gO = torch.rand_like(out)
        if not check_zero_size:
            out.backward(gO)
        offs_cpu = offs.cpu()
        alist, agradlist, gOlist, outlist = [], [], [], []
        bgradlist = [None] * n_groups if check_zero_size else b.grad
        start = 0
        for i in range(n_groups):
            alist.append(a[start:offs_cpu[i]])
            agradlist.append(None if check_zero_size else a.grad[start:offs_cpu[i]])
            outlist.append(out[start:offs_cpu[i]])
            gOlist.append(gO[start:offs_cpu[i]])
            start = offs_cpu[i]
        check_grouped(alist, b, gOlist, agradlist, bgradlist, outlist)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b_row_major", [False, True])
@pytest.mark.parametrize("a_row_major", [False, True])
@pytest.mark.parametrize("strided", [False, True])
def test_grouped_gemm_3d_3d(device, impl, strided, a_row_major, b_row_major, dtype):
    s_int = int(strided)
    m, n, k, n_groups = 16, 32, 64, 4
    if a_row_major:
        a = torch.randn(n_groups * (1 + s_int), m, k * (1 + s_int), device=device,
                        dtype=dtype)[::(1 + s_int), :, :k]
    else:
        a = torch.randn(n_groups * (1 + s_int), k * (1 + s_int), m, device=device,
                        dtype=dtype).transpose(-2, -1)[::(1 + s_int), :, :k]
    if b_row_major:
        b = torch.randn(n_groups * (1 + s_int), n, k * (1 + s_int), device=device,
                        dtype=dtype)[::(1 + s_int), :, :k]
    else:
        b = torch.randn(n_groups * (1 + s_int), k * (1 + s_int), n, device=device,
                        dtype=dtype).transpose(-2, -1)[::(1 + s_int), :, :k]
    a.requires_grad_(True)
    b.requires_grad_(True)
    a_contig = a if a_row_major else a.transpose(-2, -1)
    assert a_contig.is_contiguous() is not strided
    b_contig = b if b_row_major else b.transpose(-2, -1)
    assert b_contig.is_contiguous() is not strided
    out = impl(a, b.transpose(-2, -1), out_dtype=dtype)
    gO = torch.rand_like(out)
    out.backward(gO)
    check_grouped(a, b, gO, a.grad, b.grad, out)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b_row_major", [False, True])
@pytest.mark.parametrize("a_row_major", [False, True])
@pytest.mark.parametrize("strided", [False, True])
def test_grouped_gemm_3d_2d(device, impl, strided, a_row_major, b_row_major, dtype):
    s_int = int(strided)
    m, n, k, n_groups = 16, 32, 64, 4
    if a_row_major:
        a = torch.randn(n_groups * (1 + s_int), m, k * (1 + s_int), device=device,
                        dtype=dtype)[::(1 + s_int), :, :k]
    else:
        a = torch.randn(n_groups * (1 + s_int), k * (1 + s_int), m, device=device,
                        dtype=dtype).transpose(-2, -1)[::(1 + s_int), :, :k]
    if b_row_major:
        b = torch.randn(n * n_groups, k * (1 + s_int), device=device, dtype=dtype)[:, :k]
    else:
        b = torch.randn(k, n * (n_groups + s_int), device=device,
                        dtype=dtype).transpose(-2, -1)[:n * n_groups, :]
    a.requires_grad_(True)
    b.requires_grad_(True)
    a_contig = a if a_row_major else a.transpose(-2, -1)
    assert a_contig.is_contiguous() is not strided
    b_contig = b if b_row_major else b.transpose(-2, -1)
    assert b_contig.is_contiguous() is not strided
    for check_zero_size in (False, True):
        a.grad = None
        b.grad = None
        offs = torch.arange(n, n_groups * n + 1, n, device=device, dtype=torch.int32)
        if check_zero_size:
            offs[0] = offs[1]
        out = impl(a, b.transpose(-2, -1), offs=offs, out_dtype=dtype)
        gO = torch.rand_like(out)
        if not check_zero_size:
            out.backward(gO)
        offs_cpu = offs.cpu()
        blist, outlist, bgradlist, gOlist = [], [], [], []
        agradlist = [None] * n_groups if check_zero_size else a.grad
        start = 0
        for i in range(n_groups):
            blist.append(b[start:offs_cpu[i]])
            bgradlist.append(None if check_zero_size else b.grad[start:offs_cpu[i]])
            outlist.append(out[:, start:offs_cpu[i]])
            gOlist.append(gO[:, start:offs_cpu[i]])
            start = offs_cpu[i]
        check_grouped(a, blist, gOlist, agradlist, bgradlist, outlist)


def compiled_case(op, a_row_major, b_row_major, device):
    """test_grouped_gemm_compiled's operands: unaligned m, n, k in 8-padded storage, empty
    groups (offs[0] == 0, repeated ends)."""
    dtype, align = torch.bfloat16, 8

    def up(x):
        return (x + align - 1) // align * align

    if op == "2d/2d":
        m, n = 3, 7
        if not a_row_major and not b_row_major:
            offs = torch.tensor([0, 1, 6, 6, 7], device=device, dtype=torch.int32)
        else:
            offs = torch.tensor([0, 8, 16, 16, 27], device=device, dtype=torch.int32)
        k = int(offs[-1])
        A = (torch.randn(m, up(k), device=device, dtype=dtype)[:, :k] if a_row_major else
             torch.randn(k, up(m), device=device, dtype=dtype).t()[:m, :])
        B = (torch.randn(n, up(k), device=device, dtype=dtype)[:, :k] if b_row_major else
             torch.randn(k, up(n), device=device, dtype=dtype).t()[:n, :])
    elif op == "2d/3d":
        n, k = 7, 259  # k is larger here, to validate iterating over k tiles
        if a_row_major:
            offs = torch.tensor([0, 1, 3, 3, 5], device=device, dtype=torch.int32)
        else:
            offs = torch.tensor([0, 8, 16, 16, 19], device=device, dtype=torch.int32)
        g, m = offs.shape[0], int(offs[-1])
        A = (torch.randn(m, up(k), device=device, dtype=dtype)[:, :k] if a_row_major else
             torch.randn(k, up(m), device=device, dtype=dtype).t()[:m, :])
        B = (torch.randn(g, n, up(k), device=device, dtype=dtype)[:, :, :k] if b_row_major else
             torch.randn(g, k, up(n), device=device, dtype=dtype).transpose(-2, -1)[:, :n, :])
    elif op == "3d/2d":
        m, k = 3, 13
        offs = torch.tensor([0, 8, 16, 16, 19], device=device, dtype=torch.int32)
        g, n = offs.shape[0], int(offs[-1])
        A = (torch.randn(g, m, up(k), device=device, dtype=dtype)[:, :, :k] if a_row_major else
             torch.randn(g, k, up(m), device=device, dtype=dtype).transpose(-2, -1)[:, :m, :])
        B = (torch.randn(n, up(k), device=device, dtype=dtype)[:, :k] if b_row_major else
             torch.randn(k, up(n), device=device, dtype=dtype).t()[:n, :])
    else:
        offs, g = None, 5
        m, n, k = 3, 7, 13
        A = (torch.randn(g, m, up(k), device=device, dtype=dtype)[:, :, :k] if a_row_major else
             torch.randn(g, k, up(m), device=device, dtype=dtype).transpose(-2, -1)[:, :m, :])
        B = (torch.randn(g, n, up(k), device=device, dtype=dtype)[:, :, :k] if b_row_major else
             torch.randn(g, k, up(n), device=device, dtype=dtype).transpose(-2, -1)[:, :n, :])
    return A, B, offs


def loop_reference(A, B, offs):
    """The grouped product by a loop of fp32 matmuls (host offs: test only), as torch defines it
    for mat_b = B.transpose(-2, -1)."""
    Bt = B.transpose(-2, -1).float()
    A = A.float()
    if offs is None:
        return torch.bmm(A, Bt)
    ends = offs.cpu().tolist()
    starts = [0] + ends[:-1]
    if A.dim() == 2 and Bt.dim() == 3:
        out = torch.zeros(A.shape[0], Bt.shape[-1], device=A.device)
        for g, (s, e) in enumerate(zip(starts, ends)):
            out[s:e] = A[s:e] @ Bt[g]
        return out
    if A.dim() == 2:
        return torch.stack([A[:, s:e] @ Bt[s:e] for s, e in zip(starts, ends)])
    out = torch.zeros(A.shape[1], Bt.shape[-1], device=A.device)
    for g, (s, e) in enumerate(zip(starts, ends)):
        out[:, s:e] = A[g] @ Bt[:, s:e]
    return out


@pytest.fixture(params=[False, True], ids=["native", "padded"])
def padded(request, device, monkeypatch):
    """On the CPU, also run the CUDA path's zero-padding of unaligned dims (on CUDA it always
    runs)."""
    if request.param and device.type == "cuda":
        pytest.skip("CUDA always pads")
    monkeypatch.setattr(_dropin, "_pad_on_cpu", request.param)
    return request.param


@pytest.mark.parametrize("b_row_major", [False, True])
@pytest.mark.parametrize("a_row_major", [False, True])
@pytest.mark.parametrize("op", ["2d/2d", "2d/3d", "3d/2d", "3d/3d"])
def test_grouped_gemm_compiled(device, padded, op, a_row_major, b_row_major):
    torch._dynamo.reset()
    A, B, offs = compiled_case(op, a_row_major, b_row_major, device)
    # CPU: aot_eager traces the fake kernels and the autograd graph without a C++ toolchain
    backend = "inductor" if device.type == "cuda" else "aot_eager"
    f = torch.compile(groupmm.grouped_mm, backend=backend, fullgraph=True)
    C = f(A, B.transpose(-2, -1), offs=offs)
    C_eager = groupmm.grouped_mm(A, B.transpose(-2, -1), offs=offs)
    assert C.shape == C_eager.shape
    torch.testing.assert_close(C, C_eager, atol=0, rtol=0)
    torch.testing.assert_close(C.float(), loop_reference(A, B, offs), atol=2e-2, rtol=2e-2)
    if device.type == "cuda" or padded:  # torch's output layout: the last dim padded to 16 bytes
        last = -(-C.shape[-1] * C.element_size() // 16) * 16 // C.element_size()
        assert C.stride() == ((C.shape[1] * last, last, 1) if C.dim() == 3 else (last, 1))
        assert C_eager.stride() == C.stride()
    if device.type == "cuda":
        C_ref = torch._grouped_mm(A, B.transpose(-2, -1), offs=offs)
        assert C.stride() == C_ref.stride()
        torch.testing.assert_close(C, C_ref)
    # and compiled with autograd
    A2 = A.detach().clone().requires_grad_()
    B2 = B.detach().clone().requires_grad_()
    f(A2, B2.transpose(-2, -1), offs=offs).float().sum().backward()
    A3 = A.detach().float().requires_grad_()
    B3 = B.detach().float().requires_grad_()
    loop_reference(A3, B3, offs).sum().backward()
    torch.testing.assert_close(A2.grad.float(), A3.grad, atol=5e-2, rtol=2e-2)
    torch.testing.assert_close(B2.grad.float(), B3.grad, atol=5e-2, rtol=2e-2)


@pytest.mark.parametrize("form", ["2d3d", "2d2d", "3d2d"])
def test_compiled_with_changing_offsets(device, form):
    """test/inductor's grouped GEMM with changing offsets: one compiled graph (no recompile),
    new offs values each call, including empty groups and offs[-1] short of the extent."""
    torch._dynamo.reset()
    G, M, N, K = 4, 64, 32, 48
    dt = torch.bfloat16
    if form == "2d3d":
        A = torch.randn(M, K, device=device, dtype=dt)
        B = torch.randn(G, N, K, device=device, dtype=dt).transpose(-2, -1)
    elif form == "2d2d":
        A = torch.randn(N, M, device=device, dtype=dt)
        B = torch.randn(M, K, device=device, dtype=dt)
    else:
        A = torch.randn(G, N, K, device=device, dtype=dt)
        B = torch.randn(M, K, device=device, dtype=dt).t()
    backend = "inductor" if device.type == "cuda" else "aot_eager"
    counter = torch._dynamo.testing.CompileCounter() if device.type != "cuda" else None
    f = torch.compile(groupmm.grouped_mm, backend=counter or backend, fullgraph=True)
    for ends in ([16, 32, 48, 64], [0, 10, 10, 64], [5, 5, 40, 41], [0, 0, 0, 0], [64, 64, 64, 64]):
        offs = torch.tensor(ends, device=device, dtype=torch.int32)
        out = f(A, B, offs=offs)
        want = loop_reference(A, B.transpose(-2, -1), offs)
        short = ends[-1] < M
        if form == "2d3d" and short:  # rows past offs[-1]: zeros (torch: uninitialized)
            assert (out[ends[-1]:] == 0).all()
        if form == "3d2d" and short:
            assert (out[:, ends[-1]:] == 0).all()
        torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)
    if counter is not None:
        assert counter.frame_count == 1


@pytest.mark.parametrize("form", ["2d3d", "2d2d", "3d2d"])
def test_offs_short_of_the_extent(device, form):
    """offs[-1] < the grouped extent: torch ignores the tail; groupmm reads none of it (NaN there
    changes nothing), writes zeros to the output past it, and its gradient there is zero."""
    G, R, N, K, used = 3, 40, 24, 16, 29
    dt = torch.bfloat16
    offs = torch.tensor([7, 7, used], device=device, dtype=torch.int32)
    if form == "2d3d":
        A = torch.randn(R, K, device=device, dtype=dt)
        A[used:] = float("nan")
        B = torch.randn(G, K, N, device=device, dtype=dt)
    elif form == "2d2d":
        A = torch.randn(N, R, device=device, dtype=dt)
        A[:, used:] = float("nan")
        B = torch.randn(R, K, device=device, dtype=dt)
    else:
        A = torch.randn(G, N, K, device=device, dtype=dt)
        B = torch.randn(K, R, device=device, dtype=dt)
        B[:, used:] = float("nan")
    A.requires_grad_(True)
    B.requires_grad_(True)
    out = groupmm.grouped_mm(A, B, offs=offs)
    assert not out.isnan().any()
    Bt = B.detach().transpose(-2, -1)
    if form == "2d3d":
        torch.testing.assert_close(out[:used].float(),
                                   loop_reference(A.detach()[:used], Bt, offs), atol=2e-2,
                                   rtol=2e-2)
        assert (out[used:] == 0).all()
    elif form == "2d2d":
        torch.testing.assert_close(out.float(), loop_reference(A.detach()[:, :used],
                                                               Bt[:, :used], offs),
                                   atol=2e-2, rtol=2e-2)
    else:
        torch.testing.assert_close(out[:, :used].float(),
                                   loop_reference(A.detach(), Bt[:used], offs), atol=2e-2,
                                   rtol=2e-2)
        assert (out[:, used:] == 0).all()
    out.float().sum().backward()
    assert not A.grad.isnan().any() and not B.grad.isnan().any()
    if form == "2d3d":
        assert (A.grad[used:] == 0).all()
    elif form == "2d2d":
        assert (A.grad[:, used:] == 0).all() and (B.grad[used:] == 0).all()
    else:
        assert (B.grad[:, used:] == 0).all()


@pytest.mark.parametrize("form", ["2d3d", "3d3d"])
def test_weight_gradient_in_the_weights_layout(device, form):
    """A weight w [G, N, K] passed as w.transpose(-2, -1) (torch's MoE convention): the op returns
    the gradient of that view in the view's own strides, so it reaches w contiguous without a
    transposing copy; equal to the loop of matmuls. A contiguous [G, K, N] weight likewise."""
    G, M, N, K = 3, 24, 16, 32
    offs = torch.tensor([5, 5, 24], device=device, dtype=torch.int32) if form == "2d3d" else None
    for transposed in (True, False):
        a = torch.randn(M if form == "2d3d" else G * 8, K, device=device, dtype=torch.bfloat16)
        if form == "3d3d":
            a = a.view(G, 8, K)
        a.requires_grad_()
        w = torch.randn(*((G, N, K) if transposed else (G, K, N)), device=device,
                        dtype=torch.bfloat16, requires_grad=True)
        b = w.transpose(-2, -1) if transposed else w
        seen = []
        b.register_hook(lambda g: seen.append(g.stride()))  # the gradient as the op returns it
        dout = torch.randn(*(a.shape[:-1] + (N,)), device=device, dtype=torch.bfloat16)
        groupmm.grouped_mm(a, b, offs=offs).backward(dout)
        assert seen == [b.stride()]
        assert w.grad.is_contiguous()
        ends = offs.tolist() if offs is not None else None
        for g in range(G):
            ag, dg = ((a[(ends[g - 1] if g else 0):ends[g]], dout[(ends[g - 1] if g else 0):ends[g]])
                      if ends else (a[g], dout[g]))
            want = (ag.detach().float().t() @ dg.float())  # [K, N]
            got = w.grad[g].float().t() if transposed else w.grad[g].float()
            torch.testing.assert_close(got, want, atol=0.1, rtol=2e-2)


def test_errors_follow_torch(device):
    a = torch.randn(8, 16, device=device, dtype=torch.bfloat16)
    b = torch.randn(2, 16, 8, device=device, dtype=torch.bfloat16)
    offs = torch.tensor([4, 8], device=device, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="Offsets tensor must be integer"):
        groupmm.grouped_mm(a, b, offs=offs.long())
    with pytest.raises(RuntimeError, match="Offsets tensor not provided"):
        groupmm.grouped_mm(a, b)
    with pytest.raises(RuntimeError, match="contraction dimension"):
        groupmm.grouped_mm(a, b.transpose(-2, -1), offs=offs)
    with pytest.raises(RuntimeError, match="Bias tensor provided, but it is not supported yet"):
        groupmm.grouped_mm(a, b, offs=offs, bias=torch.zeros(2, 8, device=device))
    with pytest.raises(RuntimeError, match="matrix batch sizes have to match"):
        groupmm.grouped_mm(a, b, offs=offs[:1])
    with pytest.raises(RuntimeError, match="not needed for 3D/3D"):
        groupmm.grouped_mm(b.transpose(-2, -1), b, offs=offs)
    with pytest.raises(RuntimeError, match="one dtype"):
        groupmm.grouped_mm(a.half(), b, offs=offs)
    out = groupmm.grouped_mm(a, b, offs=offs, out_dtype=torch.float32)
    assert out.dtype == torch.float32


def test_grouped_gemm_op_splits_rules(device):
    """torch.ops.groupmm.grouped_gemm: 'exact' refuses a short sum (on the CPU at once), 'at_most'
    takes it; an unknown pass or rule is named."""
    x = torch.randn(10, 16, device=device, dtype=torch.bfloat16)
    w = torch.randn(2, 8, 16, device=device, dtype=torch.bfloat16)
    splits = torch.tensor([3, 4], device=device, dtype=torch.int32)
    y = groupmm.ops.grouped_gemm(x, w, splits, "forward", None, None, "at_most", True)
    assert (y[7:] == 0).all()
    torch.testing.assert_close(y[:7], groupmm.ops.grouped_mm(x[:7], w, splits))
    with pytest.raises(ValueError, match="gemm_pass='sideways'"):
        groupmm.ops.grouped_gemm(x, w, splits, "sideways")
    with pytest.raises(ValueError, match="splits_total='roughly'"):
        groupmm.ops.grouped_gemm(x, w, splits, "forward", None, None, "roughly")
    if device.type == "cpu":
        with pytest.raises(RuntimeError, match="sum of splits"):
            groupmm.ops.grouped_gemm(x, w, splits, "forward")


# ---- scaled_grouped_mm -----------------------------------------------------------------------

def test_scaled_grouped_mm_per_expert(device):
    G, M, N, K = 3, 48, 32, 64
    offs = torch.tensor([16, 16, 48], device=device, dtype=torch.int32)
    a = torch.randn(M, K, device=device).to(torch.float8_e4m3fn)
    w = torch.randn(G, N, K, device=device).to(torch.float8_e4m3fn)
    sa = torch.rand(G, device=device) + 0.5
    sb = torch.rand(G, device=device) + 0.5
    out = groupmm.scaled_grouped_mm(a, w.transpose(-2, -1), sa, sb, offs=offs)
    assert out.dtype == torch.bfloat16 and out.shape == (M, N)
    ends = offs.cpu().tolist()
    starts = [0] + ends[:-1]
    want = torch.zeros(M, N, device=device)
    for g, (s, e) in enumerate(zip(starts, ends)):
        want[s:e] = (a[s:e].float() @ w[g].float().t()) * sa[g] * sb[g]
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=1e-2)


def test_scaled_grouped_mm_refuses_rowwise(device):
    G, M, N, K = 2, 32, 16, 32
    offs = torch.tensor([16, 32], device=device, dtype=torch.int32)
    a = torch.randn(M, K, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(G, N, K, device=device).to(torch.float8_e4m3fn).transpose(-2, -1)
    with pytest.raises(NotImplementedError, match="rowwise"):
        groupmm.scaled_grouped_mm(a, b, torch.ones(M, device=device),
                                  torch.ones(G, N, device=device), offs=offs)
    with pytest.raises(NotImplementedError, match="2D x 2D form"):
        groupmm.scaled_grouped_mm(a, a.t(), torch.ones(M, device=device),
                                  torch.ones(M, device=device), offs=offs)
    with pytest.raises(RuntimeError, match="E4M3"):
        groupmm.scaled_grouped_mm(a.float(), b, torch.ones(G, device=device),
                                  torch.ones(G, device=device), offs=offs)
