"""Trains a tiny groupmm MoE model on synthetic data and prints the loss going down.

    .venv/bin/python examples/train_tiny_moe.py                      (after scripts/install_python.sh)
    PYTHONPATH=python .venv/bin/python examples/train_tiny_moe.py    (the in-place build of
                                                      scripts/build_python.sh or scripts/test.sh)

The task: regress the output of a fixed random teacher MLP from random tokens. The model is an
embedding projection, one groupmm.nn.MoE block (router, permute, grouped SwiGLU experts, unpermute,
shared expert) with a residual, and a head. Runs on the GPU when one is there, else on the CPU
(under a minute). --recipe fp8_current / mxfp8 trains the experts on FP8 / MXFP8 GEMMs.
"""

import argparse
import time

import torch

import groupmm


def main(argv=None):
    """Trains; returns the losses of the printed steps."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--recipe", default="bf16", choices=["bf16", "fp8_current", "mxfp8"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    dev, bf = torch.device(args.device), torch.bfloat16
    D, H, FF, E, K = 16, 64, 64, 8, 2

    teacher = torch.nn.Sequential(torch.nn.Linear(D, 128), torch.nn.GELU(),
                                  torch.nn.Linear(128, D)).to(dev)
    embed = torch.nn.Linear(D, H, device=dev, dtype=bf)
    moe = groupmm.nn.MoE(H, FF, E, K, shared_ffn_hidden=FF, aux_loss_coeff=1e-2,
                         recipe=args.recipe, device=dev)
    head = torch.nn.Linear(H, D, device=dev, dtype=bf)
    params = [*embed.parameters(), *moe.parameters(), *head.parameters()]
    opt = torch.optim.Adam(params, lr=3e-3)

    t0, losses = time.time(), []
    for step in range(args.steps + 1):
        x = torch.randn(args.tokens, D, device=dev)
        with torch.no_grad():
            target = teacher(x)
        h = embed(x.to(bf))
        y, aux = moe(h)
        pred = head(h + y).float()
        loss = torch.nn.functional.mse_loss(pred, target)
        opt.zero_grad()
        (loss + aux).backward()
        opt.step()
        if step % 10 == 0 or step == args.steps:
            losses.append(loss.item())
            print(f"step {step:3d}  loss {losses[-1]:.4f}  aux {aux.item():.4f}")
    if dev.type == "cuda":
        groupmm.check(dev)  # any device fault (bad splits) recorded during training
    print(f"{args.steps} steps on {dev} ({args.recipe}) in {time.time() - t0:.1f} s")
    return losses


if __name__ == "__main__":
    main()
