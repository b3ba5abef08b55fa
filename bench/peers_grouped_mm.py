#!/usr/bin/env python3
"""groupmm.grouped_mm (the torch._grouped_mm drop-in) against torch._grouped_mm, forward and
forward+backward, on the forms of PyTorch's grouped-mm tests at sizes large enough to time
(bf16; the suite's MoE shapes for 2D x 3D). Prints one line per case with both medians and the
ratio (torch / groupmm: > 1 means groupmm is faster), measured in alternating rounds in one
process.

    PYTHONPATH=python python3 bench/peers_grouped_mm.py [--quick] [--json out.json]

GPU only for timing; on a machine without CUDA it runs every case once on the CPU backend at
tiny sizes and checks the result against a loop of matmuls (a smoke test: --quick implied).
"""
import argparse
import json
import statistics
import sys

import torch

import groupmm

# (name, form, G, M, N, K): 2D x 3D groups rows of mat_a (MoE forward: x @ W_g^T with W
# [G, N, K]); 2D x 2D groups K (the weight gradient); 3D x 2D groups columns; 3D x 3D is bmm.
CASES = [
    ("dsv3 gate_up (EP8)", "2d3d", 32, 32768, 4096, 7168),
    ("dsv3 down (EP8)", "2d3d", 32, 32768, 7168, 2048),
    ("mixtral gate_up", "2d3d", 8, 16384, 28672, 4096),
    ("qwen3-30b gate_up", "2d3d", 128, 65536, 1536, 2048),
    ("qwen3-30b down", "2d3d", 128, 65536, 2048, 768),
    ("qwen3-30b decode", "2d3d", 128, 1024, 1536, 2048),
    ("wgrad dsv3 gate_up", "2d2d", 32, 32768, 4096, 7168),
    ("3d x 2d", "3d2d", 16, 2048, 65536, 2048),
    ("3d x 3d", "3d3d", 16, 4096, 4096, 4096),
]


def make(form, G, M, N, K, device, skew=True):
    """Operands in torch's usual layouts (weights [G, N, K] passed transposed); Zipf-like splits
    summing to the grouped extent."""
    bf = dict(device=device, dtype=torch.bfloat16)
    extent = {"2d3d": M, "2d2d": M, "3d2d": N, "3d3d": 0}[form]
    offs = None
    if extent:
        w = 1.0 / torch.arange(1, G + 1, dtype=torch.float64) ** (1.1 if skew else 0)
        w = w[torch.randperm(G)]
        # 3D x 2D groups output columns: torch needs each group's width in 16-byte multiples
        q = 8 if form == "3d2d" else 1
        counts = (w / w.sum() * extent / q).floor().long() * q
        counts[0] += extent - counts.sum()
        offs = torch.cumsum(counts, 0).to(device=device, dtype=torch.int32)
    if form == "2d3d":
        return torch.randn(M, K, **bf), torch.randn(G, N, K, **bf).transpose(-2, -1), offs
    if form == "2d2d":  # dW = dy^T x: [N, M] x [M, K], offs over M
        return torch.randn(M, N, **bf).t(), torch.randn(M, K, **bf), offs
    if form == "3d2d":
        return torch.randn(G, M // G, K, **bf), torch.randn(N, K, **bf).t(), offs
    return torch.randn(G, M // G, K, **bf), torch.randn(G, N, K, **bf).transpose(-2, -1), None


def loop_ref(a, b, offs):
    a, b = a.float(), b.float()
    if offs is None:
        return torch.bmm(a, b)
    ends = offs.tolist()
    starts = [0] + ends[:-1]
    if a.dim() == 2 and b.dim() == 3:
        return torch.cat([a[s:e] @ b[g] for g, (s, e) in enumerate(zip(starts, ends))])
    if a.dim() == 2:
        return torch.stack([a[:, s:e] @ b[s:e] for s, e in zip(starts, ends)])
    return torch.cat([a[g] @ b[:, s:e] for g, (s, e) in enumerate(zip(starts, ends))], dim=1)


def time_pair(fns, rounds=5, iters=10):
    """Median ms of each fn, in rounds that alternate which runs first."""
    times = [[] for _ in fns]
    for fn in fns:
        fn()
    for r in range(rounds):
        order = list(range(len(fns)))[::(1 if r % 2 == 0 else -1)]
        for i in order:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fns[i]()
            end.record()
            torch.cuda.synchronize()
            times[i].append(start.elapsed_time(end) / iters)
    return [statistics.median(t) for t in times]


def smoke():
    """CPU: every form at tiny sizes through groupmm.grouped_mm against the matmul loop."""
    for name, form, G, M, N, K in CASES:
        a, b, offs = make(form, min(G, 4), 64, 32, 48, "cpu")
        got = groupmm.grouped_mm(a, b, offs=offs).float()
        want = loop_ref(a, b, offs)
        err = (got - want).norm() / want.norm()
        print(f"{name:<22} {form}  cpu smoke  rel err {err:.2e}")
        assert err < 1e-2, name


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="forward only, fewer rounds")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        smoke()
        return 0
    torch.manual_seed(0)
    rows = []
    print(f"{'case':<22} {'form':<5} {'pass':<8} {'torch ms':>9} {'groupmm ms':>11} {'ratio':>6}")
    for name, form, G, M, N, K in CASES:
        a, b, offs = make(form, G, M, N, K, "cuda")
        fwd = [lambda f=f: f(a, b, offs=offs) for f in (torch._grouped_mm, groupmm.grouped_mm)]
        torch.testing.assert_close(fwd[1]().float(), fwd[0]().float(), atol=5e-2, rtol=2e-2)
        passes = [("fwd", fwd)]
        if not args.quick:
            ag, bg = a.detach().requires_grad_(), b.detach().requires_grad_()
            dout = torch.randn_like(fwd[0]())

            def train(f):
                return lambda: torch.autograd.backward(f(ag, bg, offs=offs), dout)
            passes.append(("fwd+bwd", [train(torch._grouped_mm), train(groupmm.grouped_mm)]))
        for pname, fns in passes:
            t_torch, t_ours = time_pair(fns, rounds=3 if args.quick else 5)
            rows.append(dict(case=name, form=form, G=G, M=M, N=N, K=K, pass_=pname,
                             torch_ms=t_torch, groupmm_ms=t_ours, ratio=t_torch / t_ours))
            print(f"{name:<22} {form:<5} {pname:<8} {t_torch:9.3f} {t_ours:11.3f} "
                  f"{t_torch / t_ours:6.2f}")
        del a, b
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                           rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
