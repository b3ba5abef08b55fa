"""The autograd formulas live in C++ (python/csrc/ops_autograd.cpp and ops_autograd_moe.cpp, the
Autograd dispatch key): no Python runs per call, with or without a graph. These checks keep a
Python registration (torch.library.register_autograd, which costs ~10-30 us per call even under
no_grad) from silently coming back. The formulas' values are checked by test_gemm.py / test_moe_ops.py."""

import pytest
import torch

import groupmm  # noqa: F401
from conftest import make_splits

ops = torch.ops.groupmm
DIFFERENTIABLE = ["grouped_mm", "swiglu", "weighted_swiglu", "weighted_swiglu_ex", "router_logits",
                  "router", "permute", "unpermute", "gate_up_swiglu"]
# The MoE block's formulas (ops_autograd_moe.cpp).
MOE = ["router_logits", "router", "permute", "unpermute", "gate_up_swiglu"]
# No gradient by nature; their Autograd kernel only steps below autograd (without one, the
# dispatcher's boxed fallback ran on every call).
NON_DIFFERENTIABLE = ["group_quantize", "group_dequantize", "group_quantize_w4",
                      "import_mxfp4_weights", "export_mxfp4_weights", "group_offsets",
                      "permute_plan"]
# The expert-parallel movers (differentiable) and plans: formulas in ops_ep_autograd.cpp,
# registered from ops_ep.cpp after the custom classes their schemas name.
EP = ["ep_dispatch", "ep_combine", "ep_dispatch_plan", "ep_capacity_plan_create",
      "ep_capacity_plan"]


def autograd_kernel_line(op):
    lines = torch._C._dispatch_dump(f"groupmm::{op}").splitlines()
    return next((line for line in lines if line.startswith("Autograd")), "")


@pytest.mark.parametrize("op", DIFFERENTIABLE + NON_DIFFERENTIABLE + EP)
def test_autograd_kernel_is_registered_in_cpp(op):
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"groupmm::{op}", "Autograd")
    line = autograd_kernel_line(op)
    # A C++ kernel is registered from its source file and has an unboxed entry; a Python one is
    # registered from torch/library.py and is boxed only.
    source = ("ops_ep.cpp" if op in EP else
              "ops_autograd_moe.cpp" if op in MOE else "ops_autograd.cpp")
    assert f"/{source}:" in line and "unboxed" in line, line


def test_which_ops_have_an_autograd_kernel():
    """The backward ops and the in-place accumulations keep torch's fallback (it bumps the
    version counters of mutated inputs and warns if a second-order gradient reaches them)."""
    names = [n.split("::")[1] for n in torch._C._dispatch_get_all_op_names()
             if n.startswith("groupmm::")]
    with_kernel = sorted(n for n in names if autograd_kernel_line(n))
    assert with_kernel == sorted(DIFFERENTIABLE + NON_DIFFERENTIABLE + EP)


def test_non_differentiable_outputs_do_not_require_grad(device):
    x = torch.randn(32, 64, device=device, requires_grad=True)
    splits = make_splits([8, 0, 24], device)
    q = ops.group_quantize(x, splits, "fp8_current")
    assert not any(t.requires_grad for t in q)
    y = ops.group_dequantize(*q, splits, list(x.shape), "fp8_current", out_dtype=torch.float32)
    assert not y.requires_grad and y.grad_fn is None
    torch.testing.assert_close(y, x.detach(), rtol=0.07, atol=1e-2)


def mm_inputs(device, requires_grad):
    counts = [3, 0, 5, 8]
    x = torch.randn(16, 32, device=device, dtype=torch.bfloat16, requires_grad=requires_grad)
    w = torch.randn(4, 8, 32, device=device, dtype=torch.bfloat16, requires_grad=requires_grad)
    return x, w, make_splits(counts, device)


def test_no_graph_without_grad(device):
    x, w, splits = mm_inputs(device, True)
    with torch.no_grad():
        y = ops.grouped_mm(x, w, splits)
    assert y.grad_fn is None and not y.requires_grad
    x, w, splits = mm_inputs(device, False)
    assert ops.grouped_mm(x, w, splits).grad_fn is None
    with torch.inference_mode():
        assert ops.grouped_mm(*mm_inputs(device, True)).grad_fn is None


def test_graph_node_is_the_cpp_function(device):
    x, w, splits = mm_inputs(device, True)
    y = ops.grouped_mm(x, w, splits)
    assert "GroupedMm" in y.grad_fn.name()
    dx, dw = torch.autograd.grad(y.float().sum(), [x, w])
    dy = torch.ones_like(y)
    torch.testing.assert_close(dx, ops.grouped_mm_dgrad(dy, w.detach(), splits))
    torch.testing.assert_close(dw, ops.grouped_mm_wgrad(dy, x.detach(), splits))


def test_only_the_inputs_that_need_grad_are_computed(device):
    x, w, splits = mm_inputs(device, False)
    w.requires_grad_()
    bias = torch.randn(4, 8, device=device, dtype=torch.bfloat16)
    (dw,) = torch.autograd.grad(ops.grouped_mm(x, w, splits, bias).sum(), [w])
    assert dw.shape == w.shape


def test_router_outputs_unused_in_the_loss(device):
    logits = torch.randn(8, 4, device=device, requires_grad=True)
    ids, weights, counts, aux, z = ops.router(logits, None, 2, aux_loss_coeff=0.01,
                                              z_loss_coeff=0.001)
    assert not ids.requires_grad and not counts.requires_grad
    # Only the losses (d_weights absent), only the weights (the losses' grads absent): both
    # match the same terms taken through a graph that uses every output.
    (g_loss,) = torch.autograd.grad((aux + z).sum(), [logits], retain_graph=True)
    (g_w,) = torch.autograd.grad(weights.sum(), [logits], retain_graph=True)
    (g_all,) = torch.autograd.grad(weights.sum() + (aux + z).sum(), [logits])
    torch.testing.assert_close(g_loss + g_w, g_all)
