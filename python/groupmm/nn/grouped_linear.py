"""GroupedLinear: G experts' nn.Linear layers as one [G, N, K] weight and one grouped GEMM."""

import math

import torch

ops = torch.ops.groupmm


class _MainGradLinear(torch.autograd.Function):
    """grouped_mm whose weight gradient accumulates into weight.main_grad (fp32, [G, N, K]) in
    place, Megatron style, instead of becoming weight.grad (which stays None)."""

    @staticmethod
    def forward(ctx, x, weight, bias, splits):
        ctx.save_for_backward(x, weight, splits)
        ctx.has_bias = bias is not None
        return ops.grouped_mm(x, weight, splits, bias)

    @staticmethod
    def backward(ctx, dy):
        x, weight, splits = ctx.saved_tensors
        dx = ops.grouped_mm_dgrad(dy, weight, splits) if ctx.needs_input_grad[0] else None
        ops.grouped_mm_wgrad_accumulate(dy, x, splits, weight.main_grad)
        db = ops.group_dbias(dy, splits) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, None, db, None


class GroupedLinear(torch.nn.Module):
    """y_g = x_g W_g^T (+ b_g) for the rows of expert g (rows sorted by expert, `splits` [G] rows
    per expert on x's device).

    weight [G, N, K] (out, in) and bias [G, N] are initialized like G independent nn.Linear
    layers. dtype bfloat16 or float16 (float32 too on the CPU). With
    accumulate_into_main_grad, backward adds dW into weight.main_grad (fp32, zeroed here; zero
    it yourself between optimizer steps) and leaves weight.grad None.

    A state dict of per-expert nn.Linear layers ("{prefix}{g}.weight", "{prefix}{g}.bias", as a
    ModuleList of them writes) loads directly; from_linears() builds one from the layers.
    """

    def __init__(self, experts, in_features, out_features, bias=True, dtype=torch.bfloat16,
                 device=None, accumulate_into_main_grad=False):
        super().__init__()
        self.experts, self.in_features, self.out_features = experts, in_features, out_features
        self.accumulate_into_main_grad = accumulate_into_main_grad
        kw = dict(dtype=dtype, device=device)
        self.weight = torch.nn.Parameter(torch.empty(experts, out_features, in_features, **kw))
        self.bias = torch.nn.Parameter(torch.empty(experts, out_features, **kw)) if bias else None
        self.reset_parameters()
        if accumulate_into_main_grad:
            self.weight.main_grad = torch.zeros_like(self.weight, dtype=torch.float32)

    def reset_parameters(self):
        # nn.Linear's init per expert: kaiming_uniform(a=sqrt(5)) is U(-1/sqrt(K), 1/sqrt(K)).
        bound = 1.0 / math.sqrt(self.in_features) if self.in_features > 0 else 0.0
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            if self.bias is not None:
                self.bias.uniform_(-bound, bound)

    def forward(self, x, splits):
        if self.accumulate_into_main_grad and torch.is_grad_enabled():
            return _MainGradLinear.apply(x, self.weight, self.bias, splits)
        return ops.grouped_mm(x, self.weight, splits, self.bias)

    @classmethod
    def from_linears(cls, linears, **kwargs):
        """One GroupedLinear holding copies of the weights (and biases) of `linears`."""
        first = linears[0]
        m = cls(len(linears), first.in_features, first.out_features, bias=first.bias is not None,
                dtype=kwargs.pop("dtype", first.weight.dtype),
                device=kwargs.pop("device", first.weight.device), **kwargs)
        m.load_state_dict({f"{g}.{name}": p for g, lin in enumerate(linears)
                           for name, p in lin.state_dict().items()})
        return m

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # Per-expert keys ("{prefix}{g}.weight") are stacked into the grouped ones first.
        for name in ("weight", "bias"):
            keys = [f"{prefix}{g}.{name}" for g in range(self.experts)]
            if prefix + name not in state_dict and all(k in state_dict for k in keys):
                state_dict[prefix + name] = torch.stack([state_dict.pop(k) for k in keys])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self):
        return (f"experts={self.experts}, in_features={self.in_features}, "
                f"out_features={self.out_features}, bias={self.bias is not None}, "
                f"accumulate_into_main_grad={self.accumulate_into_main_grad}")
