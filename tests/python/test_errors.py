"""Errors: the core's validation and device-fault messages reach Python as exceptions, without
the C++ source locations the core adds for C++ callers."""

import re

import pytest
import torch

import groupmm
from conftest import make_splits

ops = torch.ops.groupmm

# What groupmm::Error appends to its messages for C++ callers (" [tensor.cpp:197]").
SOURCE_LOCATION = re.compile(r"\[[\w.+-]+\.(cpp|cc|cu|cuh|hpp|h):\d+\]")


def test_mismatched_dtypes_name_the_op_and_argument(device):
    x = torch.randn(8, 16, device=device, dtype=torch.bfloat16)
    w = torch.randn(2, 8, 16, device=device, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="grouped_gemm.*(fp16|bf16)"):
        ops.grouped_mm(x, w, make_splits([4, 4], device))


def test_unsupported_dtype_is_a_type_error(device):
    x = torch.randn(8, 16, device=device).to(torch.float64)
    w = torch.randn(2, 8, 16, device=device, dtype=torch.float64)
    with pytest.raises(TypeError, match="groupmm.grouped_mm: x has dtype Double"):
        ops.grouped_mm(x, w, make_splits([4, 4], device))


def test_wrong_shapes(device):
    x = torch.randn(8, 16, device=device, dtype=torch.bfloat16)
    w = torch.randn(2, 8, 12, device=device, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match=r"grouped_gemm.*12.*16|grouped_gemm.*16.*12"):
        ops.grouped_mm(x, w, make_splits([4, 4], device))
    with pytest.raises(ValueError, match="x must be \\[M, K\\]"):
        ops.grouped_mm(x[0], w, make_splits([4, 4], device))


def test_bad_splits_raise_on_cpu():
    x = torch.randn(8, 16, dtype=torch.bfloat16)
    w = torch.randn(2, 8, 16, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="device fault in grouped_gemm.*negative split"):
        ops.grouped_mm(x, w, make_splits([10, -2], "cpu"))
    ops.grouped_mm(x, w, make_splits([4, 4], "cpu"))  # the fault was reported once and reset
    groupmm.check("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bad_splits_are_reported_by_check_on_cuda():
    x = torch.randn(8, 16, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2, 8, 16, device="cuda", dtype=torch.bfloat16)
    ops.grouped_mm(x, w, make_splits([3, 3], "cuda"))  # no host read: no error yet
    with pytest.raises(RuntimeError, match="device fault in grouped_gemm.*sum of splits"):
        groupmm.check()
    groupmm.check()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_tensors_on_two_devices():
    x = torch.randn(8, 16, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2, 8, 16, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="splits is on cpu but the op runs on cuda"):
        ops.grouped_mm(x, w, make_splits([4, 4], "cpu"))


def test_moe_arguments_are_named():
    with pytest.raises(ValueError, match=r"groupmm.nn.MoE: topk=-1 must be in \[1, min\(experts, 32\)\]"):
        groupmm.nn.MoE(16, 16, 4, -1)
    with pytest.raises(ValueError, match=r"experts=2048 must be in \[1, 1024\]"):
        groupmm.nn.MoE(16, 16, 2048, 2)
    m = groupmm.nn.MoE(16, 16, 4, 2)
    with pytest.raises(ValueError, match=r"x must be \[T, 16\] torch.bfloat16 .* got \[8, 16\] torch.float32"):
        m(torch.randn(8, 16))


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible")
def test_check_without_cuda_says_so():
    with pytest.raises(RuntimeError, match="groupmm.check: no CUDA device is available"):
        groupmm.check()


def _cpu_operands():
    bf = torch.bfloat16
    return torch.randn(8, 16, dtype=bf), torch.randn(2, 8, 16, dtype=bf)


def _backward_with_bad_splits():
    """The forward runs with good splits; the splits then go bad before backward, so the fault is
    raised by the backward ops, through the autograd engine."""
    x, w = _cpu_operands()
    x.requires_grad_()
    splits = make_splits([4, 4], "cpu")
    y = ops.grouped_mm(x, w, splits)
    splits.data.copy_(torch.tensor([10, -2], dtype=torch.int32))  # unseen by autograd's checks
    y.float().sum().backward()


def _module_with_bad_splits():
    x, _ = _cpu_operands()
    groupmm.nn.GroupedLinear(2, 16, 8)(x, make_splits([10, -2], "cpu"))


def _through_autograd_kernel():
    x, w = _cpu_operands()
    ops.grouped_mm(x.requires_grad_(), w, make_splits([10, -2], "cpu"))


# Calls that fail in the core (groupmm::Error), each down another path of the binding: host-side
# validation, device faults on the CPU, the Autograd kernels, the backward ops run by the autograd
# engine, a module, and ops of other families.
CORE_ERRORS = {
    "validation": lambda: ops.grouped_mm(_cpu_operands()[0], torch.randn(2, 8, 12).bfloat16(),
                                         make_splits([4, 4], "cpu")),
    "device_fault": lambda: ops.grouped_mm(*_cpu_operands(), make_splits([10, -2], "cpu")),
    "int64_splits": lambda: ops.grouped_mm(*_cpu_operands(),
                                           make_splits([10, -2], "cpu", torch.int64)),
    "autograd_kernel": _through_autograd_kernel,
    "backward": _backward_with_bad_splits,
    "module": _module_with_bad_splits,
    "dgrad": lambda: ops.grouped_mm_dgrad(torch.randn(8, 8).bfloat16(), _cpu_operands()[1],
                                          make_splits([10, -2], "cpu")),
    "wgrad": lambda: ops.grouped_mm_wgrad(torch.randn(8, 8).bfloat16(), _cpu_operands()[0],
                                          make_splits([10, -2], "cpu")),
    "quantize": lambda: ops.group_quantize(_cpu_operands()[0], make_splits([10, -2], "cpu"),
                                           "fp8_current"),
    "offsets": lambda: ops.group_offsets(make_splits([10, -2], "cpu")),
}


@pytest.mark.parametrize("path", sorted(CORE_ERRORS))
def test_messages_have_no_source_location(path):
    with pytest.raises(RuntimeError) as info:
        CORE_ERRORS[path]()
    msg = str(info.value)
    assert not SOURCE_LOCATION.search(msg), msg
    assert msg == msg.strip() and "  " not in msg, msg  # nothing left where a location was cut


SPLIT_FAULTS = sorted(set(CORE_ERRORS) - {"validation"})


@pytest.mark.parametrize("path", SPLIT_FAULTS)
def test_negative_split_names_its_group(path):
    """splits [10, -2] for 8 rows: group 0 runs past the rows before group 1's negative count is
    read; the message names group 1 (it named group 0, value 10, under 'negative split')."""
    with pytest.raises(RuntimeError, match=r"negative split \(treated as 0\)") as info:
        CORE_ERRORS[path]()
    msg = str(info.value)
    assert "first at group 1, value -2" in msg, msg
    assert "group 0" not in msg, msg
