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


# ---- what a new user gets wrong (issue 49, item 5) ----------------------------------------------

def test_grouped_linear_names_its_input():
    """An fp32 x to a bf16 layer names x (the ops would name the weight), in every recipe: the FP8
    recipes quantized an fp32 x without a word."""
    splits = make_splits([16, 0], "cpu")
    for kw in ({}, dict(bias=False), dict(delay_wgrad=True), dict(recipe="fp8_current"),
               dict(recipe="nvfp4_weight")):
        layer = groupmm.nn.GroupedLinear(2, 128, 128, **kw)
        with pytest.raises(ValueError, match=r"groupmm.nn.GroupedLinear.forward: x must be "
                           r"\[M, 128\] torch.bfloat16 \(the layer's in_features and dtype\); "
                           r"got \[16, 128\] torch.float32"):
            layer(torch.randn(16, 128), splits)
    layer = groupmm.nn.GroupedLinear(2, 16, 8)
    with pytest.raises(ValueError, match=r"x must be \[M, 16\] .* got \[8, 12\] torch.bfloat16"):
        layer(torch.randn(8, 12, dtype=torch.bfloat16), make_splits([4, 4], "cpu"))
    with pytest.raises(ValueError, match=r"x must be \[M, 16\] .* got \[2, 4, 16\]"):
        layer(torch.randn(2, 4, 16, dtype=torch.bfloat16), make_splits([4, 4], "cpu"))
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"got \[8, 16\] torch.float16"):
            layer(torch.randn(8, 16, dtype=torch.float16), make_splits([4, 4], "cpu"))


@pytest.mark.parametrize("op,a_name,b_name", [("grouped_mm", "a (x)", "b (W)"),
                                              ("grouped_mm_dgrad", "a (dy)", "b (W)"),
                                              ("grouped_mm_wgrad", "a (dy)", "b (x)")])
def test_operands_of_two_dtypes_name_the_input(op, a_name, b_name):
    """fp32 activations with bf16 weights: the message leads with the activation and says both
    dtypes (it said `b (W).dtype=bf16 must be fp32`)."""
    bf = torch.bfloat16
    b = torch.randn(8, 16, dtype=bf) if op == "grouped_mm_wgrad" else torch.randn(2, 8, 16,
                                                                                  dtype=bf)
    a = torch.randn(8, 8 if op != "grouped_mm" else 16)
    want = (re.escape(f"grouped_gemm: {a_name}.dtype=fp32 must equal {b_name}.dtype=bf16 ") +
            r"\(both operands in one dtype\)$")
    with pytest.raises(RuntimeError, match=want):
        getattr(ops, op)(a, b, make_splits([4, 4], "cpu"))


def test_router_logits_names_its_input():
    with pytest.raises(RuntimeError, match=r"moe_router_logits: x.dtype=fp32 must equal "
                       r"w.dtype=bf16"):
        ops.router_logits(torch.randn(8, 16), torch.randn(4, 16, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match=r"moe_router_logits: x.shape\[1\]=12 must equal "
                       r"w.shape\[1\]=16"):
        ops.router_logits(torch.randn(8, 12), torch.randn(4, 16))


def test_weight_of_the_wrong_layout_names_both_sizes():
    """W given [G, K, N] (torch._grouped_mm's layout) to the [G, N, K] op."""
    bf = torch.bfloat16
    x = torch.randn(8, 16, dtype=bf)
    with pytest.raises(RuntimeError, match=re.escape(
            "grouped_gemm: a (x).shape[1]=16 must equal b (W).shape[2]=8 (K: W is [G, N, K])")):
        ops.grouped_mm(x, torch.randn(2, 16, 8, dtype=bf), make_splits([4, 4], "cpu"))
    with pytest.raises(RuntimeError, match=re.escape(
            "grouped_gemm: a (dy).shape[1]=8 must equal b (W).shape[1]=16 (N: W is [G, N, K])")):
        ops.grouped_mm_dgrad(torch.randn(8, 8, dtype=bf), torch.randn(2, 16, 8, dtype=bf),
                             make_splits([4, 4], "cpu"))


TOPK_MESSAGES = {-1: r"topk=-1 must be in \[1, min\(experts, 32\)\] = \[1, 4\]",
                 0: r"topk=0 must be in \[1, min\(experts, 32\)\] = \[1, 4\]",
                 5: r"topk=5 must be in \[1, min\(experts, 32\)\] = \[1, 4\]"}


@pytest.mark.parametrize("topk", sorted(TOPK_MESSAGES))
def test_router_rejects_topk_itself(topk):
    """topk out of [1, min(E, 32)] is groupmm's error, naming the op, before any output is sized
    from it (topk=-1 was torch's `Trying to create tensor with negative dimension -1`), in eager,
    through the fake kernel (meta tensors, torch.compile) and in the module."""
    logits = torch.randn(8, 4)
    for lg in (logits, logits.to("meta"), logits.clone().requires_grad_()):
        with pytest.raises(ValueError, match=r"^groupmm.router: " + TOPK_MESSAGES[topk]):
            ops.router(lg, None, topk)
    with pytest.raises(ValueError, match=r"^groupmm.nn.MoE: " + TOPK_MESSAGES[topk]):
        groupmm.nn.MoE(16, 16, 4, topk)


def test_router_rejects_other_sizes():
    with pytest.raises(ValueError, match=r"^groupmm.router: topk=33 must be in \[1, min\(experts, "
                       r"32\)\] = \[1, 32\]"):
        ops.router(torch.randn(8, 64), None, 33)
    with pytest.raises(ValueError, match=r"^groupmm.router: logits.shape\[1\]=0 \(experts\) must "
                       r"be in \[1, 1024\]"):
        ops.router(torch.randn(8, 0), None, 1)
    logits = torch.randn(8, 4)
    ids = torch.zeros(8, 0, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^groupmm.router_backward: expert_ids.shape\[1\]=0 must "
                       r"be in \[1, min\(experts, 32\)\] = \[1, 4\]"):
        ops.router_backward(logits, ids, torch.zeros(4, dtype=torch.int32), torch.zeros(8, 0))
    with pytest.raises(TypeError, match=r"groupmm.nn.MoE: topk=2.5 must be an int"):
        groupmm.nn.MoE(16, 16, 4, 2.5)
    with pytest.raises(TypeError, match=r"groupmm.nn.MoE: experts=4.0 must be an int"):
        groupmm.nn.MoE(16, 16, 4.0, 2)


def test_check_of_an_unsupported_device():
    with pytest.raises(ValueError, match=r"groupmm.check: device='meta' must be a cuda or cpu "
                       r"device"):
        groupmm.check("meta")
    groupmm.check("cpu")  # nothing recorded: returns


def test_splits_of_a_wrong_dtype_name_it():
    x, w = _cpu_operands()
    with pytest.raises(RuntimeError, match=r"grouped_gemm: splits.dtype=fp32 must be int32 or "
                       r"int64"):
        ops.grouped_mm(x, w, torch.tensor([4.0, 4.0]))
    with pytest.raises(TypeError, match=r"groupmm.grouped_mm: splits has dtype Short, which "
                       r"groupmm does not take"):
        ops.grouped_mm(x, w, torch.tensor([4, 4], dtype=torch.int16))
    with pytest.raises(RuntimeError, match=r"grouped_gemm: splits.shape\[0\]=3 must equal the "
                       r"number of groups 2"):
        ops.grouped_mm(x, w, make_splits([4, 2, 2], "cpu"))


def test_splits_on_the_meta_device_are_refused():
    """A call mixing CPU and meta tensors goes to the fake kernel (torch dispatches it to Meta),
    which returned an uninitialized CPU tensor for y; it now raises as the op kernels do for
    tensors on two devices."""
    x, w = _cpu_operands()
    splits = make_splits([4, 4], "meta")
    for a in (x, x.clone().requires_grad_()):
        with pytest.raises(RuntimeError, match=r"^groupmm.grouped_mm: splits is on meta but the op "
                           r"runs on cpu \(every tensor of one call on one device\)"):
            ops.grouped_mm(a, w, splits)
    with pytest.raises(RuntimeError, match=r"^groupmm.group_quantize: splits is on meta"):
        ops.group_quantize(x, splits, "fp8_current")
    # every tensor on meta: shapes only, as before
    y = ops.grouped_mm(x.to("meta"), w.to("meta"), splits)
    assert y.device.type == "meta" and y.shape == (8, 8)


def test_dropin_names_op_argument_and_values():
    bf = torch.bfloat16
    a = torch.randn(8, 16, dtype=bf)
    offs = torch.tensor([4, 8], dtype=torch.int32)
    with pytest.raises(RuntimeError, match=re.escape(
            "groupmm.grouped_mm: contraction dimension of mat_a and mat_b must match "
            "(mat_a.shape[-1]=16, mat_b.shape[-2]=12)")):
        groupmm.grouped_mm(a, torch.randn(2, 12, 8, dtype=bf), offs)
    with pytest.raises(RuntimeError, match=re.escape(
            "groupmm.grouped_mm: matrix batch sizes have to match (offs.shape[0]=3, "
            "mat_b.shape[0]=2)")):
        groupmm.grouped_mm(a, torch.randn(2, 16, 8, dtype=bf),
                           torch.tensor([2, 4, 8], dtype=torch.int32))
    with pytest.raises(RuntimeError, match=r"^groupmm.grouped_mm: Offsets tensor must be integer "
                       r"\(int32\) tensor, but got torch.int64"):
        groupmm.grouped_mm(a, torch.randn(2, 16, 8, dtype=bf), offs.long())
    with pytest.raises(RuntimeError, match=r"^groupmm.grouped_mm: expected mat_a and mat_b of one "
                       r"dtype.*mat_a.dtype=torch.float32 and mat_b.dtype=torch.bfloat16"):
        groupmm.grouped_mm(a.float(), torch.randn(2, 16, 8, dtype=bf), offs)
    with pytest.raises(RuntimeError, match=r"^groupmm.grouped_mm: offs is on meta but mat_a is on "
                       r"cpu"):
        groupmm.grouped_mm(a, torch.randn(2, 16, 8, dtype=bf), offs.to("meta"))
    with pytest.raises(RuntimeError, match=r"^groupmm.grouped_mm: mat_b is on meta but mat_a is "
                       r"on cpu"):
        groupmm.grouped_mm(a, torch.randn(2, 16, 8, dtype=bf, device="meta"), offs)


def test_non_contiguous_inputs_give_the_contiguous_answer():
    """Strided views are copied (never read as if contiguous): the layer and the drop-in give the
    results of the contiguous tensors, bit for bit."""
    bf = torch.bfloat16
    x = torch.randn(8, 16, dtype=bf)
    xt = x.t().contiguous().t()
    assert not xt.is_contiguous()
    splits = make_splits([3, 5], "cpu")
    layer = groupmm.nn.GroupedLinear(2, 16, 8)
    assert torch.equal(layer(xt, splits), layer(x, splits))
    b = torch.randn(2, 16, 8, dtype=bf)
    bt = b.transpose(1, 2).contiguous().transpose(1, 2)  # [G, K, N] column-major (torch's usual)
    offs = torch.tensor([3, 8], dtype=torch.int32)
    want = groupmm.grouped_mm(x, b, offs)
    assert torch.equal(groupmm.grouped_mm(xt, bt, offs), want)
    assert torch.equal(groupmm.grouped_mm(x, b[:, :, :8], offs), want)


def test_dropin_offs_faults_name_offs():
    """Bad offs reach the GEMM as bad splits (their differences); on the CPU the drop-in says
    which offs it was given."""
    bf = torch.bfloat16
    a, b = torch.randn(8, 16, dtype=bf), torch.randn(2, 16, 8, dtype=bf)
    with pytest.raises(RuntimeError, match=re.escape(
            "groupmm.grouped_mm: offs=[6, 4] (cumulative group ends: group g has offs[g] - "
            "offs[g-1] rows, up to the grouped extent): device fault in grouped_gemm (status "
            "0x1): negative split (treated as 0); first at group 1, value -2")):
        groupmm.grouped_mm(a, b, torch.tensor([6, 4], dtype=torch.int32))
    with pytest.raises(RuntimeError, match=r"^groupmm.grouped_mm: offs=\[4, 10\] .*splits run "
                       r"past the buffer"):
        groupmm.grouped_mm(a, b, torch.tensor([4, 10], dtype=torch.int32))


def test_empty_cache_releases_groupmm_pools_and_ops_still_run():
    # The mechanism (freed memory kept across a synchronization, then released) is tested in C++
    # (ContextGpu.FreedTensorsStayPooledAcrossASynchronizeUntilReleased); here the package's call.
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        x = torch.randn(8, 16, device=device, dtype=torch.bfloat16)
        before = groupmm.ops.swiglu(x)
        assert groupmm.empty_cache() is None
        torch.testing.assert_close(groupmm.ops.swiglu(x), before, rtol=0, atol=0)
