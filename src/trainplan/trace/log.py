"""What a traced step did to memory, in order: the log a trace keeps beside its facts.

The counter (counters.py) writes two records of every storage it tracks:

* `events`: each allocation as Event(serial, +bytes) and each free as Event(serial, -bytes), in
  order: what the caching allocator's replay reads (derive/allocator.py);
* `memory`: the same allocations and frees with their category and phase, and the changes
  between them: a tensor's category changed (Retag: a gradient made, optimizer state tagged)
  and the warm-up's peaks reset before the measured step (Reset). Replaying it
  (counters.replay_log) gives each phase's peak by category, for the logged sizes or for others
  (the same step at another micro-batch, derive/interpolate.py).

With them: `blocks`, the cut stack's block each event happened in (trace/blocks.py; None for a
trace not cut), `marks` (the log's and the events' lengths as the first forward and the
optimizer step begin) and `gradients` (each gradient made in the backward, tracer.py
`_gradient_made`), what derive/accumulate.py reads the step with gradient accumulation from, and
`timeline`, the live total after each op (downsampled, for the reports' chart).

A log is never edited once its trace is made: a trace derived from another (stitched, extended,
accumulated, interpolated: trace/derive/) gets a log of its own.
"""
from __future__ import annotations

import functools
import pickle
from dataclasses import dataclass, field
from typing import NamedTuple


class Event(NamedTuple):
    """An allocation (`nbytes` > 0) or a free (`nbytes` < 0, the size negated) of a storage."""

    serial: int
    nbytes: int


class Alloc(NamedTuple):
    serial: int
    nbytes: int
    category: str             # counters.CATEGORIES
    phase: str                # setup | forward | backward | optimizer


class Free(NamedTuple):
    serial: int


class Retag(NamedTuple):
    serial: int
    category: str


class Reset(NamedTuple):
    """The measured step starts its peaks anew (after the optimizer's warm-up step)."""


Entry = Alloc | Free | Retag | Reset


class Mark(NamedTuple):
    """Where the step was: the memory log's and the events' lengths so far."""

    log: int
    events: int


class GradientMade(NamedTuple):
    """A parameter's gradient made in the counted backward (tracer.py `_gradient_made`)."""

    op: int                   # ops recorded before it
    log: int | None           # index of its Retag in the memory log (None: not logged)
    block: int                # the cut stack's block running (-1: none)
    add: object               # the `add_` (counters.OpRecord) accumulation would run instead


@dataclass
class TraceLog:
    """A traced step's memory log (module docstring)."""

    memory: list[Entry] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    blocks: list[int] | None = None
    marks: list[Mark] = field(default_factory=list)
    gradients: list[GradientMade] = field(default_factory=list)
    timeline: list[tuple[str, int]] = field(default_factory=list)
    # derive/repeat.py's plan of what repeats where over a whole stack, made once per log: empty
    # until made, then [the plan or None]; one list shared with the logs of the same step at
    # other micro-batches read off this one (derive/interpolate.py), as they repeat alike; kept
    # where a real log is pickled (the trace store: a warm plan over every platform made ~100)
    repeat_plan: list = field(default_factory=list, compare=False, repr=False)
    # a log read off another at other allocation sizes (an interpolated trace's:
    # derive/interpolate.py): (that log, a function giving serial -> bytes here, made when first
    # called), so that a replay reads that log's entries with these sizes without making this
    # one's (derive/peaks.py)
    resized: tuple | None = field(default=None, compare=False, repr=False)

    @functools.cached_property
    def structure(self) -> "Structure":
        """What the log does apart from sizes: each memory entry with an allocation's size left
        out, and each event's block. The same step at another micro-batch (an anchor, a trace
        read off two: derive/interpolate.py) has the same structure; what is repeated where over
        a whole stack depends only on it (derive/repeat.py)."""
        memory = tuple((Alloc, e.serial, e.category, e.phase) if type(e) is Alloc
                       else (type(e),) + tuple(e) for e in self.memory)
        return Structure((memory, tuple(self.blocks) if self.blocks is not None else None))

    @functools.cached_property
    def by_event(self) -> tuple[list, dict[int, list]]:
        """(the Alloc and Free entries of `memory`, one per event in order; {event index: the
        entries after it before the next, -1 for those before the first}): what a replay over
        the events reads (derive/peaks.py)."""
        entry: list = []
        after: dict[int, list] = {}
        for ent in self.memory:
            if type(ent) is Alloc or type(ent) is Free:
                entry.append(ent)
            else:
                after.setdefault(len(entry) - 1, []).append(ent)
        return entry, after

    @functools.cached_property
    def peaks_memo(self) -> dict:
        """Stack depth -> each phase's peaks over a whole stack of that many blocks, read off this
        (cut) log (derive/peaks.py), or None. Kept with the log where it is pickled (a worker's
        trace, the trace store): read where the trace is made (derive/replays.py `prepare`), a
        plan from stored traces reads them without the log."""
        return {}

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("structure", None)          # memos: made again where they are read
        state.pop("by_event", None)
        # a real log's repeat plan is kept: made where it is traced (replays.py `prepare`), 2 ms
        # a log to make again, a tenth of that to unpickle, as the bytes of its own pickle,
        # unpickled where read (derive/repeat.py `plan_of`): a plan from stored traces asks
        # only whether there is one (`repeats`) of most
        if self.resized is not None:          # an interpolated log's: its own sizes, not kept,
            state.pop("peaks_memo", None)     # nor its anchor's plan, which it shares
            state["repeat_plan"] = []
        elif self.repeat_plan and self.repeat_plan[0] is not None:
            plan = self.repeat_plan[0]
            state["repeat_plan"] = [plan if type(plan) is bytes else
                                    pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL)]
        state["resized"] = None
        return state


class Structure:
    """A log's structure (`TraceLog.structure`) as a key: hashed once, compared whole."""

    __slots__ = ("value", "_hash")

    def __init__(self, value: tuple):
        self.value, self._hash = value, hash(value)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return isinstance(other, Structure) and (self is other or self._hash == other._hash
                                                 and self.value == other.value)


CATEGORIES = ("weights", "gradients", "optimizer_states", "activations", "weight_casts",
              "temporaries")
PhasePeaks = dict[str, tuple[int, dict[str, int]]]      # phase -> (peak bytes, by category)


def phase_peaks_from_log(log: list[Entry], sizes: dict[int, int] | None = None) -> PhasePeaks:
    """Each phase's peak live bytes and their split by category (`replay_log`)."""
    return replay_log(log, sizes)[0]


def replay_log(log: list[Entry], sizes: dict[int, int] | None = None, timeline: bool = False
               ) -> tuple[PhasePeaks, tuple, list | None]:
    """Replay a memory log exactly as the counter computes its peaks (a new peak is checked at
    every allocation, in the phase current then): (each phase's peak live bytes and their split
    by category, the step's peak as (bytes, phase, by category), and with `timeline` the live
    total after each entry). `sizes` (serial -> bytes) replaces the logged allocation sizes:
    the same step at another micro-batch (derive/interpolate.py)."""
    live, by_cat, held = 0, dict.fromkeys(CATEGORIES, 0), {}
    peaks: PhasePeaks = {}
    peak, phase_now = (0, "setup", dict(by_cat)), "setup"
    line: list[tuple[str, int]] | None = [] if timeline else None
    for entry in log:
        kind = type(entry)
        if kind is Alloc:
            serial, nbytes, cat, phase_now = entry
            nbytes = sizes.get(serial, nbytes) if sizes is not None else nbytes
            held[serial] = [nbytes, cat]
            live += nbytes
            by_cat[cat] = by_cat.get(cat, 0) + nbytes
            if live > peak[0]:
                peak = (live, phase_now, dict(by_cat))
            if live > peaks.get(phase_now, (-1,))[0]:
                peaks[phase_now] = (live, dict(by_cat))
        elif kind is Free:
            nbytes, cat = held.pop(entry.serial)
            live -= nbytes
            by_cat[cat] -= nbytes
        elif kind is Retag:
            rec = held.get(entry.serial)
            if rec is not None:
                by_cat[rec[1]] -= rec[0]
                by_cat[entry.category] = by_cat.get(entry.category, 0) + rec[0]
                rec[1] = entry.category
        else:                                   # Reset: the real step starts its peaks anew
            peaks.clear()
            peak = (live, phase_now, dict(by_cat))
        if line is not None:
            line.append((phase_now, live))

    def whole(cats: dict) -> dict[str, int]:
        return {c: int(cats.get(c, 0)) for c in CATEGORIES}
    return ({k: (v[0], whole(v[1])) for k, v in peaks.items()}, (peak[0], peak[1], whole(peak[2])),
            line)


def downsample(timeline: list[tuple[str, int]], n: int = 1500) -> list[tuple[str, int]]:
    """At most `n` points of the live-total timeline, each the largest of its stretch (the
    reports' chart keeps every peak)."""
    if len(timeline) <= n:
        return timeline
    step = len(timeline) / n
    out = []
    for i in range(n):
        chunk = timeline[int(i * step): int((i + 1) * step)] or [timeline[-1]]
        out.append(max(chunk, key=lambda x: x[1]))
    return out
