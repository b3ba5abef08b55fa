#!/usr/bin/env python3
"""A plain PyTorch MoE block, written the way a PyTorch user writes it, timed on the shapes of
`groupmm bench moe` (forward, and forward + backward through autograd), in the same device call.

    build/groupmm bench moe --json out/moe.json && python3 bench/peers_torch_moe.py out/moe.json

Without a JSON file it runs the three default shapes (qwen3, dsv3, mixtral). The block:
softmax (or sigmoid + group-limited) top-k router with renormalized weights, argsort of the flat
expert ids, index_select into expert order, torch._grouped_mm for gate_up and down (bf16, fp32
accumulation), silu(gate) * up * weight, index_add_ back into token order, + a shared expert MLP.
With the JSON file it prints our time next to torch's and the speedup.
"""
import json
import sys

import torch
import torch.nn.functional as F

from peers_torch import median_ms  # the same event timing as the GEMM peer (bench/)

DEFAULT = [
    dict(case="qwen3", T=16384, H=2048, F=768, E=128, k=8, shared_F=0, score="softmax"),
    dict(case="dsv3", T=8192, H=7168, F=2048, E=32, k=8, shared_F=2048, score="sigmoid"),
    dict(case="mixtral", T=8192, H=4096, F=14336, E=8, k=2, shared_F=0, score="softmax"),
]


class TorchMoE(torch.nn.Module):
    def __init__(self, c, device="cuda"):
        super().__init__()
        H, Fd, E = c["H"], c["F"], c["E"]
        bf = dict(device=device, dtype=torch.bfloat16)
        self.c = c
        self.router = torch.nn.Parameter(torch.randn(E, H, **bf) * H ** -0.5)
        self.w13 = torch.nn.Parameter(torch.randn(E, 2 * Fd, H, **bf) * H ** -0.5)  # [E, 2F, H]
        self.w2 = torch.nn.Parameter(torch.randn(E, H, Fd, **bf) * Fd ** -0.5)      # [E, H, F]
        self.bias = torch.zeros(E, device=device)  # selection-only (DeepSeek-V3 style)
        if c["shared_F"]:
            Fs = c["shared_F"]
            self.s13 = torch.nn.Parameter(torch.randn(2 * Fs, H, **bf) * H ** -0.5)
            self.s2 = torch.nn.Parameter(torch.randn(H, Fs, **bf) * Fs ** -0.5)

    def route(self, x):
        c, E, k = self.c, self.c["E"], self.c["k"]
        logits = F.linear(x, self.router).float()
        if c["score"] == "softmax":
            scores = logits.softmax(-1)
            weights, ids = scores.topk(k, dim=-1)
        else:  # DeepSeek-V3: sigmoid, bias for selection, 8 groups, keep the top 4 groups
            scores = logits.sigmoid()
            sel = scores + self.bias
            g = sel.view(-1, 8, E // 8).topk(2, dim=-1)[0].sum(-1)
            keep = torch.zeros_like(g).scatter_(1, g.topk(4, dim=-1)[1], 1.0)
            sel = sel.masked_fill(keep.repeat_interleave(E // 8, dim=1) == 0, float("-inf"))
            ids = sel.topk(k, dim=-1)[1]
            weights = scores.gather(1, ids)
        weights = weights / weights.sum(-1, keepdim=True)
        if c["score"] == "sigmoid":
            weights = weights * 2.5
        return ids, weights

    def forward(self, x):
        T, E, k = x.shape[0], self.c["E"], self.c["k"]
        ids, weights = self.route(x)
        flat = ids.flatten()
        order = flat.argsort(stable=True)
        token = order // k
        counts = torch.bincount(flat, minlength=E)
        offs = counts.cumsum(0).to(torch.int32)
        xp = x.index_select(0, token)
        gu = torch._grouped_mm(xp, self.w13.transpose(-2, -1), offs=offs)
        g, u = gu.chunk(2, dim=-1)
        h = F.silu(g) * u * weights.flatten()[order].unsqueeze(1).to(x.dtype)
        yp = torch._grouped_mm(h, self.w2.transpose(-2, -1), offs=offs)
        y = torch.zeros_like(x).index_add_(0, token, yp)
        if self.c["shared_F"]:
            sg, su = F.linear(x, self.s13).chunk(2, dim=-1)
            y = y + F.linear(F.silu(sg) * su, self.s2)
        return y


def time_case(c):
    torch.manual_seed(0)
    m = TorchMoE(c)
    x = torch.rand(c["T"], c["H"], device="cuda", dtype=torch.bfloat16) * 2 - 1
    dy = (torch.rand_like(x) * 2 - 1) * 0.01
    xg = x.clone().requires_grad_(True)

    def fwd():
        with torch.no_grad():
            m(x)

    def fwd_bwd():
        m(xg).backward(dy)
        xg.grad = None
        for p in m.parameters():
            p.grad = None

    try:
        f = median_ms(fwd) * 1e3
        fb = median_ms(fwd_bwd) * 1e3
    except Exception as e:  # report, keep going with the other shapes
        return None, None, str(e).splitlines()[0][:160]
    return f, fb, None


def main():
    cases = DEFAULT
    ours = {}
    if len(sys.argv) > 1:
        data = json.load(open(sys.argv[1]))
        cases = [dict(case=c["case"], T=c["T"], H=c["H"], F=c["F"], E=c["E"], k=c["k"],
                      shared_F=c["shared_F"], score=c["score"]) for c in data["cases"]]
        ours = {c["case"]: c for c in data["cases"]}
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)} (eager, autograd)")
    print(f"{'case':9} {'T':>6} {'torch fwd us':>13} {'torch f+b us':>13} {'ours fwd':>10} "
          f"{'ours f+b':>10} {'x fwd':>6} {'x f+b':>6}")
    for c in cases:
        f, fb, err = time_case(c)
        if err:
            print(f"{c['case']:9} {c['T']:6} torch failed: {err}")
            continue
        o = ours.get(c["case"])
        if o and o["fwd_us"] > 0:
            print(f"{c['case']:9} {c['T']:6} {f:13.1f} {fb:13.1f} {o['fwd_us']:10.1f} "
                  f"{o['fwd_bwd_us']:10.1f} {f / o['fwd_us']:6.2f} {fb / o['fwd_bwd_us']:6.2f}")
        else:
            print(f"{c['case']:9} {c['T']:6} {f:13.1f} {fb:13.1f}")
        torch.cuda.empty_cache()
    print("targets (issue 19): fwd+bwd and fwd >= 2.5x torch on qwen3, >= 1.3x on mixtral")


if __name__ == "__main__":
    main()
