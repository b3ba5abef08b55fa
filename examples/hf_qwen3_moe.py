"""A transformers Qwen3-MoE causal LM with groupmm's experts backend: a few train steps, then
generate().

    .venv/bin/python examples/hf_qwen3_moe.py             (CPU: a small random config)
    .venv/bin/python examples/hf_qwen3_moe.py --real      (GPU: Qwen3-30B-A3B layer sizes, 2 layers,
                                                           bf16)

.venv/bin/python is the Python of the package's environment, after `bash scripts/install_python.sh`
(which installs transformers==5.17.0 there too). With the in-place build instead
(scripts/build_python.sh, or what scripts/test.sh leaves): PYTHONPATH=python .venv/bin/python ...

The one switch is `experts_implementation="groupmm"` after importing
groupmm.integrations.transformers (docs/integrations.md); --recipe picks an FP8 recipe
(fp8_current, fp8_block: GPU or CPU reference, bf16 models).
"""

import torch
from transformers import AutoModelForCausalLM, Qwen3MoeConfig

import groupmm.integrations.transformers  # noqa: F401  (registers "groupmm")

from hf_train_generate import parse_args, train_then_generate


def config(real):
    if real:  # Qwen3-30B-A3B's layer: hidden 2048, 128 experts of 768, top-8; 2 layers
        return Qwen3MoeConfig(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                              num_experts=128, num_experts_per_tok=8, num_hidden_layers=2,
                              num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                              vocab_size=151936, max_position_embeddings=4096)
    return Qwen3MoeConfig(hidden_size=128, intermediate_size=256, moe_intermediate_size=128,
                          num_experts=8, num_experts_per_tok=2, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                          vocab_size=512, max_position_embeddings=512)


def main(argv=None):
    """Trains; returns the losses."""
    args = parse_args(argv, __doc__, "Qwen3-30B-A3B layer sizes (GPU)")
    dev = args.device
    key = "groupmm" if args.recipe == "bf16" else f"groupmm_{args.recipe}"
    model = AutoModelForCausalLM.from_config(config(args.real), experts_implementation=key,
                                             dtype=torch.bfloat16).to(dev)
    batch, seq = (4, 2048) if args.real else (4, 64)
    return train_then_generate(model, args.steps, batch, seq, dev)


if __name__ == "__main__":
    main()
