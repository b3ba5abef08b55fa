"""groupmm.grouped_mm / groupmm.scaled_grouped_mm: drop-ins for torch._grouped_mm and
torch._scaled_grouped_mm, built on groupmm's grouped GEMM (torch.ops.groupmm.grouped_gemm).

groupmm's GEMM groups the rows of an activation matrix against per-expert weights [G, N, K]:
forward TN (y_g = x_g W_g^T), dgrad NN (dx_g = dy_g W_g) and wgrad NT (dW_g = dy_g^T x_g). Each of
torch's four forms, and its gradients, is one or two of these calls (the form table is in
docs/integrations.md). `offs` (cumulative group ends, int32) becomes `splits` (row counts) with a
device op (torch.diff), never read on the host: the CUDA path is graph safe and compiles without
graph breaks. The GEMMs run with SplitsTotal::at_most: rows past offs[-1] are neither read nor
written by the GEMM, and the output rows / gradient rows past it are zeros (zero_tail), where
torch leaves its output rows uninitialized.
"""

import torch
import torch.nn.functional as F

_ops = torch.ops.groupmm

# The CUDA engine needs 16-byte rows: the non-grouped dims of each form are zero-padded to this.
_ALIGN = 8
# Tests set this to exercise the CUDA padding path on the CPU backend.
_pad_on_cpu = False


def _check(cond, message):
    # torch._check's behaviour (RuntimeError) with an eager message: torch.compile traces it.
    # message: a string, or a callable that makes it (formatted only on failure, so that a
    # compiled call does not format symbolic sizes).
    if not cond:
        raise RuntimeError(message() if callable(message) else message)


def _splits_from_offs(offs):
    """offs (cumulative ends, [G] int32) -> splits (row counts), on offs' device (no host read)."""
    return torch.diff(offs, prepend=offs.new_zeros(1))


def _gemm(a, b, splits, gemm_pass, out_dtype=None):
    return _ops.grouped_gemm(a.contiguous(), b, splits, gemm_pass, None, out_dtype, "at_most",
                             gemm_pass != "wgrad")


def _rows_mm(x, bg, splits, out_dtype=None):
    """[R, N] = x_g @ bg_g per group of rows of x [R, K], bg [G, K, N] in either layout: a
    column-major bg ([G, N, K] in memory, the usual weight) runs the forward pass in place, a
    row-major one the dgrad pass in place; any other bg is copied first."""
    bt = bg.transpose(-2, -1)
    if bt.is_contiguous():
        return _gemm(x, bt, splits, "forward", out_dtype)
    return _gemm(x, bg.contiguous(), splits, "dgrad", out_dtype)


def _outer(p, q, splits, out_dtype=None):
    """[G, P, Q] = p_g^T @ q_g per group of rows of p [R, P] and q [R, Q] (the wgrad pass)."""
    return _gemm(p, q.contiguous(), splits, "wgrad", out_dtype)


def _outer_like(p, q, splits, like):
    """_outer(p, q) in the memory layout of `like` ([G, P, Q]): a `like` that is the transposed
    view of a [G, Q, P] tensor (a weight passed as w.transpose(-2, -1), torch's MoE convention)
    gets the transpose of q_g^T @ p_g, so that its gradient reaches the weight contiguous, with no
    transposing copy (autograd's layout rule) and no strided accumulation."""
    if like.dim() == 3 and not like.is_contiguous() and like.transpose(-2, -1).is_contiguous():
        return _outer(q, p, splits).transpose(-2, -1)
    return _outer(p, q, splits)


def _forward(kind, a, b, splits, out_dtype):
    if kind == "2d3d":  # a [R, K], b [G, K, N] -> [R, N]
        return _rows_mm(a, b, splits, out_dtype)
    if kind == "2d2d":  # a [M, Kt], b [Kt, N], groups along Kt -> [G, M, N]
        return _outer(a.t(), b, splits, out_dtype)
    if kind == "3d2d":  # a [G, M, K], b [K, Nt], groups along Nt -> [M, Nt]
        return _rows_mm(b.t(), a.transpose(-2, -1), splits, out_dtype).t().contiguous()
    G, M, K = a.shape  # 3d3d: a [G, M, K], b [G, K, N] -> [G, M, N]
    return _rows_mm(a.reshape(G * M, K), b, splits, out_dtype).view(G, M, b.shape[-1])


def _backward(kind, a, b, splits, dout, need_a, need_b):
    da = db = None
    if kind == "2d3d":
        if need_a:
            da = _rows_mm(dout, b.transpose(-2, -1), splits)
        if need_b:
            db = _outer_like(a, dout, splits, b)
    elif kind == "2d2d":
        if need_a:
            da = _rows_mm(b, dout.transpose(-2, -1), splits).t()
        if need_b:
            db = _rows_mm(a.t(), dout, splits)
    elif kind == "3d2d":
        dout_t = dout.t()
        if need_a:
            da = _outer(dout_t, b.t(), splits)
        if need_b:
            db = _rows_mm(dout_t, a, splits).t()
    else:
        G, M, K = a.shape
        N = b.shape[-1]
        dflat = dout.reshape(G * M, N)
        if need_a:
            da = _rows_mm(dflat, b.transpose(-2, -1), splits).view(G, M, K)
        if need_b:
            db = _outer_like(a.reshape(G * M, K), dflat, splits, b)
    return da, db


class _GroupedMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, splits, kind, out_dtype):
        ctx.save_for_backward(a, b, splits)
        ctx.kind = kind
        return _forward(kind, a, b, splits, out_dtype)

    @staticmethod
    def backward(ctx, dout):
        a, b, splits = ctx.saved_tensors
        da, db = _backward(ctx.kind, a, b, splits, dout.to(a.dtype), ctx.needs_input_grad[0],
                           ctx.needs_input_grad[1])
        return da, db, None, None, None


def _pad_dim(t, dim, to):
    """t zero-padded at the end of dim to size `to` (differentiable: F.pad)."""
    extra = to - t.shape[dim]
    if extra == 0:
        return t
    pads = [0, 0] * (t.dim() - 1 - dim % t.dim()) + [0, extra]
    return F.pad(t, pads)


def _narrow(t, n, dim=-1):
    """t's first n along dim; t itself where that is all of it (no slice node in autograd)."""
    return t if t.shape[dim] == n else t.narrow(dim, 0, n)


def _up(n):
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _torch_layout(t):
    """t in torch._grouped_mm's output layout (torch/_meta_registrations.py,
    _create_grouped_mm_output_tensor): the last dim's stride padded to 16 bytes, the rest dense
    over it. A view of a padded result already has it where only the last dim was padded; else
    (a padded row dim, or 3D x 2D's transposed result) one copy into that layout."""
    align = 16 // t.element_size()
    last = (t.shape[-1] + align - 1) // align * align
    want = (t.shape[1] * last, last, 1) if t.dim() == 3 else (last, 1)
    if t.stride() == want:
        return t
    out = torch.empty_strided(t.shape, want, dtype=t.dtype, device=t.device)
    return out.copy_(t)


def _check_args(mat_a, mat_b, offs, bias, out_dtype):
    # torch._grouped_mm's rules and messages (torch/_meta_registrations.py), each prefixed with
    # the op and followed by the values it read (messages made only on failure: see _check).
    op = "groupmm.grouped_mm: "
    one_device = " (every tensor of one call on one device)"
    _check(mat_a.dtype == mat_b.dtype and mat_a.dtype in (torch.bfloat16, torch.float16,
                                                         torch.float32),
           lambda: f"{op}expected mat_a and mat_b of one dtype, bfloat16, float16 or float32, "
                   f"got mat_a.dtype={mat_a.dtype} and mat_b.dtype={mat_b.dtype}.")
    _check(mat_a.dim() in (2, 3) and mat_b.dim() in (2, 3),
           lambda: f"{op}Multiplicands must be 2D or 3D but got mat_a.dim()={mat_a.dim()} and "
                   f"mat_b.dim()={mat_b.dim()}")
    _check(mat_b.device == mat_a.device,
           lambda: f"{op}mat_b is on {mat_b.device} but mat_a is on {mat_a.device}{one_device}")
    a2, b2 = mat_a.dim() == 2, mat_b.dim() == 2
    if not (a2 and b2):
        _check(mat_a.shape[-1] == mat_b.shape[-2],
               lambda: f"{op}contraction dimension of mat_a and mat_b must match "
                       f"(mat_a.shape[-1]={mat_a.shape[-1]}, mat_b.shape[-2]={mat_b.shape[-2]})")
    if a2 or b2:
        _check(offs is not None, lambda: f"{op}Offsets tensor not provided, but is needed for "
                                         f"{mat_a.dim()}D/{mat_b.dim()}D multiplicand layouts.")
        _check(offs.dim() == 1,
               lambda: f"{op}Offsets tensor must be 1D, but got offs.dim()={offs.dim()}.")
        _check(offs.dtype == torch.int32,
               lambda: f"{op}Offsets tensor must be integer (int32) tensor, but got "
                       f"{offs.dtype}.")
        _check(offs.device == mat_a.device,
               lambda: f"{op}offs is on {offs.device} but mat_a is on {mat_a.device}{one_device}")
        if a2 and not b2:
            _check(offs.shape[0] == mat_b.shape[0],
                   lambda: f"{op}matrix batch sizes have to match (offs.shape[0]="
                           f"{offs.shape[0]}, mat_b.shape[0]={mat_b.shape[0]})")
        if b2 and not a2:
            _check(offs.shape[0] == mat_a.shape[0],
                   lambda: f"{op}matrix batch sizes have to match (offs.shape[0]="
                           f"{offs.shape[0]}, mat_a.shape[0]={mat_a.shape[0]})")
    else:
        _check(offs is None, f"{op}Offsets tensor provided, but is not needed for 3D/3D "
                             "multiplicand layouts.")
        _check(mat_a.shape[0] == mat_b.shape[0],
               lambda: f"{op}batched dimension has to match (mat_a.shape[0]={mat_a.shape[0]}, "
                       f"mat_b.shape[0]={mat_b.shape[0]})")
    _check(bias is None, f"{op}Bias tensor provided, but it is not supported yet.")
    _check(out_dtype is None or out_dtype == mat_a.dtype or
           (out_dtype == torch.float32 and mat_a.dtype != torch.float32),
           lambda: f"{op}out_dtype={out_dtype} must be mat_a's dtype ({mat_a.dtype}) or "
                   "torch.float32")


def grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """torch._grouped_mm with groupmm's grouped GEMM; same arguments, shapes and gradients.

    Forms (offs: int32 cumulative group ends, on the tensors' device):
      2D x 3D  mat_a [M, K],    mat_b [G, K, N], offs over M   -> [M, N]
      2D x 2D  mat_a [M, K],    mat_b [K, N],    offs over K   -> [G, M, N]
      3D x 2D  mat_a [G, M, K], mat_b [K, N],    offs over N   -> [M, N]
      3D x 3D  mat_a [G, M, K], mat_b [G, K, N], offs None     -> [G, M, N]
    offs[-1] may stop short of the grouped extent: the rows (columns) past it take no part, the
    output rows past it (2D x 3D, 3D x 2D) and the gradient rows past it are zeros.
    dtypes: bfloat16 and float16 on CPU and CUDA, float32 on CPU (groupmm's reference backend);
    float32 on CUDA runs torch._grouped_mm itself (what torch runs there: its per-group fallback,
    which reads offs on the host). out_dtype: None, mat_a's dtype, or float32. bias: refused, as
    torch refuses it. What is copied, and why, is listed in docs/integrations.md.
    """
    _check_args(mat_a, mat_b, offs, bias, out_dtype)
    if mat_a.is_cuda and mat_a.dtype == torch.float32:
        return torch._grouped_mm(mat_a, mat_b, offs=offs, bias=bias, out_dtype=out_dtype)
    kind = f"{mat_a.dim()}d{mat_b.dim()}d"
    if kind == "3d3d":
        G, M = mat_a.shape[0], mat_a.shape[1]
        splits = torch.full((G,), M, dtype=torch.int32, device=mat_a.device)
    else:
        splits = _splits_from_offs(offs)
    if not (mat_a.is_cuda or _pad_on_cpu):
        if offs is None or torch.compiler.is_compiling():
            return _GroupedMM.apply(mat_a, mat_b, splits, kind, out_dtype)
        try:
            return _GroupedMM.apply(mat_a, mat_b, splits, kind, out_dtype)
        except RuntimeError as e:  # a split fault, raised at once on the CPU: say it of offs
            if not str(e).startswith("device fault in grouped_gemm"):
                raise
            raise RuntimeError(f"groupmm.grouped_mm: offs={offs.tolist()} (cumulative group "
                               "ends: group g has offs[g] - offs[g-1] rows, up to the grouped "
                               f"extent): {e}") from None
    # CUDA: the dims other than the grouped one must be multiples of 8 (16-byte rows); torch's
    # callers often pass 8-padded storage with a narrower view. Zero-pad those dims (a copy of
    # the operand), compute, and return the result in torch's own output layout (_torch_layout).
    if kind == "2d3d":  # K, N
        K, N = mat_a.shape[1], mat_b.shape[2]
        a = _pad_dim(mat_a, 1, _up(K))
        b = _pad_dim(_pad_dim(mat_b, 1, _up(K)), 2, _up(N))
        out = _narrow(_GroupedMM.apply(a, b, splits, kind, out_dtype), N)
    elif kind == "2d2d":  # M, N
        M, N = mat_a.shape[0], mat_b.shape[1]
        a = _pad_dim(mat_a, 0, _up(M))
        b = _pad_dim(mat_b, 1, _up(N))
        out = _narrow(_narrow(_GroupedMM.apply(a, b, splits, kind, out_dtype), N), M, -2)
    elif kind == "3d2d":  # M, K
        M, K = mat_a.shape[1], mat_a.shape[2]
        a = _pad_dim(_pad_dim(mat_a, 1, _up(M)), 2, _up(K))
        b = _pad_dim(mat_b, 0, _up(K))
        out = _narrow(_GroupedMM.apply(a, b, splits, kind, out_dtype), M, 0)
    else:  # 3d3d: K, N
        K, N = mat_a.shape[2], mat_b.shape[2]
        a = _pad_dim(mat_a, 2, _up(K))
        b = _pad_dim(_pad_dim(mat_b, 1, _up(K)), 2, _up(N))
        out = _narrow(_GroupedMM.apply(a, b, splits, kind, out_dtype), N)
    return _torch_layout(out)


def scaled_grouped_mm(mat_a, mat_b, scale_a, scale_b, offs=None, bias=None, scale_result=None,
                      out_dtype=None, use_fast_accum=False):
    """torch._scaled_grouped_mm's signature over groupmm's FP8 GEMM, for what groupmm computes:

    2D x 3D only: mat_a [M, K] float8_e4m3fn row-major, mat_b [G, K, N] float8_e4m3fn
    column-major (mat_b.transpose(-2, -1) contiguous, torch's required layout), offs int32 with
    offs[-1] == M, and PER-EXPERT scales: scale_a [G] and scale_b [G] float32 (the dequantizing
    scale_inv of each expert's rows of mat_a and of mat_b[g]; groupmm's fp8_current recipe, what
    group_quantize writes). Output bfloat16 [M, N]; bias [G, N] bfloat16 allowed. No autograd.

    torch's rowwise scales (scale_a [M] per row of mat_a, scale_b [G, N] per column of mat_b) and
    MXFP8 (float8_e8m0fnu) scales are refused: groupmm's FP8 GEMMs scale per expert, per 1x128 /
    128x128 block (fp8_block) or per 32 elements (mxfp8), never per row, and this function does
    not pretend otherwise.
    """
    def refuse(what):
        raise NotImplementedError(f"groupmm.scaled_grouped_mm: {what}. Supported: 2D x 3D with "
                                  "per-expert float32 scales scale_a [G], scale_b [G] "
                                  "(groupmm's fp8_current recipe); torch's rowwise scales "
                                  "(scale_a [M], scale_b [G, N]) are not (see "
                                  "docs/integrations.md)")

    op = "groupmm.scaled_grouped_mm: "
    _check(mat_a.dtype == torch.float8_e4m3fn and mat_b.dtype == torch.float8_e4m3fn,
           lambda: f"{op}Expected inputs of E4M3 FP8 type but got mat_a.dtype={mat_a.dtype} and "
                   f"mat_b.dtype={mat_b.dtype}.")
    if mat_a.dim() != 2 or mat_b.dim() != 3:
        refuse(f"the {mat_a.dim()}D x {mat_b.dim()}D form")
    if scale_a.dtype != torch.float32 or scale_b.dtype != torch.float32:
        refuse(f"scales of dtype {scale_a.dtype} / {scale_b.dtype}")
    G = mat_b.shape[0]
    if scale_b.dim() != 1 or scale_a.dim() != 1 or scale_a.shape[0] != G or \
            scale_b.shape[0] != G:
        refuse(f"scale_a {tuple(scale_a.shape)}, scale_b {tuple(scale_b.shape)} for G={G} "
               "(rowwise scaling)")
    if scale_result is not None:
        refuse("scale_result")
    _check(offs is not None and offs.dtype == torch.int32 and offs.dim() == 1 and
           offs.shape[0] == G,
           lambda: f"{op}offs must be int32 [G={G}]; got " +
                   ("None" if offs is None else f"{offs.dtype} {list(offs.shape)}"))
    _check(offs.device == mat_a.device, lambda: f"{op}offs is on {offs.device} but mat_a is on "
                                                f"{mat_a.device} (every tensor of one call on "
                                                "one device)")
    _check(out_dtype in (None, torch.bfloat16),
           lambda: f"{op}If output dtype provided, it must be torch.bfloat16 (got {out_dtype}).")
    _check(mat_a.shape[1] == mat_b.shape[1],
           lambda: f"{op}contraction dimension of mat_a and mat_b must match (mat_a.shape[1]="
                   f"{mat_a.shape[1]}, mat_b.shape[1]={mat_b.shape[1]})")
    w = mat_b.transpose(-2, -1)
    _check(w.is_contiguous(), lambda: f"{op}Expected mat_b tensor to be column major in the "
                                      f"last two dimensions, got strides {mat_b.stride()[-2:]}")
    N, K = w.shape[1], w.shape[2]
    none = mat_a.new_empty(0)
    # amax as group_quantize records it for these scales (scale_inv = amax / 448)
    x_parts = [mat_a.contiguous(), scale_a.contiguous(), none, none, scale_a * 448.0]
    w_parts = [w.reshape(G * N, K), scale_b.contiguous(), none, none, scale_b * 448.0]
    return _ops.grouped_mm_fp8(x_parts, w_parts, _splits_from_offs(offs), "fp8_current", "plain",
                               bias, use_fast_accum)
