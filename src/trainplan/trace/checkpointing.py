"""Activation checkpointing applied to any model's repeated blocks.

Blocks are found generically: among module classes that contain parameterised layers and occur at
least twice, the one holding the most parameters, outermost instances only (transformer layers, ResNet bottlenecks, ViT blocks).
Each block's forward is wrapped in `torch.utils.checkpoint.checkpoint`, non-reentrant unless the
job says otherwise (Job.reentrant_checkpointing):

* full: only the block's inputs are kept; everything inside is recomputed in backward
  (Korthikanti et al. 2022: 2sbh per layer remains for a transformer, the layer input);
* every-K: every K-th block as under full, the others not checkpointed: torchtitan's "selective
  layer" mode (`selective_ac_option: K`, `_apply_ac_to_transformer_block`: a block is wrapped
  when its running count is divisible by K, so blocks K-1, 2K-1, ... counting from 0), torchtune's
  `ac_option` likewise; fms-fsdp's `selective_checkpointing: 1/K` picks every K-th block too;
* selective: PyTorch's selective activation checkpointing with torchtitan's "op" policy
  (pytorch/torchtitan `_apply_ac_to_transformer_block`, its `_save_list` and `_custom_policy`,
  as at the 2024-12 benchmark's commit 9dec370 and since): it keeps the outputs of the attention kernels and of every
  other `aten.mm` (the count runs per block, separately for the forward and the backward's
  rerun: "Saves output of all compute ops, except every second mm") and recomputes the rest:
  the other matmuls, pointwise ops, norms and dropout. FP8 GEMMs (`aten._scaled_mm`) count
  as mm, as torchtitan's save list has them.

Reentrant checkpointing runs the block's forward without autograd, so nothing an autograd
Function stores on its ctx outlives the forward (bitsandbytes' MatMul4Bit keeps its input there).
It passes keyword arguments by closure, as transformers' GradientCheckpointingLayer does, and,
like peft's `enable_input_require_grads`, makes the first block's input require a gradient:
without that no block output would, and the adapters inside would get no gradient.
"""
from __future__ import annotations

import functools
import sys

import torch
import torch.nn as nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from ..spec import every_k

aten = torch.ops.aten
# torchtitan's `_save_list` (its reduce_scatter and max entries concern tensor parallelism and
# float8 amax; a trace has neither): mm outputs every other time (FP8 GEMMs, `_scaled_mm`,
# as mm), the attention kernels always
_MM = {aten.mm.default, aten._scaled_mm.default}
_SAVE = {*_MM,
         aten._scaled_dot_product_flash_attention.default,
         aten._scaled_dot_product_efficient_attention.default}


def _sac_policy(counts: dict):
    """torchtitan's op-level policy for one block: `counts` holds its mm count per mode."""
    def policy(ctx, op, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if op in _MM:
            counts[mode] = counts.get(mode, 0) + 1
        save = op in _SAVE and not (op in _MM and counts[mode] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE
    return policy


def _outermost(model: nn.Module, pick) -> list[tuple[str, nn.Module]]:
    blocks, taken = [], []
    for name, m in model.named_modules():
        if pick(m) and not any(name.startswith(t + ".") for t in taken):
            blocks.append((name, m))
            taken.append(name)
    return blocks


def _has_params(m: nn.Module) -> bool:
    return any(True for _ in m.parameters())


def _holds_layers(m: nn.Module) -> bool:
    """A block holds a sub-block, or at least three parameterised layers. Not a block: a lone
    Linear, a conv + norm pair (timm's ConvNormAct), a two-Linear MLP or attention projection."""
    kids = [c for c in m.children() if _has_params(c)]
    return len(kids) >= 3 or any(any(_has_params(g) for g in c.children()) for c in kids)


def find_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules a framework checkpoints one by one.

    1. A transformers model: its `GradientCheckpointingLayer`s (what `gradient_checkpointing_enable`
       wraps: the decoder/encoder layers of every tower).
    2. Otherwise, among module classes that hold layers (_holds_layers) and occur at least twice
       (our LoRA/QLoRA wrappers excluded: they are adapters, not blocks), those whose outermost
       instances cover at least half the parameters the best-covering class covers; of these the
       one with the most instances, then the most parameters. This takes timm's and torchvision's
       blocks (ConvNeXt, Swin and RegNet blocks, not their four stages; ResNet bottlenecks; ViT
       blocks, not their MLPs, which are as many but smaller), as timm's set_grad_checkpointing does.
    """
    hf_layers = getattr(sys.modules.get("transformers.modeling_layers"),
                        "GradientCheckpointingLayer", None)
    if hf_layers is not None:
        blocks = _outermost(model, lambda m: isinstance(m, hf_layers))
        if len(blocks) >= 2:
            return blocks
    from ..models.lora import LoraEmbedding, LoraLinear, QuantLinear, QuantizedWeight
    adapters = (LoraLinear, LoraEmbedding, QuantLinear, QuantizedWeight)
    classes: set[type] = set()
    for m in model.modules():
        if isinstance(m, (nn.ModuleList, nn.Sequential, nn.ModuleDict) + adapters) or m is model:
            continue
        if _holds_layers(m):
            classes.add(type(m))
    stats = {}
    for c in classes:
        found = _outermost(model, lambda m, c=c: type(m) is c)
        if len(found) >= 2:
            stats[c] = (len(found), sum(p.numel() for _, m in found for p in m.parameters()), found)
    if not stats:
        return []
    most = max(n for _, n, _ in stats.values())
    best = max((v for v in stats.values() if v[1] >= most / 2), key=lambda v: (v[0], v[1]))
    return best[2]


def apply_checkpointing(model: nn.Module, mode: str, recompute_context=None,
                        reentrant: bool = False) -> list[str]:
    """Wrap each block's forward. `recompute_context()`, if given, is entered around the
    backward's rerun of a block (the tracer restores its kernel semantics and autocast state
    there, as torch.utils.checkpoint restores CUDA autocast)."""
    if mode == "none":
        return []
    k = every_k(mode) or 1
    blocks = [b for i, b in enumerate(find_blocks(model)) if (i + 1) % k == 0]
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

        # a fresh count for every forward (and its rerun): torchtitan keeps one per block across
        # steps, so with an odd number of mms a block saves (n+1)/2 and (n-1)/2 in turn; the
        # trace takes the larger, the step's peak, and every block alike
        ctx = (lambda: create_selective_checkpoint_contexts(_sac_policy({}))) \
            if mode == "selective" else None

        def wrapped(*args, __run=run, __ctx=ctx, **kwargs):
            if not torch.is_grad_enabled():
                return __run(*args, **kwargs)
            if reentrant:
                _input_requires_grad(args)
                return checkpoint(functools.partial(__run, **kwargs), *args, use_reentrant=True,
                                  preserve_rng_state=False)
            kw = {"use_reentrant": False, "preserve_rng_state": False}
            if __ctx is not None:
                kw["context_fn"] = __ctx
            return checkpoint(__run, *args, **kw, **kwargs)

        block.forward = wrapped
    return [n for n, _ in blocks]


def _input_requires_grad(args) -> None:
    """peft's enable_input_require_grads, at the block: when no floating input requires a
    gradient (the frozen embedding's output), the first is made to."""
    tensors = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
    if tensors and not any(t.requires_grad for t in tensors):
        tensors[0].requires_grad_(True)
