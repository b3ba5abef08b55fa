"""The router-weighted expert bias of gpt-oss's layer (its down bias): groupmm.nn.MoE and the
transformers integration add it through unpermute's addend."""
import torch


class RoutedBias(torch.autograd.Function):
    """y [T, H] = sum_j w_tj b[e_tj] for w [T, k] fp32, b [E, H], ids [T, k] (each row's ids
    distinct, as the router's): the products and the sum over j in fp32, rounded once to dtype.
    The forward gathers the k bias rows (four kernels: a decode step's layer is bound by its
    launches); the backward's d b is a dense [T, E] fp32 matrix of w (no two adds meet in its
    scatter) times dy, so that neither direction adds in an unspecified order (the backward of an
    indexed gather would)."""

    @staticmethod
    def forward(ctx, w, b, ids, dtype):
        ctx.save_for_backward(w, b, ids)
        return (w.unsqueeze(-1) * b[ids]).sum(1).to(dtype)

    @staticmethod
    def backward(ctx, dy):
        w, b, ids = ctx.saved_tensors
        g = dy.float()
        dw = db = None
        if ctx.needs_input_grad[0]:
            dw = torch.bmm(b[ids].float(), g.unsqueeze(-1)).squeeze(-1)
        if ctx.needs_input_grad[1]:
            dense = torch.zeros(ids.shape[0], b.shape[0], dtype=torch.float32, device=ids.device)
            dense = dense.scatter_add(1, ids.long(), w.detach())
            db = (dense.t() @ g).to(b.dtype)
        return dw, db, None, None
