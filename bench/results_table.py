#!/usr/bin/env python3
"""Renders a `peers_torch.py` merged JSON as markdown tables (for bench/RESULTS.md).

    python3 bench/results_table.py out/gemm_merged.json
"""
import json
import math
import sys


def main():
    d = json.load(open(sys.argv[1]))
    print(f"Device: {d['device']}; copy bandwidth {d['copy_gbs']:.0f} GB/s (read+write); "
          f"host time per grouped_gemm call: {d.get('host_us_per_call', float('nan')):.1f} us\n")
    print("| case | pass | pattern | G | M | N | K | us | TFLOP/s | GB/s | x torch | x dense | x cuBLAS loop | config |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    ratios = {}
    for c in d["cases"]:
        xt = c.get("x_torch")
        if xt:
            ratios.setdefault(c["pass"], []).append(xt)
        print(f"| {c['case']} | {c['pass']} | {c['pattern']} | {c['G']} | {c['M']} | {c['N']} | {c['K']} | "
              f"{c['us']:.1f} | {c['flops'] / c['us'] / 1e6:.0f} | {c['bytes'] / c['us'] / 1e3:.0f} | "
              f"{xt if xt is None else f'{xt:.3f}'} | {c['dense_us'] / c['us']:.3f} | "
              f"{c['loop_us'] / c['us']:.3f} | {c['config']} |")
    print()
    for p, rs in ratios.items():
        gm = math.exp(sum(map(math.log, rs)) / len(rs))
        print(f"- {p}: geometric mean {gm:.3f}x torch._grouped_mm, min {min(rs):.3f}x, n={len(rs)}")


if __name__ == "__main__":
    main()
