#!/usr/bin/env python3
"""Renders the tables of docs/performance.md from the run records in bench/data/*.json.

    python3 bench/perf_doc.py            # rewrite every table of the document in place
    python3 bench/perf_doc.py --check    # exit 1 and print a diff if the document is stale

Each table sits between `<!-- table:NAME -->` and `<!-- end -->`; NAME is one of TABLES below,
and every NAME appears in the document exactly once. The text between the markers belongs to
this script: edit the JSON record (or the renderer), never the rendered table. A record is

    {"title": ..., "runs": [{"id", "device", "date", "commit", "command", "what"?}, ...],
     "notes"?: ..., "rows" (or "cases", for `groupmm bench --json` records): [...]}

and each rendered table opens with one line per run: device, date, commit and command.
No third-party modules: the test (tests/python/test_perf_doc.py) runs without torch.
"""
import argparse
import difflib
import json
import math
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
DATA = os.path.join(ROOT, "bench", "data")
DOC = os.path.join(ROOT, "docs", "performance.md")
PASSES = ("fwd", "dgrad", "wgrad")


def load(name, data_dir):
    with open(os.path.join(data_dir, name + ".json")) as f:
        return json.load(f)


def rows_of(d, **match):
    rows = d.get("rows", d.get("cases", []))
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def caption(d, runs=None):
    out = []
    for r in d["runs"]:
        if runs and r["id"] not in runs:
            continue
        where = ", ".join(x for x in (r["device"], r["date"], r.get("commit", "")) if x)
        what = f" ({r['what']})" if r.get("what") else ""
        out.append(f"*{where}:* `{r['command']}`{what}")
    return "<br>\n".join(out) + "\n"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join("" if c is None else str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def f0(x):
    return "" if x is None else f"{x:.0f}"


def f2(x):
    return "" if x is None else f"{x:.2f}"


def pct(x):
    return "" if x is None or x == "" else f"{100 * x:.1f}%"


def geomean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs))


def cases_in_order(rows):
    seen = []
    for r in rows:
        if r["case"] not in seen:
            seen.append(r["case"])
    return seen


# ---- renderers: one per table name --------------------------------------------------------------

def gemm_bf16(dd):
    d = load("gemm_bf16_h200", dd)
    body = []
    for c in cases_in_order(rows_of(d)):
        r0 = rows_of(d, case=c)[0]
        cells = [c, f"{r0['G']} x {r0['M']} x {r0['N']} x {r0['K']}"]
        for p in PASSES:
            r = rows_of(d, case=c, pattern="balanced", **{"pass": p})
            if not r:
                cells.append("")
                continue
            r = r[0]
            xt = "torch refuses" if r["x_torch"] is None else f"{r['x_torch']:.2f}"
            cells.append(f"{f0(r['tflops'])} ({xt} / {f2(r['x_dense'])})")
        body.append(cells)
    host = "; ".join(f"{k} {v:.1f} us" for k, v in d["host_us"].items())
    return (caption(d) + "\nBalanced routing, per case:\n\n" +
            table(["case", "G x rows x N x K", "fwd TFLOP/s (x torch / x dense)", "dgrad", "wgrad"], body) +
            "\nPer pass, over every case and split pattern:\n\n" + gemm_bf16_summary(d) +
            f"\nHost time per call (no sync, best of 5 batches of 20): {host}.\n")


def gemm_bf16_summary(d):
    body = []
    for p in PASSES:
        rs = [r for r in rows_of(d, **{"pass": p}) if r["x_torch"] is not None]
        lo = min(rs, key=lambda r: r["x_torch"])
        below = sum(r["x_torch"] < 1.0 for r in rs)
        big = [r["x_dense"] for r in rows_of(d, case="contiguous_4x8192", **{"pass": p})]
        body.append([p, len(rs), f"{geomean([r['x_torch'] for r in rs]):.3f}",
                     f"{lo['x_torch']:.3f} ({lo['case']}, {lo['pattern']})", below,
                     f"{min(big):.2f}-{max(big):.2f}"])
    return table(["pass", "cases", "geomean x torch", "min x torch", "below 1.0", "x dense, 4 x 8192 rows"], body)


def gemm_fp8_current(dd):
    d = load("gemm_fp8_current_h200", dd)
    body = []
    for c in cases_in_order(rows_of(d)):
        cells = [c]
        for p in PASSES:
            r = rows_of(d, case=c, run="b" if p == "wgrad" else "a", **{"pass": p})
            cells.append(f0(r[0]["tflops"]) if r else "")
        for p in PASSES:
            r = rows_of(d, case=c, run="a", **{"pass": p})
            cells.append(f2(r[0]["x_torch"]) if r else "")
        body.append(cells)
    gm = " / ".join(f"{geomean([r['x_torch'] for r in rows_of(d, run='a', **{'pass': p})]):.2f}"
                    for p in PASSES)
    return (caption(d) + "\n" +
            table(["case", "fwd TFLOP/s", "dgrad", "wgrad", "fwd x torch", "dgrad x torch", "wgrad x torch"],
                  body) + f"\nGeomean x torch._scaled_grouped_mm (fwd / dgrad / wgrad): {gm}.\n")


def gemm_fp8_block(dd):
    d = load("gemm_fp8_block_h200", dd)
    body = []
    for c in cases_in_order(rows_of(d)):
        cells = [c]
        for p in PASSES:
            r = rows_of(d, case=c, **{"pass": p})
            cells.append(f"{f0(r[0]['tflops'])} ({f2(r[0]['x_bf16'])})" if r else "")
        body.append(cells)
    return caption(d) + "\n" + table(["case", "fwd TFLOP/s (x our bf16)", "dgrad", "wgrad"], body)


def fp8_power_cap(dd):
    d = load("fp8_power_cap_h200", dd)
    return caption(d) + "\n" + table(
        ["kernel", "TFLOP/s, 2000 launches", "TFLOP/s, 20 launches", "power", "SM clock"],
        [[r["kernel"], r["sustained"], r["short"], r["power"], r["clock"]] for r in rows_of(d)])


def peers_deepgemm(dd):
    d = load("peers_deepgemm_h200", dd)
    return caption(d) + "\n" + table(
        ["shape", "routing", "DeepGEMM", "groupmm fp8_block", "DeepGEMM / groupmm"],
        [[r["case"], r["routing"], r["deepgemm"], r["groupmm"], f2(r["deepgemm"] / r["groupmm"])]
         for r in rows_of(d)])


def gemm_w4(dd):
    d = load("gemm_w4_h200", dd)
    body = []
    for c in cases_in_order(rows_of(d)):
        n, m = rows_of(d, case=c, format="nvfp4")[0], rows_of(d, case=c, format="mxfp4")[0]
        cells = [c, n["path"]]
        for r in (n, m):
            extra = f", {100 * r['of_copy']:.0f}% of copy" if r["path"] == "decode" else ""
            cells.append(f"{r['us']:.1f} ({r['x_bf16']:.2f}x{extra})")
        cells.append(f"{n['bf16_us']:.1f}")
        body.append(cells)
    return caption(d) + "\n" + table(["case", "path", "nvfp4 us (x bf16)", "mxfp4 us (x bf16)", "bf16 us"], body)


def gemm_w4_fused(dd):
    d = load("gemm_w4_fused_h200", dd)
    body = []
    for r in rows_of(d):
        best = min(r["decode_us"], r["prefill_us"])
        body.append([r["case"], r["format"], r["M"] // r["G"], r["automatic"], f"{r['decode_us']:.0f}",
                     f"{r['prefill_us']:.0f}", f"{r['fused_us']:.0f} ({r['fused_tflops']:.0f} TFLOP/s)",
                     f"{r['fused_rs_us']:.0f}", f"{r['fused_coop_us']:.0f}", f"{r['bf16_us']:.0f}",
                     f2(best / r["fused_us"])])
    return caption(d) + "\n" + table(
        ["case", "format", "rows an expert", "automatic", "decode us", "prefill us", "fused us",
         "fused rs_256x128 us", "fused coop_128x256 us", "bf16 engine us",
         "fused speed / best of decode, prefill"],
        body) + f"\n{d['notes']}\n"


def gemm_w4_decode_passes(dd):
    d = load("gemm_w4_decode_passes_h200", dd)
    body = [[r["case"], r["format"], f"{r['M'] / r['G']:g}", f"{r['before_us']:.1f} ({r['passes_before']})",
             f"{r['us']:.1f} ({r['passes']})", f2(r["before_us"] / r["us"]),
             f"{r['pass8_us']:.0f} / {r['pass16_us']:.0f} / {r['pass32_us']:.0f}"] for r in rows_of(d)]
    return caption(d) + "\n" + table(
        ["case", "format", "rows an expert", "one kind us (tokens a pass)", "wide passes us (tokens a pass)",
         "speedup", "forced 8 / 16 / 32 us"], body) + f"\n{d['notes']}\n"


def gemm_w4_decode_ctas(dd):
    d = load("gemm_w4_decode_ctas_h200", dd)
    body = [[r["format"], r["case"], r["timing"], f"{r['three_ctas_us']:.1f}", f"{r['two_ctas_us']:.1f}",
             f2(r["three_ctas_us"] / r["two_ctas_us"]),
             "" if r["two_ctas_4_slots_us"] is None else f"{r['two_ctas_4_slots_us']:.1f}"] for r in rows_of(d)]
    return caption(d) + "\n" + table(
        ["format", "case", "timing", "three CTAs an SM us", "two CTAs us", "speedup", "two CTAs, four slots us"],
        body) + f"\n{d['notes']}\n"


def peers_triton(dd):
    d = load("peers_triton_mxfp4_h200", dd)
    return caption(d) + "\n" + table(
        ["run", "tokens", "triton_kernels gate_up / down", "groupmm gate_up / down",
         "groupmm / peer speed", "max rel. diff"],
        [[r["run"], r["tokens"], r["peer"], r["groupmm"], r["ratio"], r["max_rel_diff"]]
         for r in rows_of(d)]) + f"\n{d['notes']}\n"


def peers_serving_triton(dd):
    d = load("peers_serving_triton_h200", dd)
    return caption(d) + "\n" + table(
        ["run", "tokens", "active experts", "groupmm us", "triton_kernels layer us",
         "groupmm / peer speed", "max rel. diff (ambiguous tokens)"],
        [[r["run"], r["tokens"], r["active_experts"], f"{r['groupmm_us']:.1f}", f"{r['peer_us']:.1f}", f2(r["ratio"]),
          f"{r['max_rel_diff']:.1e} ({r['ambiguous']})"] for r in rows_of(d)]) + f"\n{d['notes']}\n"


def quantize(dd):
    bal, zipf, h100 = (load(n, dd) for n in ("quantize_balanced_h200", "quantize_zipf_h200",
                                            "quantize_balanced_h100"))

    def frac(d, recipe, direction, big):
        for r in rows_of(d, recipe=recipe, direction=direction):
            if r["shape"].startswith("[65536" if big else "[32768"):
                return r["fraction_of_copy"]

    body = []
    for r in rows_of(h100):
        rec, dr = r["recipe"], r["direction"]
        tgt = next((c["target"] for c in rows_of(bal, recipe=rec, direction=dr)), 0)
        body.append([rec, dr,
                     f"{pct(frac(bal, rec, dr, True))} / {pct(frac(bal, rec, dr, False))}",
                     f"{pct(frac(zipf, rec, dr, True))} / {pct(frac(zipf, rec, dr, False))}",
                     f"{pct(r['large'])} / {pct(r['small'])}", pct(tgt) if tgt else "-"])
    return ("<br>\n".join(caption(d).rstrip("\n") for d in (bal, zipf, h100)) + "\n\n" +
            table(["recipe", "direction", "H200 balanced", "H200 Zipf", "H100 balanced", "target"], body))


def layer_bf16(dd):
    d = load("layer_bf16_h200", dd)
    return caption(d) + "\n" + table(
        ["case", "pattern", "layer us", "sum of its GEMMs us", "ratio", "host us per forward"],
        [[r["case"], r["pattern"], r["layer_us"], r["gemm_sum_us"], f"{r['layer_us'] / r['gemm_sum_us']:.3f}",
          r["host_us_per_forward"]] for r in rows_of(d)])


def layer_fp8(dd):
    d = load("layer_fp8_h200", dd)
    body = []
    for c in cases_in_order(rows_of(d)):
        cells = [c]
        for rec in ("fp8_current", "fp8_block"):
            r = rows_of(d, case=c, recipe=rec)[0]
            cells += [f"{r['bf16_us'] / r['new_w_us']:.2f}", f"{r['bf16_us'] / r['cached_w_us']:.2f}"]
        body.append(cells)
    return caption(d) + "\n" + table(["case", "fp8_current new W", "cached W", "fp8_block new W", "cached W"],
                                     body)


def layer_fp8_wgrad(dd):
    d = load("layer_fp8_wgrad_h200", dd)
    body = []
    for c in cases_in_order(rows_of(d)):
        cells = [c]
        for rec in ("fp8_current", "fp8_block"):
            r = rows_of(d, case=c, recipe=rec)[0]
            cells += [f"{r['bf16_us'] / r['cached_w_us']:.2f}",
                      f"{r['bf16_us'] / r['hp_wgrad_cached_w_us']:.2f}"]
        body.append(cells)
    return caption(d) + "\n" + table(
        ["case", "fp8_current", "with the bf16 wgrad", "fp8_block", "with the bf16 wgrad"], body) + \
        f"\n{d['notes']}\n"


def layer_step_kernels(dd):
    d = load("layer_step_kernels_h200", dd)
    return caption(d) + "\n" + table(["stage", "bf16", "fp8_block"],
                                     [[r["stage"], r["bf16"], r["fp8_block"]] for r in rows_of(d)])


def moe_block(dd):
    d = load("moe_block_h200", dd)
    return caption(d) + "\n" + table(
        ["case", "torch fwd / f+b us", "ours fwd / f+b us", "x fwd", "x f+b", "non-GEMM share", "movers, of copy"],
        [[r["case"], f"{r['torch_fwd_us']} / {r['torch_fb_us']}", f"{r['fwd_us']} / {r['fb_us']}",
          f2(r["torch_fwd_us"] / r["fwd_us"]), f2(r["torch_fb_us"] / r["fb_us"]), pct(r["non_gemm_share"]),
          r["movers"]] for r in rows_of(d)])


def moe_dense_bound(dd):
    d = load("moe_dense_bound_h200", dd)
    a = d["activation_bytes"]

    def pc(x):
        return f"{100 * x:.0f}%"

    return (caption(d) + "\n" + table(
        ["case", "fwd, share of bound", "fwd + bwd", "FP8 block vs bf16 block (fp8_current / fp8_block)"],
        [[r["case"], pc(r["fwd"]), pc(r["fb"]),
          "" if r["fp8_current"] is None else f"{r['fp8_current']:.2f}x / {r['fp8_block']:.2f}x"]
         for r in rows_of(d)]) +
            f"\nActivation bytes kept for backward ({a['case']}): groupmm {a['groupmm']}, "
            f"plain PyTorch block {a['plain PyTorch block']}.\n")


def moe_bench_bound(dd):
    d = load("moe_bench_bound_h200", dd)
    base = {(r["run"], r["case"]): r["fb_us"] for r in rows_of(d, recipe="bf16")}
    return caption(d) + "\n" + table(
        ["run", "case", "recipe", "fwd us (bound)", "share", "fwd + bwd us (bound)", "share", "f+b vs bf16"],
        [[r["run"], r["case"], r["recipe"], f"{r['fwd_us']} ({r['bound_fwd_us']})",
          pct(r["bound_fwd_us"] / r["fwd_us"]), f"{r['fb_us']} ({r['bound_fb_us']})",
          pct(r["bound_fb_us"] / r["fb_us"]), f"{base[(r['run'], r['case'])] / r['fb_us']:.2f}x"]
         for r in rows_of(d)])


def moe_stages_recipes(dd):
    d = load("moe_stages_recipes_h200", dd)
    recipes = ("bf16", "fp8_block", "fp8_current")

    def cell(r, rec, way):
        v = r[f"{rec}_{way}_us"]
        if v is None:
            return ""
        b = r[f"bf16_{way}_us"]
        return f"{v:.1f}" if rec == "bf16" else f"{v:.1f} ({b / v:.2f}x)"
    return caption(d) + "\n" + table(
        ["stage"] + [f"{rec} fwd us" for rec in recipes] + [f"{rec} bwd us" for rec in recipes],
        [[r["stage"]] + [cell(r, rec, "fwd") for rec in recipes] + [cell(r, rec, "bwd") for rec in recipes]
         for r in rows_of(d)]) + f"\n{d['notes']}\n"


def kernel_gate_up(dd):
    d = load("kernel_layer_gate_up_h200", dd)
    tf = lambda r, k: "" if r[k] is None else f"{r[k]} ({r['flops'] / (r[k] * 1e6):.0f})"
    return caption(d) + "\n" + table(
        ["case", "run", "fused coop 128x256 us (TFLOP/s)", "h only", "coop on 2-CTA clusters", "ping-pong 128x128",
         "unfused chain us", "fused vs unfused", "stock grouped GEMM alone", "dense cuBLAS", "fused share of dense"],
        [[r["case"], r["run"], tf(r, "coop_us"), tf(r, "h_only_us"), tf(r, "c2_us"), tf(r, "pingpong_us"),
          r["unfused_us"],
          f"{r['unfused_us'] / r['coop_us']:.2f}x", tf(r, "gemm_us"), tf(r, "dense_us"),
          pct(r["dense_us"] / r["coop_us"])] for r in rows_of(d)])


def kernel_down_dgrad(dd):
    d = load("kernel_layer_down_dgrad_h200", dd)
    tf = lambda r, k: "" if r.get(k) is None else f"{r[k]} ({r['flops'] / (r[k] * 1e6):.0f})"
    return caption(d) + "\n" + table(
        ["case", "run", "fused coop 128x256 us (TFLOP/s)", "epi_warps", "unfused chain us", "fused vs unfused",
         "stock grouped dgrad alone", "dense cuBLAS dgrad", "fused share of dense"],
        [[r["case"], r["run"], tf(r, "fused_us"), tf(r, "epi_warps_us"), r["unfused_us"],
          f"{r['unfused_us'] / r['fused_us']:.2f}x", tf(r, "gemm_us"), tf(r, "dense_us"),
          pct(r["dense_us"] / r["fused_us"])] for r in rows_of(d)])


def moe_memory(dd):
    d = load("moe_memory_h200", dd)
    return caption(d) + "\n" + table(
        ["case", "kept: recompute / keep / torch (T*H rows)", "step us: recompute / keep", "x torch"],
        [[r["case"], f"{r['kept_recompute']} / {r['kept_keep']} / {r['kept_torch']}",
          f"{r['recompute_us']} / {r['keep_us']}", f2(r["torch_us"] / r["recompute_us"])] for r in rows_of(d)])


def ep_plan(dd):
    d = load("ep_plan_h200", dd)
    return caption(d) + "\n" + table(
        ["run", "mode", "plan us", "host us", "dispatch us", "combine us"],
        [[r["run"], r["mode"], r["plan_us"], r.get("host_us"), r["dispatch_us"], r["combine_us"]]
         for r in rows_of(d)])


def ep_exchange(dd):
    d = load("ep_exchange_h200x2", dd)
    return caption(d) + "\n" + table(
        ["run", "case", "mode", "plan us", "dispatch us", "GB/s", "combine us", "GB/s"],
        [[r["run"], r["case"], r["mode"], r["plan_us"], r["dispatch_us"], r["dispatch_gbs"],
          r["combine_us"], r["combine_gbs"]] for r in rows_of(d)]) + f"\n{d['notes']}\n"


def ep_scaling(dd):
    d = load("ep_scaling_h200x2", dd)
    return caption(d) + "\n" + table(
        ["run", "case", "1 GPU fwd / f+b us", "capacity 2.0", "capacity 1.25", "capacity 1.1",
         "throughput"],
        [[r["run"], r["case"], r["one_gpu"]] +
         [f2(r[k]) if r[k] is not None else "" for k in ("cap2", "cap125", "cap11", "throughput")]
         for r in rows_of(d)])


def ep_overlap(dd):
    d = load("ep_overlap_h200x2", dd)
    return caption(d) + "\n" + table(
        ["run", "case", "R", "chunks", "exchange us", "experts us", "step, 1 chunk",
         "step, chunked", "exposed us", "exposed / exchange"],
        [[r["run"], r["case"], r["R"], r.get("chunks", 2), r["exchange_us"], r["experts_us"], r["step1_us"],
          r["stepn_us"], r["exposed_us"], f2(r["exposed_us"] / r["exchange_us"])]
         for r in rows_of(d)])


def hf_backends(dd):
    d = load("hf_backends_h200", dd)
    rows = rows_of(d)
    peer = {r["family"]: r for r in rows if r["backend"] == "grouped_mm"}
    out = []
    for r in rows:
        if "error" in r:
            out.append([r["family"], r["backend"], "refused: " + r["error"].split(": ", 1)[-1]]
                       + [""] * 5)
            continue
        bs = list(r["decode_ms"])
        dec = " / ".join(f"{r['decode_ms'][b]:.2f}" + ("" if r["decode_graphed"][b] else "*")
                         for b in bs)
        p = peer.get(r["family"])
        vs = ""
        if p and r["backend"] not in ("eager", "grouped_mm"):
            vs = (f"{p['train_ms'] / r['train_ms']:.2f}x / {p['prefill_ms'] / r['prefill_ms']:.2f}x"
                  " / " + " / ".join(f"{p['decode_ms'][b] / r['decode_ms'][b]:.2f}x" for b in bs))
        agree = ("" if "logits_calc_diff" not in r or r["backend"] == "eager" else
                 f"{r['logits_calc_diff']:.1e} / {r['grads_calc_diff']:.1e}")
        out.append([r["family"], r["backend"], f"{r['train_ms']:.1f}", f"{r['prefill_ms']:.2f}",
                    dec, vs, agree])
    return caption(d) + "\n" + table(
        ["family", "experts backend", "train step ms", "prefill ms", "decode ms, batch 1 / 8 / 64",
         "vs grouped_mm: train / prefill / decode 1 / 8 / 64", "calc_diff vs eager: logits / grads"],
        out)


def grouped_mm_dropin(dd):
    d = load("grouped_mm_dropin_h200", dd)
    return caption(d) + "\n" + table(
        ["case", "form", "G, M, N, K", "pass", "torch ms", "groupmm ms", "torch / groupmm"],
        [[r["case"], r["form"], f"{r['G']}, {r['M']}, {r['N']}, {r['K']}", r["pass_"],
          r["torch_ms"], r["groupmm_ms"], f2(r["torch_ms"] / r["groupmm_ms"])]
         for r in rows_of(d)])


def python_overhead(dd):
    d = load("python_overhead_h100", dd)
    return caption(d) + "\n" + table(["op", "run 1", "run 2", "run 3"],
                                     [[r["op"], r["run1"], r["run2"], r["run3"]] for r in rows_of(d)])


TABLES = {f.__name__: f for f in (
    gemm_bf16, gemm_fp8_current, gemm_fp8_block, fp8_power_cap,
    peers_deepgemm, gemm_w4, gemm_w4_fused, gemm_w4_decode_passes, gemm_w4_decode_ctas, peers_triton, peers_serving_triton, quantize, layer_bf16, layer_fp8, layer_fp8_wgrad, layer_step_kernels,
    moe_block, moe_dense_bound, moe_bench_bound, moe_stages_recipes, kernel_gate_up, kernel_down_dgrad, moe_memory, ep_plan, ep_exchange, ep_scaling, ep_overlap,
    python_overhead, hf_backends, grouped_mm_dropin)}

MARK = re.compile(r"(<!-- table:(\w+) -->\n)(.*?)(<!-- end -->)", re.S)


def render(doc, data_dir):
    """The document with every table rendered again; raises on unknown, missing or repeated names."""
    names = [m.group(2) for m in MARK.finditer(doc)]
    unknown = sorted(set(names) - set(TABLES))
    missing = sorted(set(TABLES) - set(names))
    repeated = sorted({n for n in names if names.count(n) > 1})
    if unknown or missing or repeated:
        raise SystemExit(f"perf_doc: table markers: unknown {unknown}, missing {missing}, repeated {repeated}")
    return MARK.sub(lambda m: m.group(1) + TABLES[m.group(2)](data_dir) + m.group(4), doc)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 with a diff if the document is stale")
    ap.add_argument("--doc", default=DOC)
    ap.add_argument("--data", default=DATA)
    a = ap.parse_args(argv)
    with open(a.doc) as f:
        doc = f.read()
    new = render(doc, a.data)
    if a.check:
        if new != doc:
            sys.stdout.writelines(difflib.unified_diff(doc.splitlines(True), new.splitlines(True),
                                                       a.doc, a.doc + " (rendered from bench/data)"))
            print(f"perf_doc: {a.doc} is stale; run python3 bench/perf_doc.py")
            return 1
        print(f"perf_doc: {a.doc} matches bench/data ({len(TABLES)} tables)")
        return 0
    if new != doc:
        with open(a.doc, "w") as f:
            f.write(new)
        print(f"perf_doc: rewrote {a.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
