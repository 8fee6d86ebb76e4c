"""The tracer's FakeTensorMode, with its dispatch cache keyed in one pass.

Every op of a trace runs through FakeTensorMode's dispatch cache (torch/_subclasses/
fake_tensor.py): the op's arguments are turned into a key (`_cache_key`), and a hit builds the
output from the cached metadata instead of running the op's meta kernel. Switched off, a
chart-rvr step traces about 2.5 times slower (7.8-8.6 s against 19.8-21.1 s, this 2-core
machine, 2026-12-03), so the cache stays. Its key is what costs: `_prep_args_for_hash` walks
the arguments and, for each fake tensor, builds its `TensorMetadata` (17 fields, three sparse-
layout checks) and flattens it field by field through `dataclasses.fields`, recursing for the
shape and the strides. Profiled on chart-rvr's step (Qwen2.5-VL-3B, LoRA, micro-batch 2: 52,499
dispatches), the key took 6.2 of the 11.8 s FakeTensorMode spent (cProfile).

`_prep_args` builds the same key in one pass: a strided fake tensor without symbols in its
sizes, strides, offset or storage size (every tensor of a trace: the tracer makes no shape
environment) is flattened as `TensorMetadata._flatten_into` flattens it, value for value and
type for type (its dtype; the shape as torch.Size, its length and each size after `int`; the
strides likewise as a tuple; then device, layout, memory format, storage offset, storage bytes,
requires_grad, the quantized, conjugate, negative and inference flags, the sparse flag False
and its three fields None); a plain scalar (int, float, bool, str, None, dtype, device, layout,
memory format) is appended after its type as the original's last branch does; everything else
(another layout, symbolic sizes, SymInts, graph modules, callables) takes the original's own
branch, raising the same bypasses. Equal keys, so the same hits and the same trace:
tests/test_fake_cache.py compares the two key for key over real traces (a decoder under AMP
with checkpointing, a channels-last convnet, Qwen2.5-VL with LoRA and batched windows, an
inference forward), and the traces with it and without.

It replaces FakeTensorMode's method only where that method, `extract_tensor_metadata` and
`TensorMetadata` are the code it was written against (`_SOURCE`: a digest of their source, read
in torch 2.13.0, the version constraints.txt installs); under any other torch the cache keys its
own way, only slower. Measured (2026-12-03, 2 cores, the same process alternating both, one
step at micro-batch 2 each): chart-rvr's step 8.1-8.9 s -> 5.9-6.2 s, glf-cr's 3.8-4.8 s ->
3.1-3.3 s, Llama-3.2-1B cut to 4 blocks 0.52-0.96 s -> 0.48-0.56 s.
"""
from __future__ import annotations

import dataclasses
import hashlib
import inspect
import types

import torch
from torch._subclasses import fake_tensor as ft
from torch._subclasses.meta_utils import is_sparse_any

# sha256 of the sources `_prep_args` reproduces (`_digest`), as torch 2.13.0 has them
_SOURCE = "28846d5678ad581b"
_ORIGINAL = ft.FakeTensorMode._prep_args_for_hash
_PLAIN = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device,
                    torch.layout, torch.memory_format})
_CONTAINERS = (list, tuple, dict)
_installed: list[bool] = []


def fake_mode() -> ft.FakeTensorMode:
    """A FakeTensorMode for one trace, its cache keyed by `_prep_args` where that is exact."""
    install()
    return ft.FakeTensorMode(allow_non_fake_inputs=True)


def install() -> bool:
    """Key FakeTensorMode's cache with `_prep_args` (once per process) where torch's code is
    the one it reproduces; whether it does."""
    if not _installed:
        ok = _digest() == _SOURCE
        if ok:
            ft.FakeTensorMode._prep_args_for_hash = _prep_args
        _installed.append(ok)
    return _installed[0]


def _digest() -> str:
    """A digest of the code `_prep_args` reproduces, or "" where it cannot be read."""
    try:
        parts = [inspect.getsource(_ORIGINAL), inspect.getsource(ft.extract_tensor_metadata),
                 inspect.getsource(ft.TensorMetadata._flatten_into),
                 repr([f.name for f in dataclasses.fields(ft.TensorMetadata)])]
    except (OSError, TypeError, AttributeError):
        return ""
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _flat(t, result: list) -> bool:
    """What `extract_tensor_metadata(t)._flatten_into(result, ...)` appends, appended, for a
    strided fake tensor whose sizes, strides, offset and storage size are plain ints (module
    docstring); False, appending nothing, for any other."""
    if t.layout is not torch.strided or t._has_symbolic_sizes_strides:
        return False
    offset, nbytes = t.storage_offset(), t.untyped_storage().nbytes()
    if type(offset) is not int or type(nbytes) is not int:
        return False
    fmt = ft.suggest_memory_format(t)
    if not t.is_contiguous(memory_format=fmt):
        fmt = None
    shape, stride = t.shape, t.stride()
    append = result.append
    append(t.dtype)
    append(torch.Size)
    append(f"length_{len(shape)}")
    for s in shape:
        append(int)
        append(s)
    append(tuple)
    append(f"length_{len(stride)}")
    for s in stride:
        append(int)
        append(s)
    result += (t.device, torch.strided, fmt, offset, nbytes, t.requires_grad, t.is_quantized,
               t.is_conj(), t.is_neg(), t.is_inference(), False, None, None, None)
    return True


def _prep_args(self, result: list, args, state, id_hashed_objects: list) -> None:
    """FakeTensorMode._prep_args_for_hash (torch 2.13.0), the same key in one pass (module
    docstring); its branches in its order."""
    append = result.append
    if isinstance(args, _CONTAINERS):
        append(type(args))
        append(f"length_{len(args)}")
        if isinstance(args, dict):
            _prep_args(self, result, args.keys(), state, id_hashed_objects)
            _prep_args(self, result, args.values(), state, id_hashed_objects)
            return
    for arg in args:
        kind = type(arg)
        if kind in _PLAIN:
            append(kind)
            append(arg)
        elif isinstance(arg, ft.FakeTensor):
            if not self.is_our_fake(arg):
                raise ft._BypassDispatchCache("not our fake")
            if arg.constant is not None:
                raise ft._BypassDispatchCache("constant attribute")
            if not _flat(arg, result):
                if is_sparse_any(arg):
                    raise ft._BypassDispatchCache(f"{arg.layout} tensor")
                ft.extract_tensor_metadata(arg)._flatten_into(result, self, state)
        elif isinstance(arg, torch.Tensor):
            raise ft._BypassDispatchCache("non-fake tensor")
        elif isinstance(arg, torch.SymInt):
            state.convert_sym_int(result, arg)
        elif isinstance(arg, (torch.SymBool, torch.SymFloat)):
            raise ft._BypassDispatchCache("symbolic shape")
        elif isinstance(arg, _CONTAINERS):
            _prep_args(self, result, arg, state, id_hashed_objects)
        elif isinstance(arg, types.FunctionType):
            raise ft._BypassDispatchCache("function argument")
        else:     # graph modules and the higher-order ops' callables: the original's branches
            # handed over as an iterator: it marks lists, tuples and dicts, not iterators
            _ORIGINAL(self, result, iter((arg,)), state, id_hashed_objects)
