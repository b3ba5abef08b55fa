#!/usr/bin/env python3
"""Renders PNG charts from the `--json` files of `groupmm bench` (bench/data/README.md).

    python3 bench/plot.py out/gemm_merged.json out/quantize.json out/layer.json [--out DIR]

One chart per file, by its "suite":
  gemm      TFLOP/s of ours and of each peer measured in the same run (dense cuBLAS GEMM of the
            same total size, the cuBLAS per-expert loop, and torch._grouped_mm when the file is the
            merged output of bench/peers_torch.py), per case and split pattern, one panel per pass;
  quantize  GB/s of every recipe and direction against the device-to-device copy of the same run
            (and the target fraction of copy, where there is one), one panel per shape and pattern;
  layer     the GroupedLinear forward + backward time beside its three grouped GEMMs timed alone
            (stacked forward / dgrad / wgrad), per case and pattern.
Charts go next to each JSON file (or into --out) as <file>.png; the paths are printed.
Needs matplotlib (Debian: python3-matplotlib; pip: matplotlib).
"""
import argparse
import json
import os
import sys

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("plot.py: needs matplotlib (Debian: apt-get install python3-matplotlib; pip install matplotlib)")

OURS, DENSE, LOOP, TORCH, COPY = "#1f77b4", "#7f7f7f", "#bcbd22", "#d62728", "#2ca02c"


def suite_of(data):
    if isinstance(data, list):  # the layer suite's first format: a bare list of records
        return "layer", {"cases": data}
    return data.get("suite", "gemm" if "host_us_per_call" in data else ""), data


def plot_gemm(d, title):
    passes = [p for p in ("fwd", "dgrad", "wgrad") if any(c["pass"] == p for c in d["cases"])]
    has_torch = any(c.get("torch_us") for c in d["cases"])
    fig, axes = plt.subplots(len(passes), 1, figsize=(16, 4.2 * len(passes)), squeeze=False)
    for ax, p in zip(axes[:, 0], passes):
        cases = [c for c in d["cases"] if c["pass"] == p]
        x = range(len(cases))
        series = [("ours (cutlass_sm90)", "us", OURS), ("dense cuBLAS, same total size", "dense_us", DENSE),
                  ("cuBLAS per-expert loop", "loop_us", LOOP)]
        if has_torch:
            series.append(("torch._grouped_mm", "torch_us", TORCH))
        w = 0.8 / len(series)
        for i, (label, key, color) in enumerate(series):
            tflops = [c["flops"] / c[key] / 1e6 if c.get(key) else 0 for c in cases]
            ax.bar([j + (i - (len(series) - 1) / 2) * w for j in x], tflops, w, label=label, color=color)
        ax.set_xticks(list(x))
        ax.set_xticklabels([f"{c['case']}\n{c['pattern']}" for c in cases], rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("TFLOP/s")
        ax.set_title(f"{p}: grouped GEMM, bf16 (higher is better)")
        ax.grid(axis="y", alpha=0.3)
        ax.set_ylim(0, ax.get_ylim()[1] * 1.2)  # room for the legend above the bars
        ax.legend(fontsize=8, ncol=len(series), loc="upper left")
    fig.suptitle(title)
    return fig


def plot_quantize(d, title):
    groups = {}
    for c in d["cases"]:
        groups.setdefault(c["shape"], []).append(c)
    fig, axes = plt.subplots(1, len(groups), figsize=(6.5 * len(groups), 5), squeeze=False)
    for ax, (shape, cases) in zip(axes[0], groups.items()):
        copy = [c for c in cases if c["recipe"].startswith("copy")]
        rows = [c for c in cases if not c["recipe"].startswith("copy")]
        copy_gbps = copy[0]["gbps"] if copy else d.get("copy_gbps", 0)
        x = range(len(rows))
        ax.bar(list(x), [c["gbps"] for c in rows], 0.7, color=OURS, label="ours (graph replay)")
        for j, c in enumerate(rows):
            ax.text(j, c["gbps"], f"{100 * c['gbps'] / copy_gbps:.0f}%", ha="center", va="bottom", fontsize=7)
            if c.get("target"):
                ax.plot([j - 0.35, j + 0.35], [c["target"] * copy_gbps] * 2, color=TORCH, lw=2,
                        label="target" if j == next(i for i, r in enumerate(rows) if r.get("target")) else None)
        if copy_gbps:
            ax.axhline(copy_gbps, color=COPY, ls="--", label=f"D2D copy {copy_gbps:.0f} GB/s")
        ax.set_xticks(list(x))
        ax.set_xticklabels([f"{c['recipe']}\n{c['direction']}" for c in rows], rotation=45, ha="right", fontsize=8)
        ax.set_ylabel("GB/s (input read + outputs written)")
        ax.set_title(shape)
        ax.grid(axis="y", alpha=0.3)
        ax.set_ylim(0, ax.get_ylim()[1] * 1.2)
        ax.legend(fontsize=8, ncol=3, loc="upper left")
    fig.suptitle(title)
    return fig


def plot_layer(d, title):
    cases = d["cases"]
    x = range(len(cases))
    fig, ax = plt.subplots(figsize=(max(8, 1.4 * len(cases)), 5))
    bottom = [0.0] * len(cases)
    for key, label, color in (("fwd_us", "forward GEMM alone", OURS), ("dgrad_us", "dgrad GEMM alone", LOOP),
                              ("wgrad_us", "wgrad GEMM alone", DENSE)):
        vals = [c[key] for c in cases]
        ax.bar([j - 0.2 for j in x], vals, 0.38, bottom=bottom, label=label, color=color)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.bar([j + 0.2 for j in x], [c["layer_us"] for c in cases], 0.38, label="GroupedLinear fwd + bwd", color=TORCH)
    for j, c in enumerate(cases):
        ax.text(j + 0.2, c["layer_us"], f"{c['layer_us'] / (c['fwd_us'] + c['dgrad_us'] + c['wgrad_us']):.2f}x",
                ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x))
    ax.set_xticklabels([f"{c['case']}\n{c['pattern']}" for c in cases], fontsize=8)
    ax.set_ylabel("us per forward + backward")
    ax.set_title("layer vs the sum of its grouped GEMMs (ratio above the layer bar)")
    ax.grid(axis="y", alpha=0.3)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.2)
    ax.legend(fontsize=8, ncol=4, loc="upper left")
    fig.suptitle(title)
    return fig


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="JSON files written by groupmm bench --json (or peers_torch.py)")
    ap.add_argument("--out", help="folder for the PNGs (default: next to each JSON file)")
    args = ap.parse_args()
    plotters = {"gemm": plot_gemm, "quantize": plot_quantize, "layer": plot_layer}
    for path in args.files:
        with open(path) as f:
            suite, data = suite_of(json.load(f))
        if suite not in plotters:
            sys.exit(f"plot.py: {path}: unknown suite '{suite}' (expected gemm, quantize or layer)")
        title = f"groupmm bench {suite}" + (f" on {data['device']}" if data.get("device") else "")
        title += f" ({os.path.basename(path)})"
        fig = plotters[suite](data, title)
        fig.tight_layout()
        out_dir = args.out or os.path.dirname(os.path.abspath(path))
        os.makedirs(out_dir, exist_ok=True)
        png = os.path.join(out_dir, os.path.splitext(os.path.basename(path))[0] + ".png")
        fig.savefig(png, dpi=100)
        plt.close(fig)
        print(png)


if __name__ == "__main__":
    main()
