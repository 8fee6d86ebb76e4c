"""A model's repeated stack of blocks, and the same model with only its first few blocks.

A transformer is embeddings, then L copies of one block (same class, same parameter shapes, same
behaviour), then a head. Every per-step quantity of such a model (each op's FLOPs and bytes, each
phase's live memory, the parameter, gradient and optimizer-state bytes) is the head-and-embedding
part plus L times one block's, so a trace of the model cut to HIGH = 4 blocks, with what its last
block does read off it (or a second trace cut to LOW = 3), gives the whole model's step
(derive/stitch.py). A trace costs time per op, so tracing 4 blocks of Llama-3.1-70B instead of
80 is what makes planning a 70B job over every platform take seconds.

The stack is the `nn.ModuleList` holding the most parameters among those whose children are all
alike: one class, the same parameter names, shapes, dtypes and trainability. A config that gives
its layers different behaviour with equal shapes in a repeating pattern (`layer_types`: Gemma-2
alternates sliding-window and full attention, period 2; GPT-OSS likewise) is cut in whole
periods: a "block" below is then a group of `period` consecutive layers, the unit that repeats
(`Stack.period`; trace/blocks.py tags each layer with its group). A pattern that does not repeat
a whole number of times over the stack (Gemma-3-1B: 26 layers in periods of 6; Qwen-2 with
sliding windows below `max_window_layers` only) is not cut: `layer_period`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:    # torch where a model is cut; a stored trace's Stack unpickles without it
    import torch.nn as nn

LOW, HIGH = 3, 4       # blocks kept in the two cut traces (derive/stitch.py)
# Cut only stacks this deep. One 4-block trace gives the whole step where one block more is read
# off its last (derive/stitch.py `extend`), and costs what 3-5 whole blocks do (warm, 2 cores,
# 2026-11-27, scripts/cut_cost.py, two runs: a micro-batch-2 step of GraphMER-SE, 12 blocks,
# 0.56-0.77 s cut against 1.56-1.99 s whole; GPT-2, 12 blocks, 0.47-0.49 against 1.05-1.29 s;
# Llama-3.2-1B, 16 blocks, 0.49-0.78 against 1.97-2.00 s), so a stack of 8 already pays. Where
# the cut step is not read exactly (below), the model's first cut traces are wasted and its later
# ones are made whole (derive/traces.py `_traced_whole`): BERT-base, 12 blocks, pays one 4-block
# trace per plan.
# The cut traces give every op and byte count of the full step, and the caching allocator's replay
# over the whole stack where the cut trace's allocations repeat block by block
# (derive/repeat.py `whole_events`: the same replay as the full trace's). Where they do not (BERT:
# an allocation between blocks), only the 4-block replay's fragmentation is known, within -2% and
# +4% of the full replay's required memory: enough to flip a verdict within that band
# (Qwen2.5-VL-3B, ZeRO-3 LoRA on 2 x T4: 14.88 GiB cut against 15.10 GiB whole, on a 15.00 GiB
# T4). Below EXACT_BLOCKS such a model is traced whole (derive/traces.py); from EXACT_BLOCKS
# (13B and up: 40-80 blocks, whose full traces made a plan take minutes) the band is accepted.
MIN_BLOCKS = 8
EXACT_BLOCKS = 40


@dataclass(frozen=True)
class Stack:
    """Where the repeated blocks sit, how many the model has and how many were traced. A block is
    `period` consecutive layers of the ModuleList (1 but for a repeating pattern of layer
    kinds: module docstring)."""

    path: str          # the ModuleList's qualified name, e.g. "model.layers"
    blocks: int        # in the model
    traced: int        # in the traced (cut) model
    period: int = 1    # layers a block

    def describe(self, traced: str | None = None) -> str:
        """'4 of its 16 alike blocks (model.layers)', or with layers grouped in periods '8 of
        its 42 layers, 4 of its 21 alike blocks of 2 (model.layers)'; `traced`: what was traced,
        in blocks, instead ('3 and with 4')."""
        alike = "alike blocks" if self.period == 1 else f"alike blocks of {self.period}"
        layers = "" if self.period == 1 or traced is not None else \
            f"{self.traced * self.period} of its {self.blocks * self.period} layers, "
        return f"{layers}{traced or self.traced} of its {self.blocks} {alike} ({self.path})"


def _signature(block: nn.Module) -> tuple:
    return (type(block), tuple((n, tuple(p.shape), p.dtype, p.requires_grad)
                               for n, p in block.named_parameters()),
            tuple((n, tuple(b.shape), b.dtype) for n, b in block.named_buffers()))


def layer_period(config, layers: int) -> int | None:
    """How many consecutive layers of a `layers`-deep stack repeat as one block (module
    docstring): 1 where the config gives every layer the same behaviour; the shortest period of
    its `layer_types` where they repeat a whole number of times over the stack; None where they
    do not, or the config says otherwise that layers differ (Qwen-2's sliding windows below
    `max_window_layers`)."""
    period = 1
    for cfg in {id(config): config, id(_text(config)): _text(config)}.values():
        if getattr(cfg, "use_sliding_window", False) and getattr(cfg, "max_window_layers", None):
            return None
        kinds = getattr(cfg, "layer_types", None)
        if not isinstance(kinds, (list, tuple)) or len(set(kinds)) <= 1:
            continue
        if len(kinds) != layers:
            return None           # another stack's pattern (the text one, of a tower found)
        p = next(p for p in range(1, layers + 1)
                 if layers % p == 0 and all(kinds[i] == kinds[i % p] for i in range(layers)))
        if p == layers or period not in (1, p):
            return None
        period = p
    return period


def _text(config):
    get = getattr(config, "get_text_config", None)
    return get() if get else config


def repeated_stack(model: nn.Module) -> tuple[str, nn.ModuleList] | None:
    """(qualified name, ModuleList) of the model's repeated layers, or None."""
    import torch.nn as nn
    best, best_params = None, -1
    for name, m in model.named_modules():
        if not isinstance(m, nn.ModuleList) or len(m) < MIN_BLOCKS:
            continue
        first = _signature(m[0])
        if any(_signature(b) != first for b in m):
            continue
        params = sum(p.numel() for p in m.parameters())
        if params > best_params:
            best, best_params = (name, m), params
    return best


def cut(model: nn.Module, blocks: int, periodic: bool = True, every: int = 1) -> Stack | None:
    """Keep the first `blocks` blocks of the model's repeated stack (in place); None when the
    model has no stack of at least MIN_BLOCKS alike blocks (it is left whole). `periodic`:
    blocks of several layers (module docstring) allowed; without, only a stack of alike layers
    is cut (generation's forwards, trace/generate.py, whose per-layer tagging reads layers).
    `every`: only every `every`-th layer is checkpointed (trace/checkpointing.py, every-K), a
    pattern of its own that the period takes in (the least common multiple of both)."""
    found = repeated_stack(model)
    if found is None:
        return None
    name, stack = found
    period = layer_period(getattr(model, "config", None), len(stack))
    if period is not None and every > 1:
        period = math.lcm(period, every)
        if len(stack) % period:
            period = None         # the checkpointed layers do not repeat a whole number of times
    if period is None or (period > 1 and not periodic) or len(stack) // period < MIN_BLOCKS or \
            blocks >= len(stack) // period:
        return None
    parent, _, attr = name.rpartition(".")
    import torch.nn as nn
    setattr(model.get_submodule(parent) if parent else model, attr,
            nn.ModuleList(stack[:blocks * period]))
    return Stack(name, len(stack) // period, blocks, period)
