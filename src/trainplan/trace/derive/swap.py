"""A step with one optimizer, read off the same step traced with another.

The tracer runs a step as: the parameters made (phase "setup"), a warm-up update on zero
gradients that makes the optimizer's state, the counted forward and backward, the update, and
the gradients freed (trace/tracer.py `_run`; its log's three marks: the forward, the update and
the gradients freed begin). Of these only the warm-up and the update depend on the optimizer:
nothing in the forward or backward reads its state, and `zero_grad(set_to_none=True)` frees the
gradients in the parameters' order whatever the optimizer. So the step with optimizer B is,
event for event:

* B's setup and warm-up: what `trace_optimizer` records for B (tracer.py), which sets the model
  up and makes its parameters as the step does, then runs B's warm-up;
* the other trace's forward and backward, its tensors renumbered (an event's serial is its
  index: trace/counters.py), their ops as they are;
* B's update, as `trace_optimizer` ran it on zero gradients of the same shapes (an update reads
  the gradients, never their values), with its ops;
* the other trace's gradients freed.

Each phase's peak, the step's peak and its split are then the log's, replayed as the tracer
computes them (log.py `replay_log`), and the FLOPs and bytes of the update B's ops. The two
setups must be the same, entry for entry (the same model, LoRA, quantisation and cut); where
they are not, or a copied part touches a tensor of a part left out (the forward freeing a state,
B's update freeing a gradient), or B's update names an op whose FLOPs are not known (an update
runs none with a formula: trace/ops.py), there is no derivation (None) and the step is traced.
The timeline (the live total after each op, for the reports' chart) is the log's live total
after each entry, sampled as the tracer samples. tests/test_swap.py checks the result, field for
field, against steps traced with B.

A plan's fix ladder asks for a job's step with 8-bit AdamW after the same step with AdamW
(plan/fixes.py): `trace_optimizer` for it is a fraction of a step's trace (no forward, no
backward), and one serves every micro-batch, sequence length and checkpointing of that model
(the cache keys it by what sets the parameters up: cache.py `_part_request`).
"""
from __future__ import annotations

from dataclasses import replace

from ..facts import OptimizerPart, Trace
from ..log import Alloc, Event, Free, Mark, Retag, TraceLog, downsample, replay_log


def _setup_end(tl: TraceLog) -> tuple[int, int]:
    """(memory entries, events) before the first allocation after the setup phase."""
    events = 0
    for i, e in enumerate(tl.memory):
        if type(e) is Alloc:
            if e.phase != "setup":
                return i, events
            events += 1
        elif type(e) is Free:
            events += 1
    return len(tl.memory), events


class _Unmapped(Exception):
    """A copied entry names a tensor of a part left out."""


def _copy(entries, events, blocks, remap, out_entries, out_events, out_blocks) -> None:
    """Append `entries` and `events` (and `blocks`) with their serials remapped."""
    for e in entries:
        kind = type(e)
        if kind is Alloc:
            out_entries.append(Alloc(remap(e.serial), e.nbytes, e.category, e.phase))
        elif kind is Free:
            out_entries.append(Free(remap(e.serial)))
        elif kind is Retag:
            out_entries.append(Retag(remap(e.serial), e.category))
        else:
            out_entries.append(e)
    out_events += [Event(remap(s), n) for s, n in events]
    if out_blocks is not None:
        out_blocks += blocks


def swapped(base: Trace, part: OptimizerPart, semantics=None) -> Trace | None:
    """`base`'s step with `part`'s optimizer (module docstring), or None. `semantics`: the
    kernel semantics `part` was made under where they are not `base`'s (torch.optim's
    per-parameter loop for its multi-tensor step: only the update differs)."""
    bl, pl = base.log, part.log
    if len(bl.marks) != 3 or len(pl.marks) != 3 or part.unknown_flop_ops \
            or (bl.blocks is None) != (pl.blocks is None):
        return None
    (bf, bfe), (bo, boe), (bz, bze) = bl.marks
    (pf, pfe), (po, poe), (pz, pze) = pl.marks
    setup, setup_e = _setup_end(bl)
    if _setup_end(pl) != (setup, setup_e) or bl.memory[:setup] != pl.memory[:setup] \
            or bl.events[:setup_e] != pl.events[:setup_e] \
            or (bl.blocks is not None and bl.blocks[:setup_e] != pl.blocks[:setup_e]):
        return None
    upd_e = pfe + (boe - bfe)            # where the update's events begin in the step read off
    freed_e = upd_e + (pze - poe)        # ...and the gradients' frees

    def from_base(s: int) -> int:
        if s < setup_e:
            return s
        if bfe <= s < boe:
            return s - bfe + pfe
        if s >= bze:
            return s - bze + freed_e
        raise _Unmapped                  # the other optimizer's state or update

    def from_part(s: int) -> int:
        if s < pfe:
            return s
        if poe <= s < pze:
            return s - poe + upd_e
        raise _Unmapped                  # the stand-in gradients

    memory: list = []
    events: list[Event] = []
    blocks = [] if bl.blocks is not None else None
    pb = pl.blocks or ()
    bb = bl.blocks or ()
    try:
        _copy(pl.memory[:pf], pl.events[:pfe], pb[:pfe], from_part, memory, events, blocks)
        fwd = len(memory)
        _copy(bl.memory[bf:bo], bl.events[bfe:boe], bb[bfe:boe], from_base, memory, events,
              blocks)
        upd = len(memory)
        _copy(pl.memory[po:pz], pl.events[poe:pze], pb[poe:pze], from_part, memory, events,
              blocks)
        freed = len(memory)
        _copy(bl.memory[bz:], bl.events[bze:], bb[bze:], from_base, memory, events, blocks)
    except _Unmapped:
        return None
    peaks, peak, timeline = replay_log(memory, timeline=True)
    gradients = [g._replace(log=g.log - bf + fwd) if g.log is not None else g
                 for g in bl.gradients]
    marks = [Mark(fwd, pfe), Mark(upd, upd_e), Mark(freed, freed_e)]
    ops = [o for o in base.ops if o.phase != "optimizer"] + list(part.ops)
    flops, moved = dict(base.flops), dict(base.bytes_moved)
    flops["optimizer"] = {f: sum(o.flops for o in part.ops if o.family == f)
                          for f in base.flops["optimizer"]}
    moved["optimizer"] = {f: sum(o.bytes for o in part.ops if o.family == f)
                          for f in base.bytes_moved["optimizer"]}
    last = (dict(base.last_block, optimizer_state_bytes=part.last_block_state_bytes)
            if base.last_block is not None else None)
    return replace(base, optimizer_state_bytes=part.optimizer_state_bytes, phase_peaks=peaks,
                   peak_allocated_bytes=peak[0], peak_phase=peak[1],
                   peak_breakdown_bytes=peak[2], ops=ops, flops=flops, bytes_moved=moved,
                   log=TraceLog(memory, events, blocks, marks, gradients,
                                downsample(timeline)),
                   last_block=last, trace_seconds=part.trace_seconds,
                   semantics=semantics if semantics is not None else base.semantics)
