"""Plan a job over platforms: the whole `trainplan plan`, as a typed `Plan`.

For every platform (planner.py): adapt the job to the devices, choose micro-batch and
accumulation, and if the device memory does not hold it, climb the fix ladder (fixes.py); if it
fits but misses the deadline, try the speed rungs. Then sessions, quota, checkpoints, cost, the
verdict and checklist (verdict.py), and finally the ranking (rank.py).

Traces are shared: the first pass traces, per kernel semantics, the per-device batches all
platforms need; platforms that must accumulate gradients share the largest-micro-batch search's
anchors (predict/evaluate.py), traced together on all cores. Each platform also reports the
largest micro-batch that fits its accelerator with the plan's accumulation: the same search, the
same answer `trainplan estimate` gives for that job there.
"""
from __future__ import annotations

import functools
from collections.abc import Callable

from ..errors import TrainplanError
from ..platforms import Platform
from .fixes import SPEED_LADDER, describe
from ..predict import MAX_MICRO_BATCH
from .planner import Config, Planner, platform_job, steps_for
from .rank import rank, tier
from .result import (OPTIMIZE, READY, READY_WITH_CHANGES, RETIRED, TIGHT, AsGiven, JobSummary,
                     Plan, PlatformPlan)
from .verdict import assess, batch_change


def _summary(job, cfg: Config | None) -> JobSummary:
    tr = cfg.trace if cfg else None
    return JobSummary(model=job.model, name=job.model_label,
                      params_total=tr.params_total if tr else None,
                      params_trainable=tr.params_trainable if tr else None,
                      precision=job.precision.name, precision_label=job.precision.label,
                      optimizer=job.optimizer.name, strategy=job.strategy.name,
                      batch_size=job.batch_size, grad_accum=job.grad_accum, seq_len=job.seq_len,
                      image_size=job.image_size, lora_rank=job.lora.rank if job.lora else None,
                      quantize=job.quantize.name, grad_checkpointing=job.grad_checkpointing,
                      max_grad_norm=job.max_grad_norm)


def plan_platform(planner: Planner, platform: Platform, jp, base_changes: list[str],
                  deadline_s: float | None, budget_usd: float | None) -> PlatformPlan:
    job = planner.job
    cfg = planner.configure(jp, platform)
    fixes, skipped, headroom = [], [], []
    if not cfg.device_fits:
        _jv, cfg, fixes, skipped = planner.ladder(jp, platform, cfg, need=lambda c: c.device_fits)
    if cfg.device_fits and cfg.evaluation.tight:
        cfg, fixes, skipped, headroom = _headroom(planner, platform, cfg, fixes, skipped)
    glob = cfg.micro_batch * cfg.grad_accum * platform.devices
    steps, _src = steps_for(job, glob)
    sessions = storage = cost = None
    if cfg.device_fits:
        sessions = planner.sessions(cfg, steps)
        if deadline_s is not None and sessions.finish_s > deadline_s:
            _jv, fast, more, skip2 = planner.ladder(
                cfg.job, platform, cfg, rungs=SPEED_LADDER,
                need=lambda c: planner.sessions(c, steps).finish_s <= deadline_s)
            fixes, skipped = fixes + more, skipped + skip2
            if fast is not cfg:
                cfg = fast
                glob = cfg.micro_batch * cfg.grad_accum * platform.devices
                steps, _src = steps_for(job, glob)
                sessions = planner.sessions(cfg, steps)
        storage = planner.storage(cfg)
        cost = planner.cost(cfg, sessions)
    changes = list(base_changes)
    bc = batch_change(job, cfg, platform.devices, planner.target_batch)
    if bc:
        changes.append(bc)
    changes += [f"{f.title} ({describe(f.setting)})"
                + (" -- changes what is trained" if f.changes_training else "")
                for f in fixes if not f.note]
    verdict, checklist, fail = assess(platform, job, cfg, changes, sessions, storage, cost, steps,
                                      deadline_s, budget_usd, planner.target_batch, headroom)
    t, m = cfg.time, cfg.memory
    largest = banded = None
    if not cfg.evaluation.blocked:
        largest = planner.largest(cfg.job, platform, accumulate=cfg.grad_accum > 1,
                                  limit=MAX_MICRO_BATCH)
        banded = planner.largest(cfg.job, platform, accumulate=cfg.grad_accum > 1,
                                 limit=MAX_MICRO_BATCH, margin=True) if largest else None
    return PlatformPlan(
        platform_id=platform.id, name=platform.name, provider=platform.provider,
        accelerator_id=platform.accelerator_id, accelerator_count=platform.accelerator_count,
        devices=platform.devices, status=platform.status,
        retired_on=platform.retired_on or (None if platform.is_current else platform.status_as_of),
        verdict=verdict, fits=cfg.fits and not fail, strategy=cfg.job.strategy.name,
        strategy_label=cfg.job.strategy.label, precision=cfg.job.precision.name,
        precision_label=cfg.job.precision.label, micro_batch_size=cfg.micro_batch,
        grad_accum=cfg.grad_accum, max_micro_batch_size=largest,
        global_batch_size=glob, device_used_bytes=m.device_used_bytes,
        required_bytes=m.required_bytes, capacity_bytes=m.capacity_bytes,
        fit_margin=m.fit_margin, peak_phase=m.peak_phase,
        memory_breakdown_bytes=dict(m.breakdown_bytes), host_ram_bytes=m.host_ram_bytes,
        platform_ram_bytes=platform.ram_bytes, step_time_s=t.step_time_s if t else None,
        step_phases_s=cfg.evaluation.step_phases_s if t else None,
        samples_per_s=t.samples_per_s if t else None, tokens_per_s=t.tokens_per_s if t else None,
        mfu=t.mfu if t else None, bound=getattr(t, "bound", None), steps=steps,
        train_s=steps * t.step_time_s if t else None, sessions=sessions, storage=storage,
        cost=cost, changes=tuple(changes), fixes=tuple(fixes), skipped_fixes=tuple(skipped),
        checklist=checklist, findings=tuple(f.to_dict() for f in cfg.findings),
        within_budget=None if budget_usd is None or cost is None else cost.total_usd <= budget_usd,
        meets_deadline=None if deadline_s is None or sessions is None else sessions.finish_s <= deadline_s,
        interpolated=cfg.interpolated, calibration=cfg.evaluation.calibration,
        headroom=tuple(headroom), reason=fail,
        fit_band=m.band.to_json() if m.band is not None else None,
        fit_probability=m.fit_probability, max_micro_batch_size_with_band=banded)


def _headroom(planner: Planner, platform: Platform, cfg: Config, fixes: list, skipped: list):
    """A job that fits only tightly: climb the ladder for the band's room. Rungs that keep what
    is trained are applied when they leave the band free; otherwise the job stays as it fits and
    the rungs that would help are returned as advice (TIGHT verdict, verdict.py). A rung that
    changes what is trained is neither applied nor advised here, so it is not climbed: it would
    be traced for nothing (chart-rvr: a smaller LoRA rank and half the sequence, two rounds of
    traces), and where it gave the room it ended the climb before a rung that keeps training
    (ZeRO-Offload) was tried."""
    jv, new, more, skip = planner.ladder(cfg.job, platform, cfg, need=lambda c: c.comfortable,
                                         same_training=True)
    if new.comfortable:
        return new, fixes + more, skipped + skip, []
    advice = [f.title for f in more if not f.note] or [
        "a smaller micro-batch with more accumulation, or a device with more memory"]
    return cfg, fixes, skipped, advice


def make_plan(job, platforms: list[Platform], optimize: str = "balanced",
              budget_usd: float | None = None, deadline_s: float | None = None,
              planner: Planner | None = None, progress=None,
              answered: Callable[[list[AsGiven]], None] | None = None) -> Plan:
    """Plan `job` on `platforms` and rank them. Pass a `planner` to reuse its traces (also for
    a variant of its job: another length, batch or budget). `answered` is told the job as written
    on each platform as soon as the first round of traces gives it, before the fix ladders and
    batch searches trace anything more (the CLI prints it while the rest is planned)."""
    if optimize not in OPTIMIZE:
        raise TrainplanError(f"--optimize {optimize!r} is not a choice.", allowed=", ".join(OPTIMIZE))
    if budget_usd is not None and budget_usd < 0:
        raise TrainplanError(f"--budget must be >= 0, got {budget_usd}.")
    if deadline_s is not None and deadline_s <= 0:
        raise TrainplanError("--deadline must be a positive number of hours.")
    if not platforms:
        raise TrainplanError("No platform to plan on.", fix="name some with --platforms, or drop "
                                                            "the option to plan on every current one")
    if planner is None:
        planner = Planner(job, progress=progress)
    elif planner.job != job:          # another job (steps, batch...): share the traces only
        planner = Planner(job, traces=planner.traces, calibration=planner.calibration)
    steps, steps_src = steps_for(job, planner.target_batch)
    adapted = [(platform_job(job, p), p) for p in platforms]
    planner.prime([(jp, p) for (jp, _), p in adapted])
    first = planner.traces.in_rounds([        # rounds: a generating job's rollout forwards too
        functools.partial(planner.evaluate, jp, p, planner.per_device(p), 1)
        for (jp, _), p in adapted])
    first = [(jp, p, c) for ((jp, _), p), c in zip(adapted, first)]
    if answered is not None:
        answered([AsGiven(p.id, c.micro_batch, c.evaluation.fit_state, c.time.step_time_s,
                          c.memory.required_bytes, c.memory.capacity_bytes) for _, p, c in first])
    planner.prime([(jp, p) for jp, p, c in first if not c.fits and planner.per_device(p) > 1],
                  accumulate=True)
    plans = planner.traces.in_rounds([
        functools.partial(plan_platform, planner, p, jp, ch, deadline_s, budget_usd)
        for (jp, ch), p in adapted])
    ranked = rank(plans, optimize, budget_usd, deadline_s)
    best = ranked[0] if ranked and tier(ranked[0]) == 0 else None
    cfg0 = next((planner.configure(jp, p) for (jp, _), p in adapted), None)
    notes = list(dict.fromkeys(cfg0.trace.notes)) if cfg0 else []
    return Plan(job=_summary(job, cfg0), steps=steps, steps_source=steps_src, epochs=job.epochs,
                dataset_size=job.dataset_size, target_batch=planner.target_batch,
                optimize=optimize, budget_usd=budget_usd, deadline_s=deadline_s,
                platforms=tuple(ranked), winner=best.platform_id if best else None,
                recommendation=_recommendation(best, ranked),
                assumptions=_assumptions(job), notes=tuple(notes))


def _recommendation(best: PlatformPlan | None, ranked: list[PlatformPlan]) -> str:
    if best is not None:
        return f"{best.platform_id}: {best.verdict} -- {best.reason}"
    live = [p for p in ranked if p.verdict != RETIRED]
    if live and live[0].verdict in (READY, READY_WITH_CHANGES, TIGHT):
        return f"none within the limits; closest: {live[0].platform_id} ({live[0].reason})"
    return "no platform fits this job, even after the fix ladder; see each platform's fixes"


def _assumptions(job) -> dict:
    from . import sessions as ses
    from .rank import VALUE_OF_TIME_USD_PER_H
    out = {"session_overhead_s": (ses.DEFAULT_SESSION_OVERHEAD_S if job.session_overhead_s is None
                                  else float(job.session_overhead_s)),
           "checkpoint_every_max_s": ses.CHECKPOINT_EVERY_S,
           "value_of_time_usd_per_h": VALUE_OF_TIME_USD_PER_H,
           "quota": "run starts right after a weekly quota reset; sessions back to back"}
    if job.expandable_segments:     # memory replayed with them where the GPU's allocator has them
        out["allocator"] = "expandable segments on CUDA (PYTORCH_CUDA_ALLOC_CONF=" \
                           "expandable_segments:True, set by the exported launch)"
    return out

