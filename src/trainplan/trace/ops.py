"""What one aten op of a traced step is to the time model: its family (matmul, attention,
other), whether it launches a kernel, its FLOPs (`op_flops`), and the record kept of it
(`OpRecord`).

FLOPs are PyTorch's own formulas (`torch.utils.flop_counter.flop_registry`), with three
exceptions: attention kernels are counted as the kernel computes them (a causal FlashAttention
or memory-efficient kernel skips the key blocks above the diagonal: of n = ceil(s/B) blocks per
row it computes n(n+1)/2 of n^2, block B = 128 for flash, 64 for the cutlass kernel); a
convolution's backward with the groups flop_counter drops (`_conv_backward_flops`); MoE grouped
GEMMs (`_grouped_mm`, which PyTorch has no formula for) as 2 x routed rows x in x out
(trace/moe.py).
"""
from __future__ import annotations

import math

import torch
from torch.utils.flop_counter import flop_registry

from . import moe
from .facts import OpRecord
from .shapes import attention_ops

aten = torch.ops.aten

MATMUL_OPS = {aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten.convolution,
              aten.convolution_backward, aten._convolution, aten.addbmm, aten.mv, aten.dot,
              aten._grouped_mm, aten._scaled_mm}     # _scaled_mm: FP8 GEMMs (trace/fp8.py)
ATTENTION_OPS = attention_ops()      # SDPA's backends' kernels, forward and backward
_FLASH = {aten._scaled_dot_product_flash_attention, aten._scaled_dot_product_flash_attention_backward}
# ops that launch no kernel (views, aliases, metadata queries, profiler markers): no bytes moved
VIEW_OPS = {
    aten.view, aten._unsafe_view, aten.t, aten.transpose, aten.permute, aten.expand,
    aten.slice, aten.select, aten.unsqueeze, aten.squeeze, aten.as_strided, aten.detach,
    aten.alias, aten.split, aten.split_with_sizes, aten.unbind, aten._reshape_alias,
    aten.view_as_real, aten.view_as_complex, aten.unfold, aten.diagonal, aten.chunk,
    aten.lift_fresh, aten.narrow, aten.expand_as, aten.view_as, aten.movedim, aten.numpy_T,
    aten._local_scalar_dense, aten.sym_size, aten.sym_stride, aten.sym_numel, aten.is_same_size,
    aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty, aten.new_empty_strided,
    torch.ops.prim.device, aten.dim, aten.size, aten.stride, aten.is_contiguous, aten.numel,
    aten.is_nonzero, torch.ops.profiler._record_function_enter_new,
    torch.ops.profiler._record_function_exit,
}


def op_family(packet) -> str:
    if packet in MATMUL_OPS:
        return "matmul"
    if packet in ATTENTION_OPS:
        return "attention"
    return "other"


def _causal_fraction(s_q: int, s_k: int, block: int) -> float:
    """Fraction of the s_q x s_k score blocks a causal tiled kernel computes: n(n+1)/2 / n^2."""
    n = max(1, math.ceil(max(s_q, s_k) / block))
    return (n * (n + 1) / 2) / (n * n)


def _group_channels(packet, args) -> int:
    """Input channels per group of a convolution (1 for depthwise), 0 for other ops.

    Depthwise convolutions have no tensor-core path; the time model needs to know them.
    """
    if packet in (aten.convolution, aten._convolution):
        x, groups = args[0], args[8]
    elif packet is aten.convolution_backward:
        x, groups = args[1], args[9]
    else:
        return 0
    return int(x.shape[1]) // max(1, int(groups))


def _conv_backward_flops(args) -> float:
    """FLOPs of `convolution_backward`: each requested gradient costs one forward convolution.

    grad_input is a transposed convolution of grad_output with the weight, grad_weight a
    convolution of the input with grad_output; both do the forward's 2 N prod(out) C_out
    (C_in / groups) prod(k) multiply-adds. torch.utils.flop_counter's formula drops `groups`
    from grad_weight (it treats the batch as channels), which overcounts a depthwise
    convolution's backward by a factor of C (about 1000x for ConvMixer).
    """
    grad_out, x, w = args[0], args[1], args[2]
    transposed, mask = bool(args[7]), args[10]
    spatial = (x if transposed else grad_out).shape[2:]
    c_out, c_in_per_group, *kernel = w.shape
    fwd = 2.0 * x.shape[0] * math.prod(spatial) * c_out * c_in_per_group * math.prod(kernel)
    return fwd * (int(bool(mask[0])) + int(bool(mask[1])))


def _is_causal(func, args, kwargs) -> bool:
    schema = func._schema
    for i, a in enumerate(schema.arguments):
        if a.name == "is_causal":
            if a.name in kwargs:
                return bool(kwargs[a.name])
            if i < len(args):
                return bool(args[i])
    return False


def op_flops(func, args, kwargs, out, unknown: set[str]) -> float:
    """The op's FLOPs (module docstring); an op whose formula does not take this overload's
    arguments is named in `unknown` and counted as 0."""
    packet = func._overloadpacket
    if packet is aten.convolution_backward:
        return _conv_backward_flops(args)
    if packet is aten._grouped_mm:  # no formula in flop_registry: MoE experts (trace/moe.py)
        return moe.grouped_mm_flops(args, kwargs)
    fn = flop_registry.get(packet)
    if fn is None:
        return 0.0
    try:
        flops = float(fn(*args, **kwargs, out_val=out))
    except Exception:  # a formula that does not accept this overload's arguments
        unknown.add(str(packet))
        return 0.0
    if packet in ATTENTION_OPS:
        causal = _is_causal(func, args, kwargs)
        if causal:
            q, k = args[0], args[1]
            if packet in (aten._scaled_dot_product_flash_attention_backward,
                          aten._scaled_dot_product_efficient_attention_backward):
                q, k = args[1], args[2]
            block = 128 if packet in _FLASH else 64
            flops *= _causal_fraction(q.shape[-2], k.shape[-2], block)
    return flops
