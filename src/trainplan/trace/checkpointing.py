"""Activation checkpointing applied to any model's repeated blocks.

Blocks are found generically: among module classes that contain parameterised layers and occur at
least twice, the one holding the most parameters, outermost instances only (transformer layers, ResNet bottlenecks, ViT blocks).
Each block's forward is wrapped in `torch.utils.checkpoint.checkpoint(use_reentrant=False)`:

* full: only the block's inputs are kept; everything inside is recomputed in backward
  (Korthikanti et al. 2022: 2sbh per layer remains for a transformer, the layer input);
* selective: PyTorch's selective activation checkpointing keeps the outputs of matmuls and
  attention kernels and recomputes the cheap pointwise ops, norms and dropout (the policy
  torchtitan calls "op" SAC).
"""
from __future__ import annotations

import functools
from collections import Counter

import torch
import torch.nn as nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

aten = torch.ops.aten
_SAVE = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default,
         aten.convolution.default,
         aten._scaled_dot_product_flash_attention.default,
         aten._scaled_dot_product_efficient_attention.default}


def _sac_policy(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op in _SAVE else CheckpointPolicy.PREFER_RECOMPUTE


def find_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    counts: Counter = Counter()
    params: Counter = Counter()
    for _name, m in model.named_modules():
        if isinstance(m, (nn.ModuleList, nn.Sequential, nn.ModuleDict)) or m is model:
            continue
        n = sum(p.numel() for p in m.parameters())
        composite = any(any(True for _ in c.parameters()) for c in m.children())
        if n == 0 or not composite:   # a block holds layers; a lone Linear/Embedding is not one
            continue
        counts[type(m)] += 1
        params[type(m)] += n
    repeated = [c for c, k in counts.items() if k >= 2]
    if not repeated:
        return []
    # the repeated class that covers the most parameters (outermost wins ties by being larger)
    best = max(repeated, key=lambda c: params[c])
    blocks, taken = [], []
    for name, m in model.named_modules():
        if type(m) is best and not any(name.startswith(t + ".") for t in taken):
            blocks.append((name, m))
            taken.append(name)
    return blocks


def apply_checkpointing(model: nn.Module, mode: str, recompute_context=None) -> list[str]:
    """Wrap each block's forward. `recompute_context()`, if given, is entered around the
    backward's rerun of a block (the tracer restores its kernel semantics and autocast state
    there, as torch.utils.checkpoint restores CUDA autocast)."""
    if mode == "none":
        return []
    blocks = find_blocks(model)
    for _name, block in blocks:
        orig = block.forward
        state = {"calls": 0}

        def run(*args, __orig=orig, __state=state, **kwargs):
            __state["calls"] += 1
            recompute = __state["calls"] % 2 == 0   # every second call is the backward's rerun
            if recompute and recompute_context is not None:
                with recompute_context():
                    return __orig(*args, **kwargs)
            return __orig(*args, **kwargs)

        ctx = functools.partial(create_selective_checkpoint_contexts, _sac_policy) \
            if mode == "selective" else None

        def wrapped(*args, __run=run, __ctx=ctx, **kwargs):
            if not torch.is_grad_enabled():
                return __run(*args, **kwargs)
            kw = {"use_reentrant": False, "preserve_rng_state": False}
            if __ctx is not None:
                kw["context_fn"] = __ctx
            return checkpoint(__run, *args, **kw, **kwargs)

        block.forward = wrapped
    return [n for n, _ in blocks]
