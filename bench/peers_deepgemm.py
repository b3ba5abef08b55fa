#!/usr/bin/env python3
"""groupmm's FP8 blockwise grouped GEMM (torch.ops.groupmm.grouped_mm_fp8, recipe fp8_block:
activations in 1x128 blocks, weights in 128x128 blocks, fp32 scales) against DeepGEMM's grouped
FP8 GEMMs, the kernels DeepSeek-V3 serving and training run, in one process, on DeepSeek-V3's
experts (hidden 7168, expert width 2048: gate_up N 4096 K 7168, down N 7168 K 2048), 32 local
experts (EP8 of 256) and 256, balanced and Zipf routings. Two DeepGEMM layouts:
  contiguous  m_grouped_fp8_gemm_nt_contiguous: the experts' rows concatenated, each expert padded
              to DeepGEMM's M alignment, an m_indices row -> expert map (-1 on padding rows,
              their expert's id for 1.x); 4096-32768 routed rows (prefill, training).
  masked      m_grouped_fp8_gemm_nt_masked: [G, max_m, K] with a per-expert valid-row count and
              the expected_m hint (DeepEP's low-latency layout: decode); 1-256 rows an expert on
              average (DeepGEMM's own masked tests run 20 and 192 over 32 groups).
Prints one line per case: both medians (us), TFLOP/s of the valid rows, the ratio
DeepGEMM / groupmm (> 1 means groupmm is faster), the outputs' difference and, for the masked
(decode) cases, the fraction of the device's copy bandwidth that the active experts' weight bytes
reach.

    PYTHONPATH=python python3 bench/peers_deepgemm.py [--layouts contiguous,masked]
        [--experts 32,256] [--matrices gate_up,down] [--routings balanced,zipf]
        [--rows 4096,8192,16384,32768] [--expected-m 1,4,16,32,64,128,256]
        [--groupmm-only] [--json out.json]

Operands: both sides multiply the same FP8 bytes. x (bf16 [rows, K], the experts' rows in expert
order) and W (bf16 [G, N, K]) are quantized once with groupmm's group_quantize(recipe
'fp8_block'; weights with block_2d). groupmm multiplies them as they are (rows with splits).
DeepGEMM gets the same e4m3 bytes and fp32 scales in its layouts: each row copied to its place in
the padded (contiguous) or [G, max_m, K] (masked) buffer, padding rows zero with scale 1, the
activation scales made MN-major and TMA-aligned by DeepGEMM's own helper (see its API
generations below), so the timed call transforms nothing; the weight scales are the first
G N/128 rows of groupmm's [G N/128 + G, K/128] buffer viewed as [G, N/128, K/128], zero-copy.
Building DeepGEMM's layouts is not timed (a server gets its rows in them from its dispatch), nor
is groupmm's compact form (its permute).
Counts: the C++ harness's split rule (tools/bench/harness.cpp: balanced, or Zipf weights
1/rank^1.1 shuffled), each expert capped at the tokens behind the rows (top-8 of 256 experts: an
expert sees a token at most once). masked: expected_m = 1.2 x the mean rows an expert, as
DeepGEMM's tests pass it; max_m = the largest count rounded up to 256 (1.x asserts a multiple of
its block M). TFLOP/s count the valid rows only (DeepGEMM's padding rows are overhead of its
layout).

DeepGEMM's API generations, found by name and called positionally with their defaults (on sm_90
fp32 scales select the 1x128 / 128x128 recipe): 1.x, the Python JIT package
(m_grouped_gemm_fp8_fp8_bf16_nt_contiguous / _masked, get_col_major_tma_aligned_tensor,
get_m_alignment_for_contiguous_layout), and 2.x, the C++ extension
(m_grouped_fp8_gemm_nt_contiguous, m_grouped_fp8_gemm_nt_masked or fp8_m_grouped_gemm_nt_masked,
get_mn_major_tma_aligned_tensor, get_mk_alignment_for_contiguous_layout; 2.6 keeps these names
as aliases of m_grouped_fp8_fp4_gemm_*).

Checks: DeepGEMM's calc_diff, 1 - 2 sum(xy) / sum(x^2 + y^2), between the two outputs over the
valid rows; 1e-3 or more fails the row (exit status 1). Both outputs are also compared with the
float64 product of the dequantized operands on a few experts (up to 512 rows each); groupmm's
must stay under 1e-3 too.

Timing (bench/peers_w4.py's time_graphs): each side's call is captured --reps times in one CUDA
graph, each launch after a 256 MB write that flushes L2, so replaying it hides the launch cost.
Every round replays both sides and a graph of the writes alone, in alternating order; a side's
time in a round is its replay less the writes' replay, over --reps. Each figure is the median
over --rounds rounds of that mean of --reps launches. A side whose call cannot be captured is
timed eagerly instead (same flushes, launch cost included) and the row says so. DeepGEMM
JIT-compiles its kernels on first use: the correctness call before timing is that warm-up, and
time_graphs warms up twice more on its capture stream.

Hopper only for timing (groupmm's FP8 kernels and DeepGEMM's fp32-scale kernels are sm_90); on a
machine without CUDA it runs a smoke test instead: tiny shapes through groupmm's CPU backend
against the float64 product of the dequantized operands, and the DeepGEMM layouts built from the
same bytes evaluated by their documented meaning (float64) and gathered back; DeepGEMM is reported
unavailable. Without an importable deep_gemm it times groupmm alone and says why.
"""
import argparse
import importlib
import importlib.metadata
import math
import random
import statistics
import sys

import torch

import groupmm  # noqa: F401  (registers torch.ops.groupmm)
import peers_common
from peers_common import PeerMissing
from peers_w4 import copy_bandwidth, time_graphs  # the same timing as the MXFP4 peer (bench/)

ops = torch.ops.groupmm
MATRICES = {"gate_up": (4096, 7168), "down": (7168, 2048)}  # name: (N, K), DeepSeek-V3 experts
EXPERTS = [32, 256]  # local experts: EP8 of 256, and all 256
ROUTINGS = ["balanced", "zipf"]
ROWS = [4096, 8192, 16384, 32768]  # contiguous: routed rows to the local experts
EXPECTED_M = [1, 4, 16, 32, 64, 128, 256]  # masked: mean rows an expert
LAYOUTS = ["contiguous", "masked"]
ROUTED_EXPERTS, TOPK = 256, 8  # DeepSeek-V3's router: top-8 of 256
ZIPF_S = 1.1
MAX_DIFF = 1e-3  # DeepGEMM's own bound for FP8 x FP8 (tests/generators.py, QuantConfig.max_diff)
BLOCK = 128
MASKED_M_ALIGN = 256  # DeepGEMM 1.x asserts max_m % block_m == 0 (block_m up to 256) past a block


# ---- the shared problem: counts, operands, reference ------------------------------------------

def route_counts(routing, G, total, seed):
    """Rows per expert summing to total: the C++ harness's bench_splits rule (balanced, or Zipf
    weights 1/rank^1.1 shuffled; floor, then the remainder one at a time), each expert capped at
    the tokens behind the rows (total rows = tokens x TOPK x G / ROUTED_EXPERTS, and a token
    picks an expert once), the excess spread over the others by the same weights."""
    rng = random.Random(seed)
    w = [1.0] * G
    if routing == "zipf":
        w = [1.0 / (i + 1) ** ZIPF_S for i in range(G)]
        rng.shuffle(w)
    cap = math.ceil(total * ROUTED_EXPERTS / (TOPK * G))
    counts, free, left = [0] * G, set(range(G)), total
    while True:
        ws = sum(w[i] for i in free)
        share = {i: math.floor(w[i] / ws * left) for i in free}
        over = [i for i in free if share[i] > cap]
        if not over:
            break
        for i in over:
            counts[i] = cap
            free.discard(i)
            left -= cap
    for i in free:
        counts[i] = share[i]
    order = sorted(free)
    i = 0
    while sum(counts) < total and any(counts[j] < cap for j in order):
        j = order[i % len(order)]
        if counts[j] < cap:
            counts[j] += 1
        i += 1
    return counts


def starts_of(counts):
    out = [0]
    for c in counts[:-1]:
        out.append(out[-1] + c)
    return out


def quantize_weights(G, N, K, device, seed):
    """groupmm's fp8_block weights (rowwise only: the forward reads nothing else) of random bf16
    W [G, N, K]: the 5 tensors grouped_mm_fp8 takes."""
    gen = torch.Generator(device=device).manual_seed(seed)
    w = torch.randn(G, N, K, generator=gen, device=device, dtype=torch.bfloat16) / K ** 0.5
    q = list(ops.group_quantize(w, None, "fp8_block", direction="rowwise", block_2d=True))
    del w
    return q


def quantize_rows(counts, K, device, seed):
    """groupmm's fp8_block activations of random bf16 x [sum(counts), K] in expert order, and the
    splits (int32 [G] on the device)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    splits = torch.tensor(counts, dtype=torch.int32, device=device)
    x = torch.randn(sum(counts), K, generator=gen, device=device, dtype=torch.bfloat16)
    q = list(ops.group_quantize(x, splits, "fp8_block", direction="rowwise"))
    del x
    return q, splits


def weight_views(qw, G, N, K):
    """DeepGEMM's rhs pair from groupmm's quantized weights, zero-copy: data [G, N, K] and the
    128x128 scales [G, N/128, K/128] (groupmm's buffer holds G N/128 block-rows, expert g's from
    row g N/128, then G rows of slack)."""
    return qw[0].view(G, N, K), qw[1][:G * N // BLOCK].view(G, N // BLOCK, K // BLOCK)


def dequant_rows(data, scale):
    """float64 [m, K] of e4m3 rows [m, K] and their 1x128 scales [m, K/128]."""
    m, K = data.shape
    return (data.double().view(m, K // BLOCK, BLOCK) * scale.double()[:, :, None]).view(m, K)


def dequant_weight(data, scale):
    """float64 [N, K] of one expert's e4m3 [N, K] and its 128x128 scales [N/128, K/128]."""
    N, K = data.shape
    v = data.double().view(N // BLOCK, BLOCK, K // BLOCK, BLOCK) * scale.double()[:, None, :, None]
    return v.view(N, K)


def calc_diff(x, y, chunk=4096):
    """DeepGEMM's calc_diff, 1 - 2 sum(xy) / sum(x^2 + y^2) in float64, over row chunks."""
    xy, sq = 0.0, 0.0
    for s in range(0, x.shape[0], chunk):
        a, b = x[s:s + chunk].double(), y[s:s + chunk].double()
        xy += (a * b).sum().item()
        sq += (a * a + b * b).sum().item()
    return 1.0 - 2.0 * xy / sq if sq > 0 else 0.0


def ref_diffs(ys, qx, qw, counts, N, K, n_experts=3, max_rows=512):
    """calc_diff of each output in ys (rows in expert order) against the float64 product of the
    dequantized operands, over the n_experts experts with the most rows and the one with the
    fewest (non-zero), up to max_rows rows each. n_experts=None: every expert, every row."""
    starts = starts_of(counts)
    live = [g for g in range(len(counts)) if counts[g] > 0]
    if n_experts is None:
        picked, max_rows = live, None
    else:
        by_rows = sorted(live, key=lambda g: -counts[g])
        picked = sorted(set(by_rows[:n_experts] + by_rows[-1:]))
    refs, outs = [], [[] for _ in ys]
    wd, ws = weight_views(qw, len(counts), N, K)
    for g in picked:
        s = starts[g]
        e = s + (counts[g] if max_rows is None else min(counts[g], max_rows))
        refs.append(dequant_rows(qx[0][s:e], qx[1][s:e]) @ dequant_weight(wd[g], ws[g]).t())
        for i, y in enumerate(ys):
            outs[i].append(y[s:e])
    ref = torch.cat(refs)
    return [calc_diff(torch.cat(o), ref) for o in outs]


# ---- DeepGEMM's layouts, from groupmm's bytes ---------------------------------------------------

def fp8_zeros(shape, device):
    return torch.zeros(shape, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)


def layout_facts(layout, counts, alignment):
    """What DeepGEMM's layout makes of the counts: the padded rows (contiguous), or max_m and
    the expected_m hint (masked)."""
    if layout == "contiguous":
        return dict(padded_rows=sum(-(-c // alignment) * alignment for c in counts))
    return dict(max_m=max(MASKED_M_ALIGN, -(-max(counts) // MASKED_M_ALIGN) * MASKED_M_ALIGN),
                expected_m=expected_m_of(counts))


def contiguous_operands(qx, counts, alignment, align_scales, pad_with_expert=False):
    """DeepGEMM's contiguous lhs from groupmm's rows: a [Mp, K] e4m3 with expert g's rows at
    padded_start_g, each expert padded to `alignment` rows (zeros, scale 1), sfa [Mp, K/128]
    through align_scales (DeepGEMM's TMA-alignment helper on the GPU), m_indices int32 [Mp]
    (the expert of each row; padding rows -1, which DeepGEMM 2.x skips block by block, or with
    pad_with_expert their expert's id: early 1.x releases read a block's expert from its first
    row and had no -1), and the destination row of every source row (to gather the output
    back)."""
    data, scale = qx[0], qx[1]
    device, K = data.device, data.shape[1]
    padded = [-(-c // alignment) * alignment for c in counts]
    Mp = sum(padded)
    dest = torch.cat([torch.arange(c, device=device) + s
                      for c, s in zip(counts, starts_of(padded))])
    a = fp8_zeros((Mp, K), device)
    a.view(torch.uint8).index_copy_(0, dest, data.view(torch.uint8))
    sfa = torch.ones(Mp, K // BLOCK, dtype=torch.float32, device=device)
    sfa.index_copy_(0, dest, scale)
    ids = torch.arange(len(counts), device=device, dtype=torch.int32)
    if pad_with_expert:
        m_indices = torch.repeat_interleave(ids, torch.tensor(padded, device=device))
    else:
        m_indices = torch.full((Mp,), -1, dtype=torch.int32, device=device)
        real = torch.repeat_interleave(ids, torch.tensor(counts, device=device))
        m_indices.index_copy_(0, dest, real)
    return (a, align_scales(sfa)), m_indices, dest


def masked_operands(qx, counts, align_scales):
    """DeepGEMM's masked lhs from groupmm's rows: a [G, max_m, K] e4m3 (expert g's rows first in
    slice g; zeros, scale 1 past them), sfa [G, max_m, K/128] through align_scales, masked_m
    int32 [G], and the flat destination row (g max_m + r) of every source row."""
    data, scale = qx[0], qx[1]
    device, K, G = data.device, data.shape[1], len(counts)
    max_m = layout_facts("masked", counts, BLOCK)["max_m"]
    dest = torch.cat([torch.arange(c, device=device) + g * max_m for g, c in enumerate(counts)])
    a = fp8_zeros((G * max_m, K), device)
    a.view(torch.uint8).index_copy_(0, dest, data.view(torch.uint8))
    sfa = torch.ones(G * max_m, K // BLOCK, dtype=torch.float32, device=device)
    sfa.index_copy_(0, dest, scale)
    masked_m = torch.tensor(counts, dtype=torch.int32, device=device)
    return (a.view(G, max_m, K), align_scales(sfa.view(G, max_m, K // BLOCK))), masked_m, dest


def expected_m_of(counts):
    """DeepGEMM's expected_m hint as its masked tests pass it: 1.2 x the mean rows an expert."""
    return max(1, int(1.2 * sum(counts) / len(counts)))


def emulate_contiguous(lhs, rhs, m_indices):
    """float64 [Mp, N]: what m_grouped_fp8_gemm_nt_contiguous computes, by its documented meaning
    (row i times expert m_indices[i]'s weights; -1 rows left 0). The CPU smoke test's check of
    contiguous_operands."""
    (a, sfa), (b, sfb) = lhs, rhs
    y = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64)
    for g in range(b.shape[0]):
        rows = (m_indices == g).nonzero().flatten()
        if rows.numel():
            y[rows] = dequant_rows(a[rows], sfa[rows]) @ dequant_weight(b[g], sfb[g]).t()
    return y


def emulate_masked(lhs, rhs, masked_m):
    """float64 [G, max_m, N]: what m_grouped_fp8_gemm_nt_masked computes (the first masked_m[g]
    rows of slice g times expert g's weights; the rest left 0)."""
    (a, sfa), (b, sfb) = lhs, rhs
    y = torch.zeros(a.shape[0], a.shape[1], b.shape[1], dtype=torch.float64)
    for g, m in enumerate(masked_m.tolist()):
        if m:
            y[g, :m] = dequant_rows(a[g, :m], sfa[g, :m]) @ dequant_weight(b[g], sfb[g]).t()
    return y


# ---- the peer: DeepGEMM, whichever of its API generations is installed ---------------------------



# Names by generation: 2.x (C++ extension, 2025-09 on; 2.6 keeps these as aliases of
# m_grouped_fp8_fp4_gemm_*) first, then 1.x (Python JIT).
CONTIGUOUS_NAMES = ["m_grouped_fp8_gemm_nt_contiguous", "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous"]
MASKED_NAMES = ["m_grouped_fp8_gemm_nt_masked", "fp8_m_grouped_gemm_nt_masked",
                "m_grouped_gemm_fp8_fp8_bf16_nt_masked"]
TMA_ALIGN_NAMES = ["get_mn_major_tma_aligned_tensor", "get_col_major_tma_aligned_tensor"]
ALIGNMENT_NAMES = ["get_mk_alignment_for_contiguous_layout",
                   "get_m_alignment_for_contiguous_layout"]


def _find(modules, names):
    """(name, attribute) of the first of names found on any of modules, else (None, None)."""
    for name in names:
        for mod in modules:
            fn = getattr(mod, name, None)
            if fn is not None:
                return name, fn
    return None, None


def load_peer():
    """The DeepGEMM adapter: a namespace with the grouped GEMMs (contiguous, masked; None where the
    installed version has no such function, with the reason in missing), the scale helper, the
    contiguous layout's M alignment, and where it came from."""
    try:
        import deep_gemm
    except Exception as e:  # ImportError, or its extension's initialisation (CUDA home, driver)
        raise PeerMissing(f"`import deep_gemm` failed: {type(e).__name__}: {e}".splitlines()[0]) \
            from None
    mods = [deep_gemm]
    for sub in ("deep_gemm.utils", "deep_gemm.jit_kernels", "deep_gemm.jit_kernels.utils"):
        try:
            mods.append(importlib.import_module(sub))
        except Exception:
            pass
    p = argparse.Namespace(origin=getattr(deep_gemm, "__file__", "?"), missing=[])
    try:
        p.version = importlib.metadata.version("deep_gemm")
    except Exception:
        p.version = getattr(deep_gemm, "__version__", "unknown")
    p.contiguous_name, p.contiguous = _find(mods, CONTIGUOUS_NAMES)
    p.masked_name, p.masked = _find(mods, MASKED_NAMES)
    p.tma_align_name, p.tma_align = _find(mods, TMA_ALIGN_NAMES)
    p.alignment_name, alignment = _find(mods, ALIGNMENT_NAMES)
    if p.contiguous is None:
        p.missing.append(f"contiguous: none of {CONTIGUOUS_NAMES}")
    if p.masked is None:
        p.missing.append(f"masked: none of {MASKED_NAMES}")
    if p.contiguous is None and p.masked is None:
        raise PeerMissing(f"deep_gemm {p.version} ({p.origin}) has neither grouped GEMM: "
                          + "; ".join(p.missing))
    if p.tma_align is None:
        # The GEMMs transpose misaligned scales themselves (inside the timed call): refuse rather
        # than time a transpose as DeepGEMM's GEMM.
        raise PeerMissing(f"deep_gemm {p.version} has none of {TMA_ALIGN_NAMES} to lay out the "
                          "activation scales before timing")
    p.pad_with_expert = p.contiguous_name == CONTIGUOUS_NAMES[-1]
    p.alignment = int(alignment()) if alignment is not None else BLOCK
    if alignment is None:
        p.alignment_name = f"none of {ALIGNMENT_NAMES}: {BLOCK} assumed"
    p.api = (f"{p.contiguous_name or '-'}(lhs, rhs, out, m_indices), "
             f"{p.masked_name or '-'}(lhs, rhs, out, masked_m, expected_m); scales: "
             f"{p.tma_align_name}; M alignment {p.alignment} ({p.alignment_name}), padding rows' "
             f"m_indices {'their expert' if p.pad_with_expert else '-1'}")
    return p


def peer_status(args):
    """(peer adapter or None, a line saying which peer runs, or why none)."""
    return peers_common.peer_status(
        args, "DeepGEMM", load_peer,
        lambda p: f"{p.version} ({p.origin}): {p.api}"
        + ("; missing " + "; ".join(p.missing) if p.missing else ""))


def peer_case(p, layout, qx, qw, counts, G, N, K):
    """(zero-argument DeepGEMM call, valid rows of its output in groupmm's row order) over the same
    bytes as groupmm's call. Builds everything outside the timed call."""
    rhs = weight_views(qw, G, N, K)
    device = qx[0].device
    if layout == "contiguous":
        if p.contiguous is None:
            raise PeerMissing(p.missing[0])
        lhs, m_indices, dest = contiguous_operands(qx, counts, p.alignment, p.tma_align,
                                                   pad_with_expert=p.pad_with_expert)
        out = torch.empty(lhs[0].shape[0], N, dtype=torch.bfloat16, device=device)
        return (lambda: p.contiguous(lhs, rhs, out, m_indices),
                lambda: out.index_select(0, dest))
    if p.masked is None:
        raise PeerMissing(p.missing[-1])
    lhs, masked_m, dest = masked_operands(qx, counts, p.tma_align)
    expected_m = expected_m_of(counts)
    out = torch.empty(G, lhs[0].shape[1], N, dtype=torch.bfloat16, device=device)
    return (lambda: p.masked(lhs, rhs, out, masked_m, expected_m),
            lambda: out.view(-1, N).index_select(0, dest))


# ---- timing -----------------------------------------------------------------------------------

def time_eager(fn, flush, reps, rounds):
    """Median us per launch of fn launched eagerly (launch cost included), each launch after the
    L2-flushing write: per round, reps x (write, fn) less reps writes alone."""
    def run(with_fn):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            flush.fill_(1)
            if with_fn:
                fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    fn()
    torch.cuda.synchronize()
    per_round = []
    for r in range(rounds):
        if r % 2 == 0:
            with_fn = run(True)
            alone = run(False)
        else:
            alone = run(False)
            with_fn = run(True)
        per_round.append((with_fn - alone) * 1e3 / reps)
    return statistics.median(per_round)


# ---- the runs ---------------------------------------------------------------------------------

def layout_sizes(args, layout, G):
    """(label, total rows) of each case of the layout."""
    if layout == "contiguous":
        return [(rows, rows) for rows in args.rows]
    return [(m, m * G) for m in args.expected_m]


def case_seed(args, routing_index, size):
    return args.seed + 1000 * routing_index + size


def smoke(args):
    """CPU: tiny shapes through grouped_mm_fp8 (fp8_block) against the float64 product of the
    dequantized operands (every expert, every row), and both DeepGEMM layouts built from the same
    bytes, evaluated by their meaning and gathered back (contiguous: with both m_indices paddings);
    then the counts of every GPU case of the arguments (sums, caps). Returns the rows."""
    G, rows_out = 4, []
    shapes = {"gate_up": (128, 256), "down": (256, 128)}  # N < K and N > K, as DeepSeek-V3's
    cases = [("contiguous", "balanced", 200), ("contiguous", "zipf", 200),
             ("contiguous", "zipf", 3), ("masked", "balanced", 12), ("masked", "zipf", 12),
             ("masked", "zipf", 3)]
    for m, (name, (N, K)) in enumerate(shapes.items()):
        qw = quantize_weights(G, N, K, "cpu", seed=m)
        rhs = weight_views(qw, G, N, K)
        for c, (layout, routing, total) in enumerate(cases):
            counts = route_counts(routing, G, total, seed=c)
            qx, splits = quantize_rows(counts, K, "cpu", seed=100 + c)
            y = ops.grouped_mm_fp8(qx, qw, splits, "fp8_block")
            same_padding = True
            if layout == "contiguous":
                lhs, m_indices, dest = contiguous_operands(qx, counts, BLOCK, lambda s: s)
                y_dg = emulate_contiguous(lhs, rhs, m_indices)[dest]
                lhs1, m_indices1, dest1 = contiguous_operands(qx, counts, BLOCK, lambda s: s,
                                                              pad_with_expert=True)
                # float64 products over other row sets: equal up to summation order
                same_padding = calc_diff(emulate_contiguous(lhs1, rhs, m_indices1)[dest1],
                                         y_dg) < 1e-12
            else:
                lhs, masked_m, dest = masked_operands(qx, counts, lambda s: s)
                y_dg = emulate_masked(lhs, rhs, masked_m).view(-1, N)[dest]
            facts = layout_facts(layout, counts, BLOCK)
            ref_g, ref_layout = ref_diffs([y, y_dg], qx, qw, counts, N, K, n_experts=None)
            diff = calc_diff(y, y_dg)
            # The emulated layout must reproduce the float64 reference (the same products):
            # anything above summation-order noise is a layout bug.
            ok = ref_g < MAX_DIFF and diff < MAX_DIFF and ref_layout < 1e-12 and same_padding
            print(f"{layout:<10} {name:<8} G={G} N={N} K={K} {routing:<8} rows {sum(counts):>3} "
                  f"counts {counts}  cpu smoke  groupmm vs float64 {ref_g:.1e}, DeepGEMM layout "
                  f"(emulated) vs float64 {ref_layout:.1e}, calc_diff {diff:.1e}"
                  f"{'' if ok else '  FAIL'}")
            rows_out.append(dict(layout=layout, matrix=name, G=G, N=N, K=K, routing=routing,
                                 rows=sum(counts), counts=counts, groupmm_ref_diff=ref_g,
                                 layout_ref_diff=ref_layout, calc_diff=diff, ok=ok, **facts))
    bad = []
    for G in args.experts:
        for layout in args.layouts:
            for size, total in layout_sizes(args, layout, G):
                for r, routing in enumerate(args.routings):
                    counts = route_counts(routing, G, total, seed=case_seed(args, r, size))
                    cap = math.ceil(total * ROUTED_EXPERTS / (TOPK * G))
                    if sum(counts) != total or max(counts) > cap or min(counts) < 0:
                        bad.append((layout, G, routing, size))
    print(f"counts of the GPU cases: {'ok' if not bad else f'FAIL {bad}'}")
    if bad:
        rows_out.append(dict(layout="counts", ok=False, bad=bad))
    return rows_out


HEADER = (f"{'layout':<10} {'exp':>4} {'G':>3} {'matrix':<7} {'routing':<8} {'size':>6} "
          f"{'rows':>6} {'act':>4} {'groupmm us':>10} {'DG us':>9} {'g TFLOP/s':>9} "
          f"{'DG TFLOP/s':>10} {'g wcopy':>7} {'DG wcopy':>8} {'DG/g':>6} {'calc_diff':>9}")


def row_line(row):
    """A row of the printed table (HEADER's columns); '-' where a figure is missing, the weight
    copy fractions only for the masked (decode) layout."""
    def cell(key, fmt, width, show=True):
        v = row.get(key) if show else None
        return f"{'-' if v is None else format(v, fmt):>{width}}"
    masked = row["layout"] == "masked"
    diff = row.get("calc_diff", row["groupmm_ref_diff"])
    return (f"{row['layout']:<10} {cell('expected_m', 'd', 4)} {row['G']:>3} {row['matrix']:<7} "
            f"{row['routing']:<8} {row['size']:>6} {row['rows']:>6} {row['active_experts']:>4} "
            f"{cell('groupmm_us', '.1f', 10)} {cell('peer_us', '.1f', 9)} "
            f"{cell('groupmm_tflops', '.0f', 9)} {cell('peer_tflops', '.0f', 10)} "
            f"{cell('groupmm_weight_copy_fraction', '.0%', 7, masked)} "
            f"{cell('peer_weight_copy_fraction', '.0%', 8, masked)} {cell('ratio', '.2f', 6)} "
            f"{diff:9.1e}{'' if row['ok'] else '  FAIL'}")


def run_case(args, peer, layout, qw, G, N, K, matrix, routing, size, total, seed, flush, copy_bps):
    counts = route_counts(routing, G, total, seed=seed)
    qx, splits = quantize_rows(counts, K, qw[0].device, seed=seed)
    active = sum(c > 0 for c in counts)
    row = dict(layout=layout, matrix=matrix, G=G, N=N, K=K, routing=routing, size=size,
               rows=sum(counts), active_experts=active, max_count=max(counts), counts=counts,
               **layout_facts(layout, counts, peer.alignment if peer is not None else BLOCK))
    fns = {"groupmm": lambda: ops.grouped_mm_fp8(qx, qw, splits, "fp8_block")}
    ys = [fns["groupmm"]()]
    if peer is not None:
        try:
            fns["peer"], gather = peer_case(peer, layout, qx, qw, counts, G, N, K)
            fns["peer"]()  # DeepGEMM's JIT compilation happens here, outside timing
            ys.append(gather())
            torch.cuda.synchronize()
        except Exception as e:
            # DeepGEMM's refusals (RuntimeError from 2.x, AssertionError from 1.x) and running
            # out of memory (the masked buffers of a skewed routing are large): the row keeps
            # groupmm's figures.
            row["peer_error"] = f"{type(e).__name__}: {e}".splitlines()[0]
            fns.pop("peer", None)
            ys = ys[:1]
            torch.cuda.empty_cache()
    refs = ref_diffs(ys, qx, qw, counts, N, K)
    row["groupmm_ref_diff"] = refs[0]
    ok = refs[0] < MAX_DIFF
    if len(ys) == 2:
        row["peer_ref_diff"] = refs[1]
        row["calc_diff"] = calc_diff(ys[0], ys[1])
        ok = ok and row["calc_diff"] < MAX_DIFF
    row["ok"] = ok
    del ys
    us, errors = time_graphs(fns, flush, args.reps, args.rounds)
    for side, err in errors.items():
        us[side] = time_eager(fns[side], flush, args.reps, args.rounds)
        row[f"{side}_timing"] = f"eager, launch cost included ({err})"
    flops = 2.0 * row["rows"] * N * K
    weight_bytes = active * (N * K + (N // BLOCK) * (K // BLOCK) * 4)
    peers_common.record_times(row, us, flops, weight_bytes, copy_bps, "weight_copy_fraction")
    del fns, qx, splits
    return row


def run_gpu(args):
    device = torch.device("cuda")
    peer, line = peer_status(args)
    print(line)
    cap = torch.cuda.get_device_capability()
    if cap[0] != 9:
        print(f"note: compute capability {cap[0]}.{cap[1]}: both sides' fp32-scale FP8 kernels are "
              "Hopper's (sm_90); DeepGEMM on other devices rounds these scales to UE8M0")
    copy_bps = copy_bandwidth(device)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=device)
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {copy_bps / 1e9:.0f} GB/s; each time: "
          f"median of {args.rounds} rounds of {args.reps} launches in a CUDA graph, L2 flushed "
          "(256 MB write) before each")
    print(HEADER)
    rows, failed = [], False
    for G in args.experts:
        for m, matrix in enumerate(args.matrices):
            N, K = MATRICES[matrix]
            qw = quantize_weights(G, N, K, device, seed=m)
            for layout in args.layouts:
                for size, total in layout_sizes(args, layout, G):
                    for r, routing in enumerate(args.routings):
                        seed = case_seed(args, r, size)
                        row = run_case(args, peer, layout, qw, G, N, K, matrix, routing, size,
                                       total, seed, flush, copy_bps)
                        failed |= not row["ok"]
                        rows.append(row)
                        print(row_line(row))
                        for key in ("peer_error", "peer_timing", "groupmm_timing"):
                            if key in row:
                                print(f"{'':>10} {key}: {row[key]}")
                        torch.cuda.empty_cache()
            del qw
            torch.cuda.empty_cache()
    print("size: rows (contiguous) or mean rows an expert (masked); exp: masked's expected_m hint; "
          "act: experts with rows. DG/g > 1: groupmm faster. TFLOP/s over the valid rows. wcopy: "
          "the active experts' FP8 weights and scales / time / copy bandwidth (masked only). "
          f"calc_diff: 1 - 2 sum(xy)/sum(x^2+y^2) of the two outputs (groupmm alone: against the "
          f"dequantized float64 product); {MAX_DIFF:g} or more fails")
    meta = dict(device=torch.cuda.get_device_name(), capability=list(cap), torch=torch.__version__,
                copy_gbps=copy_bps / 1e9, reps=args.reps, rounds=args.rounds,
                launches_per_figure=f"median of {args.rounds} rounds, each the mean of {args.reps} "
                                    "graph-replayed launches, L2 flushed before each",
                max_diff=MAX_DIFF, peer=line)
    if peer is not None:
        meta.update(peer_version=peer.version, peer_origin=peer.origin, peer_api=peer.api,
                    peer_alignment=peer.alignment)
    return rows, meta, failed


def int_list(s):
    return [int(v) for v in s.split(",")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layouts", type=lambda s: s.split(","), default=LAYOUTS,
                    help="comma-separated subset of contiguous,masked")
    ap.add_argument("--matrices", type=lambda s: s.split(","), default=list(MATRICES),
                    help="comma-separated subset of gate_up,down")
    ap.add_argument("--experts", type=int_list, default=EXPERTS,
                    help="comma-separated local expert counts (default: %(default)s)")
    ap.add_argument("--routings", type=lambda s: s.split(","), default=ROUTINGS,
                    help="comma-separated subset of balanced,zipf")
    ap.add_argument("--rows", type=int_list, default=ROWS,
                    help="contiguous: comma-separated routed rows (default: %(default)s)")
    ap.add_argument("--expected-m", type=int_list, default=EXPECTED_M,
                    help="masked: comma-separated mean rows an expert (default: %(default)s)")
    ap.add_argument("--groupmm-only", action="store_true", help="time groupmm alone (no peer)")
    ap.add_argument("--reps", type=int, default=10, help="launches captured in each CUDA graph")
    ap.add_argument("--rounds", type=int, default=11, help="replays of each graph (median)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    for name, got, known in [("--layouts", args.layouts, LAYOUTS),
                             ("--matrices", args.matrices, list(MATRICES)),
                             ("--routings", args.routings, ROUTINGS)]:
        bad = [v for v in got if v not in known]
        if bad:
            ap.error(f"{name}: unknown {bad}; choose from {known}")
    return peers_common.finish(args, "DeepGEMM", smoke, run_gpu, load_peer, max_diff=MAX_DIFF)


if __name__ == "__main__":
    sys.exit(main())
