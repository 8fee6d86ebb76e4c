"""A traced step at micro-batch b, from traces of the same job at two other micro-batches.

For a fixed input shape a training step runs the same ops at every micro-batch size b >= 2; only
their sizes change, and every size is affine in b: an activation is b x (per-sample shape), a
matmul's FLOPs b x (per-sample FLOPs), a weight, gradient or optimizer state does not depend on b
at all. So each op's FLOPs and bytes and each allocation's size is
x(b) = x(lo) + (b - lo) / (hi - lo) x (x(hi) - x(lo)), between the two traces or beyond the
larger one (`extrapolate`). A phase's peak is not affine (it is the largest of the live totals,
and which allocation reaches it can change as b grows), so it is recomputed from the allocation
sizes by replaying the tracer's memory log (trace/log.py, `phase_peaks_from_log`), and the
allocator model replays the same sizes (allocator.py). The result equals a real trace at b
(tests/test_predict_properties.py checks five kinds of model).

b = 1 is not on the line: broadcasting a batch of one is a view, of more a copy, so traces at 1
differ in bytes; traces.py keeps 1 a real trace of its own. The two traces must run the same op
and allocation sequence (`same_shape_family`); otherwise (data-dependent control flow, a kernel
that changes with size) b itself is traced.
"""
from __future__ import annotations

import functools
import hashlib
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from ..facts import ModuleRow, Trace
from ..lazy import Lazy
from ..log import Alloc, Event, TraceLog, phase_peaks_from_log
from ..shapes import on_line


def same_shape_family(lo: Trace, hi: Trace) -> bool:
    """True when the two traces ran the same ops and allocations in the same order."""
    return family_key(lo) == family_key(hi)


def family_key(tr: Trace) -> bytes:
    """What `same_shape_family` compares, as one digest: the counts of ops, events, memory log
    entries and module rows, the phases, each op's name, phase, dtype, recompute and casting
    flags, and each event's storage serial and whether it allocates or frees. Made where a real
    trace is made (replays.py `prepare`) and stored with it (TraceDerived.family), so that a plan
    from stored traces compares two anchors without unpickling their op records and events (48
    pairs, 0.8 s of a 3.9 s warm Llama-3.2-1B plan over every platform, before)."""
    key = tr.derived.family
    if key is None:
        h = hashlib.blake2b(digest_size=16)
        h.update(repr((len(tr.ops), len(tr.log.events), len(tr.log.memory), len(tr.modules),
                       sorted(tr.phase_peaks))).encode())
        h.update(repr([(o.name, o.phase, o.dtype, o.recompute, o.cast) for o in tr.ops]).encode())
        h.update(repr([(e.serial, e.nbytes > 0) for e in tr.log.events]).encode())
        key = tr.derived.family = h.digest()
    return key


class Peaks(NamedTuple):
    """What a plan reads of an interpolated trace's memory (`peaks_read`): each phase's peaks by
    category, and over whole stacks of other depths (a cut trace's `TraceLog.peaks_memo`, read
    by stitch.py). A few hundred bytes where the replays that give them read the anchor's whole
    memory log (a warm Llama-3.2-1B plan over every platform: 108 interpolated traces, about a
    quarter of its time)."""

    phases: dict
    stacks: dict
    sources: dict          # the anchors' `py:` model files (trace/store.py reads them back
                           # only while those are unchanged, as it reads the anchors)


def peaks_read(tr: Trace, lo: Trace, hi: Trace) -> Peaks:
    """The peaks of `tr`, interpolated between `lo` and `hi`, read so far (`Peaks`)."""
    return Peaks(tr.phase_peaks, dict(tr.log.peaks_memo),
                 {**(lo.sources or {}), **(hi.sources or {})})


def line_values(x0: list[float], x1: list[float], f: float) -> np.ndarray:
    """x0 + f (x1 - x0), elementwise, never below 0 (a size or a count)."""
    a = np.asarray(x0, dtype=np.float64)
    return np.maximum(0.0, a + f * (np.asarray(x1, dtype=np.float64) - a))


def trace_between(lo: Trace, hi: Trace, batch: int, extrapolate: bool = False,
                  known: Peaks | None = None) -> Trace:
    """The trace at `batch`, lo.batch_size < batch < hi.batch_size, by affine interpolation (or,
    with `extrapolate`, batch > hi.batch_size along the same line; no count goes below 0).
    `known`: its peaks as an earlier run read them (`peaks_read`, kept in the trace store by
    traces.py), so that neither anchor's memory log is decoded nor replayed for them again."""
    b0, b1 = lo.batch_size, hi.batch_size
    if not (b0 < batch < b1 or extrapolate and batch > b1 > b0):
        raise ValueError(f"batch {batch} is not strictly between {b0} and {b1}")
    f = (batch - b0) / (b1 - b0)

    def num(x0, x1):
        return max(0.0, x0 + f * (x1 - x0)) if extrapolate else x0 + f * (x1 - x0)

    def whole(x0, x1) -> int:
        return int(round(num(x0, x1)))

    def nested(d0: dict, d1: dict) -> dict:
        return {k: {kk: num(v, d1[k][kk]) for kk, v in inner.items()} for k, inner in d0.items()}

    def interpolated_ops() -> list:
        # every other field (name, dtype, module, recompute, convolution group size) is the
        # same in both traces (same_shape_family): each record is copied, its work changed
        flops = line_values([o.flops for o in lo.ops], [o.flops for o in hi.ops], f)
        moved = line_values([o.bytes for o in lo.ops], [o.bytes for o in hi.ops], f)
        ops, made = [], {}
        for a, b, fl, by in zip(lo.ops, hi.ops, flops.tolist(), moved.tolist()):
            r = made.get((id(a), id(b)))   # this call's copies, by the records they are made
            if r is None:      # of: a record repeated (a stitched trace's blocks) stays one
                r = made[id(a), id(b)] = a.copied(flops=fl, bytes=by,
                                                  shape=on_line(a.shape, b.shape, f))
            ops.append(r)
        return ops

    ops = Lazy(interpolated_ops)
    # every allocation's size is affine in the batch (frees carry the size negated); the phase
    # peaks are recomputed from the sizes exactly as the tracer computes them, since which
    # allocation reaches a phase's peak can change as b grows
    @functools.cache
    def sizes() -> dict[int, int]:      # storage serial -> bytes at `batch`, made where read
        a0 = [e for e in lo.log.memory if type(e) is Alloc]
        a1 = [e.nbytes for e in hi.log.memory if type(e) is Alloc]
        k = np.rint(line_values([e.nbytes for e in a0], a1, f)).astype(np.int64).tolist()
        return {e.serial: kk for e, kk in zip(a0, k)}

    def events():
        at = sizes()
        return [Event(serial, at[serial] if n > 0 else -at[serial])
                for serial, n in lo.log.events]

    def log():
        at = sizes()
        return [Alloc(e.serial, at[e.serial], e.category, e.phase) if type(e) is Alloc else e
                for e in lo.log.memory]

    phase_peaks = known.phases if known is not None else \
        phase_peaks_from_log(lo.log.memory, sizes())
    peak_phase = max(phase_peaks, key=lambda ph: phase_peaks[ph][0])
    modules = Lazy(lambda: [        # made where read (inspect, predict/memory.py)
        ModuleRow(a.name, a.depth, a.params, a.trainable_params,
                  whole(a.activation_bytes, b.activation_bytes),
                  num(a.flops_forward, b.flops_forward), num(a.flops_backward, b.flops_backward))
        for a, b in zip(lo.modules, hi.modules)])
    timeline = Lazy(lambda: [(p, whole(x, y)) for (p, x), (_q, y) in    # made where read
                             zip(lo.log.timeline, hi.log.timeline)]
                    if len(lo.log.timeline) == len(hi.log.timeline) else list(hi.log.timeline))
    # the same step: what repeats where over a whole stack is hi's (repeat.py); so are its
    # blocks, marks and gradients, at the interpolated sizes
    tl = TraceLog(Lazy(log), Lazy(events), hi.log.blocks, hi.log.marks, hi.log.gradients,
                  timeline, repeat_plan=hi.log.repeat_plan, resized=(lo.log, sizes))
    if known is not None:
        tl.peaks_memo.update(known.stacks)
    out = replace(
        hi, batch_size=batch, ops=ops, log=tl, phase_peaks=phase_peaks,
        peak_phase=peak_phase, peak_allocated_bytes=phase_peaks[peak_phase][0],
        peak_breakdown_bytes=dict(phase_peaks[peak_phase][1]),
        flops=nested(lo.flops, hi.flops), bytes_moved=nested(lo.bytes_moved, hi.bytes_moved),
        recompute_flops=num(lo.recompute_flops, hi.recompute_flops),
        activation_bytes=whole(lo.activation_bytes, hi.activation_bytes),
        weight_cast_bytes=whole(lo.weight_cast_bytes, hi.weight_cast_bytes),
        moe_dispatch_elements=whole(lo.moe_dispatch_elements, hi.moe_dispatch_elements),
        modules=modules, trace_seconds=0.0,
        notes=list(hi.notes),
        last_block=None if lo.last_block is None or hi.last_block is None else
        {k: whole(lo.last_block[k], v) for k, v in hi.last_block.items()})
    # its records are lo's with FLOPs and bytes on the line: what one block more adds is read
    # off the anchors' last blocks (stitch.py `block_ops`) without making them
    out.derived.line = (lo, hi, f)
    return out
