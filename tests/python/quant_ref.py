"""Pure-PyTorch dequantization of what group_quantize / group_quantize_w4 write (plain scale
layouts), written from docs/numerics.md and include/groupmm/quantize.hpp ("Layouts") with host
split counts: the reference the quantized GEMM tests multiply with."""

import torch

from conftest import ref_grouped_mm

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _starts(counts, block=1):
    """Per expert: first row, and first block of `block` rows (blocks never straddle experts)."""
    rows, blocks, r, b = [], [], 0, 0
    for m in counts:
        rows.append(r)
        blocks.append(b)
        r += m
        b += -(-m // block)
    return rows, blocks


def _columnwise_blocks(flat, counts, K):
    """Expert g's [K, m_g] block of a columnwise buffer (at element K * start_g), un-transposed."""
    starts, _ = _starts(counts)
    return [flat[K * s:K * (s + m)].view(K, m).t() for s, m in zip(starts, counts)]


def dequantize(q, counts, recipe, columnwise=False, weight=False):
    """float64 [rows, K] values of one copy of group_quantize's output q (5 tensors, plain
    scales); counts: rows per expert (weights: [N] * G); weight: fp8_block 128x128 blocks."""
    # float64 first: indexing kernels do not exist for every fp8 dtype.
    data, scale, cdata, cscale = (t.double() for t in q[:4])
    K = cdata.shape[0] if columnwise else data.shape[1]
    if columnwise:
        parts = _columnwise_blocks(cdata.reshape(-1), counts, K)
    else:
        starts, _ = _starts(counts)
        parts = [data[s:s + m] for s, m in zip(starts, counts)]
    if recipe == "fp8_current":
        return torch.cat([p * scale[g] for g, p in enumerate(parts)])
    out = []
    block = 32 if recipe == "mxfp8" else 128
    two_d = recipe == "fp8_block" and weight
    _, bstarts = _starts(counts, block)
    rstarts, _ = _starts(counts)
    for g, p in enumerate(parts):
        m = counts[g]
        if m == 0:
            out.append(p)
            continue
        lr = torch.arange(m)[:, None]
        k = torch.arange(K)[None, :]
        if two_d and not columnwise:  # [tiles, K/128], expert g from its first 128-row tile
            s = scale[bstarts[g] + lr // 128, k // 128]
        elif two_d:  # per expert [K/128, nb_g] at (K/128) * cb_start_g
            nb = -(-m // 128)
            s = cscale.reshape(-1)[(K // 128) * bstarts[g]:][:(K // 128) * nb].view(K // 128, nb)
            s = s[k // 128, lr // 128]
        elif not columnwise:  # 1 x block along K, one row per token
            s = scale[rstarts[g] + lr, k // block]
        else:  # per expert [K, nb_g] at K * cb_start_g: block x 1 along tokens
            nb = -(-m // block)
            s = cscale.reshape(-1)[K * bstarts[g]:][:K * nb].view(K, nb)[k, lr // block]
        out.append(p * s)
    return torch.cat(out)


def decode_e2m1(packed):
    """uint8 [..., K/2] of packed e2m1 pairs (element 2j in the low nibble) -> float64 [..., K]."""
    nib = torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2).long()
    mag = E2M1.double()[nib & 7]
    return torch.where(nib >= 8, -mag, mag)


def dequantize_w4(w, recipe):
    """float64 [G, N, K] of [data, scale_inv(, global_scale)] from group_quantize_w4 (plain)."""
    data, scale = w[0], w[1]
    G, N, _ = data.shape
    codes = decode_e2m1(data)
    K = codes.shape[-1]
    block = 16 if recipe == "nvfp4" else 32
    s = scale.view(G, N, K // block).double().repeat_interleave(block, dim=-1)
    out = codes * s
    if recipe == "nvfp4":
        out = out / w[2].double()[:, None, None]
    return out


def grouped_mm(a, b, counts, bias=None):
    """y_g = a_g b_g^T (+ bias_g), float64, expert by expert (b: [G, N, K])."""
    return ref_grouped_mm(a, b, counts, bias, torch.float64)


def grouped_wgrad(dy, x, counts):
    """dW_g = dy_g^T x_g, float64 [G, N, K]."""
    outs, start = [], 0
    for m in counts:
        outs.append(dy[start:start + m].double().t() @ x[start:start + m].double())
        start += m
    return torch.stack(outs)
