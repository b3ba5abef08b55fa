"""transformers MoE families, 2-layer causal LMs at real layer sizes: train step, prefill and decode
latency per experts backend ("eager", "grouped_mm", "groupmm" in bf16 and FP8), in one run, with
each backend's loss and logits against eager's (calc_diff).

    python bench/peers_hf.py [--families qwen3_moe,mixtral] [--json out.json]    (GPU)
    python bench/peers_hf.py --tiny --device cpu                                 (smoke test)
"""

import argparse
import json
import time

import torch
import transformers
from transformers import AutoModelForCausalLM

import groupmm.integrations.transformers  # noqa: F401  (registers the groupmm keys)

# Published layer sizes (2 layers), and the tiny ones for the smoke test.
REAL = {
    "qwen3_moe": ("Qwen3MoeConfig", dict(hidden_size=2048, moe_intermediate_size=768,
                                         num_experts=128, num_experts_per_tok=8, head_dim=128,
                                         num_attention_heads=32, num_key_value_heads=4)),
    "qwen2_moe": ("Qwen2MoeConfig", dict(hidden_size=2048, moe_intermediate_size=1408,
                                         shared_expert_intermediate_size=5632, num_experts=60,
                                         num_experts_per_tok=4, num_attention_heads=16,
                                         num_key_value_heads=16)),
    "mixtral": ("MixtralConfig", dict(hidden_size=4096, intermediate_size=14336,
                                      num_local_experts=8, num_experts_per_tok=2,
                                      num_attention_heads=32, num_key_value_heads=8)),
    "olmoe": ("OlmoeConfig", dict(hidden_size=2048, intermediate_size=1024, num_experts=64,
                                  num_experts_per_tok=8, num_attention_heads=16,
                                  num_key_value_heads=16)),
    "deepseek_v3": ("DeepseekV3Config", dict(hidden_size=7168, moe_intermediate_size=2048,
                                             n_routed_experts=64, num_experts_per_tok=8,
                                             first_k_dense_replace=0, num_attention_heads=32)),
    "gpt_oss": ("GptOssConfig", dict(hidden_size=2880, intermediate_size=2880,
                                     num_local_experts=128, num_experts_per_tok=4,
                                     layer_types=["sliding_attention", "full_attention"])),
}
TINY = dict(hidden_size=128, intermediate_size=128, moe_intermediate_size=128,
            shared_expert_intermediate_size=128, num_experts=8, n_routed_experts=8,
            num_local_experts=8, num_experts_per_tok=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, kv_lora_rank=32, q_lora_rank=64,
            qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=32, n_group=1, topk_group=1)
BACKENDS = ["eager", "grouped_mm", "groupmm", "groupmm_fp8_block"]


def build(family, tiny, device):
    cls, kw = REAL[family]
    cfg_cls = getattr(transformers, cls)
    if tiny:  # MLA (DeepSeek) takes its head sizes from the qk_*/v_* fields, not head_dim
        kw = {k: v for k, v in {**kw, **TINY}.items()
              if (k in kw or hasattr(cfg_cls(), k)) and not (k == "head_dim" and family == "deepseek_v3")}
    cfg = cfg_cls(**kw, num_hidden_layers=2, vocab_size=1024 if tiny else 32000)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).to(device)


def timed(fn, device, iters):
    fn()  # warm-up (and the groupmm gate check, FP8 weight quantization)
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - t) / iters, out


def calc_diff(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    return (1 - 2 * (a * b).sum() / (a * a + b * b).sum()).item()


def run_family(family, args, device):
    model = build(family, args.tiny, device)
    batch, seq = (2, 16) if args.tiny else (args.batch, args.seq)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), device=device)
    records, ref = [], None
    for backend in args.backends.split(","):
        try:
            model.set_experts_implementation(backend)

            def train():
                model.zero_grad(set_to_none=True)
                out = model(ids, labels=ids)
                out.loss.backward()
                return out

            train_ms, out = timed(train, device, args.iters)
            with torch.no_grad():
                prefill_ms, _ = timed(lambda: model(ids[:1]), device, args.iters)
                # decode: one token per sequence of the batch over a cached prompt (the cache
                # grows by a token per timed call: a few positions over seq)
                cache = model(ids[:, :-1], use_cache=True).past_key_values
                step = ids[:, -1:]
                decode_ms, _ = timed(lambda: model(step, past_key_values=cache,
                                                   use_cache=False), device, args.iters)
        except Exception as e:  # a backend a family cannot run (e.g. FP8 sizes): say so
            records.append(dict(family=family, backend=backend, error=f"{type(e).__name__}: {e}"))
            print(f"{family:12s} {backend:20s} error: {records[-1]['error'][:100]}")
            continue
        logits, loss = out.logits.detach().float(), out.loss.item()
        if ref is None:
            ref = (logits, loss)
        r = dict(family=family, backend=backend, train_ms=train_ms, prefill_ms=prefill_ms,
                 decode_ms=decode_ms, loss=loss, logits_calc_diff=calc_diff(logits, ref[0]))
        records.append(r)
        print(f"{family:12s} {backend:20s} train {train_ms:8.2f} ms  prefill {prefill_ms:7.2f} ms"
              f"  decode {decode_ms:6.2f} ms  loss {loss:.4f}  logits calc_diff "
              f"{r['logits_calc_diff']:.1e}")
    return records


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", default=",".join(REAL))
    p.add_argument("--backends", default=",".join(BACKENDS),
                   help="the first is the agreement reference")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--tiny", action="store_true", help="tiny sizes (a smoke test)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--json")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if args.tiny:
        args.iters = min(args.iters, 2)
    records = [r for f in args.families.split(",") for r in run_family(f, args, device)]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                           records=records), f, indent=1)
    return records


if __name__ == "__main__":
    main()
