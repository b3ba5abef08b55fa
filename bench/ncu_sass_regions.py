"""Group the warp-state samples of one GEMM kernel's ncu source page (SASS) by where they fall.

Usage (on the GPU machine):
    ncu --set none --section WarpStateStats --section SourceCounters -k device_kernel -s 3 -c 1 \\
        -o rep groupmm bench gemm --recipe fp8_block --case dsv3_down --pass fwd --pattern balanced
    ncu -i rep.ncu-rep --page source --csv --print-source sass > sass.csv
    python3 bench/ncu_sass_regions.py sass.csv

Groups: the consumer mainloop by instruction class (from the full-barrier wait before the first
QGMMA), the consumer epilogue (from the last QGMMA's block to the consumer's EXIT), and every other
warp (producer, scheduler, prologue). The region bounds are found from the SASS, so they are
approximate to a few instructions. A kernel without QGMMA (bf16 wgmma, groupmm's own kernel layer)
is split into runs of instructions by how often they execute instead (see by_count).
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
    if not mma:  # not a CUTLASS FP8 mainloop: the kernel's runs of equal execution counts
        return by_count(path, data, src, samples, total)
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


def by_count(path, data, src, samples, total):
    """Any kernel: consecutive instructions with the same class of execution count form a run (per
    K block, per tile, once, never), printed with their share of the samples, their stall reasons
    and their first instruction: the mainloop, the epilogue and the producer's loop fall apart by
    how often they run (per K block: a third of a wgmma's count and up, spin loops included)."""
    executed = [count(d["Instructions Executed"]) for d in data]
    stalls = [k for k in data[0] if k.startswith("stall_") and "Not Issued" not in k]
    gmma = [e for e, t in zip(executed, src) if "GMMA" in opcode(t)]
    top = max(gmma) if gmma else max(executed)  # an MMA's count: once per K block (and warp)
    cls = ["per K block" if e >= top / 3 else "per tile" if e > 0 else "not executed" for e in executed]
    runs, a = [], 0
    for i in range(1, len(src) + 1):
        if i == len(src) or cls[i] != cls[a]:
            runs.append((a, i - 1))
            a = i
    print(f"{path}: {total} samples (no QGMMA: runs of instructions by execution count)")
    for a, b in runs:
        n = sum(samples[a:b + 1])
        if n < 0.005 * total:
            continue
        why = {k: sum(count(data[i][k]) for i in range(a, b + 1)) for k in stalls}
        worst = ", ".join(f"{k[6:]} {100 * v / n:.0f}%" for k, v in sorted(why.items(), key=lambda kv: -kv[1])[:3])
        print(f"  {100 * n / total:5.1f}%  [{a}, {b}] {cls[a]:12}  {worst}   ({src[a][:40]})")


if __name__ == "__main__":
    main(sys.argv[1])
