"""What the transformers examples share (hf_qwen3_moe.py, hf_llama4_moe.py): their command line,
and the loop: a few AdamW steps on random tokens, printing each loss and its time, then greedy
generate()."""

import argparse
import time

import torch


def parse_args(argv, doc, real_help):
    """--real, --recipe, --steps, --device of an example whose docstring is `doc`; seeds torch."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--real", action="store_true", help=real_help)
    p.add_argument("--recipe", default="bf16", choices=["bf16", "fp8_current", "fp8_block"])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    args.device = torch.device(args.device)
    torch.manual_seed(0)
    return args


def train_then_generate(model, steps, batch, seq, device):
    """Trains `model` (a causal LM on `device`) `steps` steps of [batch, seq] random tokens, then
    generates 8 tokens for 2 random prompts; returns the losses."""
    vocab = model.config.vocab_size
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(steps):
        ids = torch.randint(0, vocab, (batch, seq), device=device)
        t = time.perf_counter()
        loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        print(f"step {step}: loss {losses[-1]:.4f}  {1e3 * (time.perf_counter() - t):.1f} ms")
    model.eval()
    with torch.no_grad():
        prompt = torch.randint(0, vocab, (2, 8), device=device)
        out = model.generate(prompt, max_new_tokens=8, do_sample=False)
    print("generated:", out[:, 8:].tolist())
    return losses
