"""Which block of a cut stack (trace/stack.py) each allocation and free of a traced step happens
in, so that derive/repeat.py can replay the caching allocator over the whole stack.

A model cut to a few alike blocks runs, block after block, the same allocations: in the forward
block 0, 1, 2, 3 in turn; in the backward 3, 2, 1, 0; in the optimizer, one list entry per
parameter, the blocks' in model order. The counter (counters.py) tags every event with `block`:

* forward: a forward pre-hook on block i sets i, its post-hook restores what was set before;
* backward: a gradient hook on block i's output sets i as autograd reaches it (its grad is
  ready, block i's nodes run next), one on block 0's input sets -1 (the embeddings' backward);
  the hidden state flows through the blocks in turn, so every node of block i runs in between;
* setup and optimizer: the block of the tensor an event belongs to (counters.py `_owners`):
  a parameter is its block's, its gradient and optimizer state are its parameter's;
* a no-grad forward (trace/generate.py): a block's output freed between blocks, as the next
  block's output replaces it, is the next block's (counters.py `no_grad_stack`).

Ops are tagged alike: the share of each op's work that is the last block's (counters.py
`OpRecord.last_block`), what one more block adds (derive/stitch.py `extend`, `whole_forward`).

Where a block is a group of `period` layers (trace/stack.py `Stack.period`), each layer is
tagged with its group's index: the events of the layers of one group are that block's, in the
order its layers run them, and what happens between two of its layers (the model's loop) is
the block's too.
"""
from __future__ import annotations

import torch
import torch.nn as nn


def _first_grad_tensor(x):
    """The first tensor in x (a tensor, tuple or model output) that requires grad."""
    if isinstance(x, torch.Tensor):
        return x if x.requires_grad else None
    items = x.values() if isinstance(x, dict) else x if isinstance(x, (list, tuple)) else ()
    for v in items:
        t = _first_grad_tensor(v)
        if t is not None:
            return t
    return None


def module_blocks(blocks: nn.ModuleList, period: int = 1) -> dict[int, int]:
    """id(module) -> index of the block it belongs to, for every module inside the stack (the
    layers of `blocks`, `period` a block)."""
    return {id(m): i // period for i, block in enumerate(blocks) for m in block.modules()}


def tag(counter, blocks: nn.ModuleList, period: int = 1) -> None:
    """Install the hooks (module docstring) on the cut stack's layers `blocks`, `period` a
    block, for the one step traced with them (the model is dropped after it, hooks and all)."""
    counter.tag_blocks = True
    counter.last_block = len(blocks) // period - 1
    before: list[int] = []
    carried = [False]          # the block's tag kept between two of its layers (`post`)

    def set_to(i):
        def hook(grad):
            counter.block = i
        return hook

    for layer, block in enumerate(blocks):
        i = layer // period

        def pre(mod, args, kwargs, i=i, first=layer == 0):
            # the tag outside the block: -1 where the layer before, of this block, left its own
            before.append(-1 if carried[0] and counter.block == i else counter.block)
            carried[0] = False
            counter.block = i
            if first and counter.phase == "forward" and not counter.recompute:
                t = _first_grad_tensor(args)
                t = _first_grad_tensor(kwargs) if t is None else t
                if t is not None:
                    t.register_hook(set_to(-1))

        def post(mod, args, kwargs, out, i=i, inner=(layer + 1) % period != 0):
            counter.block = before.pop() if before else -1
            if inner and counter.block == -1:   # between two layers of one block: still its
                counter.block, carried[0] = i, True
            if counter.phase == "forward" and not counter.recompute:
                t = _first_grad_tensor(out)
                if t is not None:
                    t.register_hook(set_to(i))

        block.register_forward_pre_hook(pre, with_kwargs=True)
        block.register_forward_hook(post, with_kwargs=True)
