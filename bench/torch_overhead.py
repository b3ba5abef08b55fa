#!/usr/bin/env python3
"""Host overhead of the PyTorch binding per op: N calls through torch.ops.groupmm against N calls
of the same core op straight from C++ (the _core_call_us bench hook, python/csrc/ops_hooks.cpp),
on the same tensors, tiny shapes (the GPU keeps up: the host is what is measured).

    PYTHONPATH=python python3 bench/torch_overhead.py [--json out/torch_overhead.json]
    PYTHONPATH=python python3 bench/torch_overhead.py --cpu --quick        (a smoke run)
    PYTHONPATH=python python3 bench/torch_overhead.py --grad    (float inputs require grad: the
                                                                 autograd node is recorded too)

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


def cases(device, quick, grad=False):
    """(name, torch call, hook tensors, hook ints) per op, over tiny tensors; with grad, the torch
    calls take copies of the float inputs that require grad (the hook takes the plain ones)."""
    bf = dict(device=device, dtype=torch.bfloat16)
    G, M, K, N, T, E, k = (4, 64, 32, 32, 32, 4, 2) if quick else (8, 256, 128, 128, 128, 8, 2)
    splits = torch.full((G,), M // G, dtype=torch.int32, device=device)
    x, w, dy = torch.randn(M, K, **bf), torch.randn(G, N, K, **bf), torch.randn(M, N, **bf)
    logits = torch.randn(T, E, device=device)
    ids, weights, *_ = ops.router(logits, None, k, renormalize=True)
    plan = ops.permute_plan(ids, E, 1, 0)
    xt = torch.randn(T, K, **bf)
    y_perm = torch.randn(groupmm.permuted_rows(T, k, E), K, **bf)
    g = (lambda t: t.detach().clone().requires_grad_()) if grad else (lambda t: t)
    tx, tw, tlogits, txt, tweights, ty_perm = map(g, (x, w, logits, xt, weights, y_perm))
    return [
        ("grouped_mm", lambda: ops.grouped_mm(tx, tw, splits), [x, w, splits], []),
        ("grouped_mm_dgrad", lambda: ops.grouped_mm_dgrad(dy, w, splits), [dy, w, splits], []),
        ("grouped_mm_wgrad", lambda: ops.grouped_mm_wgrad(dy, x, splits), [dy, x, splits], []),
        ("group_quantize", lambda: ops.group_quantize(x, splits, "mxfp8"), [x, splits], []),
        ("router", lambda: ops.router(tlogits, None, k, renormalize=True), [logits], [k]),
        ("permute", lambda: ops.permute(txt, *plan, 1, 0, tweights), [xt, *plan, weights],
         [1, 0]),
        ("unpermute", lambda: ops.unpermute(ty_perm, *plan, 1, 0), [y_perm, *plan], [1, 0]),
    ]


def reference_cases(device, quick):
    """(name, call): torch's own ops and groupmm ops without a core-call hook, tiny tensors."""
    T, E, k = (32, 4, 2) if quick else (128, 8, 2)
    logits = torch.randn(T, E, device=device)
    splits = torch.full((E,), 4, dtype=torch.int32, device=device)
    ids = ops.router(logits, None, k, renormalize=True)[0]
    return [
        ("torch: logits + logits", lambda: logits + logits),
        ("torch: topk(logits, k)", lambda: torch.topk(logits, k)),
        ("groupmm: group_offsets", lambda: ops.group_offsets(splits)),
        ("groupmm: permute_plan", lambda: ops.permute_plan(ids, E, 1, 0)),
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
    p.add_argument("--grad", action="store_true",
                   help="grad enabled and float inputs requiring grad (default: no_grad)")
    args = p.parse_args()
    device = common.device_of(args)
    n = args.calls or (5 if args.quick else 200)
    reps = args.iters or (1 if args.quick else 15)
    result = dict(common.header(device), bench="torch_overhead", calls=n, reps=reps,
                  grad=args.grad, ops=[])
    # By default no_grad: the target is the binding's cost, not the autograd node's (--grad adds
    # it: the C++ node of ops_autograd.cpp and its saved tensors).
    with torch.enable_grad() if args.grad else torch.no_grad():
        for name, call, tensors, ints in cases(device, args.quick, args.grad):
            torch_us = statistics.median(host_us_per_call(call, device, n) for _ in range(reps))
            core_us = statistics.median(
                ops._core_call_us(name, tensors, ints, "mxfp8", n) for _ in range(reps))
            result["ops"].append(dict(op=name, torch_us=torch_us, core_us=core_us,
                                      overhead_us=torch_us - core_us,
                                      met=torch_us - core_us <= 10.0))
        # The host's own speed, to read the figures above against (the lent machine's host varies
        # by up to 2x between calls): whole calls of torch's own ops on the same tiny tensors,
        # kernel launch included, and ops of ours that the hook does not time.
        result["reference"] = [
            dict(op=name, torch_us=statistics.median(
                host_us_per_call(call, device, n) for _ in range(reps)))
            for name, call in reference_cases(device, args.quick)]
    print(f"host us per call{' (graph recorded)' if args.grad else ''}, median of {reps} loops "
          f"of {n} calls, {result['device']}, "
          f"torch {result['torch']} (target: overhead <= 10 us)")
    print(common.table(["op", "torch_us", "core_us", "overhead_us", "met"], result["ops"]))
    print("host reference (whole calls through torch, us):")
    print(common.table(["op", "torch_us"], result["reference"]))
    common.write_json(args.json, result)


if __name__ == "__main__":
    main()
