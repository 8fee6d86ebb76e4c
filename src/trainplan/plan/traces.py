"""Traces shared by every platform of a plan: one `Analyzer` per traced job variant.

A trace depends on the model, shapes, precision, optimizer, checkpointing, LoRA/quantisation and
on whether gradients are accumulated (with accumulation a second micro-batch runs with gradients
live), but not on the device count, strategy, offload or accelerator memory: those are applied
afterwards by memory.py and timing.py. So platforms share traces: the key drops the fields that do
not change the traced step, and folds every grad_accum > 1 into 2 (the tracer runs two
micro-batches for any accumulation). Within a variant the Analyzer caches by (kernel semantics,
micro-batch). A micro-batch between two traced ones is interpolated (interpolate.py) instead of
traced, when the two traces run the same ops.
"""
from __future__ import annotations

import bisect
from collections.abc import Callable

from ..estimate import Analyzer
from ..trace.parallel import trace_all
from ..trace.semantics import KernelSemantics
from ..trace.tracer import Trace
from .interpolate import same_shape_family, trace_between

# Job fields that do not change the traced step (applied after tracing, or planning-only).
_UNTRACED = dict(gpus=1, strategy="single", offload="none", gpu=None, platforms=(), steps=None,
                 epochs=None, dataset_size=None, target_batch=None, session_overhead_s=None,
                 num_workers=None, samples_per_s_per_worker=None, batch_size=1)


def trace_job(job):
    """The job as the tracer sees it: untraced fields reset, grad_accum folded to 1 or 2."""
    return job.with_(grad_accum=1 if job.grad_accum <= 1 else 2, **_UNTRACED)


class Traces:
    """Trace cache for one plan; `progress(msg)` is told about every real trace."""

    def __init__(self, progress: Callable[[str], None] | None = None):
        self._analyzers: dict[str, Analyzer] = {}
        self._between: dict[tuple, Trace] = {}
        self._done: dict[tuple, set[int]] = {}     # (variant key, semantics key) -> traced batches
        self._progress = progress
        self.traced = 0

    def analyzer(self, job) -> Analyzer:
        tj = trace_job(job)
        key = repr(tj)
        if key not in self._analyzers:
            self._analyzers[key] = Analyzer(tj, progress=self._progress)
        return self._analyzers[key]

    def traced_batches(self, job, sem: KernelSemantics) -> list[int]:
        return sorted(self._done.get((repr(trace_job(job)), sem.key()), ()))

    def exact(self, job, sem: KernelSemantics, batch: int) -> Trace:
        done = self._done.setdefault((repr(trace_job(job)), sem.key()), set())
        if batch not in done:
            self.traced += 1
            done.add(batch)
        return self.analyzer(job).trace(sem, batch)

    def prefetch(self, requests: list[tuple]) -> None:
        """Trace each (job, semantics, batch) not yet traced, in parallel where cores allow
        (trace/parallel.py). A failure is left for `exact` to raise when that platform is
        planned."""
        todo, seen = [], set()
        for job, sem, batch in requests:
            an = self.analyzer(job)
            key = (id(an), sem.key(), batch)
            if key not in seen and an.needs_trace(sem, batch):
                seen.add(key)
                todo.append((an, sem, batch))
        if len(todo) < 2:
            return
        if self._progress:
            for an, sem, batch in todo:
                self._progress(an.trace_message(sem, batch))
        for (an, sem, batch), tr in zip(todo, trace_all([(an.job, sem, b) for an, sem, b in todo])):
            if isinstance(tr, Trace):
                an.store(sem, batch, tr)
                self._done.setdefault((repr(an.job), sem.key()), set()).add(batch)
                self.traced += 1

    def at(self, job, sem: KernelSemantics, batch: int) -> tuple[Trace, bool]:
        """(trace at `batch`, interpolated?): traced if it was, interpolated between the nearest
        traced batches when both exist and run the same ops, else traced now."""
        done = self.traced_batches(job, sem)
        if batch in done:
            return self.exact(job, sem, batch), False
        i = bisect.bisect_left(done, batch)
        if 0 < i < len(done):
            lo, hi = self.exact(job, sem, done[i - 1]), self.exact(job, sem, done[i])
            key = (repr(trace_job(job)), sem.key(), batch)
            if key in self._between:
                return self._between[key], True
            if same_shape_family(lo, hi):
                tr = trace_between(lo, hi, batch)
                self._between[key] = tr
                return tr, True
        return self.exact(job, sem, batch), False
