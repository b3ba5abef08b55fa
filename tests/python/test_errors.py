"""Errors: the core's validation and device-fault messages reach Python as exceptions."""

import pytest
import torch

import groupmm
from conftest import make_splits

ops = torch.ops.groupmm


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
