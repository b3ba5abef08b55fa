#!/usr/bin/env python3
"""groupmm's 4-bit-weight grouped GEMM (torch.ops.groupmm.grouped_mm_w4, MXFP4 weights) against
triton_kernels' MXFP4 matmul_ogs (the MoE GEMM vLLM runs for gpt-oss), in one process, on
gpt-oss-120b's expert shapes: 128 experts, top-4 routing, gate_up N 5760 K 2880, down N 2880
K 2880. Prints one line per token count and matrix: both medians (us), TFLOP/s, the fraction of
the device's copy bandwidth that the bytes moved reach (up to 256 tokens), and the ratio
peer / groupmm (> 1 means groupmm is faster).

    PYTHONPATH=python python3 bench/peers_w4.py [--tokens 1,8,64,256] [--groupmm-only]
        [--path automatic] [--json out.json]

Both sides multiply the same MXFP4 numbers: random checkpoint-layout blocks (uint8 [G, N, K/32,
16]) and E8M0 scales (uint8 [G, N, K/32]), the layout gpt-oss ships. groupmm imports them with
import_mxfp4_weights; triton_kernels gets them as vLLM's _swizzle_mxfp4 prepares them (transposed
to [G, K, N], wrapped as FP4, converted to the device's default MXFP4 value and scale layouts,
scales for 8 warps; on Hopper also the scale groups padded to a multiple of 4 and the opt_flags
constraint split_k=1, both as vLLM sets them), with a PrecisionConfig carrying the scales. The form
timed is the plain grouped GEMM y_g = x_g W_g^T over rows already sorted by expert: matmul_ogs(x,
w, None, RoutingData(expert histogram, its ragged metadata)) without the gather / scatter indices,
fused SwiGLU, bias and router weights of vLLM's serving call. The adapter follows triton_kernels'
API generations as vLLM names them: 3.5.1 (RoutingData in routing.py, compute_expt_data), 3.6
(RoutingData in matmul_ogs.py, make_ragged_tensor_metadata) and 3.8 (matmul(x, w, None,
a_ragged_metadata=...) in place of matmul_ogs, PrecisionConfig(b_mx_scale=...)): the same GEMM.
The outputs must agree up to fp32 summation order: max |y_groupmm - y_peer| / max |y_peer| above
1e-2 fails the row (exit status 1); each side is also compared with the float64 product of the
dequantized weights on the few experts with the most rows.

Timing: each side's call is captured --reps times in one CUDA graph, each launch after a 256 MB
write that flushes L2, so replaying it hides the launch cost. Every round replays both sides and a
graph of the writes alone, in alternating order; a side's time in a round is its replay less the
writes' replay, over --reps. Each figure is the median over --rounds rounds of that mean of --reps
launches.

GPU only for timing; on a machine without CUDA it runs a smoke test instead (tiny shapes through
groupmm's CPU backend against the float64 product of the dequantized weights) and reports the peer
unavailable. Without triton_kernels (importable as triton_kernels, or as vLLM's vendored
vllm.third_party.triton_kernels) it times groupmm alone and says so.
"""
import argparse
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import inspect
import statistics
import sys

import torch

import groupmm  # noqa: F401  (loads the ops)
import peers_common
from peers_common import PeerMissing

ops = torch.ops.groupmm
MATRICES = {"gate_up": (5760, 2880), "down": (2880, 2880)}  # name: (N, K)
TOKENS = [1, 8, 64, 256, 1024, 4096, 8192]
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
TOLERANCE = 1e-2
BW_MAX_TOKENS = 256  # above this the GEMMs are compute bound: TFLOP/s is the figure that matters


# ---- the shared problem: checkpoint-layout weights, routing, reference ------------------------

def make_checkpoint(G, N, K, device, seed):
    """Random MXFP4 weights as gpt-oss ships them: blocks uint8 [G, N, K/32, 16] (element 2j in the
    low nibble), E8M0 scales uint8 [G, N, K/32], exponents near 2^-5 to keep products finite."""
    gen = torch.Generator(device=device).manual_seed(seed)
    kw = dict(generator=gen, dtype=torch.uint8, device=device)
    return (torch.randint(0, 256, (G, N, K // 32, 16), **kw),
            torch.randint(120, 126, (G, N, K // 32), **kw))


def dequantize(blocks, scales):
    """float32 [..., N, K] of checkpoint blocks [..., N, K/32, 16] and scales [..., N, K/32]."""
    lut = torch.tensor(E2M1 + [-v for v in E2M1], device=blocks.device)
    codes = torch.stack([blocks & 0xF, blocks >> 4], dim=-1).flatten(-2)  # [..., N, K/32, 32]
    return (lut[codes.long()] * torch.exp2(scales.float() - 127)[..., None]).flatten(-2)


def make_routing(tokens, G, topk, K, device, seed):
    """Top-k of random logits per token (distinct experts, as gpt-oss routes): splits int32 [G]
    and x bf16 [tokens * topk, K], its rows already sorted by expert (the gather is not timed)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    experts = torch.rand(tokens, G, generator=gen, device=device).topk(topk, dim=1).indices
    counts = torch.bincount(experts.flatten(), minlength=G).to(torch.int32)
    x = torch.randn(tokens * topk, K, generator=gen, device=device, dtype=torch.bfloat16)
    return counts, x


def ref_diff(ys, x, blocks, scales, counts, n_experts=4):
    """max |y - ref| / max |ref| of each output in ys against the float64 product of the
    dequantized weights, over the n_experts experts with the most rows."""
    starts = [0]
    for c in counts[:-1]:
        starts.append(starts[-1] + c)
    picked = sorted(range(len(counts)), key=lambda g: -counts[g])[:n_experts]
    err, top = [0.0] * len(ys), 0.0
    for g in picked:
        s, e = starts[g], starts[g] + counts[g]
        if s == e:
            continue
        ref = x[s:e].double() @ dequantize(blocks[g], scales[g]).double().t()
        top = max(top, ref.abs().max().item())
        for i, y in enumerate(ys):
            err[i] = max(err[i], (y[s:e].double() - ref).abs().max().item())
    return [v / max(top, 1e-30) for v in err]


def rel_diff(a, b):
    """max |a - b| / max |b|: elementwise ratios mean nothing where outputs cross zero."""
    a, b = a.float(), b.float()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def groupmm_weights(blocks, scales, scale_layout):
    return list(ops.import_mxfp4_weights(blocks, scales, scale_layout))


def groupmm_call(x, w, splits, scale_layout, path):
    return lambda: ops.grouped_mm_w4(x, w, splits, "mxfp4", scale_layout, None, path)


# ---- the peer: triton_kernels, whichever of its API generations is installed -------------------



def _import(stmt, module, *names):
    """from module import names (the module itself without names), or PeerMissing naming the
    statement that failed."""
    try:
        mod = importlib.import_module(module)
        return [getattr(mod, n) for n in names] if names else [mod]
    except (ImportError, AttributeError) as e:
        raise PeerMissing(f"`{stmt}` failed: {type(e).__name__}: {e}") from None


def load_peer():
    """The triton_kernels adapter: a namespace with api (which form is called), where it came
    from, and the classes and functions build_peer_weights / peer_call use."""
    why = []
    try:
        import triton_kernels
    except ImportError as e:
        why.append(f"`import triton_kernels`: {e}")
        # vLLM's wheels vendor it; vLLM aliases the package the same way.
        if importlib.util.find_spec("vllm") is None:
            raise PeerMissing("; ".join(why + ["vllm (which vendors it) is not installed"])) from None
        try:
            import vllm.third_party.triton_kernels as triton_kernels
        except ImportError as e2:
            raise PeerMissing("; ".join(why + [f"`import vllm.third_party.triton_kernels`: {e2}"])) \
                from None
        sys.modules["triton_kernels"] = triton_kernels
    import triton

    p = argparse.Namespace(origin=triton_kernels.__file__, triton=triton.__version__)
    try:
        p.version = importlib.metadata.version("triton_kernels")
    except Exception:
        p.version = getattr(triton_kernels, "__version__", "unknown")
    p.wrap_torch_tensor, p.convert_layout, p.FP4 = _import(
        "from triton_kernels.tensor import wrap_torch_tensor, convert_layout, FP4",
        "triton_kernels.tensor", "wrap_torch_tensor", "convert_layout", "FP4")
    (p.layout,) = _import("from triton_kernels.tensor_details import layout",
                          "triton_kernels.tensor_details.layout")
    (p.InFlexData,) = _import("from triton_kernels.numerics import InFlexData",
                              "triton_kernels.numerics", "InFlexData")
    try:  # where opt_flags lives: matmul_ogs_details, matmul_details after matmul_ogs was renamed
        (p.opt_flags,) = _import("import triton_kernels.matmul_ogs_details.opt_flags",
                                 "triton_kernels.matmul_ogs_details.opt_flags")
    except PeerMissing as e:
        (p.opt_flags,) = _import(f"import triton_kernels.matmul_details.opt_flags (after {e})",
                                 "triton_kernels.matmul_details.opt_flags")
    missing = []
    for attr, stmt, module, name in [
            ("make_ragged", "from triton_kernels.tensor import make_ragged_tensor_metadata",
             "triton_kernels.tensor", "make_ragged_tensor_metadata"),
            ("compute_expt_data", "from triton_kernels.routing import compute_expt_data",
             "triton_kernels.routing", "compute_expt_data")]:
        try:
            (fn,) = _import(stmt, module, name)
        except PeerMissing as e:
            fn = None
            missing.append(str(e))
        setattr(p, attr, fn)
    try:  # matmul_ogs: what vLLM calls
        p.matmul_ogs, p.PrecisionConfig, p.FlexCtx, p.RoutingData = _import(
            "from triton_kernels.matmul_ogs import matmul_ogs, PrecisionConfig, FlexCtx, RoutingData",
            "triton_kernels.matmul_ogs", "matmul_ogs", "PrecisionConfig", "FlexCtx", "RoutingData")
        # The metadata type follows RoutingData's home (matmul_ogs.py re-exports routing.py's):
        # routing.py's (3.5.1) takes compute_expt_data's ExptData, matmul_ogs.py's (3.6) a
        # RaggedTensorMetadata.
        legacy = p.RoutingData.__module__.endswith(".routing")
        if (legacy and p.compute_expt_data is None) or (not legacy and p.make_ragged is None):
            raise PeerMissing("no expert metadata builder for this RoutingData: " + "; ".join(missing))
        if not legacy:
            p.compute_expt_data = None
        p.api = "matmul_ogs(x, w, None, RoutingData(hist, expt_data))"
    except PeerMissing as e:
        if p.make_ragged is None:
            raise PeerMissing(f"{e}; " + "; ".join(missing)) from None
        p.matmul_ogs = None
        p.matmul, p.PrecisionConfig, p.FlexCtx = _import(
            f"from triton_kernels.matmul import matmul, PrecisionConfig, FlexCtx (after {e})",
            "triton_kernels.matmul", "matmul", "PrecisionConfig", "FlexCtx")
        if "a_ragged_metadata" not in inspect.signature(p.matmul).parameters:
            raise PeerMissing("triton_kernels.matmul.matmul takes no a_ragged_metadata: an API this "
                              "script does not know") from None
        p.api = "matmul(x, w, None, a_ragged_metadata=...)"
    p.api += ", metadata: " + ("compute_expt_data" if p.compute_expt_data else "make_ragged_tensor_metadata")
    return p


def _to_default_layout(p, make, t, **kw):
    """t converted to the layout triton_kernels' make_default_matmul_mxfp4_w*_layout picks for
    this device, and the layout's name. Older releases return (class, options) and their layout
    classes take the mx axis as 1 (of [G, K, N]); newer ones return a layout object and take only
    -2. Either may reject the other's axis, when made or when converting."""
    err = None
    for axis in (1, -2):
        try:
            made = make(mx_axis=axis, **kw)
            if isinstance(made, tuple):
                cls, opts = made
                return p.convert_layout(t, cls, **opts), getattr(cls, "__name__", str(cls))
            return p.convert_layout(t, made), type(made).__name__
        except (AssertionError, ValueError, TypeError) as e:
            err = e
    raise err


def build_peer_weights(p, blocks, scales, hopper, num_warps=8):
    """triton_kernels' operands for checkpoint blocks [G, N, K/32, 16] and scales [G, N, K/32], as
    vLLM's _swizzle_mxfp4 makes them: w [G, K, N] (the packed K axis contiguous) in the device's
    default MXFP4 value layout, scales [G, K/32, N] in its scale layout, and the PrecisionConfig.
    On Hopper (hopper=True) vLLM first pads the scale groups to a multiple of 4 (zeros, never
    read for K's own blocks): its workaround for the Hopper scale swizzle of triton_kernels before
    3.8, kept here so that the peer runs as vLLM runs it. Returns (w, precision_config, the
    layouts' names)."""
    G, N, K = blocks.shape[0], blocks.shape[1], 32 * blocks.shape[2]
    if hopper and scales.shape[-1] % 4:
        scales = torch.nn.functional.pad(scales, (0, -scales.shape[-1] % 4))
    w = p.wrap_torch_tensor(blocks.view(G, N, K // 2).transpose(-2, -1), dtype=p.FP4)
    s = p.wrap_torch_tensor(scales.transpose(-2, -1))
    layouts = "strided (no make_default_matmul_mxfp4_w_layout)"
    if hasattr(p.layout, "make_default_matmul_mxfp4_w_layout"):
        w, wl = _to_default_layout(p, p.layout.make_default_matmul_mxfp4_w_layout, w)
        s, sl = _to_default_layout(p, p.layout.make_default_matmul_mxfp4_w_scale_layout, s,
                                   num_warps=num_warps)
        layouts = f"{wl} / {sl}"
    fields = {f.name for f in dataclasses.fields(p.PrecisionConfig)}
    kw = {}
    if "flex_ctx" in fields:
        kw["flex_ctx"] = p.FlexCtx(rhs_data=p.InFlexData())
    if "weight_scale" in fields:
        kw["weight_scale"] = s
    elif "b_mx_scale" in fields:
        kw["b_mx_scale"] = s
        if "b_microblock_size" in fields:
            kw["b_microblock_size"] = 32
    else:
        raise PeerMissing(f"PrecisionConfig has neither weight_scale nor b_mx_scale: {sorted(fields)}")
    return w, p.PrecisionConfig(**kw), layouts


def peer_call(p, x, w, pc, splits):
    """A zero-argument call of the peer's grouped GEMM over x's rows sorted by expert (splits:
    int32 [G] on the device). The metadata is built here, once, outside the timed call."""
    hist, rows, G = splits.to(torch.int32), x.shape[0], splits.shape[0]
    meta = p.compute_expt_data(hist, G, rows) if p.compute_expt_data else p.make_ragged(hist, rows)
    if p.matmul_ogs is not None:
        # n_expts_act=1: every row is one (token, expert) pair, nothing gathered or combined.
        rd = p.RoutingData(None, hist, G, 1, expt_data=meta)
        return lambda: p.matmul_ogs(x, w, None, rd, precision_config=pc)
    return lambda: p.matmul(x, w, None, a_ragged_metadata=meta, precision_config=pc)


# ---- timing -----------------------------------------------------------------------------------

def copy_bandwidth(device, nbytes=1 << 30, iters=10):
    """Bytes per second of a device-to-device copy (read + write), the bandwidth roof."""
    a = torch.empty(nbytes, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    times = []
    for i in range(iters + 3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        b.copy_(a)
        end.record()
        end.synchronize()
        if i >= 3:
            times.append(start.elapsed_time(end))
    return 2 * nbytes / (statistics.median(times) * 1e-3)


def time_graphs(fns, flush, reps, rounds):
    """Median us per launch of each fn (a dict name: fn), L2 flushed before every launch (not
    with flush=None), launch cost hidden: see the module's docstring. Returns ({name: us}, {name: error}) where a side
    that could not be captured gets an error instead of a time."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    # Warm up on the capture stream: JIT compilation, autotuning, and groupmm's per-stream state
    # happen before capture.
    with torch.cuda.stream(stream):
        for fn in fns.values():
            fn()
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graphs, errors, pool = {}, {}, None
    # flush=None (bench/peers_serving_w4.py: a layer in a model runs back to back): no writes
    # between launches and nothing subtracted.
    for name, fn in ([("flush", None)] if flush is not None else []) + list(fns.items()):
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g, pool=pool, stream=stream):
                for _ in range(reps):
                    if flush is not None:
                        flush.fill_(1)  # a kernel writing 256 MB: every line of L2 is evicted
                    if fn is not None:
                        fn()
        except Exception as e:  # a peer that syncs or allocates on the host cannot be captured
            errors[name] = f"CUDA graph capture failed: {type(e).__name__}: {e}".splitlines()[0]
            torch.cuda.synchronize()
            continue
        pool = pool or g.pool()
        graphs[name] = g
    if "flush" in errors:
        raise RuntimeError(errors["flush"])
    for g in graphs.values():  # clocks up, caches and TLBs in their steady state
        g.replay()
    torch.cuda.synchronize()
    names = list(graphs)
    per_round = {n: [] for n in names}
    for r in range(rounds):
        for n in (names if r % 2 == 0 else names[::-1]):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graphs[n].replay()
            end.record()
            end.synchronize()
            per_round[n].append(start.elapsed_time(end))
    flush_ms = per_round.pop("flush", None) or [0.0] * rounds
    us = {n: statistics.median((t - f) * 1e3 / reps for t, f in zip(ts, flush_ms))
          for n, ts in per_round.items()}
    del graphs
    return us, errors


# ---- the runs ---------------------------------------------------------------------------------

def smoke(args):
    """CPU: both matrices at tiny sizes through grouped_mm_w4 against the float64 product of the
    dequantized weights (every expert). Returns the rows."""
    G, topk, rows_out = 4, 2, []
    for m, (name, (N, K)) in enumerate({"gate_up": (128, 64), "down": (64, 64)}.items()):
        blocks, scales = make_checkpoint(G, N, K, "cpu", seed=m)
        w = groupmm_weights(blocks, scales, args.scale_layout)
        for tokens in (1, 3, 8):
            splits, x = make_routing(tokens, G, topk, K, "cpu", seed=tokens)
            y = groupmm_call(x, w, splits, args.scale_layout, args.path)()
            counts = splits.tolist()
            (err,) = ref_diff([y], x, blocks, scales, counts, n_experts=G)
            ok = err < TOLERANCE
            print(f"{name:<8} G={G} N={N} K={K} tokens {tokens} top-{topk}  cpu smoke  "
                  f"groupmm vs dequantized float64 rel diff {err:.2e}{'' if ok else '  FAIL'}")
            rows_out.append(dict(matrix=name, tokens=tokens, G=G, N=N, K=K, topk=topk,
                                 rows=x.shape[0], groupmm_ref_diff=err, ok=ok))
    return rows_out


def peer_status(args):
    """(peer adapter or None, a line saying which peer runs, or why none)."""
    return peers_common.peer_status(
        args, "triton_kernels", load_peer,
        lambda p: f"{p.version} ({p.origin}), triton {p.triton}: {p.api}")


HEADER = (f"{'tokens':>6} {'matrix':<8} {'rows':>6} {'exp':>4} {'groupmm us':>11} {'peer us':>9} "
          f"{'g TFLOP/s':>9} {'p TFLOP/s':>9} {'g copy':>7} {'p copy':>7} {'peer/g':>7} {'diff':>8}")


def row_line(row):
    """A row of the printed table (HEADER's columns); '-' where a figure is missing, and the copy
    fractions only up to BW_MAX_TOKENS tokens."""
    def cell(key, fmt, width, show=True):
        v = row.get(key) if show else None
        return f"{'-' if v is None else format(v, fmt):>{width}}"
    small = row["tokens"] <= BW_MAX_TOKENS
    diff = row.get("max_rel_diff", row["groupmm_ref_diff"])
    return (f"{row['tokens']:>6} {row['matrix']:<8} {row['rows']:>6} {row['active_experts']:>4} "
            f"{cell('groupmm_us', '.1f', 11)} {cell('peer_us', '.1f', 9)} "
            f"{cell('groupmm_tflops', '.0f', 9)} {cell('peer_tflops', '.0f', 9)} "
            f"{cell('groupmm_copy_fraction', '.0%', 7, small)} {cell('peer_copy_fraction', '.0%', 7, small)} "
            f"{cell('ratio', '.2f', 7)} {diff:8.1e}{'' if row['ok'] else '  FAIL'}")


def peer_on_this_device(args, status=None):
    """The peer adapter (or None), the line naming it (printed), whether the device is a Hopper,
    and the opt_flags constraints set. vLLM constrains triton_kernels to split_k=1 on Hopper
    before its first matmul_ogs (a setting global to triton_kernels), and so does this."""
    peer, line = (status or peer_status)(args)
    hopper = torch.cuda.get_device_capability()[0] == 9
    constraints = {"split_k": 1} if hopper else {}
    if peer is not None and constraints:
        peer.opt_flags.update_opt_flags_constraints(constraints)
        line += f"; opt_flags constraints {constraints} (as vLLM sets on Hopper)"
    print(line)
    return peer, line, hopper, constraints


def run_gpu(args):
    device = torch.device("cuda")
    peer, line, hopper, constraints = peer_on_this_device(args)
    copy_bps = copy_bandwidth(device)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=device)
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {copy_bps / 1e9:.0f} GB/s; each time: "
          f"median of {args.rounds} rounds of {args.reps} launches in a CUDA graph, L2 flushed "
          f"(256 MB write) before each; groupmm path={args.path}, scale_layout={args.scale_layout}")
    print(HEADER)
    rows, failed, layouts = [], False, None
    for m, name in enumerate(args.matrices):
        N, K = MATRICES[name]
        blocks, scales = make_checkpoint(args.experts, N, K, device, seed=m)
        w_ours = groupmm_weights(blocks, scales, args.scale_layout)
        w_peer = None
        if peer is not None:
            try:
                w_peer, pc, layouts = build_peer_weights(peer, blocks, scales, hopper)
            except Exception as e:
                print(f"peer triton_kernels: building the {name} weights failed ({type(e).__name__}: "
                      f"{e}); timing groupmm alone")
                peer = None
        for tokens in args.tokens:
            splits, x = make_routing(tokens, args.experts, args.topk, K, device, seed=tokens)
            counts = splits.tolist()
            active = sum(c > 0 for c in counts)
            fns = {"groupmm": groupmm_call(x, w_ours, splits, args.scale_layout, args.path)}
            row = dict(tokens=tokens, matrix=name, G=args.experts, N=N, K=K, topk=args.topk,
                       rows=x.shape[0], active_experts=active)
            ys = [fns["groupmm"]()]
            if peer is not None and w_peer is not None:
                try:
                    fns["peer"] = peer_call(peer, x, w_peer, pc, splits)
                    y_peer = fns["peer"]()
                    ys.append(y_peer.view(-1, y_peer.shape[-1]))
                    del y_peer
                    torch.cuda.synchronize()
                except Exception as e:
                    row["peer_error"] = f"{type(e).__name__}: {e}".splitlines()[0]
                    fns.pop("peer", None)
            refs = ref_diff(ys, x, blocks, scales, counts)
            row["groupmm_ref_diff"] = refs[0]
            ok = refs[0] <= TOLERANCE
            if len(ys) == 2:
                row["peer_ref_diff"] = refs[1]
                row["max_rel_diff"] = rel_diff(ys[0], ys[1])
                ok = ok and row["max_rel_diff"] <= TOLERANCE
            row["ok"] = ok
            failed |= not ok
            del ys
            us, errors = time_graphs(fns, flush, args.reps, args.rounds)
            if "peer" in errors:
                row["peer_error"] = errors["peer"]
            if "groupmm" in errors:
                row["groupmm_error"] = errors["groupmm"]
            flops = 2.0 * x.shape[0] * N * K
            nbytes = active * (N * K // 2 + N * K // 32) + x.shape[0] * (K + N) * 2
            peers_common.record_times(row, us, flops, nbytes, copy_bps)
            rows.append(row)

            print(row_line(row))
            for key in ("peer_error", "groupmm_error"):
                if key in row:
                    print(f"       {key}: {row[key]}")
            del fns, x
        del blocks, scales, w_ours, w_peer
        torch.cuda.empty_cache()
    print("diff: max |y_groupmm - y_peer| / max |y_peer| (groupmm alone: against the dequantized float64 "
          f"product); above {TOLERANCE:g} fails. peer/g > 1: groupmm faster. copy: bytes moved "
          "(active experts' weights and scales, x, y) / time / copy bandwidth")
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                copy_gbps=copy_bps / 1e9, reps=args.reps, rounds=args.rounds,
                launches_per_figure=f"median of {args.rounds} rounds, each the mean of {args.reps} "
                                    "graph-replayed launches, L2 flushed before each",
                groupmm_path=args.path, groupmm_scale_layout=args.scale_layout, peer=line)
    if peer is not None:
        meta.update(peer_api=peer.api, peer_version=peer.version, peer_origin=peer.origin,
                    triton=peer.triton, peer_layouts=layouts,
                    peer_opt_flags_constraints=constraints)
    return rows, meta, failed


def add_common_options(ap, reps, what):
    """The options both MXFP4 peer scripts take (this one and peers_serving_w4.py)."""
    ap.add_argument("--groupmm-only", action="store_true", help="time groupmm alone (no peer)")
    ap.add_argument("--path", default="automatic", choices=["automatic", "decode", "prefill", "fused"],
                    help="grouped_mm_w4's path")
    ap.add_argument("--scale-layout", default="plain", choices=["plain", "swizzled"],
                    help="groupmm's scale layout (import_mxfp4_weights)")
    ap.add_argument("--reps", type=int, default=reps, help=f"{what} captured in each CUDA graph")
    ap.add_argument("--rounds", type=int, default=11, help="replays of each graph (median)")
    ap.add_argument("--json", help="write the rows here")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=lambda s: [int(v) for v in s.split(",")], default=TOKENS,
                    help="comma-separated token counts (default: %(default)s)")
    ap.add_argument("--matrices", type=lambda s: s.split(","), default=list(MATRICES),
                    help="comma-separated subset of gate_up,down")
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--topk", type=int, default=4)
    add_common_options(ap, 10, "launches")
    args = ap.parse_args()
    bad = [m for m in args.matrices if m not in MATRICES]
    if bad:
        ap.error(f"--matrices: unknown {bad}; choose from {list(MATRICES)}")
    return peers_common.finish(args, "triton_kernels", smoke, run_gpu, load_peer)


if __name__ == "__main__":
    sys.exit(main())
