"""The real traces a plan reads: one per (traced job, kernel semantics, blocks kept, micro-batch),
made once per process, kept on disk between runs (trace/store.py), or read off a twin's
(twins.py), off the step without gradient accumulation (accumulate.py) or off the same step with
another optimizer (swap.py).

`TraceCache._real` is the one way a real trace is had: from this cache, from a twin's trace,
from the disk store (its own, or its attention twin's where that is the same step), read off the
step without accumulation, read off the step with another optimizer held here (its optimizer's
update made once per model: `_part`), deferred to the round's parallel tracing (rounds.py), or
traced now.
Keys are values: the traced job's repr (kept per job value: planning asks for the same few jobs
thousands of times), the semantics' key and the blocks kept.
"""
from __future__ import annotations

import bisect
import functools
import gc
from collections.abc import Callable
from dataclasses import replace

from ... import optimizer as opt_mod
from .. import store
from ..facts import OptimizerPart, Trace
from ..semantics import KernelSemantics
from ..stack import HIGH
from ..parallel import OptimizerStep, trace_all
from .accumulate import accumulated, derivable
from .anchoring import describe, trace_job
from .replays import prepare
from .rounds import Deferred, Rounds, asked, may_trace, record
from .swap import swapped
from .twins import Twin, as_semantics, attention_twin, hint_key, relabel, same_under, twin


@functools.lru_cache(maxsize=4096)
def _variant_of(job) -> str:
    return repr(trace_job(job))


def variant(job) -> str:
    """The traced job (anchors.trace_job) as a key: its repr, kept per job value."""
    try:
        hash(job)
    except TypeError:            # a job holding a mapping (a py: model's model_args)
        return repr(trace_job(job))
    return _variant_of(job)


# the optimizers a step is traced with (optimizer.py `traced_as`), AdamW first: the steps a
# step with another update is read off (`TraceCache._swapped`)
TRACED_OPTIMIZERS = tuple(dict.fromkeys(opt_mod.traced_as(o) for o in opt_mod.ALL))
PENDING = object()      # `_swapped`: the optimizer's update is asked of the round


def part_job(job):
    """The job as its optimizer's update sees it (tracer.py `trace_optimizer`): the traced job
    with what changes no parameter and no update reset (checkpointing, accumulation), so that
    one update serves the rungs that differ only in those. swap.py checks the parameters' setup
    of each step it reads entry for entry, so a setting left here changes only how often an
    update is made, never a result."""
    return trace_job(job).with_(grad_checkpointing="none", checkpoint_impl="auto", grad_accum=1)


def trace_one(request: tuple) -> Trace:
    """One trace (parallel.py: in a worker, forked warm, where there are workers), its replays
    made beside it (replays.py `prepare`); a failure raised as its TrainplanError."""
    tr = trace_all([request], finish=prepare)[0]
    if isinstance(tr, BaseException):
        raise tr
    return tr


class TraceCache(Rounds):
    """Real traces by key (module docstring); `progress(msg)` is told about every trace made."""

    asked = staticmethod(asked)

    def __init__(self, progress: Callable[[str], None] | None = None):
        self._exact: dict[tuple, Trace] = {}       # (variant, semantics, depth, batch) -> trace
        self._batches: dict[tuple, list[int]] = {}  # (variant, semantics, depth) -> traced batches
        self._progress = progress
        self._failed: set[tuple] = set()            # traces a worker could not make
        self._absent: set[tuple] = set()            # looked for in the disk store, not there
        self.deferring: list[tuple] | None = None   # while set: missing traces, recorded
        self._flash_hint: dict[tuple, bool] = {}    # did a trace of this model take flash?
        self._sdpa_hint: dict[tuple, bool] = {}     # ... make attention calls at all?
        self.traced = 0                             # traces made by this cache
        self.loaded = 0                             # traces read from the disk store
        self._parts: dict[tuple, object] = {}      # optimizers' updates (`_part`)

    def _key(self, job, sem: KernelSemantics, depth: int | None = None) -> tuple:
        """(the traced variant, the kernel semantics, blocks kept)."""
        return (variant(job), sem.key(), depth)

    def _store(self, key: tuple, batch: int, tr: Trace, made: str | None = None) -> None:
        """Keep `tr` as the trace at `key` + batch; `made`: "traced" (now, counted in `traced`),
        "loaded" (from the disk store, counted in `loaded`), None (derived from another)."""
        self._exact[key + (batch,)] = tr
        bisect.insort(self._batches.setdefault(key, []), batch)
        if made == "traced":
            self.traced += 1
        elif made == "loaded":
            self.loaded += 1
        if made:
            # kept until the plan ends: out of the cyclic collector's view, whose full
            # collections would otherwise walk every record of every trace read so far (a warm
            # Llama-3.1-70B plan over every platform: 0.56 s collecting, 0.33 s of it in three
            # full collections; 0.16 s so, none full). As the tracer does (tracer.py
            # `_collect_and_freeze`, which also thaws it every 16 traces)
            gc.freeze()

    def _load(self, key: tuple, job, sem: KernelSemantics, batch: int, depth: int | None
              ) -> str | None:
        """Read the trace from the disk store (trace/store.py) into the cache, if it is there;
        its store name either way (to save it under once traced)."""
        name = store.key(trace_job(job), sem, batch, depth)
        tr = store.load(name)
        if tr is not None:
            self._store(key, batch, tr, "loaded")
        return name

    def _real(self, job, sem: KernelSemantics, batch: int, depth: int | None = None) -> Trace:
        """The real trace of (job, sem) at `batch`, `depth` blocks kept (module docstring)."""
        key = self._key(job, sem, depth)
        at = key + (batch,)
        if at in self._exact:
            return self._exact[at]
        step = twin(job, sem)
        if step is not None:              # read off its twin's trace (twins.py)
            how, tjob, tsem = step
            base = self._real(tjob, tsem, batch, depth)
            self._store(key, batch, relabel(base, sem) if how is Twin.RELABEL else base)
            return self._exact[at]
        name = self._load(key, job, sem, batch, depth)
        shared = None if at in self._exact else self._shared(job, sem, batch, depth)
        if shared is not None:
            self._store(key, batch, shared)
        if at in self._exact:
            return self._exact[at]
        if job.grad_accum > 1 and derivable(sem):   # read off the step without it, and
            made = accumulated(self._real(job.with_(grad_accum=1), sem, batch, depth))
            if made is not None:                    # kept on disk like a trace
                store.save(name, prepare(made))
                self._store(key, batch, made)
                return made
        made = self._swapped(job, sem, batch, depth)
        if made is PENDING:
            raise Deferred
        if made is not None:
            return made
        if self.deferring is not None and at not in self._failed:
            self.deferring.append((job, sem, batch, depth))
            raise Deferred
        if sem.attention in ("flash", "math") and self._hint(job, sem) is False:
            first = self._real(job, attention_twin(sem), batch, depth)
            if same_under(first, sem):      # the same step: shared (twins.attention_twin)
                self._store(key, batch, as_semantics(first, sem))
                return self._exact[at]
        if self._progress:
            self._progress(describe(job, sem, batch))
        tr = trace_one((trace_job(job), sem, batch, depth))
        store.save(name, tr)
        self._store(key, batch, tr, "traced")
        self._learn(job, sem, tr)
        return self._exact[at]

    def _swapped(self, job, sem: KernelSemantics, batch: int, depth: int | None,
                 ask: bool = True):
        """The step read off the same step with another update (swap.py: another optimizer, or
        torch.optim's multi-tensor step for its per-parameter loop or back) held in this cache,
        and kept like a trace (on disk too); PENDING where the optimizer's update is asked of
        this round (or cannot be made within `made_only`); None where no such step is held, the
        update could not be made (or, without `ask`, is not made yet), or the step cannot be
        read off. A step only in the disk store is not looked for: a read-off step is stored
        itself, and looking costs a store key for each of 15 other updates."""
        if not ask and self._part(job, sem, depth, ask=False) is None:
            return None
        mine, own = opt_mod.traced_as(job.optimizer), sem.optimizer_foreach
        # another optimizer first, then the other implementation of each (AdamW's first)
        bases = [(o, own) for o in TRACED_OPTIMIZERS if o is not mine] + \
            [(o, not own) for o in (mine,) + TRACED_OPTIMIZERS]
        for other, foreach in dict.fromkeys(bases):
            base = self._in_memory(job.with_(optimizer=other),
                                   replace(sem, optimizer_foreach=foreach), batch, depth)
            if base is None:
                continue
            part = self._part(job, sem, depth, ask)
            if part is PENDING or not isinstance(part, OptimizerPart):
                return part if part is PENDING else None
            made = swapped(base, part, sem)
            if made is not None:             # kept on disk like a trace
                store.save(store.key(trace_job(job), sem, batch, depth), prepare(made))
                self._store(self._key(job, sem, depth), batch, made)
            return made
        return None

    def _in_memory(self, job, sem: KernelSemantics, batch: int, depth: int | None
                   ) -> Trace | None:
        """The trace held in this cache, or its attention twin's where that is held and the same
        step (`_shared`), else None: nothing is read from the disk store."""
        at = self._key(job, sem, depth) + (batch,)
        other = attention_twin(sem)
        if at not in self._exact and other is not None \
                and self._key(job, other, depth) + (batch,) in self._exact:
            self._held(job, sem, batch, depth)
        return self._exact.get(at)

    def _part(self, job, sem: KernelSemantics, depth: int | None, ask: bool = True):
        """`job`'s optimizer's update (tracer.py `trace_optimizer`), made once per process for
        every step that shares it (`part_job`): made in a worker with the round's traces
        (rounds.py `record`: PENDING until then), or now outside rounds; a TrainplanError where
        it cannot be made; None, without `ask`, where it is not made yet."""
        key, request, keep = self._part_request(job, sem, depth)
        if key not in self._parts:
            if not ask:
                return None
            if record(key, request, keep):
                return PENDING
            if not may_trace() or self.deferring is not None:
                return PENDING
            keep(trace_all([request])[0])
        return self._parts[key]

    def _part_request(self, job, sem: KernelSemantics, depth: int | None) -> tuple:
        """(the key `_part` keeps `job`'s update by, the request that makes it, the function
        that keeps what it made): the job as the update sees it (`part_job`), the semantics but
        for the attention kernel (no update runs one), the blocks kept."""
        pj, psem = part_job(job), replace(sem, attention="efficient")
        key = (variant(pj), psem.key(), depth)
        return key, OptimizerStep(pj, psem, depth), functools.partial(self._parts.__setitem__,
                                                                      key)

    def _hint(self, job, sem: KernelSemantics) -> bool | None:
        """Whether traces of this model at this precision took flash (None: none made yet), or,
        for math attention, made attention calls at all: whether `sem`'s step may differ from
        its attention twin's. It only orders tracing, never decides a result (`_shared` checks
        each trace)."""
        hints = self._sdpa_hint if sem.attention == "math" else self._flash_hint
        return hints.get(hint_key(job, sem))

    def _learn(self, job, sem: KernelSemantics, tr) -> None:
        if isinstance(tr, Trace) and sem.attention in ("flash", "efficient", "math"):
            self._sdpa_hint[hint_key(job, sem)] = tr.sdpa_calls > 0
            if sem.attention != "math":
                self._flash_hint[hint_key(job, sem)] = tr.flash_eligible > 0

    def _shared(self, job, sem: KernelSemantics, batch: int, depth: int | None) -> Trace | None:
        """The attention twin's trace (in memory or on disk) as this one's, where it is the same
        step; for a whole trace, the one asked cut to HIGH blocks where the built model had no
        stack to cut (traces.py `_traced_whole`); else None."""
        if depth is None:
            cut = self._exact.get(self._key(job, sem, HIGH) + (batch,))
            if cut is not None and cut.stack is None:
                return cut
        other = attention_twin(sem)
        if other is None:
            return None
        tkey = self._key(job, other, depth)
        if tkey + (batch,) not in self._exact:
            self._load(tkey, job, other, batch, depth)
        tr = self._exact.get(tkey + (batch,))
        return as_semantics(tr, sem) if tr is not None and same_under(tr, sem) else None

    def _held(self, job, sem: KernelSemantics, batch: int, depth: int | None) -> bool:
        """Whether the trace is in this cache, after reading it from the disk store or taking
        its attention twin's where it is there: what `fill` traces only where it is not, and
        `prefetch`, while deferring, defers only where it is not. Within `made_only`, only what
        this cache holds already: the traces this run made or read for its plan (a warm run
        reads from the store the ones a cold run made, so its memory curve is the cold one's),
        never one another command stored, so a curve lists the same micro-batches whatever else
        was traced before."""
        key = self._key(job, sem, depth)
        at = key + (batch,)
        if not may_trace():
            return at in self._exact
        if at not in self._exact and at not in self._absent:
            self._load(key, job, sem, batch, depth)
            if at not in self._exact:    # not stored: not looked for again (what this process
                self._absent.add(at)     # traces goes in _exact)
        if at not in self._exact:
            shared = self._shared(job, sem, batch, depth)
            if shared is not None:
                self._store(key, batch, shared)
        return at in self._exact
