"""The trace cache every prediction shares: one real trace per (traced job, kernel semantics,
micro-batch), and interpolation between traced micro-batches.

A trace depends on the model, shapes, precision, optimizer, checkpointing, LoRA/quantisation and
on whether gradients are accumulated (with accumulation a second micro-batch runs with gradients
live), but not on the device count, strategy, offload or accelerator memory: memory.py and
timing.py apply those afterwards. So the key drops the fields that do not change the traced step
and folds every grad_accum > 1 into 2 (the tracer runs two micro-batches for any accumulation).
Real traces are made at micro-batch 1 and at two anchors, 2 and 32; every other micro-batch is
read off the line through the anchors (interpolate.py: every op's work and every allocation is
affine in the batch, and the phase peaks and the allocator are replayed on those sizes, so the
result equals a real trace; tests/test_predict_properties.py). When the two anchors run different
ops (data-dependent control flow) the micro-batch itself is traced.

One trace serves several targets where their steps are the same, or one step is read off another: a
job with gradient accumulation reads the step without it (accumulate.py, exact; not under
channels_last), an fp16 job reads its bf16 twin's trace with the dtype renamed (`half_twin`), a
TPU's fp16 AMP step is its bf16 AMP step (`same_step`), and flash and memory-efficient attention
share a trace where no SDPA call could take flash (`attention_twin`: a bias such as ALiBi, a
padding mask, fp32, a CNN). The last is known only once one of the two is traced, so `fill` traces
the memory-efficient one first and the flash one only where the first took flash calls (a core that
would sit idle traces it anyway).
"""
from __future__ import annotations

import bisect
import contextlib
import contextvars
import copy
import functools
import re
from collections.abc import Callable
from dataclasses import replace

import torch

from ..strategy import SINGLE
from ..trace import store
from ..trace.parallel import IDLE, RUN, SKIP, WAIT, Forward, trace_all
from ..trace.semantics import KernelSemantics
from ..models import stack_hint
from ..trace.depth import EXACT_BLOCKS, MIN_BLOCKS

_BLOCK_INDEX = re.compile(r"\.\d+(\.|$)")    # a frozen prefix naming one block: model.layers.3
from ..trace.tracer import Trace, trace_step
from .depth import HIGH, LOW, extend, keep_replays, prepare, repeats, stitch
from .accumulate import accumulated, derivable
from .interpolate import same_shape_family, trace_between

ANCHORS = (2, 32)      # the two real traces every micro-batch >= 2 is read from
PER_SAMPLE_ANCHORS = (2, 4)   # ...for models that loop over the samples' images (anchors())

# Job fields that do not change the traced step (applied after tracing, or planning-only).
_UNTRACED = dict(gpus=1, strategy=SINGLE, offload="none", gpu=None, platforms=(), steps=None,
                 epochs=None, dataset_size=None, target_batch=None, session_overhead_s=None,
                 num_workers=None, samples_per_s_per_worker=None, batch_size=1,
                 expert_parallel=1, rollout=None, campaign=None)


def anchors(job) -> tuple[int, int]:
    """The anchors of `job`'s line. A model whose forward loops in Python over each sample's
    images (Qwen-VL's vision tower runs attention window by window, image by image) runs
    batch x images x windows ops: a trace at 32 costs 32 times one at 1 (26 s at micro-batch 1
    for Qwen2.5-VL-3B with one 560 px image on 2 cores, about 300 s at 32). Its work and
    allocations are as affine in the batch as any model's, so any two anchors give the same
    line; only the allocator's fragmentation beyond the larger anchor is extrapolated from a
    shorter base (memory.fragmentation_between). Such jobs use (2, 4)."""
    return PER_SAMPLE_ANCHORS if loops_over_images(job) else ANCHORS


def loops_over_images(job) -> bool:
    """Whether the job's step loops in Python over each sample's images (`anchors`)."""
    return bool(job.image_size and job.images_per_sample != 0 and job.model.startswith("hf:")
                and _loops_over_images(job.model))


@functools.cache
def _loops_over_images(model: str) -> bool:
    """Vision-language models whose inputs carry images (models/hf.py QWEN_VL_TYPES)."""
    from ..models.hf import QWEN_VL_TYPES
    from ..models.hf_names import load_config_dict
    try:
        return load_config_dict(model[3:])[0].get("model_type") in QWEN_VL_TYPES
    except Exception:          # the model build will say why
        return False


def trace_job(job):
    """The job as the tracer sees it: untraced fields reset, grad_accum folded to 1 or 2, and of
    the algorithm only what changes the traced step (DPO's two sequences per sample)."""
    return job.with_(grad_accum=1 if job.grad_accum <= 1 else 2,
                     algorithm="dpo" if job.algorithm == "dpo" else "sft", **_UNTRACED)


def describe(job, sem: KernelSemantics, batch: int) -> str:
    """The progress line for one trace."""
    return (f"tracing {job.model_label} (micro-batch {batch}, {sem.attention} attention, "
            f"{str(sem.autocast_dtype).replace('torch.', '') if sem.autocast_dtype else 'no autocast'})")


def describe_forward(job, sem: KernelSemantics, batch: int, new_tokens: int, context: int) -> str:
    """The progress line for one generation forward."""
    what = f"prefill of {new_tokens} tokens" if not context else f"decode at context {context}"
    return f"tracing {job.model_label} generation ({batch} sequences, {what})"


class Deferred(Exception):
    """A trace that is not made yet was asked for while `Traces.deferring` (see `in_rounds`) or
    within `Traces.made_only`."""


def every(asks: list[Callable]) -> list:
    """Each call's answer; where some ask for traces not made yet (`Deferred`), all are still
    asked, so that a round (`Traces.in_rounds`) makes their traces together, and then Deferred
    is raised. Asked one by one, the second of two traces a step reads (a line's two anchors, a
    cut model's 3 and 4 blocks where both are read) waited a whole round for the first."""
    out, deferred = [], False
    for ask in asks:
        try:
            out.append(ask())
        except Deferred:
            deferred = True
    if deferred:
        raise Deferred
    return out


_MAKING = contextvars.ContextVar("trainplan_making_traces", default=True)


def may_trace() -> bool:
    """False within `Traces.made_only()`: what is not traced yet is not traced then (the
    generation forwards of predict/generation.py read this)."""
    return _MAKING.get()


_FORWARDS = contextvars.ContextVar("trainplan_pending_forwards", default=None)


def defer_forward(key, request: Forward, keep: Callable) -> None:
    """A generation forward not traced yet (predict/generation.py). Within `Traces.in_rounds`
    it is made with the round's other traces, on all cores: recorded under `key` with
    `keep(trace or TrainplanError)`, which caches it, and the task deferred (`Deferred`).
    Outside, or within `made_only`, nothing is recorded: the caller traces it now (or not)."""
    pending = _FORWARDS.get()
    if pending is not None and may_trace():
        pending.append((key, request, keep))
        raise Deferred


class Traces:
    """Trace cache for one job and its variants; `progress(msg)` is told about every real trace.

    `cut` (default True): a model with a deep stack of alike blocks is traced cut to HIGH
    blocks (and LOW, where one block more cannot be read off its last: depth.extend) and the
    whole step is stitched from them (depth.py); False traces every block."""

    def __init__(self, progress: Callable[[str], None] | None = None, cut: bool = True):
        self._exact: dict[tuple, Trace] = {}       # (variant, semantics, depth, batch) -> trace
        self._batches: dict[tuple, list[int]] = {}  # (variant, semantics, depth) -> traced batches
        self._between: dict[tuple, Trace] = {}
        self._family: dict[tuple, bool] = {}        # do the traces at (lo, hi) run the same ops?
        self._keys: dict[int, tuple] = {}           # id(job) -> (job, its variant key)
        self._depths: dict[tuple, int | None] = {}  # (model, dims) -> blocks its config names,
                                                    # None once traced whole (_traced_whole)
        self._whole: dict[tuple, tuple[Trace, bool]] = {}   # stitched traces (depth.py)
        self._extended: dict[int, tuple] = {}       # id(trace) -> (trace, one block more)
        self._progress = progress
        self._cut = cut
        self._failed: set[tuple] = set()            # traces a worker could not make
        self._absent: set[tuple] = set()            # looked for in the disk store, not there
        self.deferring: list[tuple] | None = None   # while set: missing traces, recorded
        self._flash_hint: dict[tuple, bool] = {}    # did a trace of this model take flash?
        self.traced = 0                             # traces made by this cache
        self.loaded = 0                             # traces read from the disk store

    def _key(self, job, sem: KernelSemantics, depth: int | None = None) -> tuple:
        """(the traced variant, the kernel semantics, blocks kept); the variant's repr is kept per
        job object (jobs are immutable), since planning asks for the same few jobs thousands of
        times."""
        hit = self._keys.get(id(job))
        if hit is None or hit[0] is not job:
            hit = self._keys[id(job)] = (job, repr(trace_job(job)))
        return (hit[1], sem.key(), depth)

    def _cuts(self, job, sem: KernelSemantics) -> bool:
        """Whether `job` is traced cut (depth.py): its model names a stack deep enough to cut.
        A vision-language model's text stack is cut too, its vision tower traced whole in the
        cut trace: one cut trace costs the tower and 4 text blocks (when both a 3- and a 4-block
        trace were made, each ran the whole tower, and cutting cost more than it saved:
        Qwen2.5-VL-3B with one 560 px image, 33-50 s a step, 14 s of it the text model). A job
        that freezes some blocks by name (LLaMA-Factory's freeze tuning) is traced whole: its
        blocks are not alike."""
        if not self._cut or any(_BLOCK_INDEX.search(f) for f in job.frozen):
            return False          # some blocks frozen, others not: the blocks are not alike
        model = (job.model, job.transformer)     # what stack_hint reads
        if model not in self._depths:
            self._depths[model] = stack_hint(job)
        return (self._depths[model] or 0) >= MIN_BLOCKS

    def traced_batches(self, job, sem: KernelSemantics) -> list[int]:
        depth = HIGH if self._cuts(job, sem) else None
        return list(self._batches.get(self._key(job, sem, depth), ()))

    def _store(self, key: tuple, batch: int, tr: Trace, made: str | None = None) -> None:
        """Keep `tr` as the trace at `key` + batch; `made`: "traced" (now, counted in `traced`),
        "loaded" (from the disk store, counted in `loaded`), None (derived from another)."""
        self._exact[key + (batch,)] = tr
        bisect.insort(self._batches.setdefault(key, []), batch)
        if made == "traced":
            self.traced += 1
        elif made == "loaded":
            self.loaded += 1

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
        key = self._key(job, sem, depth)
        if key + (batch,) not in self._exact:
            twin = half_twin(job, sem)
            if twin is not None:          # the bf16 twin's trace, its dtype renamed (half_twin)
                self._store(key, batch, relabel(self._real(*twin, batch, depth), sem))
                return self._exact[key + (batch,)]
            canon = same_step(job, sem)[0]
            if canon is not job:          # a TPU's fp16 AMP step is its bf16 AMP step
                self._store(key, batch, self._real(canon, sem, batch, depth))
                return self._exact[key + (batch,)]
            name = self._load(key, job, sem, batch, depth)
            shared = None if key + (batch,) in self._exact else self._shared(job, sem, batch, depth)
            if shared is not None:
                self._store(key, batch, shared)
            if key + (batch,) in self._exact:
                return self._exact[key + (batch,)]
            if job.grad_accum > 1 and derivable(sem):   # read off the step without it, and
                made = accumulated(self._real(job.with_(grad_accum=1), sem, batch, depth))
                if made is not None:                    # kept on disk like a trace
                    store.save(name, prepare(made))
                    self._store(key, batch, made)
                    return made
            if self.deferring is not None and key + (batch,) not in self._failed:
                self.deferring.append((job, sem, batch, depth))
                raise Deferred
            if sem.attention == "flash" and self._hint(job, sem) is False:
                first = self._real(job, attention_twin(sem), batch, depth)
                if first.flash_eligible == 0:   # the same step: shared (attention_twin)
                    self._store(key, batch, _as(first, sem))
                    return self._exact[key + (batch,)]
            if self._progress:
                self._progress(describe(job, sem, batch))
            tr = prepare(trace_step(trace_job(job), sem, batch, depth=depth))
            store.save(name, tr)
            self._store(key, batch, tr, "traced")
            self._learn(job, sem, tr)
        return self._exact[key + (batch,)]

    def _hint(self, job, sem: KernelSemantics) -> bool | None:
        """Whether traces of this model at this precision took flash (None: none made yet); it
        only orders tracing, never decides a result (`_shared` checks each trace)."""
        return self._flash_hint.get(_hint_key(job, sem))

    def _learn(self, job, sem: KernelSemantics, tr) -> None:
        if isinstance(tr, Trace) and sem.attention in ("flash", "efficient"):
            self._flash_hint[_hint_key(job, sem)] = tr.flash_eligible > 0

    def _shared(self, job, sem: KernelSemantics, batch: int, depth: int | None) -> Trace | None:
        """The attention twin's trace (`attention_twin`, in memory or on disk) as this one's,
        where it is the same step; for a whole trace, the one asked cut to HIGH blocks where the
        built model had no stack to cut (`_traced_whole`); else None."""
        if depth is None:
            cut = self._exact.get(self._key(job, sem, HIGH) + (batch,))
            if cut is not None and cut.stack is None:
                return cut
        twin = attention_twin(sem)
        if twin is None:
            return None
        tkey = self._key(job, twin, depth)
        if tkey + (batch,) not in self._exact:
            self._load(tkey, job, twin, batch, depth)
        tr = self._exact.get(tkey + (batch,))
        return _as(tr, sem) if tr is not None and tr.flash_eligible == 0 else None

    def _stitched(self, job, sem: KernelSemantics, batch: int, how: str) -> tuple[Trace, bool] | None:
        """The whole model's trace at `batch` from its cut traces (`how`: "exact" or "at"), or
        None where the model is not cut (then it is marked to be traced whole)."""
        memo = self._key(job, sem) + (how, batch)
        if memo not in self._whole:
            def part(d):
                return (self._real(job, sem, batch, d), False) if how == "exact" else \
                    self._at(job, sem, batch, d)
            hi, between = part(HIGH)
            more = self._more(hi)
            whole = stitch(hi, more, tagged=hi) if more is not None else None
            if whole is None and self._reads_low(hi):
                lo, lo_between = part(LOW)
                whole, between = stitch(lo, hi), between or lo_between
            if whole is not None and not whole.derived["whole_replay"] and \
                    whole.stack.blocks < EXACT_BLOCKS:
                whole = None      # the allocator's waste only within a band: traced whole
            if whole is None:
                self._traced_whole(job)
                return None
            self._whole[memo] = (whole, between)
        return self._whole[memo]

    def _traced_whole(self, job) -> None:
        """`job`'s model is traced whole from now on, this variant and the others (`_cuts`): its
        built model has no stack of alike blocks (depth.cut: T5's first block owns the relative
        position bias), so its traces "cut" to HIGH blocks are whole ones, kept as such; or its
        stack is shallower than EXACT_BLOCKS and its allocations do not repeat block by block
        (BERT), so the whole step cannot be read off a cut trace. Both are the built model's,
        not the variant's: cutting the next rung's trace would be the same wasted trace. The
        whole traces then asked for reuse the "cut" ones that are whole (`_shared`)."""
        self._depths[(job.model, job.transformer)] = None

    def _reads_low(self, hi: Trace) -> bool:
        """Whether the whole step is read off the trace cut to LOW blocks as well as `hi`, the
        HIGH-block one: where one block more cannot be read off its last (`_more`), unless the
        model is traced whole anyway (a stack shallower than EXACT_BLOCKS whose events do not
        repeat block by block: `_stitched`)."""
        return hi.stack is not None and self._more(hi) is None and \
            (repeats(hi, hi.stack.blocks) or hi.stack.blocks >= EXACT_BLOCKS)

    def _more(self, tr: Trace) -> Trace | None:
        """`tr` with one block more (depth.py `extend`), made once per trace."""
        hit = self._extended.get(id(tr))
        if hit is None or hit[0] is not tr:
            hit = self._extended[id(tr)] = (tr, extend(tr))
        return hit[1]

    def exact(self, job, sem: KernelSemantics, batch: int) -> Trace:
        """The trace of `job` at micro-batch `batch`: real (traced now if it was not), or
        stitched from real cut traces (depth.py)."""
        if self._cuts(job, sem):
            hit = self._stitched(job, sem, batch, "exact")
            if hit is not None:
                return hit[0]
        return self._real(job, sem, batch)

    def prefetch(self, requests: list[tuple], forwards: list[tuple] = ()) -> None:
        """Trace each (job, semantics, batch) not yet traced, in parallel where cores allow
        (trace/parallel.py); a cut model's two cut traces; with the generation `forwards`
        (`asked`). A failure is left for `exact` to raise when it is asked for. While
        deferring, the requests are recorded instead."""
        todo = []
        for job, sem, batch in requests:
            job, sem = same_step(*(half_twin(job, sem) or (job, sem)))
            if job.grad_accum > 1 and derivable(sem):    # accumulate.py: read off this one
                job = job.with_(grad_accum=1)
            todo.append((job, sem, batch, HIGH if self._cuts(job, sem) else None))
        if self.deferring is not None:
            missing = [r for r in todo if not self._held(*r)]
            if missing:
                self.deferring.extend(missing)
                raise Deferred
            return
        self.fill(todo, at_least=2, forwards=forwards)

    def _held(self, job, sem: KernelSemantics, batch: int, depth: int | None) -> bool:
        """Whether the trace is in this cache, after reading it from the disk store or taking
        its attention twin's where it is there: what `fill` traces only where it is not, and
        `prefetch`, while deferring, defers only where it is not (so a memory curve, within
        `made_only`, reads the traces an earlier run stored as the run that made them does)."""
        key = self._key(job, sem, depth)
        at = key + (batch,)
        if at not in self._exact and at not in self._absent:
            self._load(key, job, sem, batch, depth)
            if at not in self._exact:    # not stored: not looked for again (what this process
                self._absent.add(at)     # traces goes in _exact)
        if at not in self._exact:
            shared = self._shared(job, sem, batch, depth)
            if shared is not None:
                self._store(key, batch, shared)
        return at in self._exact

    @staticmethod
    def asked(ask: Callable) -> list[tuple]:
        """The generation forwards not traced yet that `ask()` asks for (`defer_forward`),
        recorded for `prefetch` or `fill` instead of traced."""
        forwards: list[tuple] = []
        token = _FORWARDS.set(forwards)
        try:
            ask()
        finally:
            _FORWARDS.reset(token)
        return forwards

    def fill(self, requests: list[tuple], at_least: int = 1, forwards: list[tuple] = ()) -> None:
        """Trace each (job, semantics, batch, depth) not yet traced, at once on all cores, when
        there are `at_least` of them, and each generation forward (key, `Forward`, keep) of
        `defer_forward`. A flash trace whose memory-efficient twin is traced in the
        same call waits for it and is made only if the twin could take flash (`attention_twin`;
        a free core makes it anyway rather than idle)."""
        todo, seen = [], set()
        for job, sem, batch, depth in requests:
            key = self._key(job, sem, depth) + (batch,)
            if key not in self._exact and key not in seen and key not in self._failed:
                seen.add(key)
                todo.append((key, trace_job(job), sem, batch, depth))
        fwd = list({key: (request, keep) for key, request, keep in forwards}.values())
        if len(todo) + len(fwd) < at_least:
            return
        todo = [r for r in todo if not self._held(*r[1:])]
        if not todo and not fwd:
            return
        first, then = self._pairs(todo)
        steps = len(first)
        requests = [r[1:] for r in first] + [request for request, _keep in fwd]
        followups = [then[i][1:] if i in then else None for i in range(steps)] + [None] * len(fwd)

        def policy(i, done, result):
            if i >= steps:
                return SKIP
            if done:
                self._learn(first[i][1], first[i][2], result)
                same = isinstance(result, Trace) and result.flash_eligible == 0
                return SKIP if i not in then or same else RUN
            hint = self._hint(then[i][1], then[i][2])
            return RUN if hint else WAIT if hint is False else IDLE

        def started(kind, i):
            if not self._progress:
                return
            if i >= steps:
                f = fwd[i - steps][0]
                self._progress(describe_forward(f.job, f.sem, f.batch, f.new_tokens, f.context))
                return
            _key, tj, sem, batch, _d = first[i] if kind == "r" else then[i]
            self._progress(describe(tj, sem, batch))

        out = trace_all(requests, followups, policy, started, finish=prepare)
        results, more = out if then else (out, [None] * len(requests))
        for (_request, keep), tr in zip(fwd, results[steps:]):
            keep(tr)
        for i, ((key, tj, sem, _b, _d), tr) in enumerate(zip(first, results)):
            self._keep(key, tj, sem, tr, True)
            if i in then:
                fkey, ftj, fsem = then[i][:3]
                if more[i] is not None or not isinstance(tr, Trace):
                    self._keep(fkey, ftj, fsem, more[i], True)
                else:                     # the same step (policy: not made)
                    self._keep(fkey, ftj, fsem, _as(tr, fsem), False)

    def _pairs(self, todo: list[tuple]) -> tuple[list[tuple], dict[int, tuple]]:
        """(requests, {i: the flash request that waits for request i}): a flash request whose
        memory-efficient twin is also asked for, or, where this model's traces have not taken
        flash (`_hint`), whose twin is added to be traced first."""
        index = {(key[0], key[1], key[2], key[3]): n for n, (key, *_r) in enumerate(todo)}
        waiting: dict[int, int | None] = {}
        for n, (key, tj, sem, batch, depth) in enumerate(todo):
            if sem.attention != "flash":
                continue
            m = index.get((key[0], attention_twin(sem).key(), key[2], key[3]))
            if m is not None:
                waiting[n] = m
            elif self._hint(tj, sem) is False:
                waiting[n] = None
        first = [r for n, r in enumerate(todo) if n not in waiting]
        at = {id(r): i for i, r in enumerate(first)}
        then = {}
        for n, m in waiting.items():
            key, tj, sem, batch, depth = todo[n]
            if m is None:                 # its twin, traced first
                twin = attention_twin(sem)
                first.append((self._key(tj, twin, depth) + (batch,), tj, twin, batch, depth))
                then[len(first) - 1] = todo[n]
            else:
                then[at[id(todo[m])]] = todo[n]
        return first, then

    def _keep(self, key: tuple, tj, sem: KernelSemantics, tr, traced: bool) -> None:
        """A trace from `fill` (`traced`: made, not shared): cached, stored on disk, learnt
        from; a failure (or none) recorded as failed."""
        if isinstance(tr, Trace):
            store.save(store.key(tj, sem, key[-1], key[-2]), tr)
            self._store(key[:-1], key[-1], tr, "traced" if traced else None)
            self._learn(tj, sem, tr)
        else:
            self._failed.add(key)

    @contextlib.contextmanager
    def made_only(self):
        """Within: read only traces made already (in this cache, or in the disk store from an
        earlier run); asking for any other raises `Deferred`, generation forwards included, so
        the caller leaves out what would need a new trace (plan/extras.py's memory curves)."""
        old, token = self.deferring, _MAKING.set(False)
        self.deferring = []
        try:
            yield
        finally:
            self.deferring = old
            _MAKING.reset(token)

    def in_rounds(self, tasks: list[Callable]) -> list:
        """Each task's result, the traces they need made in parallel rounds: every round runs
        the unfinished tasks until each asks for a trace not made yet (`Deferred`), then makes all
        of those at once on all cores (generation forwards too: `defer_forward`). A task restarts from its beginning each round; what it
        computed before is cached (planner.py), so a round costs the new traces only. The
        results are those of running the tasks one after another."""
        results: dict[int, object] = {}
        pending = list(range(len(tasks)))
        while pending:
            self.deferring, still, forwards = [], [], []
            token = _FORWARDS.set(forwards)
            try:
                for i in pending:
                    try:
                        results[i] = tasks[i]()
                    except Deferred:
                        still.append(i)
                requests = self.deferring
            finally:
                self.deferring = None
                _FORWARDS.reset(token)
            if still and not requests and not forwards:
                raise RuntimeError("a task deferred without naming a trace")
            self.fill(requests, forwards=forwards)
            pending = still
        return [results[i] for i in range(len(tasks))]

    def between(self, job, sem: KernelSemantics, batch: int, lo: int, hi: int,
                depth: int | None = None) -> Trace:
        """The trace at `batch` on the line through the real traces at `lo` and `hi` (traced if
        needed): interpolated for lo < batch < hi, extrapolated for batch > hi; the real trace
        at `batch` where the two run different ops (interpolate.py). `depth`: of the model cut
        to that many blocks."""
        memo = self._key(job, sem, depth) + (batch, lo, hi)
        if memo in self._between:
            return self._between[memo]
        if batch in (lo, hi) or not self.on_line(job, sem, lo, hi, depth):
            return self._real(job, sem, batch, depth)
        t_lo, t_hi = self._real(job, sem, lo, depth), self._real(job, sem, hi, depth)
        self._between[memo] = trace_between(t_lo, t_hi, batch, extrapolate=batch > hi)
        return self._between[memo]

    def on_line(self, job, sem: KernelSemantics, lo: int | None = None,
                hi: int | None = None, depth: int | None = None) -> bool:
        """Whether the real traces at `lo` and `hi` run the same ops, so that other micro-batches
        can be read off their line (interpolate.same_shape_family; traced if needed); for a cut
        model, whether the cut models' it reads do (`_reads_low`). Default: the job's anchors."""
        if lo is None or hi is None:
            lo, hi = anchors(job)
        if depth is None and self._cuts(job, sem):   # the HIGH-block traces', and the LOW-
            if not self.on_line(job, sem, lo, hi, HIGH):   # block ones' where those are read
                return False
            return not self._reads_low(self._real(job, sem, lo, HIGH)) or \
                self.on_line(job, sem, lo, hi, LOW)
        family = self._key(job, sem, depth) + (lo, hi)
        if family not in self._family:
            self._family[family] = same_shape_family(
                *every([lambda b=b: self._real(job, sem, b, depth) for b in (lo, hi)]))
        return self._family[family]

    def _at(self, job, sem: KernelSemantics, batch: int, depth: int | None) -> tuple[Trace, bool]:
        pair = anchors(job)
        if batch == 1 or batch in pair:
            return self._real(job, sem, batch, depth), False
        tr = self.between(job, sem, batch, *pair, depth=depth)
        return tr, tr is not self._exact.get(self._key(job, sem, depth) + (batch,))

    def at(self, job, sem: KernelSemantics, batch: int) -> tuple[Trace, bool]:
        """(trace at `batch`, interpolated?): a real trace at 1 and at the anchors (2 and
        32), else the line through the anchors (interpolate.py: between them or beyond); the
        real trace at `batch` where the anchors run different ops. Which micro-batches are traced
        never depends on the batch asked about, so neither does any answer. A cut model's trace
        is stitched from its cut models' (depth.py)."""
        if self._cuts(job, sem):
            hit = self._stitched(job, sem, batch, "at")
            if hit is not None:
                return hit
        return self._at(job, sem, batch, None)


def same_step(job, sem: KernelSemantics) -> tuple:
    """(job, sem) as traced: an fp16 AMP job whose target computes in bf16 (a TPU: XLA runs AMP
    in bf16, target.py) runs the bf16 AMP job's step, ops, dtypes and all; it is traced as that
    job, so a plan traces it once for the TPU and for an fp16 GPU's bf16 twin (`half_twin`)."""
    if sem.autocast_dtype is torch.bfloat16 and job.precision.amp and job.precision.is_fp16:
        return job.with_(precision=job.precision.with_compute("bf16")), sem
    return job, sem


def attention_twin(sem: KernelSemantics) -> KernelSemantics | None:
    """The flash semantics' memory-efficient twin and back. The two part only where an SDPA
    call can take flash (no mask, 16-bit, head dim <= 256: semantics.py `_sdpa`); a step with no
    such call (an attention bias such as ALiBi, a padding mask, fp32, no SDPA at all: CNNs) runs
    the same ops, allocations and FLOPs under either, and one trace serves both
    (`Trace.flash_eligible` == 0)."""
    other = {"flash": "efficient", "efficient": "flash"}.get(sem.attention)
    return replace(sem, attention=other) if other else None


def _hint_key(job, sem: KernelSemantics) -> tuple:
    """What `Traces._hint` is kept by: the model and what decides its SDPA calls' dtype."""
    return (job.model, job.precision.name, job.attention, str(sem.autocast_dtype),
            sem.channels_last)


def _as(tr: Trace, sem: KernelSemantics) -> Trace:
    """`tr` under semantics `sem` (the same step: `attention_twin`)."""
    return tr if tr.semantics == sem else keep_replays(tr, replace(tr, semantics=sem))


def half_twin(job, sem: KernelSemantics) -> tuple | None:
    """(the job in bf16, its semantics) for an fp16 job (AMP or pure), else None. fp16 and bf16
    are both 2 bytes and autocast casts the same ops to either, so the two steps allocate the
    same bytes and run the same ops; only the dtype the kernels compute in differs, which the
    time model reads per op (timing.py). One trace serves both (tests/test_depth.py)."""
    if sem.autocast_dtype is torch.float16 or (sem.autocast_dtype is None and job.precision.is_fp16):
        twin = job.with_(precision=job.precision.with_compute("bf16"))
        return twin, replace(sem, autocast_dtype=torch.bfloat16 if sem.autocast_dtype else None)
    return None


_DTYPE_TWIN = {"bfloat16": "float16", "torch.bfloat16": "torch.float16"}


def relabel(tr: Trace, sem: KernelSemantics) -> Trace:
    """The bf16 twin's trace as the fp16 job's: each op's dtype and the semantics renamed."""
    ops, made = [], {}
    for r in tr.ops:
        if r.dtype in _DTYPE_TWIN:
            if id(r) not in made:          # a record repeated (a stitched trace's blocks: the
                made[id(r)] = copy.copy(r)  # same object) stays one object (optable._in_order)
                made[id(r)].dtype = _DTYPE_TWIN[r.dtype]
            r = made[id(r)]
        ops.append(r)
    return keep_replays(tr, replace(tr, ops=ops, semantics=sem))


def anchors_for(job, batch: int) -> list[int]:
    """The real traces evaluating micro-batch `batch` reads (what to prefetch): the anchors, whose
    line gives the trace and the allocator's fragmentation (evaluate.memory_at), and 1 itself.
    Micro-batch 1 reads only the smaller anchor's fragmentation: the larger one is left until a
    search for the largest micro-batch asks for it (a 70B job on one GPU never does)."""
    pair = anchors(job)
    return [1, pair[0]] if batch == 1 else list(pair)
