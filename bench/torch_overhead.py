#!/usr/bin/env python3
"""Host overhead of the PyTorch binding per op: N calls through torch.ops.groupmm against N calls
of the same core op straight from C++ (the _core_call_us bench hook, python/csrc/ops_hooks.cpp),
on the same tensors, tiny shapes (the GPU keeps up: the host is what is measured).

    PYTHONPATH=python python3 bench/torch_overhead.py [--json out/torch_overhead.json]
    PYTHONPATH=python python3 bench/torch_overhead.py --cpu --quick        (a smoke run)

The hook binds arguments, outputs and workspace once and then times only the core call, so the
difference is everything the binding adds: the dispatcher, argument checks and views, output and
workspace allocation from torch's caching allocator, the Context lookup for the current stream.
Both sides enqueue without synchronizing (each loop is synchronized before and after). Target
(issue 20): <= 10 us per op on the GPU machine.
"""

import statistics
import time

import torch_bench_common as common  # noqa: I001  (sets up sys.path)

import torch

import groupmm

ops = torch.ops.groupmm


def cases(device, quick):
    """(name, torch call, hook tensors, hook ints) per op, over tiny tensors."""
    bf = dict(device=device, dtype=torch.bfloat16)
    G, M, K, N, T, E, k = (4, 64, 32, 32, 32, 4, 2) if quick else (8, 256, 128, 128, 128, 8, 2)
    splits = torch.full((G,), M // G, dtype=torch.int32, device=device)
    x, w, dy = torch.randn(M, K, **bf), torch.randn(G, N, K, **bf), torch.randn(M, N, **bf)
    logits = torch.randn(T, E, device=device)
    ids, weights, *_ = ops.router(logits, None, k, renormalize=True)
    plan = ops.permute_plan(ids, E, 1, 0)
    xt = torch.randn(T, K, **bf)
    y_perm = torch.randn(groupmm.permuted_rows(T, k, E), K, **bf)
    return [
        ("grouped_mm", lambda: ops.grouped_mm(x, w, splits), [x, w, splits], []),
        ("grouped_mm_dgrad", lambda: ops.grouped_mm_dgrad(dy, w, splits), [dy, w, splits], []),
        ("grouped_mm_wgrad", lambda: ops.grouped_mm_wgrad(dy, x, splits), [dy, x, splits], []),
        ("group_quantize", lambda: ops.group_quantize(x, splits, "mxfp8"), [x, splits], []),
        ("router", lambda: ops.router(logits, None, k, renormalize=True), [logits], [k]),
        ("permute", lambda: ops.permute(xt, *plan, 1, 0, weights), [xt, *plan, weights], [1, 0]),
        ("unpermute", lambda: ops.unpermute(y_perm, *plan, 1, 0), [y_perm, *plan], [1, 0]),
    ]


def host_us_per_call(fn, device, n):
    fn()
    common.sync(device)
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    common.sync(device)
    return 1e6 * (t1 - t0) / n


def main():
    p = common.parser(__doc__.splitlines()[0], "out/torch_overhead.json")
    p.add_argument("--calls", type=int, default=0, help="calls per timed loop")
    args = p.parse_args()
    device = common.device_of(args)
    n = args.calls or (5 if args.quick else 200)
    reps = args.iters or (1 if args.quick else 15)
    result = dict(common.header(device), bench="torch_overhead", calls=n, reps=reps, ops=[])
    with torch.no_grad():  # the autograd recording of the ops is not the binding's cost
        for name, call, tensors, ints in cases(device, args.quick):
            torch_us = statistics.median(host_us_per_call(call, device, n) for _ in range(reps))
            core_us = statistics.median(
                ops._core_call_us(name, tensors, ints, "mxfp8", n) for _ in range(reps))
            result["ops"].append(dict(op=name, torch_us=torch_us, core_us=core_us,
                                      overhead_us=torch_us - core_us,
                                      met=torch_us - core_us <= 10.0))
    print(f"host us per call, median of {reps} loops of {n} calls, {result['device']}, "
          f"torch {result['torch']} (target: overhead <= 10 us)")
    print(common.table(["op", "torch_us", "core_us", "overhead_us", "met"], result["ops"]))
    common.write_json(args.json, result)


if __name__ == "__main__":
    main()
