"""The trace cache every prediction shares: a job's trace at any micro-batch, whole or read off
its cut model's (stitch.py), real or read off the line through two real ones (interpolate.py).

    Traces.exact(job, sem, b)  the trace at micro-batch b: real, or stitched from real cut ones
    Traces.at(job, sem, b)     (trace, interpolated?): real at 1 and at the anchors (anchoring.py),
                               else the line through the anchors, stitched where the model is cut

A model with a deep stack of alike blocks (trace/stack.py) is traced cut to HIGH blocks, and the
whole step is stitched from that trace and what its last block does (stitch.py `extend`), or from
a second trace cut to LOW where one block more cannot be read off the last (a mixture of experts,
events that do not repeat). A vision-language model's text stack is cut too, its vision tower
traced whole in the cut trace. A job that freezes some blocks by name (LLaMA-Factory's freeze
tuning) is traced whole: its blocks are not alike. The real traces come from cache.py (with the
twins a step shares: twins.py), made in parallel rounds where a caller asks in rounds
(rounds.py, schedule.py).
"""
from __future__ import annotations

import re
from collections.abc import Callable

from ...models import stack_hint
from ..facts import Trace
from ..semantics import KernelSemantics
from ..stack import EXACT_BLOCKS, HIGH, LOW, MIN_BLOCKS
from .. import store
from .anchoring import anchors, trace_job
from .interpolate import Peaks, peaks_read, same_shape_family, trace_between
from .repeat import repeats
from .rounds import every
from .schedule import Scheduling
from .stitch import one_more, stitch

_BLOCK_INDEX = re.compile(r"\.\d+(\.|$)")    # a frozen prefix naming one block: model.layers.3


class Traces(Scheduling):
    """Trace cache for one job and its variants (module docstring); `progress(msg)` is told
    about every real trace. `cut` (default True): a model with a deep stack of alike blocks is
    traced cut; False traces every block."""

    def __init__(self, progress: Callable[[str], None] | None = None, cut: bool = True):
        super().__init__(progress)
        self._between: dict[tuple, Trace] = {}
        self._family: dict[tuple, bool] = {}        # do the traces at (lo, hi) run the same ops?
        self._depths: dict[tuple, int | None] = {}  # (model, dims) -> blocks its config names,
                                                    # None once traced whole (_traced_whole)
        self._whole: dict[tuple, tuple[Trace, bool]] = {}   # stitched traces
        self._unsaved: dict[int, tuple] = {}     # interpolated cut traces whose peaks are
                                                 # stored once read: (name, it, its anchors)
        self._cut = cut

    def _cuts(self, job, sem: KernelSemantics) -> bool:
        """Whether `job` is traced cut: its model names a stack deep enough to cut and no block
        is frozen by name (module docstring)."""
        if not self._cut or any(_BLOCK_INDEX.search(f) for f in job.frozen):
            return False          # some blocks frozen, others not: the blocks are not alike
        model = (job.model, job.transformer)     # what stack_hint reads
        if model not in self._depths:
            self._depths[model] = stack_hint(job)
        return (self._depths[model] or 0) >= MIN_BLOCKS

    def traced_batches(self, job, sem: KernelSemantics) -> list[int]:
        depth = HIGH if self._cuts(job, sem) else None
        return list(self._batches.get(self._key(job, sem, depth), ()))

    def exact(self, job, sem: KernelSemantics, batch: int) -> Trace:
        """The trace of `job` at micro-batch `batch`: real (traced now if it was not), or
        stitched from real cut traces."""
        if self._cuts(job, sem):
            hit = self._stitched(job, sem, batch, "exact")
            if hit is not None:
                return hit[0]
        return self._real(job, sem, batch)

    def at(self, job, sem: KernelSemantics, batch: int) -> tuple[Trace, bool]:
        """(trace at `batch`, interpolated?): a real trace at 1 and at the anchors, else the
        line through the anchors (interpolate.py: between them or beyond); the real trace at
        `batch` where the anchors run different ops. A cut model's trace is stitched from its
        cut models' at the same micro-batch."""
        if self._cuts(job, sem):
            hit = self._stitched(job, sem, batch, "at")
            if hit is not None:
                return hit
        return self._at(job, sem, batch, None)

    def _at(self, job, sem: KernelSemantics, batch: int, depth: int | None) -> tuple[Trace, bool]:
        pair = anchors(job)
        if batch == 1 or batch in pair:
            return self._real(job, sem, batch, depth), False
        tr = self.between(job, sem, batch, *pair, depth=depth)
        return tr, tr is not self._exact.get(self._key(job, sem, depth) + (batch,))

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
        name = store.key(trace_job(job), sem, f"{batch} on {lo}-{hi}", depth)
        known = store.load(name, "peaks")
        known = known if isinstance(known, Peaks) else None     # absent, or not what it says
        tr = self._between[memo] = trace_between(t_lo, t_hi, batch, extrapolate=batch > hi,
                                                 known=known)
        if known is None:
            if depth is None:
                store.save(name, peaks_read(tr, t_lo, t_hi), "peaks")
            else:                 # once stitch.py has read its peaks over the stack
                self._unsaved[id(tr)] = (name, tr, t_lo, t_hi)
        return tr

    def _keep_peaks(self, *parts: Trace) -> None:
        """Store what was read of each interpolated cut trace in `parts` (`between`): the next
        plan of the job reads its peaks without replaying its anchors' logs."""
        for tr in parts:
            if tr is None:
                continue
            name, *made = self._unsaved.pop(id(tr), (None,))
            if name is not None:
                store.save(name, peaks_read(*made), "peaks")

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

    def _stitched(self, job, sem: KernelSemantics, batch: int, how: str
                  ) -> tuple[Trace, bool] | None:
        """The whole model's trace at `batch` from its cut traces (`how`: "exact" or "at"), or
        None where the model is not cut (then it is marked to be traced whole)."""
        memo = self._key(job, sem) + (how, batch)
        if memo not in self._whole:
            def part(d):
                return (self._real(job, sem, batch, d), False) if how == "exact" else \
                    self._at(job, sem, batch, d)
            hi, between = part(HIGH)
            more = one_more(hi)
            whole = stitch(hi, more, tagged=hi) if more is not None else None
            lo = None
            if whole is None and self._reads_low(hi):
                lo, lo_between = part(LOW)
                whole, between = stitch(lo, hi), between or lo_between
            self._keep_peaks(hi, lo)
            if whole is not None and not whole.derived.repeats and \
                    whole.stack.blocks < EXACT_BLOCKS:
                whole = None      # the allocator's waste only within a band: traced whole
            if whole is None:
                self._traced_whole(job)
                return None
            self._whole[memo] = (whole, between)
        return self._whole[memo]

    def _traced_whole(self, job) -> None:
        """`job`'s model is traced whole from now on, this variant and the others (`_cuts`): its
        built model has no stack of alike blocks (trace/stack.py `cut`: T5's first block owns
        the relative position bias), so its traces "cut" to HIGH blocks are whole ones, kept as
        such; or its stack is shallower than EXACT_BLOCKS and its allocations do not repeat
        block by block (BERT), so the whole step cannot be read off a cut trace. Both are the
        built model's, not the variant's: cutting the next rung's trace would be the same wasted
        trace. (A variant whose events alone did not repeat, Apple's per-parameter optimizer
        loop, made every later trace of its model whole, Llama-3.2-1B's over every platform
        among them, until repeat.py `_merge_lagging_frees`.) The whole traces then asked for reuse the "cut" ones that are whole
        (cache.py `_shared`)."""
        self._depths[(job.model, job.transformer)] = None

    def _reads_low(self, hi: Trace) -> bool:
        """Whether the whole step is read off the trace cut to LOW blocks as well as `hi`, the
        HIGH-block one: where one block more cannot be read off its last (stitch.py
        `one_more`), unless the model is traced whole anyway (a stack shallower than
        EXACT_BLOCKS whose events do not repeat block by block: `_stitched`)."""
        return hi.stack is not None and one_more(hi) is None and \
            (repeats(hi, hi.stack.blocks) or hi.stack.blocks >= EXACT_BLOCKS)
