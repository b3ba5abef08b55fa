#!/usr/bin/env python3
"""Expert-parallel dispatch and combine written the way PyTorch users do it today, on the settings
of `groupmm bench ep`, plus an nccl-tests-style all-to-all bandwidth measurement (the reference of
the issue's 70% target). One process per GPU under torchrun:

    torchrun --nproc-per-node 8 bench/peers_torch_ep.py --json out/torch_ep.json
    torchrun --no-python --nproc-per-node 8 build/groupmm bench ep --id-file /tmp/ep.$$ \\
        --json out/ep.json
    # CPU smoke run (gloo), the shapes of `groupmm bench ep --cpu`:
    torchrun --nproc-per-node 2 bench/peers_torch_ep.py --cpu

The peer (a token dispatcher as in Megatron-LM's all-to-all dispatcher, no groupmm code):
  dispatch  the per-destination row counts are exchanged first with all_to_all_single (the host
            reads them: a sync), then each token row is sent ONCE to each rank holding one of its k
            experts (all_to_all_single with those split sizes; rows ordered by destination rank,
            then token), with a second all_to_all_single carrying each row's k local expert ids
            (-1 elsewhere) and router weights; the receiver expands rows to (row, slot) entries and
            sorts them by local expert (a stable sort: torch's local permute) into the grouped
            buffer the expert GEMMs read.
  combine   the expert outputs (identity experts here: y = x) are weighted and summed per received
            row on the expert rank (index_add_ in fp32, one row per (token, rank)), sent back with
            all_to_all_single (the reverse split sizes), and summed into the token on the home rank.
            groupmm's combine instead returns k rows per token and sums on the home rank in a fixed
            order (bit reproducible), so it moves more bytes: compare times, and GB/s each of its
            own bytes.
GB/s = bytes of token rows this rank sends to OTHER ranks / time (metadata not counted), rank 0's
view, median of --iters timed runs after --warmup; every timed op is a collective, so its time
includes waiting for the slowest rank. The all-to-all measurement times all_to_all_single of equal
splits at a sweep of sizes and at each case's dispatch size, and reports nccl-tests' algbw
(bytes per rank / time) and busbw (algbw * (R - 1) / R: the bytes that cross links, the number to
hold dispatch GB/s against).

--json writes rank 0's records in the layout of `groupmm bench ep --json` (device, ranks, cases:
[{case, mode, T, H, E, k, dispatch_us, dispatch_gbs, combine_us, combine_gbs, valid, ...}]) with
mode "torch_a2a", plus "alltoall": [{bytes, us, algbw_gbs, busbw_gbs}].
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

CASES = {"dsv3": (7168, 256, 8), "qwen3": (2048, 128, 8)}  # H, E, k (`groupmm bench ep`)
CPU_CASES = {"dsv3": (64, 32, 8), "qwen3": (32, 16, 4)}  # `groupmm bench ep --cpu`


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--case", default="dsv3,qwen3", help="comma separated: dsv3, qwen3")
    p.add_argument("--tokens", type=int, default=0, help="tokens a rank (default 4096; --cpu 64)")
    p.add_argument("--iters", type=int, default=20, help="timed runs per measurement (median)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--cpu", action="store_true", help="gloo on the CPU (smoke run, small shapes)")
    p.add_argument("--backend", default="", help="nccl or gloo (default: nccl on GPUs)")
    p.add_argument("--a2a-sizes", default="",
                   help="all-to-all sweep, bytes a rank (comma separated; default 1M..1G on GPUs, "
                   "64K..4M on the CPU)")
    p.add_argument("--json", default="", help="rank 0 writes its records here")
    return p.parse_args()


class Timer:
    """Median wall time of a collective op; the GPU is synchronized around every run."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def us(self, fn, warmup, iters):
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(iters):
            self.sync()
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            self.sync()
            times.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(times)


def routing(T, E, k, seed, device):
    """k distinct experts per token, uniform; every weight 1/k (as `groupmm bench ep`)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.rand(T, E, generator=g).topk(k, dim=-1).indices
    return ids.to(device), torch.full((T, k), 1.0 / k, device=device)


class Dispatcher:
    """All-to-all token dispatcher: rows once per destination rank, counts exchanged first."""

    def __init__(self, E, R, k):
        self.E, self.R, self.k, self.El = E, R, k, E // R

    def dispatch(self, x, ids, w):
        R, El, k = self.R, self.El, self.k
        T, H = x.shape
        dev = x.device
        dest = ids // El                                            # [T, k] destination rank
        need = torch.zeros(T, R, dtype=torch.bool, device=dev)
        need.scatter_(1, dest, True)                                # token t needs rank q
        send_counts = need.sum(0)                                   # [R] rows to each peer
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts)            # counts first
        self.send_splits = send_counts.tolist()                     # host sync
        self.recv_splits = recv_counts.tolist()
        q_idx, t_idx = need.t().nonzero(as_tuple=True)              # by rank, then token
        self.t_idx = t_idx
        # Per sent row: its k slots' local expert (-1 when the slot is on another rank) and weight.
        local = torch.where(dest[t_idx] == q_idx[:, None], ids[t_idx] % El, -1)
        meta = torch.cat([local.float(), w[t_idx]], dim=1)          # [S, 2k]
        send_x = x[t_idx]
        n_recv = sum(self.recv_splits)
        recv_x = torch.empty(n_recv, H, dtype=x.dtype, device=dev)
        recv_meta = torch.empty(n_recv, 2 * k, dtype=meta.dtype, device=dev)
        dist.all_to_all_single(recv_x, send_x, self.recv_splits, self.send_splits)
        dist.all_to_all_single(recv_meta, meta, self.recv_splits, self.send_splits)
        # Local permute: (row, slot) entries with a local expert, stable-sorted by expert.
        r_local = recv_meta[:, :k].long()
        row, slot = (r_local >= 0).nonzero(as_tuple=True)
        expert = r_local[row, slot]
        order = torch.sort(expert, stable=True).indices
        self.entry_row = row[order]
        self.entry_w = recv_meta[:, k:][row, slot][order]
        self.splits = torch.bincount(expert, minlength=El)
        self.n_recv = n_recv
        self.sent_rows = send_counts
        return recv_x[self.entry_row]                               # grouped by local expert

    def combine(self, y_grouped, T):
        H = y_grouped.shape[1]
        dev = y_grouped.device
        rows = torch.zeros(self.n_recv, H, dtype=torch.float32, device=dev)
        rows.index_add_(0, self.entry_row, y_grouped.float() * self.entry_w[:, None])
        back = torch.empty(int(self.t_idx.numel()), H, dtype=y_grouped.dtype, device=dev)
        dist.all_to_all_single(back, rows.to(y_grouped.dtype), self.send_splits, self.recv_splits)
        out = torch.zeros(T, H, dtype=torch.float32, device=dev)
        out.index_add_(0, self.t_idx, back.float())
        return out.to(y_grouped.dtype)


def remote(per_peer, me):
    return sum(v for q, v in enumerate(per_peer) if q != me)


def alltoall_us(nbytes, R, device, timer, warmup, iters):
    """nccl-tests' alltoall: nbytes a rank, equal splits (bf16 elements)."""
    n = max(R, (nbytes // 2) // R * R)
    src = torch.ones(n, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    us = timer.us(lambda: dist.all_to_all_single(dst, src), warmup, iters)
    algbw = n * 2 / (us * 1e3)
    return dict(bytes=n * 2, us=us, algbw_gbs=algbw, busbw_gbs=algbw * (R - 1) / R)


def main():
    a = parse()
    use_cuda = not a.cpu and torch.cuda.is_available()
    backend = a.backend or ("nccl" if use_cuda else "gloo")
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend)
    R, me = dist.get_world_size(), dist.get_rank()
    device = torch.device("cuda") if use_cuda else torch.device("cpu")
    timer = Timer(device)
    table = CASES if use_cuda else CPU_CASES
    T = a.tokens or (4096 if use_cuda else 64)
    warmup, iters = (a.warmup, a.iters) if use_cuda else (min(a.warmup, 1), min(a.iters, 3))
    records, ok = [], True
    for name in [c for c in a.case.split(",") if c]:
        if name not in table:
            sys.exit(f"peers_torch_ep: unknown case {name!r} (dsv3, qwen3)")
        H, E, k = table[name]
        if E % R:
            sys.exit(f"peers_torch_ep: case {name} has E={E}, which {R} ranks do not divide")
        ids, w = routing(T, E, k, 1000 + me, device)
        x = (torch.rand(T, H, generator=torch.Generator().manual_seed(17 + me)) * 2 - 1)
        x = x.to(torch.bfloat16).to(device)
        d = Dispatcher(E, R, k)
        xg = d.dispatch(x, ids, w)
        out = d.combine(xg, T)                          # identity experts, weights 1/k: out ~= x
        valid = bool(torch.allclose(out.float(), x.float(), rtol=1e-2, atol=1e-2))
        disp_us = timer.us(lambda: d.dispatch(x, ids, w), warmup, iters)
        comb_us = timer.us(lambda: d.combine(xg, T), warmup, iters)
        row = H * 2
        sent = remote(d.send_splits, me) * row        # rows out, and the same rows back
        back = remote(d.recv_splits, me) * row
        # The all-to-all at the dispatch's size: the largest rank's dispatch bytes (self included;
        # every rank must pass the same size).
        total = torch.tensor([sum(d.send_splits) * row], dtype=torch.int64, device=device)
        dist.all_reduce(total, op=dist.ReduceOp.MAX)
        a2a = alltoall_us(int(total.item()), R, device, timer, warmup, iters)
        records.append(dict(case=name, mode="torch_a2a", T=T, H=H, E=E, k=k,
                            dispatch_us=disp_us, dispatch_gbs=sent / (disp_us * 1e3),
                            combine_us=comb_us, combine_gbs=back / (comb_us * 1e3),
                            dispatch_bytes=sent, combine_bytes=back, valid=valid,
                            a2a_bytes=a2a["bytes"], a2a_us=a2a["us"],
                            a2a_busbw_gbs=a2a["busbw_gbs"]))
        ok = ok and valid
    if a.a2a_sizes:
        sizes = [int(float(s)) for s in a.a2a_sizes.split(",") if s]
    else:
        sizes = [1 << p for p in (range(20, 31, 2) if use_cuda else range(16, 23, 2))]
    sweep = [alltoall_us(n, R, device, timer, warmup, iters) for n in sizes]
    if me == 0:
        print(f"peers_torch_ep: {R} rank(s), backend {backend}, {device.type}, T={T} tokens a rank")
        print(f"  {'case':<7} {'dispatch us':>12} {'GB/s':>8} {'combine us':>11} {'GB/s':>8} "
              f"{'a2a busbw':>10}  check")
        for r in records:
            print(f"  {r['case']:<7} {r['dispatch_us']:12.1f} {r['dispatch_gbs']:8.2f} "
                  f"{r['combine_us']:11.1f} {r['combine_gbs']:8.2f} {r['a2a_busbw_gbs']:10.2f}  "
                  f"{'ok' if r['valid'] else 'FAILED'}")
        print("  all-to-all (nccl-tests style, equal splits):")
        print(f"  {'bytes':>12} {'us':>10} {'algbw GB/s':>11} {'busbw GB/s':>11}")
        for s in sweep:
            print(f"  {s['bytes']:12d} {s['us']:10.1f} {s['algbw_gbs']:11.2f} {s['busbw_gbs']:11.2f}")
        print("(GB/s: bytes of token rows rank 0 sends to other ranks / time; busbw = algbw (R-1)/R)")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(dict(device=device.type, ranks=R, peer="torch.distributed",
                               backend=backend, cases=records, alltoall=sweep), f, indent=1)
            print(f"wrote {a.json}")
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
