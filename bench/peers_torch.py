#!/usr/bin/env python3
"""Times torch._grouped_mm on the exact cases (same splits) of a `groupmm bench gemm --json` file,
in the same device call, and prints the merged table with our ratio to it.

    build/groupmm bench gemm --json out/gemm.json && python3 bench/peers_torch.py out/gemm.json

--ours (16-bit cases; needs the groupmm package, PYTHONPATH=python after scripts/build_python.sh):
also times our engine through torch.ops.groupmm on the same tensors, in rounds that alternate
which of the two runs first, and reports the ratio of the medians of that process instead of the
ratio to the JSON's time (a GPU's clock differs from one process to the next by more than the
margins being measured). Ours runs the heuristic's configuration, whatever the JSON's config was.

forward: x[M,K] @ W^T (2d x 3d, W given as [G,K,N] view of [G,N,K]); dgrad: dy[M,N] @ W[G,N,K]
(2d x 3d); wgrad: dy^T[N,M] @ x[M,K] (2d x 2d, offs over M) -> [G,N,K]. bf16 in and out, fp32 accumulation.
"""
import json
import math
import statistics
import sys

import torch


def median_ms(fn, warmup=3, iters=10):
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def rotation(nbytes):
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(1, min(16, math.ceil(3 * l2 / max(nbytes, 1))))


def same_process(fns, rounds=6):
    """Median over `rounds` of each fn's median_ms, the order of the fns rotating every round."""
    times = [[] for _ in fns]
    for r in range(rounds):
        for j in range(len(fns)):
            i = (r + j) % len(fns)
            times[i].append(median_ms(fns[i]))
    return [statistics.median(t) for t in times]


def time_case(c, ours=False):
    G, M, N, K = c["G"], c["M"], c["N"], c["K"]
    dev = "cuda"
    offs = torch.tensor(c["splits"], dtype=torch.int64, device=dev).cumsum(0).to(torch.int32)
    bf = torch.bfloat16
    out_dtype = torch.float32 if c.get("out") == "fp32" else bf  # bench gemm --out
    if c["pass"] == "fwd":
        nbytes = (M * K + G * N * K) * 2
        R = rotation(nbytes)
        xs = [torch.randn(M, K, device=dev, dtype=bf) for _ in range(R)]
        ws = [torch.randn(G, N, K, device=dev, dtype=bf) * 0.05 for _ in range(R)]
        args = [(xs[i], ws[i].transpose(-2, -1)) for i in range(R)]
    elif c["pass"] == "dgrad":
        nbytes = (M * N + G * N * K) * 2
        R = rotation(nbytes)
        dys = [torch.randn(M, N, device=dev, dtype=bf) for _ in range(R)]
        ws = [torch.randn(G, N, K, device=dev, dtype=bf) * 0.05 for _ in range(R)]
        # torch wants the second operand's last dim contiguous in one of the two allowed majors;
        # W[G,N,K] row-major is [G,K_in=N,N_out=K] with stride (N*K, K, 1).
        args = [(dys[i], ws[i]) for i in range(R)]
    else:
        nbytes = (M * N + M * K) * 2
        R = rotation(nbytes)
        dys = [torch.randn(M, N, device=dev, dtype=bf) for _ in range(R)]
        xs = [torch.randn(M, K, device=dev, dtype=bf) for _ in range(R)]
        args = [(dys[i].t(), xs[i]) for i in range(R)]
    state = {"i": 0}

    def run():
        a, b = args[state["i"] % R]
        state["i"] += 1
        return torch._grouped_mm(a, b, offs=offs, out_dtype=out_dtype)

    # ours on the same tensors: W [G,N,K] as stored, dy [M,N] row-major
    mine = [(xs[i], ws[i]) if c["pass"] == "fwd" else (dys[i], ws[i]) if c["pass"] == "dgrad"
            else (dys[i], xs[i]) for i in range(R)]
    splits = torch.tensor(c["splits"], dtype=torch.int64, device=dev)

    def run_ours():
        a, b = mine[state["i"] % R]
        state["i"] += 1
        if c["pass"] == "fwd":
            return torch.ops.groupmm.grouped_mm(a, b, splits)
        if c["pass"] == "dgrad":
            return torch.ops.groupmm.grouped_mm_dgrad(a, b, splits)
        return torch.ops.groupmm.grouped_mm_wgrad(a, b, splits, out_dtype=out_dtype)

    try:
        run()
    except Exception as e:  # layout requirement: retry with a contiguous copy (outside timing)
        msg = str(e).splitlines()[0][:120]
        if c["pass"] == "wgrad":
            args = [(a.contiguous().t().contiguous().t(), b) for a, b in args]
        else:
            args = [(a, b.contiguous()) for a, b in args]
        try:
            run()
        except Exception as e2:
            return None, f"torch failed: {msg} / {str(e2).splitlines()[0][:120]}", None
    if not ours:
        return median_ms(run) * 1e3, None, None
    t_torch, t_ours = same_process([run, run_ours])
    return t_torch * 1e3, None, t_ours * 1e3


def time_case_fp8(c, fast_accum):
    """torch._scaled_grouped_mm with rowwise scales (per token / per output channel): the torch
    peer closest to our FP8 recipes. Operands are e4m3 in the majors torch requires (A row-major,
    B column-major); the quantization itself is not timed, as in our numbers."""
    G, M, N, K = c["G"], c["M"], c["N"], c["K"]
    dev = "cuda"
    offs = torch.tensor(c["splits"], dtype=torch.int64, device=dev).cumsum(0).to(torch.int32)
    f8 = torch.float8_e4m3fn

    def q(*shape):
        return (torch.randn(*shape, device=dev) * 0.5).to(f8)

    if c["pass"] == "fwd":  # x[M,K] @ W^T: W [G,N,K] row-major viewed as [G,K,N] column-major
        R = rotation(M * K + G * N * K)
        args = [(q(M, K), q(G, N, K).transpose(-2, -1), torch.ones(M, device=dev),
                 torch.ones(G, N, device=dev)) for _ in range(R)]
    elif c["pass"] == "dgrad":  # dy[M,N] @ W: W^T stored [G,K,N] row-major, viewed [G,N,K] col-major
        R = rotation(M * N + G * N * K)
        args = [(q(M, N), q(G, K, N).transpose(-2, -1), torch.ones(M, device=dev),
                 torch.ones(G, K, device=dev)) for _ in range(R)]
    else:  # dy^T[N,M] (row-major copy) @ x[M,K] (column-major: x^T [K,M] row-major, transposed)
        R = rotation(M * N + M * K)
        args = [(q(N, M), q(K, M).t(), torch.ones(G * N, device=dev),
                 torch.ones(G * K, device=dev)) for _ in range(R)]
    state = {"i": 0}

    def run():
        a, b, sa, sb = args[state["i"] % R]
        state["i"] += 1
        return torch._scaled_grouped_mm(a, b, sa, sb, offs=offs, out_dtype=torch.bfloat16,
                                        use_fast_accum=fast_accum)

    try:
        run()
    except Exception as e:
        return None, f"torch failed: {str(e).splitlines()[0][:160]}", None
    return median_ms(run) * 1e3, None, None


def compare(data, path, time_fn, peer, dense_key, dense_label):
    """Times the peer on every case of `data`, prints the merged table and the geometric means,
    and writes PATH_merged.json."""
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}; our numbers from {path}; "
          f"peer {peer}")
    print(f"{'case':22} {'pass':6} {'pattern':8} {'ours_us':>9} {'torch_us':>9} {'x_torch':>7} "
          f"{dense_label:>8} {'TFLOP/s':>8}")
    ratios = {"fwd": [], "dgrad": [], "wgrad": []}
    for c in data["cases"]:
        t, err, t_ours = time_fn(c)
        c["torch_us"] = t
        if t_ours is not None:  # --ours: both timed in this process; the JSON's time is replaced
            c["us_bench"], c["us"] = c["us"], t_ours
        if t is None:
            print(f"{c['case']:22} {c['pass']:6} {c['pattern']:8} {c['us']:9.1f}  {err}")
            continue
        r = t / c["us"]
        ratios[c["pass"]].append(r)
        c["x_torch"] = r
        print(f"{c['case']:22} {c['pass']:6} {c['pattern']:8} {c['us']:9.1f} {t:9.1f} {r:7.3f} "
              f"{c[dense_key] / c['us']:8.3f} {c['flops'] / c['us'] / 1e6:8.1f}")
        torch.cuda.empty_cache()
    for p, rs in ratios.items():
        if rs:
            gm = math.exp(sum(math.log(x) for x in rs) / len(rs))
            print(f"{p}: geometric mean speedup vs {peer.split(' ')[0]} {gm:.3f} "
                  f"(min {min(rs):.3f}, n={len(rs)})")
    json.dump(data, open(path.replace(".json", "_merged.json"), "w"), indent=1)


def main():
    ours = "--ours" in sys.argv[1:]
    path = [a for a in sys.argv[1:] if a != "--ours"][0]
    data = json.load(open(path))
    if data.get("recipe", "bf16") != "bf16":
        fast = bool(data.get("fast_accum", False))
        return compare(data, path, lambda c: time_case_fp8(c, fast),
                       f"torch._scaled_grouped_mm (rowwise scales, use_fast_accum={fast}); "
                       f"{data['recipe']}", "dense_fp8_us", "x_dense8")
    if ours:
        import groupmm  # noqa: F401  (registers torch.ops.groupmm)
        peer = "torch._grouped_mm; ours and torch timed in this process, alternating (--ours)"
    else:
        peer = "torch._grouped_mm"
    compare(data, path, lambda c: time_case(c, ours), peer, "dense_us", "x_dense")


if __name__ == "__main__":
    main()
