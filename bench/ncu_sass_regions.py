"""Group the warp-state samples of one GEMM kernel's ncu source page (SASS) by where they fall.

Usage (on the GPU machine):
    ncu --set none --section WarpStateStats --section SourceCounters -k device_kernel -s 3 -c 1 \\
        -o rep groupmm bench gemm --recipe fp8_block --case dsv3_down --pass fwd --pattern balanced
    ncu -i rep.ncu-rep --page source --csv --print-source sass > sass.csv
    python3 bench/ncu_sass_regions.py sass.csv

Groups: the consumer mainloop by instruction class (from the full-barrier wait before the first
QGMMA), the consumer epilogue (from the last QGMMA's block to the consumer's EXIT), and every other
warp (producer, scheduler, prologue). The region bounds are found from the SASS, so they are
approximate to a few instructions.
"""

import csv
import sys


def count(x):
    x = x.replace(",", "")
    return int(x) if x.isdigit() else 0


def opcode(src):
    words = src.split()
    if not words:
        return ""
    return words[1] if words[0].startswith("@") and len(words) > 1 else words[0]


def main(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header = rows[1]
    data = [dict(zip(header, r)) for r in rows[2:]]
    src = [d["Source"].strip() for d in data]
    samples = [count(d["# Samples"]) for d in data]
    total = sum(samples)
    mma = [i for i, s in enumerate(src) if opcode(s).startswith("QGMMA")]
    if not mma:
        sys.exit(f"{path}: no QGMMA in the source page (not an FP8 wgmma kernel?)")
    start = max(i for i in range(mma[0]) if "TRYWAIT" in src[i]) - 2
    end = next(i for i in range(mma[-1], len(src)) if opcode(src[i]) == "EXIT")
    epilogue = next(i for i in range(mma[-1], len(src)) if "BAR.SYNC" in src[i] or "UTMACCTL" in src[i]) - 30
    groups = {}
    for i, s in enumerate(src):
        op = opcode(s)
        if i < start or i > end:
            key = "other warps (producer, scheduler, prologue)"
        elif i >= epilogue:
            key = "consumer: epilogue (store, barriers, tile bookkeeping)"
        elif op.startswith("QGMMA"):
            key = "consumer: QGMMA issue"
        elif op == "WARPGROUP.DEPBAR.LE":
            key = "consumer: wgmma wait (" + s.split()[-1].rstrip(";") + ")"
        elif "TRYWAIT" in s or (op == "BRA" and i > 0 and "TRYWAIT" in src[i - 1]):
            key = "consumer: waiting for a stage to land"
        elif op in ("FFMA", "FMUL"):
            key = "consumer: promotion FFMA"
        else:
            key = "consumer: other mainloop instructions"
        groups[key] = groups.get(key, 0) + samples[i]
    print(f"{path}: {total} samples")
    for key, value in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f"  {100 * value / total:5.1f}%  {key}")


if __name__ == "__main__":
    main(sys.argv[1])
