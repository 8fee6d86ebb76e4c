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
"""
from __future__ import annotations

import bisect
from collections.abc import Callable

from ..strategy import SINGLE
from ..trace.parallel import trace_all
from ..trace.semantics import KernelSemantics
from ..trace.tracer import Trace, trace_step
from .interpolate import same_shape_family, trace_between

ANCHORS = (2, 32)      # the two real traces every micro-batch >= 2 is read from

# Job fields that do not change the traced step (applied after tracing, or planning-only).
_UNTRACED = dict(gpus=1, strategy=SINGLE, offload="none", gpu=None, platforms=(), steps=None,
                 epochs=None, dataset_size=None, target_batch=None, session_overhead_s=None,
                 num_workers=None, samples_per_s_per_worker=None, batch_size=1,
                 expert_parallel=1)


def trace_job(job):
    """The job as the tracer sees it: untraced fields reset, grad_accum folded to 1 or 2."""
    return job.with_(grad_accum=1 if job.grad_accum <= 1 else 2, **_UNTRACED)


def describe(job, sem: KernelSemantics, batch: int) -> str:
    """The progress line for one trace."""
    return (f"tracing {job.model_label} (micro-batch {batch}, {sem.attention} attention, "
            f"{str(sem.autocast_dtype).replace('torch.', '') if sem.autocast_dtype else 'no autocast'})")


class Traces:
    """Trace cache for one job and its variants; `progress(msg)` is told about every real trace."""

    def __init__(self, progress: Callable[[str], None] | None = None):
        self._exact: dict[tuple, Trace] = {}       # (variant, semantics, batch) -> trace
        self._batches: dict[tuple, list[int]] = {}  # (variant, semantics) -> sorted traced batches
        self._between: dict[tuple, Trace] = {}
        self._family: dict[tuple, bool] = {}        # do the traces at (lo, hi) run the same ops?
        self._keys: dict[int, tuple] = {}           # id(job) -> (job, its variant key)
        self._progress = progress
        self.traced = 0

    def _key(self, job, sem: KernelSemantics) -> tuple:
        """(the traced variant, the kernel semantics); the variant's repr is kept per job object
        (jobs are immutable), since planning asks for the same few jobs thousands of times."""
        hit = self._keys.get(id(job))
        if hit is None or hit[0] is not job:
            hit = self._keys[id(job)] = (job, repr(trace_job(job)))
        return (hit[1], sem.key())

    def traced_batches(self, job, sem: KernelSemantics) -> list[int]:
        return list(self._batches.get(self._key(job, sem), ()))

    def _store(self, key: tuple, batch: int, tr: Trace) -> None:
        self._exact[key + (batch,)] = tr
        bisect.insort(self._batches.setdefault(key, []), batch)
        self.traced += 1

    def exact(self, job, sem: KernelSemantics, batch: int) -> Trace:
        """The real trace of `job` at micro-batch `batch` (traced now if it was not)."""
        key = self._key(job, sem)
        if key + (batch,) not in self._exact:
            if self._progress:
                self._progress(describe(job, sem, batch))
            self._store(key, batch, trace_step(trace_job(job), sem, batch))
        return self._exact[key + (batch,)]

    def prefetch(self, requests: list[tuple]) -> None:
        """Trace each (job, semantics, batch) not yet traced, in parallel where cores allow
        (trace/parallel.py). A failure is left for `exact` to raise when it is asked for."""
        todo, seen = [], set()
        for job, sem, batch in requests:
            key = self._key(job, sem)
            if key + (batch,) not in self._exact and key + (batch,) not in seen:
                seen.add(key + (batch,))
                todo.append((key, trace_job(job), sem, batch))
        if len(todo) < 2:
            return
        if self._progress:
            for _key, tj, sem, batch in todo:
                self._progress(describe(tj, sem, batch))
        for (key, _tj, _sem, batch), tr in zip(todo, trace_all([(tj, sem, b)
                                                                  for _k, tj, sem, b in todo])):
            if isinstance(tr, Trace):
                self._store(key, batch, tr)

    def between(self, job, sem: KernelSemantics, batch: int, lo: int, hi: int) -> Trace:
        """The trace at `batch` on the line through the real traces at `lo` and `hi` (traced if
        needed): interpolated for lo < batch < hi, extrapolated for batch > hi; the real trace
        at `batch` where the two run different ops (interpolate.py)."""
        memo = self._key(job, sem) + (batch, lo, hi)
        if memo in self._between:
            return self._between[memo]
        if batch in (lo, hi) or not self.on_line(job, sem, lo, hi):
            return self.exact(job, sem, batch)
        t_lo, t_hi = self.exact(job, sem, lo), self.exact(job, sem, hi)
        self._between[memo] = trace_between(t_lo, t_hi, batch, extrapolate=batch > hi)
        return self._between[memo]

    def on_line(self, job, sem: KernelSemantics, lo: int = ANCHORS[0],
                hi: int = ANCHORS[1]) -> bool:
        """Whether the real traces at `lo` and `hi` run the same ops, so that other micro-batches
        can be read off their line (interpolate.same_shape_family; traced if needed)."""
        family = self._key(job, sem) + (lo, hi)
        if family not in self._family:
            self._family[family] = same_shape_family(self.exact(job, sem, lo),
                                                     self.exact(job, sem, hi))
        return self._family[family]

    def at(self, job, sem: KernelSemantics, batch: int) -> tuple[Trace, bool]:
        """(trace at `batch`, interpolated?): a real trace at 1 and at the anchors (2 and
        32), else the line through the anchors (interpolate.py: between them or beyond); the
        real trace at `batch` where the anchors run different ops. Which micro-batches are traced
        never depends on the batch asked about, so neither does any answer."""
        if batch == 1 or batch in ANCHORS:
            return self.exact(job, sem, batch), False
        tr = self.between(job, sem, batch, *ANCHORS)
        return tr, tr is not self._exact.get(self._key(job, sem) + (batch,))


def anchors_for(batch: int) -> list[int]:
    """The real traces evaluating micro-batch `batch` reads (what to prefetch): the anchors, whose
    line gives the trace and the allocator's fragmentation (evaluate.memory_at), and 1 itself."""
    return ([1] if batch == 1 else []) + list(ANCHORS)
