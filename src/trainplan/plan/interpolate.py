"""A traced step at micro-batch b, from traces of the same job at two other micro-batches.

For a fixed input shape a training step runs the same ops at every micro-batch size; only their
sizes change, and every size is affine in the batch b: an activation is b x (per-sample shape),
a matmul's FLOPs b x (per-sample FLOPs), a weight, gradient or optimizer state does not depend on
b at all. So each per-op FLOP and byte count, each allocation and each phase's live bytes by
category is  x(b) = x(lo) + (b - lo) / (hi - lo) x (x(hi) - x(lo)).

Where that holds exactly the interpolated trace equals a traced one (tests/test_plan_interpolate.py
checks a model at three batches). Where a phase's peak moves to another op as b grows, the peak is
a maximum of affine functions -- convex in b -- and the chord between two traced batches lies
above it: interpolation then over-states memory, never under-states it. That is why the planner
interpolates only between traced batches (lo < b < hi) and never extrapolates.

The two traces must run the same op sequence (`same_shape_family`); otherwise (data-dependent
control flow, a kernel that changes with size) the planner traces b itself.
"""
from __future__ import annotations

from dataclasses import replace

from ..trace.counters import OpRecord
from ..trace.tracer import ModuleRow, Trace


def same_shape_family(lo: Trace, hi: Trace) -> bool:
    """True when the two traces ran the same ops and allocations in the same order."""
    if len(lo.ops) != len(hi.ops) or len(lo.alloc_events) != len(hi.alloc_events):
        return False
    if lo.phase_peaks.keys() != hi.phase_peaks.keys() or len(lo.modules) != len(hi.modules):
        return False
    for a, b in zip(lo.ops, hi.ops):
        if a.name != b.name or a.phase != b.phase or a.dtype != b.dtype or a.recompute != b.recompute:
            return False
    return all(a[0] == b[0] and (a[1] > 0) == (b[1] > 0)
               for a, b in zip(lo.alloc_events, hi.alloc_events))


def trace_between(lo: Trace, hi: Trace, batch: int) -> Trace:
    """The trace at `batch`, lo.batch_size < batch < hi.batch_size, by affine interpolation."""
    b0, b1 = lo.batch_size, hi.batch_size
    if not b0 < batch < b1:
        raise ValueError(f"batch {batch} is not strictly between {b0} and {b1}")
    f = (batch - b0) / (b1 - b0)

    def num(x0, x1):
        return x0 + f * (x1 - x0)

    def whole(x0, x1) -> int:
        return int(round(num(x0, x1)))

    def nested(d0: dict, d1: dict) -> dict:
        return {k: {kk: num(v, d1[k][kk]) for kk, v in inner.items()} for k, inner in d0.items()}

    ops = [OpRecord(a.name, a.family, a.phase, num(a.flops, b.flops), num(a.bytes, b.bytes),
                    a.dtype, a.module, a.recompute) for a, b in zip(lo.ops, hi.ops)]
    events = [(a[0], whole(a[1], b[1])) for a, b in zip(lo.alloc_events, hi.alloc_events)]
    phase_peaks = {ph: (whole(lo.phase_peaks[ph][0], hi.phase_peaks[ph][0]),
                        {c: whole(v, hi.phase_peaks[ph][1][c]) for c, v in lo.phase_peaks[ph][1].items()})
                   for ph in lo.phase_peaks}
    peak_phase = max(phase_peaks, key=lambda ph: phase_peaks[ph][0])
    modules = [ModuleRow(a.name, a.depth, a.params, a.trainable_params,
                         whole(a.activation_bytes, b.activation_bytes),
                         num(a.flops_forward, b.flops_forward), num(a.flops_backward, b.flops_backward))
               for a, b in zip(lo.modules, hi.modules)]
    timeline = ([(p, whole(x, y)) for (p, x), (_q, y) in zip(lo.timeline, hi.timeline)]
                if len(lo.timeline) == len(hi.timeline) else list(hi.timeline))
    return replace(
        hi, batch_size=batch, ops=ops, alloc_events=events, phase_peaks=phase_peaks,
        peak_phase=peak_phase, peak_allocated_bytes=phase_peaks[peak_phase][0],
        peak_breakdown_bytes=dict(phase_peaks[peak_phase][1]),
        flops=nested(lo.flops, hi.flops), bytes_moved=nested(lo.bytes_moved, hi.bytes_moved),
        recompute_flops=num(lo.recompute_flops, hi.recompute_flops),
        activation_bytes=whole(lo.activation_bytes, hi.activation_bytes),
        weight_cast_bytes=whole(lo.weight_cast_bytes, hi.weight_cast_bytes),
        modules=modules, timeline=timeline, trace_seconds=0.0,
        notes=list(hi.notes))
