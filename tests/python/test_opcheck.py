"""torch.library.opcheck on every op: schema (mutation and aliasing as declared), fake kernel
against the real one (shapes, dtypes, strides), autograd registration, and AOT dispatch with
dynamic shapes (the path torch.compile takes)."""

import pytest
import torch

import groupmm
from conftest import make_splits

ops = torch.ops.groupmm
COUNTS = [3, 0, 6, 7]  # 16 rows; expert 1 empty


def samples(device):
    """(op name, args, kwargs) for every op; float inputs of differentiable ops require grad."""
    G, M, K, N, T, E, k, H = len(COUNTS), sum(COUNTS), 64, 32, 8, 4, 2, 32
    bf = dict(device=device, dtype=torch.bfloat16)
    splits = make_splits(COUNTS, device)
    x = torch.randn(M, K, **bf)
    w = torch.randn(G, N, K, **bf)
    dy = torch.randn(M, N, **bf)
    gate_up = torch.randn(M, 2 * N, **bf)
    prob = torch.rand(M, device=device)
    logits = torch.randn(T, E, device=device)
    ids, weights, counts, _, _ = ops.router(logits, None, k)
    plan = ops.permute_plan(ids, E, 4, 0)
    R = groupmm.permuted_rows(T, k, E, 4, 0)
    xt = torch.randn(T, H, **bf)
    x128 = torch.randn(M, 128, **bf)  # fp8_block needs K % 128 == 0
    q = ops.group_quantize(x, splits, "mxfp8")
    # FP8 GEMM operands: 16-row aligned experts, as the FP8 wgrad needs.
    splits16 = make_splits([16, 0, 32, 16], device)
    x16, dy16 = torch.randn(64, 128, **bf), torch.randn(64, 128, **bf)
    w128 = torch.randn(G, 128, 128, **bf)
    fp8 = {r: [list(ops.group_quantize(t, s, r, block_2d=s is None and r == "fp8_block"))
               for t, s in ((x16, splits16), (w128, None), (dy16, splits16))]
           for r in ("fp8_current", "fp8_block", "mxfp8")}
    w4 = torch.randn(G, N, K, **bf)
    nv = list(ops.group_quantize_w4(w4, "nvfp4"))
    mx = ops.group_quantize_w4(w4, "mxfp4", "swizzled")
    blocks, scales = ops.export_mxfp4_weights(*ops.group_quantize_w4(w4, "mxfp4")[:2])
    grad = lambda t: t.clone().requires_grad_()  # noqa: E731
    return [
        ("grouped_mm", (grad(x), grad(w), splits, grad(torch.randn(G, N, **bf))), {}),
        ("grouped_mm", (grad(x), grad(w), splits, grad(torch.randn(G, N, device=device))),
         {"out_dtype": torch.float32}),
        ("grouped_mm_dgrad", (dy, w, splits), {}),
        ("grouped_mm_dgrad", (dy, w, splits), {"out_dtype": torch.float32}),
        ("grouped_mm_wgrad", (dy, x, splits), {"out_dtype": torch.float32}),
        ("grouped_gemm", (x, w, splits, "forward"), {"splits_total": "at_most", "zero_tail": True}),
        ("grouped_gemm", (dy, w, splits, "dgrad"), {"out_dtype": torch.float32}),
        ("grouped_gemm", (dy, x, splits, "wgrad"), {"splits_total": "at_most"}),
        ("grouped_mm_wgrad_accumulate", (dy, x, splits, torch.zeros(G, N, K, device=device)), {}),
        ("group_dbias", (dy, splits), {}),
        ("group_dbias_accumulate", (dy, splits, torch.zeros(G, N, device=device)), {}),
        ("grouped_mm_fp8", (*fp8["fp8_current"][:2], splits16, "fp8_current"),
         {"bias": torch.randn(G, 128, **bf), "fast_accum": True}),
        ("grouped_mm_fp8", (*fp8["fp8_block"][:2], splits16, "fp8_block"), {}),
        ("grouped_mm_fp8", (*fp8["mxfp8"][:2], splits16, "mxfp8"), {}),
        ("grouped_mm_fp8_dgrad", (fp8["fp8_block"][2], fp8["fp8_block"][1], splits16,
                                  "fp8_block"), {}),
        ("grouped_mm_fp8_wgrad", (fp8["fp8_current"][2], fp8["fp8_current"][0], splits16,
                                  "fp8_current"), {"out_dtype": torch.float32}),
        ("grouped_mm_fp8_wgrad_accumulate", (fp8["mxfp8"][2], fp8["mxfp8"][0], splits16, "mxfp8",
                                             torch.zeros(G, 128, 128, device=device)), {}),
        ("group_quantize_w4", (w4, "nvfp4"), {}),
        ("group_quantize_w4", (w4, "mxfp4"), {"scale_layout": "swizzled"}),
        ("grouped_mm_w4", (x, nv, splits, "nvfp4"), {"bias": torch.randn(G, N, **bf)}),
        ("grouped_mm_w4", (x, list(mx), splits, "mxfp4", "swizzled"), {}),
        ("import_mxfp4_weights", (blocks, scales), {"scale_layout": "swizzled"}),
        ("export_mxfp4_weights", (*mx[:2], "swizzled"), {}),
        ("_core_grouped_linear", (x, splits, w, torch.randn(G, N, **bf), dy), {}),
        ("_core_moe", (xt, torch.randn(E, H, **bf), torch.randn(E, 2 * N, H, **bf),
                       torch.randn(E, H, N, **bf), torch.randn(2 * N, H, **bf),
                       torch.randn(H, N, **bf), xt, k), {"align": 4}),
        ("group_offsets", (splits,), {}),
        ("swiglu", (grad(gate_up),), {}),
        ("swiglu_backward", (torch.randn(M, N, **bf), gate_up), {}),
        ("weighted_swiglu", (grad(gate_up), grad(prob)), {}),
        ("weighted_swiglu_backward", (torch.randn(M, N, **bf), gate_up, prob), {}),
        ("weighted_swiglu_ex", (grad(gate_up), grad(prob), 1.702, 7.0, 1.0, True), {}),
        ("weighted_swiglu_ex_backward", (torch.randn(M, N, **bf), gate_up, prob),
         {"alpha": 1.702, "limit": 7.0, "up_offset": 1.0, "interleaved": True}),
        ("router", (logits, torch.zeros(E, device=device), k), {"renormalize": True,
                                                               "aux_loss_coeff": 0.01}),
        ("router_backward", (logits, ids, counts, torch.randn(T, k, device=device)), {}),
        ("router_logits", (grad(xt), grad(torch.randn(E, H, **bf))), {}),
        ("router_logits", (grad(xt), grad(torch.randn(E, H, **bf)), grad(torch.randn(E, **bf))),
         {}),
        ("router_logits_backward", (logits, xt, torch.randn(E, H, **bf)), {}),
        ("permute_plan", (ids, E, 4, 0), {}),
        ("permute", (grad(xt), *plan, 4, 0, grad(weights)), {}),
        ("permute_backward", (torch.randn(R, H, **bf), *plan, 4, 0,
                              torch.randn(R, device=device)), {}),
        ("unpermute", (grad(torch.randn(R, H, **bf)), *plan, 4, 0, grad(xt)), {}),
        ("unpermute_backward", (xt, *plan, 4, 0), {}),
        ("gate_up_swiglu", (grad(xt), *plan, 4, 0, grad(weights),
                            grad(torch.randn(E, 128, H, **bf) * H ** -0.5)),
         {"pre_activation": True}),
        ("gate_up_swiglu", (xt, *plan, 4, 0, weights, torch.randn(E, 128, H, **bf)), {}),
        ("group_quantize", (x, splits, "fp8_current"), {}),
        ("group_quantize", (x, splits, "mxfp8"), {"scale_layout": "swizzled"}),
        ("group_quantize", (x128, splits, "fp8_block"), {"direction": "rowwise",
                                                      "scale_layout": "mn_major"}),
        ("group_quantize", (w, None, "mxfp8"), {}),
        ("group_dequantize", (*q, splits, [M, K], "mxfp8"), {"out_dtype": torch.float32}),
        ("group_dequantize", (*q, splits, [M, K], "mxfp8"), {"from_columnwise": True}),
        # the at-most splits rule (a full sum here: every output row written, so the eager and
        # AOT outputs compare; tests/python/test_at_most.py has the short sums)
        ("grouped_mm", (grad(x), grad(w), splits, grad(torch.randn(G, N, **bf))),
         {"splits_total": "at_most"}),
        ("grouped_mm_wgrad_accumulate", (dy, x, splits, torch.zeros(G, N, K, device=device)),
         {"splits_total": "at_most"}),
        ("group_dbias", (dy, splits), {"out_dtype": torch.float32, "splits_total": "at_most"}),
        ("grouped_mm_fp8", (*fp8["mxfp8"][:2], splits16, "mxfp8"), {"splits_total": "at_most"}),
        # expected_rows (at_most only: the kernel choice's rows), through the autograd formula too
        ("grouped_mm", (grad(x), grad(w), splits, grad(torch.randn(G, N, **bf))),
         {"splits_total": "at_most", "expected_rows": 12}),
        ("grouped_gemm", (dy, x, splits, "wgrad"), {"splits_total": "at_most", "expected_rows": 8}),
        ("grouped_mm_fp8_dgrad", (fp8["fp8_current"][2], fp8["fp8_current"][1], splits16,
                                  "fp8_current"), {"splits_total": "at_most", "expected_rows": 48}),
        ("grouped_mm_fp8_wgrad_accumulate", (fp8["mxfp8"][2], fp8["mxfp8"][0], splits16, "mxfp8",
                                             torch.zeros(G, 128, 128, device=device)),
         {"splits_total": "at_most", "expected_rows": 32}),
        ("group_quantize", (x, splits, "fp8_current"), {"splits_total": "at_most"}),
        ("weighted_swiglu", (grad(gate_up), grad(prob), splits), {}),
        ("weighted_swiglu_backward", (torch.randn(M, N, **bf), gate_up, prob, splits), {}),
    ]


NAMES = [s[0] for s in samples("cpu")]


FP8 = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu)
ALL_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor",
             "test_aot_dispatch_dynamic")


@pytest.mark.parametrize("index", range(len(NAMES)), ids=[f"{i}-{n}" for i, n in enumerate(NAMES)])
def test_opcheck(device, index):
    name, args, kwargs = samples(device)[index]
    utils = ALL_UTILS
    flat = [t for a in args for t in (a if isinstance(a, list) else [a])]
    if any(isinstance(t, torch.Tensor) and t.dtype in FP8 for t in flat):
        # torch's schema check compares inputs before and after with allclose, which has no fp8
        # kernel on the CPU; test_quantize.py / test_fp8_gemm.py / test_w4.py check that these
        # ops leave their inputs unchanged.
        utils = ALL_UTILS[1:]
    torch.library.opcheck(getattr(ops, name).default, args, kwargs, test_utils=utils)


def test_every_op_is_covered():
    defined = {n.split("::")[1] for n in torch._C._dispatch_get_all_op_names()
               if n.startswith("groupmm::")}
    # check_status is a host-side sync (tested in test_errors.py), not a tensor op; the two
    # timing hooks return host / device microseconds (eager only; smoke-tested by the bench
    # scripts' tests); recipe_traits takes and returns no tensor (test_recipes.py).
    # empty_cache releases groupmm's pooled device memory (test_errors.py).
    host = {"check_status", "_core_call_us", "_core_layer_step_us", "recipe_traits",
            "empty_cache"}
    # The expert-parallel ops are collectives over a process group that take custom classes
    # (EpGroup, EpPlan): eager only, no fake kernels; test_moe_ep.py tests them, and
    # ep_nccl_unique_id (host bytes for a CUDA EpGroup).
    host |= {"ep_nccl_unique_id", "ep_dispatch_plan", "ep_capacity_plan_create",
             "ep_capacity_plan", "ep_dispatch", "ep_dispatch_backward", "ep_combine",
             "ep_combine_backward"}
    assert defined - host == set(NAMES)
