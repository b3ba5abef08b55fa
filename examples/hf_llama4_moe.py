"""A transformers Llama 4 causal LM with its MoE layers on groupmm: a few train steps, then
generate().

    .venv/bin/python examples/hf_llama4_moe.py            (CPU: a small random config)
    .venv/bin/python examples/hf_llama4_moe.py --real     (GPU: Llama 4 Scout's layer sizes, 2
                                                           layers, bf16)

.venv/bin/python is the Python of the package's environment, after `bash scripts/install_python.sh`
(which installs transformers==5.17.0 there too). With the in-place build instead
(scripts/build_python.sh, or what scripts/test.sh leaves): PYTHONPATH=python .venv/bin/python ...

Llama 4's experts do not go through transformers' experts interface, so the MoE layers are
replaced whole: groupmm.integrations.transformers.replace_llama4_moe(model) (docs/integrations.md);
--recipe picks an FP8 recipe (fp8_current, fp8_block: GPU or CPU reference, bf16 models).
"""

import torch
from transformers import Llama4ForCausalLM, Llama4TextConfig

from groupmm.integrations.transformers import replace_llama4_moe

from hf_train_generate import parse_args, train_then_generate


def config(real):
    if real:  # Llama 4 Scout's layer: hidden 5120, 16 experts of 8192, top-1, a shared expert
        return Llama4TextConfig(hidden_size=5120, intermediate_size=8192,
                                intermediate_size_mlp=16384, num_local_experts=16,
                                num_experts_per_tok=1, num_hidden_layers=2, moe_layers=[0, 1],
                                num_attention_heads=40, num_key_value_heads=8, head_dim=128,
                                vocab_size=202048, max_position_embeddings=4096,
                                attention_chunk_size=8192)
    return Llama4TextConfig(hidden_size=128, intermediate_size=128, intermediate_size_mlp=256,
                            num_local_experts=8, num_experts_per_tok=1, num_hidden_layers=2,
                            moe_layers=[0, 1], num_attention_heads=4, num_key_value_heads=2,
                            head_dim=32, vocab_size=512, max_position_embeddings=512,
                            attention_chunk_size=512)


def main(argv=None):
    """Trains; returns the losses."""
    args = parse_args(argv, __doc__, "Llama 4 Scout layer sizes (GPU)")
    dev = args.device
    model = Llama4ForCausalLM(config(args.real)).to(device=dev, dtype=torch.bfloat16)
    with torch.no_grad():  # transformers initializes the experts to zero: give them weights
        for name, w in model.named_parameters():
            if "feed_forward.experts" in name:
                w.normal_(0, 0.02)
    replaced = replace_llama4_moe(model, recipe=args.recipe)
    print(f"{replaced} MoE layers on groupmm (recipe {args.recipe})")
    batch, seq = (4, 2048) if args.real else (4, 64)
    return train_then_generate(model, args.steps, batch, seq, dev)


if __name__ == "__main__":
    main()
