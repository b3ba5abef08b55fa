"""transformers MoE families, 2-layer causal LMs at real layer sizes: train step, prefill and decode
latency per experts backend ("eager", "grouped_mm", "groupmm" in bf16 and FP8), in one run, with
each backend's loss, logits and gradients against the first backend's (eager: calc_diff).

Decode: one token per sequence over a static KV cache of a --prompt-token prompt, at each batch of
--decode-batches; on CUDA the step is captured in a CUDA graph and replayed (launch cost hidden, as
served); a backend whose step cannot be captured (eager's experts read the routing on the host) is
timed eagerly and marked so. Each figure averages --iters calls after one warm-up call.

With --fp32-ref each backend is also compared with one training step of an fp32 copy of the
model on eager experts: how far each bf16 backend (eager's included) rounds from the same step
computed in fp32.

    python bench/peers_hf.py [--families qwen3_moe,mixtral] [--json out.json]    (GPU)
    python bench/peers_hf.py --tiny --device cpu                                 (smoke test)
"""

import argparse
import json
import time

import torch
import transformers
from transformers import AutoModelForCausalLM, StaticCache

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
FREE = "free_experts"  # the bound: the same model with experts that cost nothing
BACKENDS = ["eager", "grouped_mm", "groupmm", "groupmm_fp8_block", FREE]


def free_experts(module, hidden_states, top_k_index, top_k_weights):
    """The bound: experts that cost nothing (an elementwise scale keeps the router in autograd)."""
    return hidden_states * top_k_weights.sum(-1, keepdim=True).to(hidden_states.dtype)


def build(family, tiny, device):
    cls, kw = REAL[family]
    cfg_cls = getattr(transformers, cls)
    if tiny:  # MLA (DeepSeek) takes its head sizes from the qk_*/v_* fields, not head_dim
        kw = {k: v for k, v in {**kw, **TINY}.items()
              if (k in kw or hasattr(cfg_cls(), k)) and not (k == "head_dim" and family == "deepseek_v3")}
    cfg = cfg_cls(**kw, num_hidden_layers=2, vocab_size=1024 if tiny else 32000)
    torch.manual_seed(0)
    with torch.device(device):  # initialized where it runs (billions of parameters)
        return AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)


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


def grads_of(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def grads_calc_diff(got, ref):
    """calc_diff of every gradient together (the parameters both backends gave one), in chunks
    of fp64 (a Mixtral expert weight is 7 GB in fp64)."""
    ab = aa = 0.0
    for n, g in got.items():
        if n in ref:
            for a, b in zip(g.flatten().split(1 << 24), ref[n].flatten().split(1 << 24)):
                a, b = a.double(), b.double()
                ab += (a * b).sum().item()
                aa += (a * a + b * b).sum().item()
    return 1 - 2 * ab / aa if aa > 0 else float("nan")


def decode_ms(model, ids, batch, args, device):
    """One decode step of `batch` sequences over a static cache holding a prompt: (ms, graphed).
    A family whose attention does not take transformers' static cache (DeepSeek-V3's MLA in some
    versions) decodes over its dynamic cache, eagerly."""
    prompt = ids[:batch, : args.prompt]
    steps = args.iters + 9  # every call (warm-ups, capture, replays) writes one cache position
    try:
        cache = StaticCache(config=model.config, max_cache_len=prompt.shape[1] + steps)
        model(prompt, past_key_values=cache, use_cache=True)
        model(prompt[:, -1:], past_key_values=cache, use_cache=True)
    except RuntimeError:
        dyn = model(prompt, use_cache=True).past_key_values
        tok = prompt[:, -1:].contiguous()
        return timed(lambda: model(tok, past_key_values=dyn, use_cache=False), device,
                     args.iters)[0], False
    tok = prompt[:, -1:].contiguous()
    # cache_position given: transformers would otherwise read the cache length on the host
    pos = torch.tensor([prompt.shape[1]], device=device)

    def step():
        return model(tok, past_key_values=cache, cache_position=pos, use_cache=True).logits

    if device.type != "cuda":
        return timed(step, device, args.iters)[0], False
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            step()
    except Exception:  # not capturable (host reads of the routing): timed eagerly
        torch.cuda.synchronize()
        return timed(step, device, args.iters)[0], False
    return timed(graph.replay, device, args.iters)[0], True


def fp32_reference(model, ids):
    """Logits and gradients of one training step of an fp32 copy of the model with transformers'
    eager experts (the copy is dropped before returning)."""
    import copy
    ref = copy.deepcopy(model).float()
    ref.set_experts_implementation("eager")
    out = ref(ids, labels=ids)
    out.loss.backward()
    result = out.logits.detach(), grads_of(ref)
    del ref, out
    if ids.is_cuda:
        torch.cuda.empty_cache()
    return result


def run_family(family, args, device):
    model = build(family, args.tiny, device)
    batch, seq = (2, 16) if args.tiny else (args.batch, args.seq)
    ids = torch.randint(0, model.config.vocab_size, (max(batch, *args.decode_batches), seq),
                        device=device)
    records, ref = [], None
    fp32 = fp32_reference(model, ids[:batch]) if args.fp32_ref else None
    for backend in args.backends.split(","):
        try:
            model.set_experts_implementation(backend)

            def train():
                model.zero_grad(set_to_none=True)
                out = model(ids[:batch], labels=ids[:batch])
                out.loss.backward()
                return out

            train_ms, out = timed(train, device, args.iters)
            grads = grads_of(model)
            model.zero_grad(set_to_none=True)
            with torch.no_grad():
                prefill_ms, _ = timed(lambda: model(ids[:1]), device, args.iters)
                decode = {b: decode_ms(model, ids, b, args, device) for b in args.decode_batches}
        except Exception as e:  # a backend a family cannot run (e.g. FP8 sizes): say so
            records.append(dict(family=family, backend=backend, error=f"{type(e).__name__}: {e}"))
            print(f"{family:12s} {backend:20s} error: {records[-1]['error'][:100]}")
            continue
        if backend == FREE:  # a bound, not a backend: no agreement to check
            records.append(dict(family=family, backend=backend, train_ms=train_ms,
                                prefill_ms=prefill_ms,
                                decode_ms={str(b): v[0] for b, v in decode.items()},
                                decode_graphed={str(b): v[1] for b, v in decode.items()}))
            print(f"{family:12s} {backend:20s} train {train_ms:8.2f} ms  prefill {prefill_ms:7.2f}"
                  f" ms  decode ms " + "  ".join(f"b{b} {v[0]:6.2f}{'' if v[1] else '*'}"
                                                 for b, v in decode.items()))
            continue
        logits, loss = out.logits.detach().float(), out.loss.item()
        if ref is None:
            ref = (logits, loss, grads)
        if fp32 is not None:  # the same step in fp32 (eager experts): how far each rounds from it
            extra = dict(logits_calc_diff_fp32=calc_diff(logits, fp32[0]),
                         grads_calc_diff_fp32=grads_calc_diff(grads, fp32[1]))
        else:
            extra = {}
        r = dict(family=family, backend=backend, train_ms=train_ms, prefill_ms=prefill_ms,
                 decode_ms={str(b): v[0] for b, v in decode.items()},
                 decode_graphed={str(b): v[1] for b, v in decode.items()}, loss=loss,
                 logits_calc_diff=calc_diff(logits, ref[0]),
                 grads_calc_diff=grads_calc_diff(grads, ref[2]), **extra)
        del grads, out
        if device.type == "cuda":
            torch.cuda.empty_cache()
        records.append(r)
        dec = "  ".join(f"b{b} {v[0]:6.2f}{'' if v[1] else '*'}" for b, v in decode.items())
        print(f"{family:12s} {backend:20s} train {train_ms:8.2f} ms  prefill {prefill_ms:7.2f} ms"
              f"  decode ms {dec}  loss {loss:.4f}  calc_diff logits "
              f"{r['logits_calc_diff']:.1e} grads {r['grads_calc_diff']:.1e}" +
              (f"  vs fp32: logits {extra['logits_calc_diff_fp32']:.1e} grads "
               f"{extra['grads_calc_diff_fp32']:.1e}" if extra else ""))
    by = {r["backend"]: r for r in records if "error" not in r}
    if FREE in by and "grouped_mm" in by:  # what any experts backend could gain at most
        p, f = by["grouped_mm"], by[FREE]
        dec = "  ".join(f"b{b} {p['decode_ms'][b] / f['decode_ms'][b]:.2f}x" for b in f["decode_ms"])
        print(f"{family:12s} bound (experts free) / grouped_mm: train "
              f"{p['train_ms'] / f['train_ms']:.2f}x  prefill {p['prefill_ms'] / f['prefill_ms']:.2f}x"
              f"  decode {dec}")
    for ours in [b for b in by if b.startswith("groupmm")]:
        if "grouped_mm" in by:  # the speed-ups over transformers' own torch._grouped_mm backend
            p, o = by["grouped_mm"], by[ours]
            dec = "  ".join(f"b{b} {p['decode_ms'][b] / o['decode_ms'][b]:.2f}x"
                            for b in o["decode_ms"])
            print(f"{family:12s} {ours} / grouped_mm: train {p['train_ms'] / o['train_ms']:.2f}x  "
                  f"prefill {p['prefill_ms'] / o['prefill_ms']:.2f}x  decode {dec}")
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return records


def write_json(path, records, device):
    with open(path, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                       records=records), f, indent=1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", default=",".join(REAL))
    p.add_argument("--backends", default=",".join(BACKENDS),
                   help="the first is the agreement reference")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--prompt", type=int, default=256, help="decode: prompt tokens in the cache")
    p.add_argument("--decode-batches", default="1,8,64", help="decode: sequences per step")
    p.add_argument("--fp32-ref", action="store_true",
                   help="also compare every backend's logits and gradients with one step of an "
                        "fp32 copy of the model on eager experts (*_calc_diff_fp32)")
    p.add_argument("--tiny", action="store_true", help="tiny sizes (a smoke test)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--json")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    args.decode_batches = [int(b) for b in args.decode_batches.split(",")]
    if args.tiny:
        args.iters, args.prompt = min(args.iters, 2), 8
        args.decode_batches = [1, 2]
    from transformers.integrations.moe import ExpertsInterface
    ExpertsInterface.register(FREE, free_experts)
    records = []
    for family in args.families.split(","):
        records += run_family(family, args, device)
        if args.json:  # after every family: a run cut short keeps what it measured
            write_json(args.json, records, device)
    return records


if __name__ == "__main__":
    main()
