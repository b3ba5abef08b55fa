"""GroupedLinear's quantized-checkpoint imports (import_fp8_block, import_mxfp4): a checkpoint's
tensors checked against the layer and turned into the operand its recipe's GEMM reads, on the
layer's device (a checkpoint may be read to the host)."""

import torch

ops = torch.ops.groupmm


def _refuse(layer, message, error=ValueError):
    raise error(f"groupmm.nn.GroupedLinear(recipe='{layer.recipe}'): {message}")


def _shaped(layer, what, t, rows, tail):
    """t as [G, rows, *tail] (a one-group layer, whose weight is [N, K] like nn.Linear's, takes
    [rows, *tail] too), or raises naming the argument and both shapes."""
    if layer.weight is None:
        _refuse(layer, f"{what.split(':')[0]}: the layer's weights were already imported",
                RuntimeError)
    G = layer.experts
    if layer.weight.dim() == 2 and t.dim() == 1 + len(tail):
        t = t.unsqueeze(0)
    if tuple(t.shape) != (G, rows, *tail):
        _refuse(layer, f"{what} must be {[G, rows, *tail]} (experts, ...); got {list(t.shape)}")
    return t


def fp8_block_parts(layer, weight, weight_scale_inv):
    """group_quantize's five parts (rowwise data and 128x128 block scales; the rest empty) from
    DeepSeek-V3's weight [G, N, K] e4m3 and weight_scale_inv [G, ceil(N / 128), K / 128] fp32."""
    if layer.recipe != "fp8_block":
        _refuse(layer, "import_fp8_block needs recipe='fp8_block' (the 128x128 block-scaled "
                       "weights)")
    if weight.dtype != torch.float8_e4m3fn:
        _refuse(layer, f"import_fp8_block: weight must be torch.float8_e4m3fn; got {weight.dtype}")
    if weight_scale_inv.dtype != torch.float32:
        _refuse(layer, "import_fp8_block: weight_scale_inv must be torch.float32; got "
                       f"{weight_scale_inv.dtype}")
    G, N, K = layer.experts, layer.out_features, layer.in_features
    nb = (N + 127) // 128
    weight = _shaped(layer, "import_fp8_block: weight", weight, N, (K,))
    scale = _shaped(layer, "import_fp8_block: weight_scale_inv", weight_scale_inv, nb, (K // 128,))
    device = layer.weight.device
    # The GEMM's scale buffer is group_quantize's: the experts' blocks in order, then zero rows up
    # to the bound its shape is sized by (taken from the op's fake kernel).
    meta = torch.empty(G, N, K, dtype=torch.bfloat16, device="meta")
    shape = ops.group_quantize(meta, None, "fp8_block", block_2d=True)[1].shape
    scales = torch.zeros(shape, dtype=torch.float32, device=device)
    scales[: G * nb] = scale.reshape(G * nb, K // 128)
    none = torch.empty(0, dtype=torch.float32, device=device)
    return [weight.reshape(G * N, K).to(device).contiguous(), scales,
            none.to(torch.float8_e4m3fn), none, none]


def mxfp4_parts(layer, blocks, scales):
    """grouped_mm_w4's three parts from gpt-oss's blocks [G, N, K / 32, 16] and scales
    [G, N, K / 32] uint8 (import_mxfp4_weights' relayout)."""
    if layer.recipe != "mxfp4_weight":
        _refuse(layer, "import_mxfp4 needs recipe='mxfp4_weight'")
    N, K = layer.out_features, layer.in_features
    blocks = _shaped(layer, "import_mxfp4: blocks", blocks, N, (K // 32, 16))
    scales = _shaped(layer, "import_mxfp4: scales", scales, N, (K // 32,))
    device = layer.weight.device
    data, scale_inv = ops.import_mxfp4_weights(blocks.to(device), scales.to(device))
    return [data, scale_inv, torch.empty(0, dtype=torch.float32, device=device)]
