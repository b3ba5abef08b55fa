"""What groupmm.nn.MoE's backward makes again instead of keeping (recompute=True): a callable that
reruns an op on the forward's tensors, used by the block (moe.py) and its expert-parallel form
(moe_ep.py)."""

import torch


def again(op, *args, part=None):
    """A callable that runs op(*args) again (outside autograd) and returns its output (or output
    `part`), raising if a tensor argument was written in place since: the recomputed value would
    not be the forward's."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    versions = [t._version for t in tensors]
    detached = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]

    def run():
        if any(t._version != v for t, v in zip(tensors, versions)):
            raise RuntimeError("groupmm.nn.MoE(recompute=True): an input of the block (x or the "
                               "router's outputs) was modified in place between forward and "
                               "backward; backward recomputes from it (pass recompute=False to "
                               "keep the activations instead)")
        out = op(*detached)
        return out if part is None else out[part]
    return run
