#!/usr/bin/env python3
"""GroupedLinear forward + backward through the PyTorch package on the shapes of
`groupmm bench layer` (Qwen3-30B-A3B expert layers: gate_up G=128 K=2048 N=1536, down G=128
K=768 N=2048; 65536 routed rows; bf16; balanced, Zipf and 25%-empty splits), against the C++
nn::GroupedLinear's step on the same tensors in the same process (the _core_layer_step_us hook).

    PYTHONPATH=python python3 bench/torch_layer_step.py [--recipe bf16] [--json out/torch_layer_step.json]
    PYTHONPATH=python python3 bench/torch_layer_step.py --cpu --quick      (a smoke run)

A step is: y = layer(x, splits); y.backward(dy) with x requiring grad (dx, dW; immediate wgrad),
as the CLI's layer.forward + layer.backward. Device time, CUDA events, median of --iters. The
`core_us` column is what `groupmm bench layer` reports as "layer us" for the same case (up to the
split pattern's expert order: Zipf and 25%-empty shuffle which expert gets which count with
Python's RNG here, the CLI's with std::mt19937_64; the counts are the same). Target (issue 20):
the package within 3% of the core layer (ratio <= 1.03).
"""

import math
import random

import torch_bench_common as common  # noqa: I001  (sets up sys.path)

import torch

import groupmm

ops = torch.ops.groupmm
LAYERS = [("qwen3_gate_up", 128, 2048, 1536), ("qwen3_down", 128, 768, 2048)]
PATTERNS = ("balanced", "zipf", "empty25")


def bench_splits(pattern, G, total, seed=7):
    """tools/bench/harness.cpp's bench_splits: the same per-expert counts (expert order aside)."""
    rng = random.Random(seed)
    w = [1.0] * G
    if pattern == "zipf":
        w = [1.0 / (i + 1) ** 1.1 for i in range(G)]
        rng.shuffle(w)
    elif pattern == "empty25":
        idx = list(range(G))
        rng.shuffle(idx)
        for i in idx[:G // 4]:
            w[i] = 0.0
    s = [math.floor(v / sum(w) * total) for v in w]
    i = 0
    while sum(s) < total:
        if w[i] > 0:
            s[i] += 1
        i = (i + 1) % G
    return s


def time_case(name, G, K, N, rows, pattern, recipe, device, iters, warmup):
    align = {"fp8_block": 128, "fp8_current": 16, "mxfp8": 16}.get(recipe, 1)
    counts = bench_splits(pattern, G, rows // align)
    splits = torch.tensor([c * align for c in counts], dtype=torch.int32, device=device)
    torch.manual_seed(0)
    layer = groupmm.nn.GroupedLinear(G, K, N, bias=False, recipe=recipe, device=device)
    x = (torch.rand(rows, K, device=device, dtype=torch.bfloat16) * 2 - 1).requires_grad_()
    dy = (torch.rand(rows, N, device=device, dtype=torch.bfloat16) * 2 - 1) * 0.05

    def step():
        layer(x, splits).backward(dy)
        x.grad = layer.weight.grad = None  # no grad accumulation kernels (the core writes dW)

    ours = common.median_us(step, device, warmup, iters)
    core = ops._core_layer_step_us(x.detach(), splits, layer.weight.detach(), None, dy, recipe,
                                   iters=iters, warmup=warmup)
    flops = 6.0 * rows * N * K
    return dict(case=name, pattern=pattern, G=G, M=rows, N=N, K=K, recipe=recipe, package_us=ours,
                core_us=core, ratio=ours / core, tflops=flops / ours / 1e6, met=ours / core <= 1.03)


def main():
    p = common.parser(__doc__.splitlines()[0], "out/torch_layer_step.json")
    p.add_argument("--recipe", default="bf16", choices=["bf16", "fp8_current", "fp8_block",
                                                         "mxfp8"])
    p.add_argument("--rows", type=int, default=0, help="routed rows (default GPU 65536, CPU 512)")
    p.add_argument("--pattern", default=",".join(PATTERNS), help="comma separated")
    args = p.parse_args()
    device = common.device_of(args)
    small = args.cpu or args.quick  # the CLI's --cpu smoke scaling: G / 8, dims / 16
    rows = args.rows or (256 if args.quick else 512 if small else 65536)
    iters = args.iters or (1 if args.quick else 2 if small else 20)
    warmup = 1 if small else 3
    patterns = args.pattern.split(",") if not args.quick else ["balanced"]
    result = dict(common.header(device), bench="torch_layer_step", iters=iters, cases=[])
    for name, G, K, N in LAYERS:
        if small:
            G, K, N = G // 8, K // 16, N // 16
            if args.recipe != "bf16":  # the quantized recipes' feature alignment
                K, N = -(-K // 128) * 128, -(-N // 128) * 128
        for pattern in patterns:
            result["cases"].append(time_case(name, G, K, N, rows, pattern, args.recipe, device,
                                             iters, warmup))
            if device.type == "cuda":
                torch.cuda.empty_cache()
    print(f"GroupedLinear fwd + bwd through the package vs the C++ layer, recipe {args.recipe}, "
          f"{result['device']}, torch {result['torch']}, median of {iters} "
          "(target: ratio <= 1.03)")
    print(common.table(["case", "pattern", "G", "M", "N", "K", "package_us", "core_us", "ratio",
                        "tflops", "met"], result["cases"]))
    common.write_json(args.json, result)


if __name__ == "__main__":
    main()
