"""What the caching allocator makes of a trace's allocations: its fragmentation, made once per
trace and backend and kept with it (facts.py `TraceDerived`).

A trace's own replay (allocator.py) gives the peaks allocated, reserved and pinned; what the
allocator holds beyond the allocated peak is its fragmentation. A trace stitched from a cut one
(stitch.py) takes that of the whole stack's replay: the cut trace's allocations repeated block
by block (repeat.py `whole_events`), which equals the full trace's replay (tests/test_depth.py);
where they do not repeat, the cut trace's own replay (the cut model has the whole model's mix of
block sizes; within -2% and +4% of the full trace's required memory: trace/stack.py).

`prepare` makes a real trace's replay where it is traced (a worker, trace/parallel.py), so the
replays run on all cores beside the traces and the trace store keeps them: a warm plan replays
nothing. A cut trace's phase peaks over the whole stack and over one block more (what stitch.py
reads of it: peaks.py) are read there too and kept on its log (`TraceLog.peaks_memo`).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..facts import Trace
from ..stack import HIGH
from .allocator import CUDA, MPS, Rules, replay
from .interpolate import family_key
from .repeat import whole_events
from .stitch import read_peaks


@dataclass(frozen=True)
class Fragmentation:
    """What the caching allocator holds beyond the allocated peak, in bytes of the traced
    single-device step: `pinned` (segments a live block keeps, the least it must hold) and
    `reserved` (everything it caches on a device with room)."""

    pinned: int
    reserved: int


def replayed(alloc: int, reserved: int, pinned: int) -> Fragmentation:
    """The fragmentation of an allocator replay's peaks (allocator.replay)."""
    return Fragmentation(max(0, pinned - alloc), max(0, reserved - alloc))


def fragmentation(trace: Trace, rules: Rules = CUDA) -> Fragmentation:
    """The trace's peak pinned and peak reserved minus its peak allocated under the backend's
    allocator `rules` (CUDA and ROCm share one; MPS's heaps differ): its own replay, or for a
    stitched trace the whole stack's (module docstring), made when first asked."""
    memo = trace.derived
    if rules.name not in memo.fragmentation and memo.whole_of is not None:
        memo.fragmentation[rules.name] = whole_fragmentation(memo.whole_of, rules)
    if rules.name in memo.fragmentation:
        return memo.fragmentation[rules.name]
    return replayed(*_replay_once(trace, rules))


def whole_fragmentation(cut: Trace, rules: Rules = CUDA) -> Fragmentation:
    """The fragmentation of the whole model's step (its `stack.blocks` blocks) from the cut trace
    `cut`, memoised on it: the replay of the whole stack's allocations, or where they do not
    repeat block by block the cut trace's own (module docstring)."""
    memo = cut.derived.whole_fragmentation
    if rules.name not in memo:
        events = whole_events(cut, cut.stack.blocks)
        memo[rules.name] = fragmentation(cut, rules) if events is None else \
            replayed(*replay(events, rules))
    return memo[rules.name]


def _replay_once(trace: Trace, rules: Rules = CUDA) -> tuple[int, int, int]:
    """(peak allocated, peak reserved, peak pinned) of the trace's allocations, memoised on it."""
    memo = trace.derived.replay
    if rules.name not in memo:
        memo[rules.name] = replay(trace.log.events, rules)
    return memo[rules.name]


def prepare(tr: Trace) -> Trace:
    """`tr` with the allocator replay a plan reads of it made and kept on it (module docstring):
    the whole stack's for a HIGH-block cut trace (tens of thousands of events for an 80-block
    model: made beside the trace, in its worker, not in the planning process), the trace's own
    for a whole one. A LOW-block trace is never replayed. The replay is the allocator's of the
    targets the trace is made for: Apple's (MPS) for the per-parameter optimizer loop, which
    predict/target.py gives MPS alone; CUDA's (ROCm's and XLA's alike) for any other."""
    rules = CUDA if tr.semantics.optimizer_foreach else MPS
    if tr.stack is None:
        fragmentation(tr, rules)
    elif tr.stack.traced == HIGH and tr.stack.blocks > HIGH:
        whole_fragmentation(tr, rules)
        read_peaks(tr)
    family_key(tr)          # what interpolating it compares (interpolate.py), kept with it
    return tr
