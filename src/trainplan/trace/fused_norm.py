"""CUDA's fused RMSNorm, for the tracer: `F.rms_norm` as one kernel each way.

Since PyTorch 2.9 (pytorch/pytorch#153666) `rms_norm` on a CUDA tensor runs `_fused_rms_norm`
(aten/src/ATen/native/layer_norm.cpp `rms_norm_symint`): one kernel that writes the normalised
output and each row's 1/rms (`rstd`, float32 for 16- and 32-bit inputs), and whose autograd node
keeps the input, `rstd` and the weight (tools/autograd/derivatives.yaml `_fused_rms_norm`); its
backward is one kernel too (`_fused_rms_norm_backward`). A CPU build has no such kernel: there
`_fused_rms_norm` is composed of pow, mean, add, rsqrt and two multiplies, whose autograd nodes
keep the normalised input as well (one more activation-sized tensor a norm, float32 in a float32
residual stream) and launch a dozen kernels each way. The fused path is taken unless the input is
channels-last or complex or its dtype differs from the weight's (then the composite runs on CUDA
too).

The two kernels here are custom ops (as models/fused_loss.py's), so the tracer records each as
one kernel moving its tensors' bytes, and the memory tracker sees what the CUDA node keeps. They
compute the real result on real tensors (tests/test_cuda_kernels.py).
"""
from __future__ import annotations

import torch
from torch import Tensor


def _dims(x: Tensor, normalized_shape: list[int]) -> list[int]:
    return list(range(x.dim() - len(normalized_shape), x.dim()))


def _eps(x: Tensor, eps: float | None) -> float:
    """`rms_norm`'s default: the epsilon of the type it computes in (layer_norm.cpp)."""
    return eps if eps is not None else torch.finfo(_opmath(x)).eps


def _opmath(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


@torch.library.custom_op("trainplan::fused_rms_norm", mutates_args=())
def fused_rms_norm(x: Tensor, normalized_shape: list[int], weight: Tensor | None,
                   eps: float | None) -> tuple[Tensor, Tensor]:
    """(x / rms(x) x weight in x's dtype, 1/rms per row in float32), as `_fused_rms_norm`."""
    xf = x.to(_opmath(x))
    rstd = torch.rsqrt(xf.pow(2).mean(_dims(x, normalized_shape), keepdim=True) + _eps(x, eps))
    out = xf * rstd
    if weight is not None:
        out = out * weight
    return out.to(x.dtype), rstd


@fused_rms_norm.register_fake
def _(x, normalized_shape, weight, eps):
    stat = list(x.shape[:x.dim() - len(normalized_shape)]) + [1] * len(normalized_shape)
    return torch.empty_like(x, memory_format=torch.contiguous_format), \
        x.new_empty(stat, dtype=_opmath(x))


@torch.library.custom_op("trainplan::fused_rms_norm_backward", mutates_args=())
def fused_rms_norm_backward(grad: Tensor, x: Tensor, normalized_shape: list[int], rstd: Tensor,
                            weight: Tensor | None) -> tuple[Tensor, Tensor]:
    """(gradient of x, gradient of the weight: empty without one)."""
    dims = _dims(x, normalized_shape)
    xhat = x.to(rstd.dtype) * rstd
    g = grad.to(rstd.dtype)
    wg = g * weight if weight is not None else g
    c = (xhat * wg).mean(dims, keepdim=True)
    dx = ((wg - xhat * c) * rstd).to(x.dtype)
    if weight is None:
        return dx, x.new_empty(0)
    lead = list(range(x.dim() - len(normalized_shape)))
    return dx, (g * xhat).sum(lead).to(weight.dtype)


@fused_rms_norm_backward.register_fake
def _(grad, x, normalized_shape, rstd, weight):
    return torch.empty_like(x, memory_format=torch.contiguous_format), \
        (torch.empty_like(weight) if weight is not None else x.new_empty(0))


def _setup(ctx, inputs, output) -> None:
    x, normalized_shape, weight, _eps_ = inputs
    ctx.save_for_backward(x, output[1], weight)
    ctx.normalized_shape = normalized_shape


def _backward(ctx, grad_out: Tensor, _grad_rstd: Tensor):
    x, rstd, weight = ctx.saved_tensors
    dx, dw = fused_rms_norm_backward(grad_out, x, ctx.normalized_shape, rstd, weight)
    return dx, None, (dw if weight is not None else None), None


fused_rms_norm.register_autograd(_backward, setup_context=_setup)


def takes_fused(x: Tensor, weight: Tensor | None) -> bool:
    """Whether CUDA's `rms_norm` would run the fused kernel on these (`rms_norm_symint`)."""
    if x.is_complex():
        return False
    if weight is not None and weight.dtype != x.dtype:
        return False
    last = {4: torch.channels_last, 5: torch.channels_last_3d}.get(x.dim())
    return last is None or x.is_contiguous() or not x.is_contiguous(memory_format=last)


def rms_norm(x: Tensor, normalized_shape, weight: Tensor | None = None,
             eps: float | None = None) -> Tensor:
    """`F.rms_norm` as CUDA runs it where it takes the fused kernel."""
    return fused_rms_norm(x, [int(n) for n in normalized_shape], weight, eps)[0]
