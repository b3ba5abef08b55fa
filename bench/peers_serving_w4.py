#!/usr/bin/env python3
"""The serving MoE layer of gpt-oss-120b with MXFP4 expert weights, groupmm's ops against the same
layer built from triton_kernels' kernels as vLLM serves gpt-oss on Hopper, in one process, at
decode batches: 128 experts, top-4 router (a bf16 linear with bias; softmax over the top-4
logits), hidden 2880, expert width 2880, gate_up [E, 5760, 2880] with gate and up interleaved
(rows 2i, 2i + 1) and a bias, the clamped SwiGLU (alpha 1.702, limit 7.0, up + 1), down
[E, 2880, 2880] with a bias, the router-weighted combine (the down bias weighted too). Prints one
line per batch: both medians (us per layer), the ratio peer / groupmm (> 1 means groupmm is
faster) and the outputs' max relative difference.

    PYTHONPATH=python python3 bench/peers_serving_w4.py [--tokens 1,2,4,8,16,32,64,256,1024]
        [--groupmm-layer module|ops] [--groupmm-only] [--path automatic] [--json out.json]

groupmm's layer (--groupmm-layer module, the default) is the package's entry point for it:
groupmm.nn.MoE.from_gpt_oss on the checkpoint's tensors (recipe 'mxfp4_weight', the MXFP4 bytes
imported as they are), called under torch.no_grad(). --groupmm-layer ops times the same layer as
the chain of public ops the module runs, with --path and --scale-layout for the 4-bit GEMMs (the
chain is groupmm.integrations.transformers' experts forward with the checkpoint's MXFP4 weights
imported): router_logits (+ the router bias, in the op), router (softmax, renormalized
top-4: the softmax over the top-4 logits), permute_plan, permute (the router weights become
per-row probs), grouped_mm_w4 gate_up (+ its bias, in the GEMM), weighted_swiglu_ex (alpha, limit,
up + 1, interleaved; the router weight applied here), grouped_mm_w4 down and unpermute with the
routed down bias sum_j w_tj b_down[e_tj] (the weight is applied before the down GEMM, so the
GEMM's own bias would be unweighted; unpermute adds it in the same pass as the k rows): 9 op
calls, each of which is at least one kernel launch.

The peer's layer is vLLM's gpt-oss MoE on triton_kernels (vllm/model_executor/layers/fused_moe/
gpt_oss_triton_kernels_moe.py, triton_kernel_moe_forward and triton_kernel_fused_experts; the
router is gpt-oss's bf16 torch Linear): logits = F.linear(x, W_router, b_router) (bf16),
routing(logits, 4, sm_first=False) (triton_kernels.routing; where that module is gone, the
equivalent the gpt-oss reference builds from triton_kernels.topk.topk(apply_softmax=True) and
make_ragged_tensor_metadata), matmul_ogs gate_up with the gather indices, fp32 bias and the fused
SwiGLU epilogue (FusedActivation(FnSpecs('swiglu', swiglu_fn, ('alpha', 'limit')), (1.702, 7.0),
2)), matmul_ogs down with the scatter indices, fp32 bias and the routing's gate_scal as gammas. Its
MXFP4 weights are built by bench/peers_w4.py's build_peer_weights (vLLM's _swizzle_mxfp4) from the
same checkpoint bytes, and on Hopper the opt_flags constraint split_k=1 is set as vLLM sets it.
triton_kernels' 3.8 API (matmul in place of matmul_ogs) is not adapted here: the peer is then
reported missing.

Same weights (random checkpoint-layout MXFP4 blocks and scales from bench/peers_w4.py, bf16
biases, bf16 router), same input. Each side routes itself, as in serving, from logits that differ
in rounding (groupmm: fp32; the peer: bf16, as vLLM's router), so a token whose 4th and 5th logits
are within 2^-6 max|logit| (float64) may pick different experts on the two sides: such tokens are
counted (`ambiguous`) and left out of the comparisons. Other tokens get the same experts on both
sides; their weights differ by the logits' rounding (at most about 2^-8 max|logit| relative), hence
the tolerance 3e-2 of max |y_groupmm - y_peer| / max |y_peer|; groupmm is also compared with a
float64 layer on the dequantized weights over the first tokens. A row over it fails (exit 1).

Timing: each side's layer is captured --reps times in one CUDA graph, back to back with nothing
between (L2 is not flushed: a layer in a model runs after the previous one, with its weights
possibly warm when the batch is small and repeated; this is the decode loop's steady state, not a
cold-cache figure); every round replays both graphs in alternating order; a figure is the median
over --rounds rounds of the mean over --reps layers.

--kernels adds each side's breakdown: the kernels of one layer (torch.profiler over one replay of
a graph of --reps layers; device time by kernel name, divided by --reps), printed after each batch
and kept in the rows (<side>_kernels: [name, launches a layer, us a layer]); the smoke run prints
the operators of the CPU layer instead (self time of eager calls).

GPU only for timing; on a machine without CUDA it runs a smoke test instead (4 experts, top-2,
hidden 64 through groupmm's CPU backend, both forms of groupmm's layer, against the float64 layer)
and reports the peer unavailable. Without triton_kernels it times groupmm alone and says why.
"""
import argparse
import sys

import torch
import torch.nn.functional as F

import groupmm  # noqa: F401  (loads the ops)
import peers_common
import peers_w4
from peers_common import PeerMissing
from peers_w4 import _import

ops = torch.ops.groupmm
TOKENS = [1, 2, 4, 8, 16, 32, 64]
ALPHA, LIMIT, UP_OFFSET = 1.702, 7.0, 1.0
TOLERANCE = 3e-2
AMBIGUOUS = 2.0 ** -6  # the 4th-5th logit gap, relative to max |logit|, under which routes may differ
REF_TOKENS = 8  # tokens the float64 layer is computed for on the GPU (dequantizing is the cost)


# ---- the shared problem: checkpoint, router, reference ------------------------------------------

def make_layer(E, H, F_, device, seed):
    """The layer's tensors as a gpt-oss checkpoint holds them: MXFP4 gate_up blocks/scales [E, 2F,
    H/32, 16] / [E, 2F, H/32] (gate and up interleaved by row), down [E, H, F/32, 16] /
    [E, H, F/32], bf16 biases, bf16 router weight [E, H] and bias [E]."""
    gen = torch.Generator(device=device).manual_seed(seed)
    bf = dict(generator=gen, device=device, dtype=torch.bfloat16)
    gu_b, gu_s = peers_w4.make_checkpoint(E, 2 * F_, H, device, seed)
    dn_b, dn_s = peers_w4.make_checkpoint(E, H, F_, device, seed + 1)
    return dict(gu_blocks=gu_b, gu_scales=gu_s, gu_bias=torch.randn(E, 2 * F_, **bf) * 0.5,
                dn_blocks=dn_b, dn_scales=dn_s, dn_bias=torch.randn(E, H, **bf) * 0.5,
                router_w=torch.randn(E, H, **bf) / H ** 0.5, router_b=torch.randn(E, **bf) * 0.1)


def ref_logits(x, L):
    return x.double() @ L["router_w"].double().t() + L["router_b"].double()


def ambiguous_tokens(x, L, topk):
    """bool [T]: tokens whose top-k set the two sides' rounding of the logits may change."""
    s = ref_logits(x, L).sort(dim=1, descending=True).values
    return (s[:, topk - 1] - s[:, topk]) < AMBIGUOUS * s.abs().max(dim=1).values


def ref_layer(x, L, topk, tokens, stats=None):
    """float64 [len(tokens), H]: the gpt-oss layer (HF GptOssExperts' formula) on the dequantized
    weights for the given tokens. stats (a dict), when given, gets the fraction of gate / up values
    the limit clamps ('clamped')."""
    logits = ref_logits(x[tokens], L)
    top, ids = logits.topk(topk, dim=1)
    weights = torch.softmax(top, dim=1)
    deq = {}

    def w(name, e):
        if (name, e) not in deq:
            deq[(name, e)] = peers_w4.dequantize(L[f"{name}_blocks"][e], L[f"{name}_scales"][e]).double()
        return deq[(name, e)]

    out, clamped, total = [], 0, 0
    for i, t in enumerate(tokens):
        xt, y = x[t].double(), 0.0
        for j in range(topk):
            e = int(ids[i, j])
            gu = w("gu", e) @ xt + L["gu_bias"][e].double()
            clamped += int((gu[0::2] > LIMIT).sum() + (gu[1::2].abs() > LIMIT).sum())
            total += gu.numel()
            g, u = gu[0::2].clamp(max=LIMIT), gu[1::2].clamp(-LIMIT, LIMIT)
            h = g * torch.sigmoid(ALPHA * g) * (u + UP_OFFSET)
            y = y + weights[i, j] * (w("dn", e) @ h + L["dn_bias"][e].double())
        out.append(y)
    if stats is not None:
        stats["clamped"] = clamped / max(total, 1)
    return torch.stack(out)


def rel_diff(a, b, keep):
    """max |a - b| / max |b| over the rows in keep (None when none is kept)."""
    if not bool(keep.any()):
        return None
    a, b = a[keep].double(), b[keep].double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


# ---- groupmm's layer ----------------------------------------------------------------------------

class GroupmmLayer:
    """The layer as a chain of groupmm's public ops (the module docstring lists them)."""

    def __init__(self, L, topk, scale_layout, path):
        self.E, self.topk, self.scale_layout, self.path = L["router_w"].shape[0], topk, scale_layout, path
        self.router_w, self.router_b = L["router_w"], L["router_b"]
        self.gu = list(ops.import_mxfp4_weights(L["gu_blocks"], L["gu_scales"], scale_layout))
        self.dn = list(ops.import_mxfp4_weights(L["dn_blocks"], L["dn_scales"], scale_layout))
        self.gu_bias, self.dn_bias = L["gu_bias"], L["dn_bias"]

    def __call__(self, x):
        logits = ops.router_logits(x, self.router_w, self.router_b)
        ids, weights = ops.router(logits, None, self.topk, "softmax", 1, 1, True)[:2]
        plan = ops.permute_plan(ids, self.E, 1, 0)
        x_perm, probs = ops.permute(x, *plan, 1, 0, weights)
        gu = ops.grouped_mm_w4(x_perm, self.gu, plan[3], "mxfp4", self.scale_layout, self.gu_bias,
                               self.path)
        h = ops.weighted_swiglu_ex(gu, probs, ALPHA, LIMIT, UP_OFFSET, True)
        y_perm = ops.grouped_mm_w4(h, self.dn, plan[3], "mxfp4", self.scale_layout, None, self.path)
        return ops.unpermute(y_perm, *plan, 1, 0, None, self.dn_bias, ids, weights)


class GroupmmModule:
    """The layer as the package builds it for a user: groupmm.nn.MoE.from_gpt_oss on the checkpoint's
    tensors (gpt-oss's keys), MXFP4 experts imported."""

    def __init__(self, L, topk):
        state = {"router.weight": L["router_w"], "router.bias": L["router_b"]}
        for ours, theirs in (("gu", "gate_up_proj"), ("dn", "down_proj")):
            for part in ("blocks", "scales", "bias"):
                state[f"experts.{theirs}_{part}"] = L[f"{ours}_{part}"]
        self.moe = groupmm.nn.MoE.from_gpt_oss(state, topk, recipe="mxfp4_weight",
                                               device=L["router_w"].device).eval()

    def __call__(self, x):
        with torch.no_grad():  # imported 4-bit experts: forward only
            return self.moe(x)[0]


def groupmm_layer(args, L):
    if args.groupmm_layer == "module":
        return GroupmmModule(L, args.topk)
    return GroupmmLayer(L, args.topk, args.scale_layout, args.path)


# ---- the peer's layer: triton_kernels as vLLM calls it ------------------------------------------

def load_peer():
    """peers_w4's adapter plus what the serving form needs: FusedActivation / FnSpecs, swiglu_fn
    and a route(logits, k) -> (RoutingData, GatherIndx, ScatterIndx)."""
    p = peers_w4.load_peer()
    if p.matmul_ogs is None:
        raise PeerMissing(f"triton_kernels {p.version} has matmul() in place of matmul_ogs; its "
                          "gather / scatter / fused-activation form is not adapted here")
    mo = p.matmul_ogs.__module__
    p.FnSpecs, p.FusedActivation = _import(f"from {mo} import FnSpecs, FusedActivation", mo,
                                           "FnSpecs", "FusedActivation")
    (p.swiglu_fn,) = _import("from triton_kernels.swiglu import swiglu_fn", "triton_kernels.swiglu",
                             "swiglu_fn")
    try:  # what vLLM calls (renormalize=True: top-k first, then the softmax over it)
        (routing,) = _import("from triton_kernels.routing import routing", "triton_kernels.routing",
                             "routing")
        p.route = lambda logits, k: routing(logits, k, sm_first=False)
        p.routing_api = "routing(logits, k, sm_first=False)"
    except PeerMissing as e:
        # routing.py removed: the same metadata from topk, as gpt-oss's triton reference builds it.
        (topk,) = _import(f"from triton_kernels.topk import topk (after {e})", "triton_kernels.topk",
                          "topk")
        if p.make_ragged is None:
            raise PeerMissing("no make_ragged_tensor_metadata next to triton_kernels.topk") from None
        GatherIndx, ScatterIndx = _import(f"from {mo} import GatherIndx, ScatterIndx", mo,
                                          "GatherIndx", "ScatterIndx")

        def route(logits, k):
            sparse = topk(logits, k, apply_softmax=True)
            meta = sparse.mask_metadata
            dispatch, combine = meta.col_sorted_indx, meta.row_sorted_indx
            ragged = p.make_ragged(meta.col_sum, dispatch.shape[0])
            rd = p.RoutingData(sparse.vals.flatten()[combine], ragged.batch_sizes, logits.shape[-1],
                               k, ragged)
            return rd, GatherIndx(combine, dispatch), ScatterIndx(dispatch, combine)

        p.route = route
        p.routing_api = "topk(logits, k, apply_softmax=True) + make_ragged_tensor_metadata"
    p.api = (f"F.linear router (bf16) -> {p.routing_api} -> matmul_ogs(gather_indx, bias, "
             "fused swiglu) -> matmul_ogs(scatter_indx, bias, gammas=gate_scal)")
    return p


class PeerLayer:
    def __init__(self, p, L, topk, hopper):
        self.p, self.topk = p, topk
        self.router_w, self.router_b = L["router_w"], L["router_b"]
        self.w1, self.pc1, self.layouts = peers_w4.build_peer_weights(p, L["gu_blocks"], L["gu_scales"],
                                                                      hopper)
        self.w2, self.pc2, _ = peers_w4.build_peer_weights(p, L["dn_blocks"], L["dn_scales"], hopper)
        # vLLM keeps the expert biases in fp32 (triton_kernel_fused_experts asserts it).
        self.b1, self.b2 = L["gu_bias"].float(), L["dn_bias"].float()
        self.act = p.FusedActivation(p.FnSpecs("swiglu", p.swiglu_fn, ("alpha", "limit")),
                                     (ALPHA, LIMIT), 2)

    def __call__(self, x):
        p = self.p
        logits = F.linear(x, self.router_w, self.router_b)
        rd, gather, scatter = p.route(logits, self.topk)
        h = p.matmul_ogs(x, self.w1, self.b1, rd, gather_indx=gather, precision_config=self.pc1,
                         fused_activation=self.act)
        y = p.matmul_ogs(h.view(-1, h.shape[-1]), self.w2, self.b2, rd, scatter_indx=scatter,
                         precision_config=self.pc2, gammas=rd.gate_scal)
        return y.view(-1, x.shape[1])


# ---- the runs -----------------------------------------------------------------------------------

def kernel_breakdown(fn, reps):
    """[[name, launches a layer, us a layer]], most time first: on CUDA the kernels of one replay
    of a graph of `reps` calls of fn (torch.profiler's device time; the graph is captured on a side
    stream after two eager calls there, as time_graphs does); on the CPU the operators of `reps`
    eager calls (self time)."""
    from torch.profiler import ProfilerActivity, profile
    agg = {}
    if torch.cuda.is_available():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            for _ in range(reps):
                fn()
        g.replay()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            g.replay()
            torch.cuda.synchronize()
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                a = agg.setdefault(e.name, [0, 0.0])
                a[0] += 1
                a[1] += e.device_time_total
    else:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(reps):
                fn()
        for e in prof.key_averages():
            if e.self_cpu_time_total > 0:
                agg[e.key] = [e.count, e.self_cpu_time_total]
    rows = [[name, n / reps, us / reps] for name, (n, us) in agg.items()]
    return sorted(rows, key=lambda r: -r[2])


def print_breakdown(label, rows, what):
    calls = "launches" if what == "kernels" else "calls"
    print(f"       {what} a layer, {label}: {sum(r[1] for r in rows):.0f} {calls}, "
          f"{sum(r[2] for r in rows):.1f} us")
    for name, n, us in rows:
        print(f"         {us:8.1f} us  x{n:4.1f}  {name[:96]}")


def smoke(args):
    """CPU: groupmm's layer at tiny sizes against the float64 layer, every token. Returns the rows."""
    E, topk, H, F_ = 4, 2, 64, 64
    L = make_layer(E, H, F_, "cpu", seed=0)
    # At hidden 64 the products are small: a larger gate_up bias makes the limit clamp some gate /
    # up values, so the smoke test checks the clamped branches too.
    L["gu_bias"] = L["gu_bias"] * 16
    layers = dict(module=GroupmmModule(L, topk),
                  ops=GroupmmLayer(L, topk, args.scale_layout, args.path))
    rows = []
    for tokens in (1, 3, 8):
        x = torch.randn(tokens, H, generator=torch.Generator().manual_seed(tokens), dtype=torch.bfloat16)
        keep = ~ambiguous_tokens(x, L, topk)
        stats = {}
        ref = ref_layer(x, L, topk, list(range(tokens)), stats)
        for form, layer in layers.items():
            if args.kernels and tokens == 3:
                print_breakdown(f"groupmm {form}", kernel_breakdown(lambda: layer(x), 2),
                                "operators")
            err = rel_diff(layer(x), ref, keep)
            ok = err is None or err < TOLERANCE
            print(f"E={E} top-{topk} H={H} F={F_} tokens {tokens}  cpu smoke  groupmm {form} vs "
                  f"float64 rel diff {'-' if err is None else f'{err:.2e}'} ({int((~keep).sum())} "
                  f"ambiguous, {stats['clamped']:.0%} of gate/up clamped){'' if ok else '  FAIL'}")
            rows.append(dict(tokens=tokens, E=E, topk=topk, H=H, F=F_, groupmm_layer=form,
                             groupmm_ref_diff=err, ambiguous=int((~keep).sum()),
                             clamped=stats["clamped"], ok=ok))
    return rows


def peer_status(args):
    """(peer adapter or None, a line saying which peer runs, or why none)."""
    return peers_common.peer_status(
        args, "triton_kernels", load_peer,
        lambda p: f"{p.version} ({p.origin}), triton {p.triton}: {p.api}")


def run_gpu(args):
    device = torch.device("cuda")
    peer, line, hopper, constraints = peers_w4.peer_on_this_device(args, peer_status)
    L = make_layer(args.experts, args.hidden, args.hidden, device, seed=0)
    ours, theirs = groupmm_layer(args, L), None
    if peer is not None:
        try:
            theirs = PeerLayer(peer, L, args.topk, hopper)
        except Exception as e:
            print(f"peer triton_kernels: building its weights failed ({type(e).__name__}: {e}); "
                  "timing groupmm alone")
    print(f"{torch.cuda.get_device_name()}: E={args.experts} top-{args.topk} H=F={args.hidden}; each "
          f"time: median of {args.rounds} rounds of {args.reps} layers back to back in a CUDA graph "
          f"(L2 not flushed); groupmm layer={args.groupmm_layer}"
          + ("" if args.groupmm_layer == "module"
             else f", path={args.path}, scale_layout={args.scale_layout}"))
    print(f"{'tokens':>6} {'exp':>4} {'groupmm us':>11} {'peer us':>9} {'peer/g':>7} {'diff':>8} "
          f"{'g-ref':>8} {'ambig':>5}")
    rows, failed = [], False
    for tokens in args.tokens:
        gen = torch.Generator(device=device).manual_seed(tokens)
        x = torch.randn(tokens, args.hidden, generator=gen, device=device, dtype=torch.bfloat16)
        keep = ~ambiguous_tokens(x, L, args.topk)
        active = int(ref_logits(x, L).topk(args.topk, dim=1).indices.unique().numel())
        row = dict(tokens=tokens, active_experts=active, ambiguous=int((~keep).sum()))
        fns = {"groupmm": lambda: ours(x)}
        y = ours(x)
        n_ref = min(tokens, REF_TOKENS)
        ref = ref_layer(x, L, args.topk, list(range(n_ref)))
        row["groupmm_ref_diff"] = rel_diff(y[:n_ref], ref, keep[:n_ref])
        ok = row["groupmm_ref_diff"] is None or row["groupmm_ref_diff"] <= TOLERANCE
        if theirs is not None:
            try:
                y_peer = theirs(x)
                torch.cuda.synchronize()
                row["max_rel_diff"] = rel_diff(y, y_peer, keep)
                row["peer_ref_diff"] = rel_diff(y_peer[:n_ref], ref, keep[:n_ref])
                ok = ok and (row["max_rel_diff"] is None or row["max_rel_diff"] <= TOLERANCE)
                fns["peer"] = lambda: theirs(x)
            except Exception as e:
                row["peer_error"] = f"{type(e).__name__}: {e}".splitlines()[0]
        row["ok"] = ok
        failed |= not ok
        us, errors = peers_w4.time_graphs(fns, None, args.reps, args.rounds)
        for side, err in errors.items():
            row[f"{side}_error"] = err
        for side, t in us.items():
            row[f"{side}_us"] = t
        if "groupmm_us" in row and "peer_us" in row:
            row["ratio"] = row["peer_us"] / row["groupmm_us"]
        rows.append(row)

        def cell(key, fmt, width):
            v = row.get(key)
            return f"{'-' if v is None else format(v, fmt):>{width}}"
        print(f"{tokens:>6} {active:>4} {cell('groupmm_us', '.1f', 11)} {cell('peer_us', '.1f', 9)} "
              f"{cell('ratio', '.2f', 7)} {cell('max_rel_diff', '.1e', 8)} "
              f"{cell('groupmm_ref_diff', '.1e', 8)} {row['ambiguous']:>5}{'' if ok else '  FAIL'}")
        for key in ("peer_error", "groupmm_error"):
            if key in row:
                print(f"       {key}: {row[key]}")
        if args.kernels:
            for side, fn in fns.items():
                if f"{side}_error" not in row:
                    row[f"{side}_kernels"] = kernel_breakdown(fn, args.reps)
                    print_breakdown(side, row[f"{side}_kernels"], "kernels")
    print(f"diff: max |y_groupmm - y_peer| / max |y_peer|; g-ref: groupmm against the float64 layer "
          f"(first {REF_TOKENS} tokens); both over the tokens not ambiguous (ambig: 4th-5th logit gap "
          f"under {AMBIGUOUS:g} max|logit|); above {TOLERANCE:g} fails. peer/g > 1: groupmm faster.")
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, reps=args.reps,
                rounds=args.rounds, l2="not flushed (layers back to back in a CUDA graph)",
                groupmm_layer=args.groupmm_layer, groupmm_path=args.path,
                groupmm_scale_layout=args.scale_layout, peer=line,
                experts=args.experts, topk=args.topk, hidden=args.hidden, tolerance=TOLERANCE)
    if theirs is not None:
        meta.update(peer_api=peer.api, peer_version=peer.version, peer_origin=peer.origin,
                    triton=peer.triton, peer_layouts=theirs.layouts,
                    peer_opt_flags_constraints=constraints)
    return rows, meta, failed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=lambda s: [int(v) for v in s.split(",")], default=TOKENS,
                    help="comma-separated decode batches (default: %(default)s; 256,1024 optional)")
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=2880, help="hidden size = expert width")
    ap.add_argument("--groupmm-layer", default="module", choices=["module", "ops"],
                    help="groupmm.nn.MoE.from_gpt_oss (default) or the chain of ops it runs (which "
                         "takes --path and --scale-layout)")
    ap.add_argument("--kernels", action="store_true",
                    help="each side's kernels a layer (torch.profiler; CPU smoke: its operators)")
    peers_w4.add_common_options(ap, 20, "layers")
    args = ap.parse_args()
    return peers_common.finish(args, "triton_kernels", smoke, run_gpu, load_peer)


if __name__ == "__main__":
    sys.exit(main())
