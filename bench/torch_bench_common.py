"""What the PyTorch package's bench scripts share (bench/torch_*.py): finding the package, the
device and timer, and the output (a markdown table on stdout, a JSON file)."""

import argparse
import json
import os
import statistics
import sys
import time

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
# The in-place build (scripts/build_python.sh) when groupmm is not installed.
sys.path.insert(1, os.path.join(_HERE, "..", "python"))
sys.path.insert(1, _HERE)


def parser(description, json_default):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--cpu", action="store_true",
                   help="run on the CPU (the reference backend: a smoke run; no GPU needed)")
    p.add_argument("--quick", action="store_true", help="small shapes and few repetitions")
    p.add_argument("--iters", type=int, default=0, help="timed repetitions (median)")
    p.add_argument("--json", default=json_default, help="where to write the results")
    return p


def device_of(args):
    if args.cpu:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        sys.exit("no CUDA device visible: run on the GPU machine, or pass --cpu for a smoke run")
    return torch.device("cuda")


def device_name(device):
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def median_us(fn, device, warmup=3, iters=10):
    """Median time of fn() in microseconds: CUDA events around each call on the GPU (device time,
    as `groupmm bench` measures), the wall clock on the CPU."""
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(iters)]
        for start, end in ev:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return 1e3 * statistics.median(s.elapsed_time(e) for s, e in ev)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(1e6 * (time.perf_counter() - t0))
    return statistics.median(times)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def table(columns, rows):
    """A markdown table; rows are dicts keyed by the column names (ratios to 3 decimals)."""
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
        return str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def write_json(path, payload):
    if os.path.dirname(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)
    print(f"wrote {path}")


def header(device):
    import groupmm  # noqa: F401  (fails loudly when the extension is missing)
    return {"device": device_name(device), "torch": torch.__version__}
