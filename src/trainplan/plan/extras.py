"""What the plan reports show beside the plan itself, computed here in plan/ so that the reports
only render (report/plan_document.py):

    memory_vs_micro_batch   device memory per device at several micro-batches, for the top
                            platforms (the HTML chart and the Markdown table of it)
    catalog                 per platform, the catalog facts and dates the plan rests on
                            (session limit, quota, host RAM, disk, price; `as_of` of the
                            platform row and of its accelerator row; source ids)

report/plan_document.py adds both under their own top-level keys of the one document Markdown,
HTML and `--format json` render.

Memory against micro-batch. Every point is the prediction core's evaluation of the job at that
micro-batch (predict/evaluate.py): read off the line through the anchor traces (trace/derive/traces.py,
the same numbers as a real trace). The curve costs no trace the plan did not already take
(`Traces.made_only`): where the plan did not trace both anchors, or they do not run the same ops
(data-dependent control flow), nothing is read off their line and the curve keeps the
micro-batches already traced; a point that needs another trace (a generating job's rollout at
another batch) is left out, and a curve left with one point is not drawn. With P = ceil(target batch /
devices) the per-device batch: when the plan runs P with no accumulation, hi = max(2P, 8), so the
chart shows how far the headroom goes; when it accumulates, hi = P - 1, the largest micro-batch that
still needs accumulation (the planner's own search range). The job is the job as planned on that
platform: adapted to its devices, with the fix-ladder rungs it keeps, and its accumulation.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..accelerators import get_accelerator
from ..errors import TrainplanError
from ..predict.target import semantics_for
from ..trace.derive import Deferred
from .fixes import apply
from .planner import platform_job

CURVE_PLATFORMS = 4     # platforms with a memory curve: the top-ranked distinct configurations
CURVE_POINTS = 8        # micro-batches per curve, evenly spaced over [1, hi], plus P and the plan's
CURVE_MIN_HI = 8        # without accumulation the curve reaches at least this micro-batch


@dataclass(frozen=True)
class CurvePoint:
    micro_batch_size: int
    device_used_bytes: int
    fits: bool
    interpolated: bool


@dataclass(frozen=True)
class MemoryCurve:
    platform_id: str
    accelerator_id: str
    devices: int
    grad_accum: int
    capacity_bytes: int
    planned_micro_batch_size: int
    per_device_batch: int
    points: tuple[CurvePoint, ...]


@dataclass(frozen=True)
class CatalogRow:
    """The catalog facts one platform's plan rests on (None: no limit or not published)."""

    platform_id: str
    platform_as_of: str | None
    status_as_of: str | None
    accelerator_id: str
    accelerator_as_of: str | None
    sources: tuple[str, ...]
    session_max_s: float | None
    idle_timeout_s: float | None
    weekly_quota_s: float | None
    ram_bytes: int | None
    cpu_cores: int | None
    disk_bytes: int | None
    usd_per_hour: float
    usd_per_month: float | None
    background_execution: bool


@dataclass(frozen=True)
class ReportExtras:
    memory_curves: tuple[MemoryCurve, ...] = ()
    catalog: tuple[CatalogRow, ...] = ()


def curve_batches(per_device: int, planned: int, accumulating: bool,
                  points: int = CURVE_POINTS) -> list[int]:
    """Micro-batches for a curve: `points` evenly spaced over [1, hi], plus the plan's micro-batch
    and P when it lies in range; hi = P - 1 when accumulating, else max(2P, 8) (module docstring)."""
    hi = max(2, planned, per_device - 1 if accumulating else max(2 * per_device, CURVE_MIN_HI))
    even = {1 + round(i * (hi - 1) / (points - 1)) for i in range(points)}
    return sorted(even | {planned, hi} | ({per_device} if per_device <= hi else set()))


def _variant(planner, platform, pp):
    """The job as planned on the platform: adapted, with the kept ladder rungs, its accumulation."""
    jv, _ = platform_job(planner.job, platform)
    for f in pp.fixes:
        if not f.note:               # a rung that was tried and not kept carries a note
            jv = apply(jv, f.setting)
    return jv.with_(grad_accum=pp.grad_accum)


def memory_curve(planner, platform, pp) -> MemoryCurve | None:
    """Device memory against micro-batch for `pp` (a PlatformPlan) on `platform`, or None
    when the plan has no micro-batch there (the job cannot run on it at all) or fewer than two
    micro-batches can be read without another trace. Only from the
    traces the plan took (`Traces.made_only`): a micro-batch that would need another trace (off
    the anchors' line, or a generating job's rollout at another batch) is left out."""
    if pp.micro_batch_size is None or pp.grad_accum is None:
        return None
    jv = _variant(planner, platform, pp)
    per_device = planner.per_device(platform)
    batches = curve_batches(per_device, pp.micro_batch_size, pp.grad_accum > 1)
    sem = semantics_for(jv, platform.accelerator)
    pts = []
    with planner.traces.made_only():
        try:
            line = planner.traces.on_line(jv, sem)
        except Deferred:             # an anchor the plan did not trace
            line = False
        except TrainplanError:
            return None
        if not line:
            # nothing can be read off the anchors' line (not traced, or the op sequence changes
            # with the batch): keep the micro-batches traced
            traced = planner.traces.traced_batches(jv, sem)
            batches = [b for b in batches if b in traced]
        for b in batches:
            try:
                interpolated, mem = planner.memory(jv, platform, b, pp.grad_accum)
            except Deferred:         # would need a trace the plan did not take
                continue
            except TrainplanError:
                return None
            pts.append(CurvePoint(b, int(mem.device_used_bytes), bool(mem.fits),
                                  bool(interpolated)))
    if len(pts) < 2:                 # one point is the plan's own row: no curve
        return None
    return MemoryCurve(pp.platform_id, pp.accelerator_id, pp.devices, pp.grad_accum,
                       pp.capacity_bytes, pp.micro_batch_size, per_device, tuple(pts))


def memory_curves(planner, plan, platforms, limit: int = CURVE_PLATFORMS) -> tuple[MemoryCurve, ...]:
    """Curves for the `limit` best-ranked current platforms with distinct configurations
    (accelerator, devices, strategy, precision, micro-batch split); `platforms` are the
    Platform rows the plan was made from."""
    by_id = {p.id: p for p in platforms}
    seen, out = set(), []
    for pp in plan.platforms:
        if len(out) >= limit:
            break
        if pp.verdict == "RETIRED" or pp.platform_id not in by_id:
            continue
        key = (pp.accelerator_id, pp.devices, pp.strategy, pp.precision, pp.grad_accum,
               tuple(f.rung for f in pp.fixes if not f.note))
        if key in seen:
            continue
        seen.add(key)
        curve = memory_curve(planner, by_id[pp.platform_id], pp)
        if curve is not None:
            out.append(curve)
    return tuple(out)


def catalog_rows(plan, platforms) -> tuple[CatalogRow, ...]:
    """The catalog row behind each planned platform, in the plan's order."""
    by_id = {p.id: p for p in platforms}
    out = []
    for pp in plan.platforms:
        p = by_id.get(pp.platform_id)
        if p is None:
            continue
        try:
            acc_as_of = get_accelerator(p.accelerator_id).as_of
        except TrainplanError:
            acc_as_of = None
        out.append(CatalogRow(p.id, p.as_of, p.status_as_of, p.accelerator_id, acc_as_of,
                              tuple(p.sources), p.session_max_s, p.idle_timeout_s,
                              p.weekly_quota_s, p.ram_bytes, p.cpu_cores, p.disk_bytes,
                              p.usd_per_hour, p.usd_per_month, p.background_execution))
    return tuple(out)


def plan_extras(plan, platforms, planner=None) -> ReportExtras:
    """Everything the reports add to the plan; memory curves only when a planner (with the
    plan's traces) is given."""
    curves = memory_curves(planner, plan, platforms) if planner is not None else ()
    return ReportExtras(curves, catalog_rows(plan, platforms))
