"""CUDA's memory-layout rules, for the tracer: the copies a CUDA kernel makes of an operand whose
layout it does not take, which the CPU fake device does not make.

The tracer runs on a fake CPU device, and PyTorch decides some layouts by device:

* **Group norm computes NCHW on CUDA.** `native_group_norm` takes the input's own layout only on
  the CPU (and PrivateUse1); on CUDA and ROCm it makes the input contiguous (a transposing copy
  of a channels-last input), writes its result contiguous, and its backward does the same to the
  gradient and to the saved input (aten/src/ATen/native/group_norm.cpp: `memory_format` is
  `X.suggest_memory_format()` only where `X.device().is_cpu() || X.device().is_privateuseone()`,
  else `Contiguous`, then `X.contiguous(memory_format)`; `dY.contiguous(memory_format)` in
  `native_group_norm_backward`; tools/autograd/derivatives.yaml makes the incoming gradient
  contiguous on non-CPU devices before the call). Traced on the CPU, a channels-last model keeps
  channels-last through its group norms and none of those copies appear. `group_norm` below runs
  the CUDA kernel's contract: a copy of a non-contiguous input (recorded: it is a kernel on the
  GPU too, inside the op), the kernel on it, a contiguous result; its backward copies the
  gradient and the saved input where they are not contiguous. Its node keeps what CUDA's keeps
  (the input as given, the weight, mean and 1/std); the copies are temporaries, as CUDA's are.
* **A convolution converts an activation not in its layout, inside the kernel.** cuDNN runs
  channels-last where the input or the weight suggests it (ConvUtils.h
  `cudnn_conv_suggest_memory_format`: `suggest_memory_format()` of either is ChannelsLast), and
  ATen passes `input.contiguous(backend_memory_format)` to it (Convolution.cpp `_convolution`;
  `convolution_backward` converts the saved input and the incoming gradient the same way). So a
  channels-last model's convolution after a group norm reads an NCHW activation and transposes
  it first, forward and backward; so does an NCHW convolution over a channel slice (MixNet's
  mixed kernels, Res2Net), which is not contiguous. The tracer records a convolution as one op:
  `convolution` gives its result in cuDNN's layout and the bytes those transposes read and
  write, added to the op's (counters.py).

`KernelSemantics.cuda_layouts` turns both on (CUDA and ROCm targets, and XLA's, traced alike:
predict/target.py).
"""
from __future__ import annotations

import math

import torch
from torch._prims_common import suggest_memory_format

aten = torch.ops.aten

_CONV = (aten.convolution, aten.convolution_backward)


class _GroupNorm(torch.autograd.Function):
    """`F.group_norm` as CUDA's `native_group_norm` runs it on a non-contiguous input."""

    @staticmethod
    def forward(ctx, x, num_groups, weight, bias, eps):
        n, c = x.shape[0], x.shape[1]
        hw = math.prod(x.shape[2:])
        y, mean, rstd = aten.native_group_norm(x.contiguous(), weight, bias, n, c, hw,
                                               num_groups, eps)
        ctx.save_for_backward(x, mean, rstd, weight)
        ctx.dims = (n, c, hw, num_groups)
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        x, mean, rstd, weight = ctx.saved_tensors
        n, c, hw, groups = ctx.dims
        mask = [ctx.needs_input_grad[0], weight is not None and ctx.needs_input_grad[2],
                ctx.has_bias and ctx.needs_input_grad[3]]
        dx, dw, db = aten.native_group_norm_backward(dy.contiguous(), x.contiguous(), mean, rstd,
                                                     weight, n, c, hw, groups, mask)
        return (dx if mask[0] else None), None, (dw if mask[1] else None), \
            (db if mask[2] else None), None


def takes_copy(x) -> bool:
    """Whether CUDA's group norm copies this input: a non-contiguous tensor (channels-last)."""
    return isinstance(x, torch.Tensor) and x.dim() >= 2 and not x.is_contiguous()


def group_norm(x: torch.Tensor, num_groups: int, weight=None, bias=None,
               eps: float = 1e-5) -> torch.Tensor:
    """`F.group_norm` with CUDA's layout contract (module docstring), for a `takes_copy` input."""
    return _GroupNorm.apply(x, int(num_groups), weight, bias, float(eps))


def _conv_operands(packet, args):
    """(layout cuDNN runs, the activation operands it converts) of a convolution op, or None."""
    if packet not in _CONV or len(args) < 3:
        return None
    if packet is aten.convolution:
        x, w, acts = args[0], args[1], (args[0],)
    else:
        x, w, acts = args[1], args[2], (args[0], args[1])
    if not all(isinstance(t, torch.Tensor) for t in (x, w) + acts) or w.dim() not in (4, 5):
        return None
    last = torch.channels_last if w.dim() == 4 else torch.channels_last_3d
    fmt = last if last in (suggest_memory_format(x), suggest_memory_format(w)) \
        else torch.contiguous_format
    return fmt, acts


def _in(t, fmt):
    return t if t is None or t.is_contiguous(memory_format=fmt) else t.contiguous(memory_format=fmt)


def convolution(packet, args, out) -> tuple:
    """(the op's result in the layout cuDNN writes, bytes its own layout conversions read and
    write); (`out`, 0) for an op that is not a convolution.

    The layout cuDNN writes is the one it runs: the CPU device's rule follows the input alone
    (torch/_meta_registrations.py `pick_memory_format`: the weight's layout counts only on CUDA),
    so an NCHW activation meeting a channels-last weight would stay NCHW on the CPU and turn
    channels-last on the GPU. Backward, the input and weight gradients are written in it; a
    weight gradient in the weight's layout is taken as the `.grad` without a copy
    (AccumulateGrad's layout contract). Each activation operand (the input; in backward also
    the incoming gradient) not in that layout is copied into it: one read and one write."""
    got = _conv_operands(packet, args)
    if got is None:
        return out, 0
    fmt, acts = got
    converted = sum(2 * t.numel() * t.element_size() for t in acts
                    if not t.is_contiguous(memory_format=fmt))
    if packet is aten.convolution:
        return _in(out, fmt), converted
    return (_in(out[0], fmt), _in(out[1], fmt)) + tuple(out[2:]), converted
