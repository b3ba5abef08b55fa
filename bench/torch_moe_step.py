#!/usr/bin/env python3
"""A training step (forward + backward) of groupmm.nn.MoE against the plain PyTorch MoE block of
bench/peers_torch_moe.py (softmax / sigmoid top-k router, argsort + index_select, two
torch._grouped_mm, index_add_), eager and under torch.compile, on the same shapes, weights and
inputs, in the same process.

    PYTHONPATH=python python3 bench/torch_moe_step.py [--case qwen3] [--json out/torch_moe_step.json]
    PYTHONPATH=python python3 bench/torch_moe_step.py --cpu --quick     (a smoke run, seconds)

With --fused-gate-up the groupmm block is timed a second time with fused_gate_up=True (the
gathered gate_up projection with the weighted SwiGLU in its epilogue; same weights): groupmm_fused_us.
On the GPU each block's activation memory is reported too: the bytes a forward leaves allocated
for backward (its output excluded), in units of T*H 16-bit rows (x itself is one), for groupmm with
recompute (the default) and without, and the torch block; and the step time without recompute.

Shapes: those of `groupmm bench moe` (Qwen3-30B-A3B, DeepSeek-V3 with EP8-sized experts, Mixtral);
bf16, dropless, router weights applied to the expert output, shared expert where the model has
one. Times are the median over --iters steps (CUDA events) after warmup; both blocks compute the
same function (the table's rel_err compares their outputs; routing ties can differ by a token).
"""

import torch_bench_common as common  # noqa: I001  (sets up sys.path for the next imports)

import torch

import groupmm
from peers_torch_moe import DEFAULT, TorchMoE


def quick(c):
    """The CPU smoke shape of a case: every dimension scaled down, the routing kept."""
    E = 16 if c["score"] == "sigmoid" else 8  # sigmoid: 8 groups of 2
    return dict(c, T=64, H=64, F=32, E=E, k=min(c["k"], 4 if E == 8 else 8),
                shared_F=32 if c["shared_F"] else 0)


def groupmm_block(c, device, **kw):
    sigmoid = c["score"] == "sigmoid"
    return groupmm.nn.MoE(c["H"], c["F"], c["E"], c["k"], shared_ffn_hidden=c["shared_F"],
                          score=c["score"], renormalize=True, n_group=8 if sigmoid else 1,
                          topk_group=4 if sigmoid else 1, scaling_factor=2.5 if sigmoid else 1.0,
                          device=device, **kw)


def make_pair(c, device):
    """groupmm.nn.MoE and the torch block with the same weights."""
    ours = groupmm_block(c, device)
    theirs = TorchMoE(c, device=str(device))
    with torch.no_grad():
        theirs.router.copy_(ours.router.weight)
        theirs.w13.copy_(ours.gate_up.weight)
        theirs.w2.copy_(ours.down.weight)
        if c["shared_F"]:
            theirs.s13.copy_(ours.shared_up.weight)
            theirs.s2.copy_(ours.shared_down.weight)
    return ours, theirs


def kept_rows(block, x):
    """What block's forward leaves allocated for backward, in T*H 16-bit rows (CUDA)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    y = block(x)
    y = y[0] if isinstance(y, tuple) else y
    torch.cuda.synchronize()
    kept = torch.cuda.memory_allocated() - base - y.numel() * y.element_size()
    del y
    return round(kept / (x.numel() * 2), 2)


def time_fused(c, ours, x, dy, device, iters, warmup):
    """The same step with fused_gate_up=True on ours' weights; its output against ours'."""
    fused = groupmm_block(c, device, fused_gate_up=True)
    fused.load_state_dict(ours.state_dict())

    def step():
        y, _aux = fused(x)
        y.backward(dy)
        for p in (x, *fused.parameters()):
            p.grad = None

    with torch.no_grad():
        same = torch.equal(fused(x)[0], ours(x)[0])
    return common.median_us(step, device, warmup, iters), same


def time_case(c, device, iters, warmup, fused_gate_up=False):
    torch.manual_seed(0)
    ours, theirs = make_pair(c, device)
    x = (torch.rand(c["T"], c["H"], device=device, dtype=torch.bfloat16) * 2 - 1)
    x.requires_grad_()
    dy = (torch.rand_like(x) * 2 - 1) * 0.01
    params = [x, *ours.parameters(), *theirs.parameters()]

    def clear():
        for p in params:
            p.grad = None

    def step_ours():
        y, _aux = ours(x)
        y.backward(dy)
        clear()

    def step_theirs():
        theirs(x).backward(dy)
        clear()

    with torch.no_grad():
        y_ours, y_theirs = ours(x)[0].float(), theirs(x).float()
    rel = ((y_ours - y_theirs).norm() / y_theirs.norm()).item()
    row = dict(case=c["case"], T=c["T"], H=c["H"], F=c["F"], E=c["E"], k=c["k"],
               shared_F=c["shared_F"], rel_err=round(rel, 5))
    row["groupmm_us"] = common.median_us(step_ours, device, warmup, iters)
    if fused_gate_up:
        row["groupmm_fused_us"], row["fused_same_y"] = time_fused(c, ours, x, dy, device, iters,
                                                                  warmup)
    if device.type == "cuda":
        row["kept_rows"] = kept_rows(ours, x)
        ours.recompute = False
        row["kept_rows_no_recompute"] = kept_rows(ours, x)
        row["groupmm_no_recompute_us"] = common.median_us(step_ours, device, warmup, iters)
        ours.recompute = True
        row["torch_kept_rows"] = kept_rows(theirs, x)
    try:
        row["torch_us"] = common.median_us(step_theirs, device, warmup, iters)
        row["speedup"] = round(row["torch_us"] / row["groupmm_us"], 3)
    except RuntimeError as e:  # e.g. out of memory: report, keep the other shapes
        row["torch_error"] = str(e).splitlines()[0][:160]
    # The second peer: the same block under torch.compile, as a PyTorch user would try it (graph
    # breaks where the routing's shapes depend on the data). Inductor on CUDA; on the CPU smoke
    # run aot_eager, which traces forward and backward without generating C++.
    compiled = torch.compile(theirs, backend="inductor" if device.type == "cuda" else "aot_eager")

    def step_compiled():
        compiled(x).backward(dy)
        clear()

    try:
        with torch.no_grad():
            y_c = compiled(x).float()
        row["torch_compiled_rel_err"] = round(((y_c - y_theirs).norm() / y_theirs.norm()).item(), 5)
        # one more warm-up step: the first compiles the training graphs
        row["torch_compiled_us"] = common.median_us(step_compiled, device, warmup + 1, iters)
        row["speedup_vs_compiled"] = round(row["torch_compiled_us"] / row["groupmm_us"], 3)
    except Exception as e:  # a compiler failure is the peer's result: report, keep going
        row["torch_compiled_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    torch._dynamo.reset()
    return row


def main():
    p = common.parser(__doc__.splitlines()[0], "out/torch_moe_step.json")
    p.add_argument("--case", default="", help="only the cases whose name contains this")
    p.add_argument("--fused-gate-up", action="store_true",
                   help="also time groupmm.nn.MoE(fused_gate_up=True) (groupmm_fused_us)")
    args = p.parse_args()
    device = common.device_of(args)
    cases = [c for c in DEFAULT if args.case in c["case"]]
    if args.quick:
        cases = [quick(c) for c in cases]
    iters, warmup = args.iters or (1 if args.quick else 20), 1 if args.quick else 3
    result = dict(common.header(device), bench="torch_moe_step", iters=iters, cases=[])
    for c in cases:
        result["cases"].append(time_case(c, device, iters, warmup, args.fused_gate_up))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(f"MoE training step (fwd + bwd), groupmm.nn.MoE vs plain PyTorch, "
          f"{result['device']}, torch {result['torch']}, median of {iters}")
    cols = ["case", "T", "H", "F", "E", "k", "groupmm_us", "torch_us", "speedup", "rel_err",
            "torch_compiled_us", "speedup_vs_compiled"]
    if args.fused_gate_up:
        cols += ["groupmm_fused_us", "fused_same_y"]
    if device.type == "cuda":
        cols += ["groupmm_no_recompute_us", "kept_rows", "kept_rows_no_recompute", "torch_kept_rows"]
    print(common.table(cols, result["cases"]))
    common.write_json(args.json, result)


if __name__ == "__main__":
    main()
