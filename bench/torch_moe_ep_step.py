#!/usr/bin/env python3
"""groupmm.nn.MoE over a torch.distributed process group (ep_group): a training step (forward +
backward) per rank, in capacity and throughput mode, against the same module without expert
parallelism holding all E experts on one GPU with the same T tokens (the weak-scaling reference:
the same expert GEMM work a rank does). At R = 1 the ratio is the cost of the EP path itself (the
expert-parallelism issue's target: within 3%).

    PYTHONPATH=python python3 bench/torch_moe_ep_step.py [--case qwen3]           (R = 1)
    torchrun --nproc-per-node 2 bench/torch_moe_ep_step.py --json out/ep_step.json
    PYTHONPATH=python python3 bench/torch_moe_ep_step.py --cpu --quick            (a smoke run)

Over NCCL the EP module exchanges through groupmm's NCCL transport on a communicator made for the
group (docs/expert_parallelism.md); on the CPU over gloo. Times: rank 0's median over --iters
steps (CUDA events, or the wall clock on the CPU) after warmup; every step is a collective, so it
includes waiting for the slowest rank. Without torchrun the script makes a one-rank group itself.
Shapes: those of `groupmm bench moe --ep` (Qwen3-30B-A3B, DeepSeek-V3-like with 32 experts,
Mixtral), bf16; capacity mode with --capacity-factor (default 2, as `bench moe --ep capacity`).
"""

import torch_bench_common as common  # noqa: I001  (sets up sys.path for the next imports)

import datetime
import os
import shutil
import tempfile

import torch
import torch.distributed as dist

import groupmm
from peers_torch_moe import DEFAULT
from torch_moe_step import groupmm_block as block
from torch_moe_step import quick


def init_group(device):
    """The default process group: torchrun's environment, else a one-rank group made here (returns
    its rendezvous folder, to remove at the end)."""
    if dist.is_initialized():
        return None
    backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
    if "RANK" in os.environ:
        if device.type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=300))
        return None
    folder = tempfile.mkdtemp()
    dist.init_process_group(backend, init_method=f"file://{os.path.join(folder, 'rendezvous')}",
                            rank=0, world_size=1)
    return folder


def step_us(moe, x, dy, device, warmup, iters):
    def step():
        y, _aux = moe(x)
        y.backward(dy)
        for p in (x, *moe.parameters()):
            p.grad = None
    return common.median_us(step, device, warmup, iters)


def time_case(c, device, factor, warmup, iters):
    rank, R = dist.get_rank(), dist.get_world_size()
    row = dict(case=c["case"], R=R, T=c["T"], H=c["H"], F=c["F"], E=c["E"], k=c["k"],
               shared_F=c["shared_F"])
    if c["E"] % R:
        row["error"] = f"E={c['E']} is not a multiple of R={R}"
        return row
    torch.manual_seed(rank)  # each rank its own tokens
    x = (torch.rand(c["T"], c["H"], device=device, dtype=torch.bfloat16) * 2 - 1)
    x.requires_grad_()
    dy = (torch.rand_like(x) * 2 - 1) * 0.01
    # The reference: all E experts, no EP, on this rank's T tokens (every rank times its own).
    torch.manual_seed(0)
    row["one_gpu_us"] = step_us(block(c, device), x, dy, device, warmup, iters)
    for mode in ("capacity", "throughput"):
        torch.manual_seed(0)
        kw = dict(ep_group=dist.group.WORLD, ep_mode=mode)
        if mode == "capacity":
            kw["capacity_factor"] = factor
        moe = block(c, device, **kw)
        row[f"{mode}_us"] = step_us(moe, x, dy, device, warmup, iters)
        row[f"{mode}_scaling"] = round(row["one_gpu_us"] / row[f"{mode}_us"], 3)
        if device.type == "cpu" and moe.ep_overflow:
            row[f"{mode}_overflow"] = moe.ep_overflow.splitlines()[0][:120]
        del moe
        if device.type == "cuda":
            groupmm.check()  # a capacity overflow is reported here, on every rank
            torch.cuda.empty_cache()
    return row


def main():
    p = common.parser(__doc__.splitlines()[0], "out/torch_moe_ep_step.json")
    p.add_argument("--case", default="", help="only the cases whose name contains this")
    p.add_argument("--capacity-factor", type=float, default=2.0,
                   help="capacity mode's per-peer budget factor (default 2)")
    args = p.parse_args()
    device = common.device_of(args)
    folder = init_group(device)
    cases = [c for c in DEFAULT if args.case in c["case"]]
    if args.quick:
        cases = [quick(c) for c in cases]
    iters, warmup = args.iters or (1 if args.quick else 10), 1 if args.quick else 3
    result = dict(common.header(device), bench="torch_moe_ep_step", ranks=dist.get_world_size(),
                  iters=iters, capacity_factor=args.capacity_factor, cases=[])
    for c in cases:
        result["cases"].append(time_case(c, device, args.capacity_factor, warmup, iters))
    if dist.get_rank() == 0:
        print(f"groupmm.nn.MoE training step over {result['ranks']} rank(s) (ep_group), "
              f"{result['device']}, torch {result['torch']}, median of {iters}, rank 0")
        cols = ["case", "R", "T", "E", "k", "one_gpu_us", "capacity_us", "capacity_scaling",
                "throughput_us", "throughput_scaling"]
        print(common.table(cols, result["cases"]))
        print("(scaling = the one-GPU module with all E experts on the same T over the EP step; "
              "at R = 1 it is the EP path's own cost)")
        common.write_json(args.json, result)
    dist.destroy_process_group()
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
