"""Which ops CUDA runs through TensorIterator's dynamic-casting loop: scalar loads, no vector ones.

PyTorch's CUDA elementwise kernels (aten/src/ATen/native/cuda/CUDALoops.cuh, `gpu_kernel_impl`)
load and store with 16-byte vector instructions when every tensor holds the dtype the kernel's
functor takes (`launch_vectorized_kernel`). When one does not (`needs_dynamic_casting`), the
kernel is `launch_unrolled_kernel` with `memory::LoadWithCast` / `StoreWithCast`: each element
loaded on its own and cast through `c10::fetch_and_cast`, a switch over the stored dtype (the
vectorized path for bf16/fp16-with-fp32 mixes is ROCm's only, `#ifdef USE_ROCM`). An op falls
there when its tensors mix floating dtypes: under autocast an fp32 LayerNorm output added to a
half residual, a composite RMSNorm's fp32 weight times its half input, GPT-2's tanh GELU after
`pow` went to fp32; and a half-to-float `copy_` / `_to_copy` (Copy.cu `direct_copy_kernel_cuda`:
float-to-half and float-to-bfloat16 have their own non-casting vector kernels,
`float16_copy_kernel_cuda` / `bfloat16_copy_kernel_cuda`; the reverse directions have them on
ROCm only). Read at pytorch/pytorch @ 002a5676 (CUDALoops.cuh) and @ 007aa8ae (Copy.cu).

Zero-dimensional tensors are left out of the mix: a Python number wrapped as a CPU scalar is
passed by value (`gpu_kernel_with_scalars`), not loaded.
"""
from __future__ import annotations

import torch

aten = torch.ops.aten
_COPIES = (aten._to_copy, aten.copy_, aten.copy)
_HALF = (torch.float16, torch.bfloat16)


def dynamic_casting(func, packet, args, ins: list, written: list) -> bool:
    """Whether CUDA runs this aten op through the dynamic-casting loop (module docstring)."""
    if packet in _COPIES:
        src = args[1] if packet is not aten._to_copy else args[0]
        if not isinstance(src, torch.Tensor) or not written:
            return False
        return src.dtype in _HALF and written[0].dtype == torch.float32
    if torch.Tag.pointwise not in func.tags:
        return False
    floats = {t.dtype for t in (*ins, *written) if t.is_floating_point() and t.dim() > 0}
    return len(floats) > 1
