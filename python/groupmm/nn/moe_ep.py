"""Expert parallelism of groupmm.nn.MoE over a torch.distributed process group.

The block on each of the group's R ranks holds the router (all E experts), the shared expert, and
its E_l = E / R local experts (rank r: global experts [r E_l, (r + 1) E_l)). A step composes like
the C++ nn::MoE with MoEConfig::ep (src/nn/moe.cpp), op for op:

  router_logits -> router -> plan (ep_dispatch_plan, or ep_capacity_plan on a plan made once per
  T) -> ep_dispatch (rows, and the router weights as probs) -> gate_up, weighted_swiglu, down on
  the local experts (plan.splits()) -> ep_combine (unweighted, + the shared expert's output)

and autograd runs the backward collectives (ep_combine_backward, ep_dispatch_backward) in reverse.
The transport is torch.classes.groupmm.EpGroup: for CPU tensors the core's ep::Transport over the
process group's own communicator (gloo; nothing is created); for CUDA tensors the core's NCCL
transport on a communicator groupmm creates for the group's ranks (rank 0's unique id broadcast
over the process group), the same transport the C++ layers and benchmarks run.

Capacity mode: the grouped buffer is sized for the budget (R * C_e rows), the rows past the
entries received a zero tail. The expert layers run with splits_total='at_most' over
plan.splits_at_most() (the splits without the tail) and weighted_swiglu takes the same splits, so
the tail is neither read nor computed, and the rows of y_grouped, dx_grouped and d_probs there are
left unwritten; ep_combine and ep_dispatch_backward read only the entries' rows (every recipe,
the 4-bit weight ones included). The expert GEMMs expect
T*k rows (expected_rows, capped at the buffer's rows: a rank receives its share of the T*k routed
rows on average, whatever the budget holds), as nn::MoE's capacity layers expect max_tokens * topk:
their kernel choice only.

With align > 1 (the FP8 recipes' split_multiple), the received rows are padded per local expert by
a local permute (k = 1, ids from the splits) and unpadded by its unpermute: a row's bits do not
change, so the experts see exactly the one-rank block's padded rows. In capacity mode the tail
rows are a group of their own after the local experts (E_l + 1 groups in the permute), which the
experts' at-most splits (the first E_l) leave out.
"""

import math

import torch

from ._recompute import again as _again

ops = torch.ops.groupmm

MODES = ("throughput", "capacity")


def ep_group(process_group, device):
    """The EpGroup of `process_group` for tensors on `device` (a collective of the group's ranks:
    it makes one small exchange, which connects NCCL's peers before any capture).

    CPU: the process group's own communicator. CUDA: a new NCCL communicator of the group's
    ranks on `device` (the current CUDA device if no index is given): rank 0 makes a unique id and
    broadcasts it over the process group (a CUDA tensor, so the group needs a backend that
    carries CUDA tensors, as NCCL and gloo do)."""
    import torch.distributed as dist
    device = torch.device(device)
    name = process_group.group_name
    if device.type != "cuda":
        return torch.classes.groupmm.EpGroup(name, str(device), None)
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if dist.get_rank(process_group) == 0:
        uid = ops.ep_nccl_unique_id()
    else:
        uid = torch.zeros(128, dtype=torch.uint8)
    uid = uid.to(device)
    dist.broadcast(uid, src=dist.get_global_rank(process_group, 0), group=process_group)
    with torch.cuda.device(device):
        return torch.classes.groupmm.EpGroup(name, str(device), uid.cpu())


def capacity_from_factor(tokens, topk, ranks, capacity_factor):
    """Capacity mode's per-peer budget from a capacity factor: C_e = ceil(factor * T k / R)
    (token, slot) entries for one peer's experts (the balanced share times the factor) and
    C = min(T, C_e) token rows, each at least 1. Every rank must derive the same budget: with
    capacity_factor, every rank's T must be the same (else pass ep_capacity explicitly)."""
    entries = max(1, math.ceil(capacity_factor * tokens * topk / ranks))
    return max(1, min(tokens, entries)), entries


class ExpertParallel:
    """The expert-parallel state of one MoE block: the process group, its EpGroup per device, the
    mode, and capacity mode's plans (a pool per T: a plan still referred to by an autograd graph
    that has not run its backward, or by a delayed wgrad, is never refilled)."""

    def __init__(self, process_group, experts, mode, capacity_factor, capacity):
        import torch.distributed as dist
        if mode not in MODES:
            raise ValueError(f"groupmm.nn.MoE: ep_mode='{mode}' must be 'throughput' or "
                             "'capacity'")
        self.process_group = process_group
        self.rank = dist.get_rank(process_group)
        self.ranks = dist.get_world_size(process_group)
        if experts % self.ranks != 0:
            raise ValueError(f"groupmm.nn.MoE: experts={experts} must be divisible by the "
                             f"expert-parallel world size {self.ranks}")
        self.local_experts = experts // self.ranks
        self.first_expert = self.rank * self.local_experts
        self.mode = mode
        if mode == "throughput" and (capacity_factor or capacity is not None):
            raise ValueError("groupmm.nn.MoE: ep_mode='throughput' is dropless: capacity_factor="
                             f"{capacity_factor} must be 0 and ep_capacity None (use "
                             "ep_mode='capacity' for a budget)")
        if mode == "capacity":
            if capacity is None and not capacity_factor > 0:
                raise ValueError("groupmm.nn.MoE: ep_mode='capacity' needs capacity_factor > 0 "
                                 "or ep_capacity=(rows_per_peer, entries_per_peer)")
            if capacity is not None:
                rows, entries = capacity
                if rows < 1 or entries < 0:
                    raise ValueError(f"groupmm.nn.MoE: ep_capacity={tuple(capacity)} needs "
                                     "rows_per_peer >= 1 and entries_per_peer >= 0 (0: "
                                     "rows_per_peer * topk)")
        self.capacity_factor = capacity_factor
        self.capacity = None if capacity is None else tuple(int(c) for c in capacity)
        self._groups = {}
        self._plans = {}  # (device, T, dtype) -> [EpPlan]
        self.last_overflow = None

    def splits_total(self, recipe):
        """The expert layers' splits rule: 'at_most' in capacity mode (the budget's padding rows
        are not computed; every recipe's GEMM takes it), else 'exact'."""
        return "at_most" if self.mode == "capacity" else "exact"

    def group(self, device):
        key = str(device)
        if key not in self._groups:
            self._groups[key] = ep_group(self.process_group, device)
        return self._groups[key]

    def budget(self, tokens, topk):
        if self.capacity is not None:
            return self.capacity
        return capacity_from_factor(tokens, topk, self.ranks, self.capacity_factor)

    def plan(self, ids, experts, hidden, dtype, zero_tail=True):
        """This step's plan for expert_ids [T, k] (a collective). zero_tail=False: capacity mode's
        movers leave the grouped rows past the entries unwritten (for consumers that never read
        them)."""
        group = self.group(ids.device)
        if self.mode == "throughput":
            return ops.ep_dispatch_plan(group, ids, experts, hidden)
        key = (str(ids.device), ids.shape[0], dtype, zero_tail)
        pool = self._plans.setdefault(key, [])
        plan = next((p for p in pool if not p.in_use()), None)
        if plan is None:  # allocates: make it in an eager step before capturing one
            rows, entries = self.budget(ids.shape[0], ids.shape[1])
            plan = ops.ep_capacity_plan_create(group, ids, experts, hidden, rows, entries, dtype,
                                               zero_tail)
            pool.append(plan)
        ops.ep_capacity_plan(plan, ids)
        if ids.device.type == "cpu":
            self.last_overflow = plan.last_overflow() or None
        return plan


def _local_ids(splits, rows, tail=False):
    """[rows, 1] int32: the local expert of each grouped row (rows in expert order). tail: splits
    may sum to less than rows, and the rows past the sum get id E_l (a group of their own); on
    the device, no host read of the splits."""
    if tail:
        rest = (rows - splits.sum()).reshape(1).to(splits.dtype)
        splits = torch.cat([splits, rest])
    experts = torch.arange(splits.shape[0], device=splits.device, dtype=torch.int32)
    return torch.repeat_interleave(experts, splits, output_size=rows).unsqueeze(1)


def forward(moe, x, is_first_microbatch, again):
    """The expert-parallel step of groupmm.nn.MoE (moe.MoE.forward calls it): returns (y, aux)."""
    ep = moe.ep
    logits = ops.router_logits(x, moe.router.weight, moe.router.bias)
    ids, weights, counts, aux, z = ops.router(logits, moe.expert_bias, moe.topk, *moe.router_cfg)
    if moe.tokens_per_expert is not None and moe.training and torch.is_grad_enabled():
        with torch.no_grad():
            moe.tokens_per_expert.add_(counts)
    # Capacity mode: the splits without the budget's tail, which the experts leave out. Unpadded
    # (align 1), nothing reads the tail, so the movers leave it unwritten; the local permute of
    # align > 1 copies it as a group of its own, so there it stays zero.
    at_most = moe.gate_up.splits_total == "at_most"
    plan = ep.plan(ids, moe.experts, x.shape[1], x.dtype, zero_tail=not at_most or moe.align > 1)
    splits = plan.splits_at_most() if at_most else plan.splits()
    # The dispatched rows are kept for gate_up's wgrad (recomputing them would repeat the
    # exchange); the SwiGLU outputs and the shared expert recompute as without EP.
    x_g, probs = ops.ep_dispatch(plan, x, weights)
    local = None
    if moe.align > 1:
        El = ep.local_experts
        lids = _local_ids(splits, x_g.shape[0], tail=at_most)
        lmap = ops.permute_plan(lids, El + 1 if at_most else El, moe.align, 0)
        x_g, probs = ops.permute(x_g, *lmap, moe.align, 0, probs.unsqueeze(1))
        splits, local = (lmap[3][:El] if at_most else lmap[3]), lmap
    act_splits = splits if at_most else None
    # Capacity mode: the rows this rank's experts are expected to get, T k (every rank's T the
    # same; nn::MoE's max_tokens * topk), not the budget's R C_e: the GEMMs' kernel choice only.
    # The layers cap it at the buffer's rows. With align > 1 the padding (under align rows a
    # local expert) is not counted.
    expected = x.shape[0] * moe.topk if at_most else None
    gu = moe.gate_up(x_g, splits, is_first_microbatch, expected_rows=expected)
    h = ops.weighted_swiglu(gu, probs, act_splits)
    rh = _again(ops.weighted_swiglu, gu, probs, act_splits) if again else None
    y_g = moe.down(h, splits, is_first_microbatch, recompute_input=rh, expected_rows=expected)
    if local is not None:
        y_g = ops.unpermute(y_g, *local, moe.align, 0, None)
    shared = None
    if moe.shared_up is not None:
        sgu = moe.shared_up(x, is_first_microbatch)
        rs = _again(ops.swiglu, sgu) if again else None
        shared = moe.shared_down(ops.swiglu(sgu), is_first_microbatch, recompute_input=rs)
    y = ops.ep_combine(plan, y_g, None, shared)
    return y, moe._router_loss(aux, z)
