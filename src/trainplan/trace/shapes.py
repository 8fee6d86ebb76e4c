"""What each kernel the traced step launches computes, by shape: one registry, op -> shape.

The step-time model (predict/kernels.py) tiles each matrix multiply over the GPU's SMs, so it
needs the multiply's dimensions, not only its FLOPs. Every shape is a flat tuple of ints, so
that it is hashable (the op table de-duplicates by it) and affine in the micro-batch like every
other size of the trace (derive/interpolate.py reads a shape at another micro-batch off two):

* GEMM-like ops (mm, addmm, bmm, baddbmm, linear's kernels, convolutions as implicit GEMMs,
  MoE grouped GEMMs): one or more GEMMs of five ints each, (batch, M, N, K, layout). A GEMM
  computes batch x (M x K) @ (K x N). `layout` says how the operands lie in memory: for a
  matmul whether A and B are transposed (NN 0, NT 1, TN 2, TT 3: cuBLAS's row-major view; the
  autograd backward of a linear layer is NT and TN), for a convolution its activation layout
  (NHWC 4, NCHW 5: cuDNN's tensor-core kernels are NHWC). A convolution's forward is one GEMM
  (M = N Ho Wo output pixels, N = C_out / g, K = C_in / g x R x S, batched over the g groups);
  its backward the data gradient (M = N Hi Wi, N = C_in / g, K = C_out / g x R x S x
  Ho Wo / (Hi Wi): a strided convolution's input pixel gathers only the taps that reach it) and
  the weight
  gradient (M = C_out / g, N = C_in / g x R x S, K = N Ho Wo), as its output mask asks
  (cuDNN's implicit-GEMM formulation: Chetlur et al. 2014, arXiv:1410.0759, section 3). Each
  GEMM does the forward's FLOPs, as trace/counters.py counts them.
* attention kernels (SDPA's flash, memory-efficient and cuDNN backends, forward and backward):
  (B, H_q, H_kv, S_q, S_k, D, D_v, causal, bias), bias 1 where an additive mask or bias is read.
* multi-tensor (`_foreach_*`) optimizer kernels: (tensors, lists): the length of the list and
  how many lists the op reads and writes, which set how many kernels launch (multi_tensor_apply
  fills a launch with at most 110 tensors for one list, 64 for two, ..., or 320 chunks:
  ATen/native/cuda/MultiTensorApply.cuh) and the host's work per call. In a trace cut to some
  of a model's blocks a third entry counts the list's tensors of the last block traced
  (trace/counters.py), what one block more adds to the list (predict/depth.py `extend`).
* every other op: () -- elementwise kernels, norms and reductions are timed by their bytes.
"""
from __future__ import annotations

import math

import functools

NN, NT, TN, TT, NHWC, NCHW = range(6)     # GEMM layout codes (see the module docstring)
GEMM_INTS = 5                              # ints per GEMM in a shape
ATTN_INTS = 9                              # (B, Hq, Hkv, Sq, Sk, D, Dv, causal, bias)


def _transposed(t) -> bool:
    """True when a 2-D (or batched) operand is stored column-major: its last dim is not the
    contiguous one (a `.t()` view, as autograd hands a linear layer's weight to mm)."""
    return t.dim() >= 2 and t.stride(-1) != 1 and t.stride(-2) == 1


def _layout(a, b) -> int:
    return 2 * int(_transposed(a)) + int(_transposed(b))


def _mm(a, b) -> tuple:
    return (1, a.shape[-2], b.shape[-1], a.shape[-1], _layout(a, b))


def _bmm(a, b) -> tuple:
    return (a.shape[0], a.shape[-2], b.shape[-1], a.shape[-1], _layout(a, b))


def _conv_dims(x, w, stride, padding, dilation, transposed, output_padding, groups):
    """(N, C_in, spatial in, C_out, spatial out, kernel) of a convolution, forward direction
    (a transposed convolution's GEMMs are its adjoint's: computed the same way, roles swapped)."""
    n, c_in, spatial = x.shape[0], x.shape[1], list(x.shape[2:])
    kernel = list(w.shape[2:])
    if transposed:
        c_out = w.shape[1] * groups
        out = [(s - 1) * st - 2 * p + d * (k - 1) + op + 1 for s, st, p, d, k, op in
               zip(spatial, stride, padding, dilation, kernel, output_padding)]
    else:
        c_out = w.shape[0]
        out = [(s + 2 * p - d * (k - 1) - 1) // st + 1 for s, st, p, d, k in
               zip(spatial, stride, padding, dilation, kernel)]
    return n, c_in, spatial, c_out, out, kernel


def _conv_layout(x) -> int:
    import torch
    return NHWC if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) else NCHW


def conv_gemms(x, w, stride, padding, dilation, transposed, output_padding, groups,
               mask=(False, False, False), forward=True) -> tuple:
    """The implicit GEMMs of a convolution (forward) or of its backward (`mask`: grad_input,
    grad_weight, grad_bias), as (batch=groups, M, N, K, layout) each."""
    n, c_in, sp_in, c_out, sp_out, kernel = _conv_dims(x, w, stride, padding, dilation,
                                                      transposed, output_padding, groups)
    g = max(1, int(groups))
    if transposed:        # the adjoint of a convolution from c_out to c_in
        c_in, c_out, sp_in, sp_out = c_out, c_in, sp_out, sp_in
    rs, lay = math.prod(kernel), _conv_layout(x)
    pix_in, pix_out = n * math.prod(sp_in), n * math.prod(sp_out)
    fwd = (g, pix_out, c_out // g, c_in // g * rs, lay)
    if forward:
        return fwd
    out = ()
    if mask[0]:     # each input pixel gathers the taps that reach it, R S x pix_out / pix_in
        k = max(1, round(c_out // g * rs * pix_out / max(pix_in, 1)))     # of them on average
        out += (g, pix_in, c_in // g, k, lay)
    if mask[1]:
        out += (g, c_out // g, c_in // g * rs, pix_out, lay)
    return out


def _conv(args) -> tuple:
    x, w = args[0], args[1]
    return conv_gemms(x, w, args[3], args[4], args[5], args[6], args[7], args[8])


def _conv_backward(args) -> tuple:
    grad_out, x, w = args[0], args[1], args[2]
    return conv_gemms(x, w, args[4], args[5], args[6], args[7], args[8], args[9],
                      mask=args[10], forward=False)


def _grouped(args) -> tuple:
    """MoE `_grouped_mm(a [rows, K], b [G, K, N], offs)`: G GEMMs over rows / G routed rows each
    (uniform routing, trace/moe.py)."""
    a, b = args[0], args[1]
    if b.dim() == 3 and a.dim() == 2:
        g = b.shape[0]
        return (g, max(1, a.shape[0] // g), b.shape[-1], a.shape[-1], _layout(a, b[0]))
    if a.dim() == 3 and b.dim() == 3:
        return _bmm(a, b)
    return _mm(a, b)


def _named(func, args, kwargs, name: str, default=None):
    """The argument `name` of an aten op, by its schema (positional or keyword)."""
    if name in kwargs:
        return kwargs[name]
    for i, a in enumerate(func._schema.arguments):
        if a.name == name:
            return args[i] if i < len(args) else default
    return default


def _attention(func, args, kwargs) -> tuple:
    """Every SDPA kernel, forward and backward, names its operands query/key/value (B, H, S, D)."""
    q, k, v = (_named(func, args, kwargs, n) for n in ("query", "key", "value"))
    bias = _named(func, args, kwargs, "attn_bias", _named(func, args, kwargs, "attn_mask"))
    causal = bool(_named(func, args, kwargs, "is_causal", False))
    import torch
    return (q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3], v.shape[3],
            int(causal), int(isinstance(bias, torch.Tensor)))


def _foreach(args) -> tuple:
    """(tensors in the first list, lists read or written): multi_tensor_apply's `depth`."""
    first = args[0] if args else None
    if not isinstance(first, (list, tuple)):
        return ()
    return (len(first), sum(isinstance(a, (list, tuple)) and len(a) == len(first) for a in args))


@functools.cache
def _tables() -> tuple[dict, frozenset]:
    """The aten ops read as GEMMs (each with how its shape is read) and the SDPA kernels,
    forward and backward; made on first use, so a plan answered from stored traces never
    imports torch (trace/semantics.py)."""
    import torch
    aten = torch.ops.aten
    gemm = {
        aten.mm: lambda a: _mm(a[0], a[1]),
        aten.addmm: lambda a: _mm(a[1], a[2]),
        aten.bmm: lambda a: _bmm(a[0], a[1]),
        aten.baddbmm: lambda a: _bmm(a[1], a[2]),
        aten.addbmm: lambda a: (1, a[1].shape[-2], a[2].shape[-1], a[1].shape[0] * a[1].shape[-1],
                                _layout(a[1][0], a[2][0])),
        aten.mv: lambda a: (1, a[0].shape[0], 1, a[0].shape[1], _layout(a[0], a[0])),
        aten.dot: lambda a: (1, 1, 1, a[0].shape[0], NN),
        aten.convolution: _conv,
        aten._convolution: _conv,
        aten.convolution_backward: _conv_backward,
        aten._grouped_mm: _grouped,
        aten._scaled_mm: lambda a: _mm(a[0], a[1]),          # FP8 GEMMs (trace/fp8.py)
    }
    attention = frozenset({
        aten._scaled_dot_product_flash_attention, aten._scaled_dot_product_flash_attention_backward,
        aten._scaled_dot_product_efficient_attention,
        aten._scaled_dot_product_efficient_attention_backward,
        aten._scaled_dot_product_cudnn_attention, aten._scaled_dot_product_cudnn_attention_backward,
        aten._scaled_dot_product_flash_attention_for_cpu,
        aten._scaled_dot_product_flash_attention_for_cpu_backward,
    })
    return gemm, attention


def attention_ops() -> frozenset:
    """SDPA's backends' kernels, forward and backward."""
    return _tables()[1]


def kernel_shape(func, args, kwargs) -> tuple:
    """The shape `func`'s kernel computes over (see the module docstring), () where the time
    model reads none. Never raises: an overload whose arguments do not fit gives ()."""
    packet = func._overloadpacket
    gemm, attention = _tables()
    try:
        if packet in gemm:
            return tuple(int(x) for x in gemm[packet](args))
        if packet in attention:
            return _attention(func, args, kwargs)
        if packet.__name__.startswith("_foreach_"):
            return _foreach(args)
    except (IndexError, TypeError, AttributeError, ValueError, RuntimeError):
        return ()
    return ()


def gemms(shape: tuple) -> list[tuple[int, int, int, int, int]]:
    """A GEMM-like op's shape as its GEMMs."""
    return [tuple(shape[i:i + GEMM_INTS]) for i in range(0, len(shape) - GEMM_INTS + 1,
                                                          GEMM_INTS)]


def on_line(s0: tuple, s1: tuple, f: float) -> tuple:
    """The shape at s0 + f (s1 - s0), each dimension rounded: a kernel's shape at another
    micro-batch or depth read off two traces (derive/interpolate.py, derive/stitch.py). Every
    dimension is affine in the batch (a GEMM's M is batch x tokens, an attention call's B the
    batch) and a multi-tensor op's list in the depth; the others are equal in both."""
    if s0 == s1 or len(s0) != len(s1):
        return s1
    return tuple(max(0, int(round(x0 + f * (x1 - x0)))) for x0, x1 in zip(s0, s1))
