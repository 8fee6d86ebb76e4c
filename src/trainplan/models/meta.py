"""Models built on the meta device, without running their initialisers.

A traced model lives on the meta device: its tensors have shapes and dtypes and no values. Its
modules' constructors still run their initialisers (nn.Linear's `reset_parameters`: a
`kaiming_uniform_` of the weight and a `uniform_` of the bias; Embedding's `normal_`, a norm's
`ones_` and `zeros_`), each a few ops dispatched through `torch.device("meta")`'s function mode
to fill values a meta tensor does not hold. Every trace builds its model: without them a build
of Llama-3.1-70B takes 0.08 s where it took 0.19 s, Qwen2.5-VL-3B 0.12 s where 0.20 s (best of
three, 2 cores, 2026-12-02). `on_meta()` builds under `torch.device("meta")` with
torch.nn.init's in-place initialisers (the functions whose name ends in `_`) returning their
tensor untouched where it is a meta tensor, as transformers' `no_init_weights` does for
loading (a tensor with values is initialised as before: `trainplan measure` builds the same
models on a real device, measure/runner.py). Nothing else changes:
shapes, dtypes, parameters, buffers and weight tying (transformers ties weights in `post_init`,
which `no_init_weights` would skip, so it is not used) are the constructors' own.
tests/test_params.py checks a model built this way against one built with its initialisers.
"""
from __future__ import annotations

import contextlib
import sys


def _skipped(init):
    """`init` for a tensor with values; a meta tensor returned untouched."""
    def skip(tensor, *args, **kwargs):
        return tensor if tensor.is_meta else init(tensor, *args, **kwargs)
    return skip


@contextlib.contextmanager
def on_meta():
    """Build under `torch.device("meta")` with torch's initialisers skipped (module docstring):
    torch.nn.init's, and the same functions where a torch.nn module imported them by name
    (MultiheadAttention's `xavier_uniform_`)."""
    import torch
    init = torch.nn.init
    # by id: an initialiser held here cannot share its id with another live object
    skips = {id(f): _skipped(f) for n, f in vars(init).items()
             if n.endswith("_") and not n.startswith("_") and callable(f)}
    patched = []
    for name in [m for m in list(sys.modules) if m == "torch.nn.init" or
                 m.startswith("torch.nn.modules.")]:
        module = sys.modules[name]
        for attr, value in list(vars(module).items()):
            if id(value) in skips:
                patched.append((module, attr, value))
                setattr(module, attr, skips[id(value)])
    try:
        with torch.device("meta"):
            yield
    finally:
        for module, attr, value in patched:
            setattr(module, attr, value)
