"""Verdict and checklist for one platform, from what the planner computed.

    RETIRED             catalog status is not current (planned for reference only)
    WON'T FIT           the device memory does not hold the step even after the fix ladder; or
                        the host RAM is too small; or a session is all overhead; or a run that
                        needs several sessions cannot save one checkpoint (disk or file limit)
    READY               fits with no change to the job
    READY WITH CHANGES  fits after the changes listed (in the order to make them)
    TIGHT               fits on paper, within the band of the device's capacity (OOM-prone);
                        the checklist says what gives headroom

The checklist says, item by item, what was checked and with which numbers (like the seeds'
"Configuration Checklist"), so a user can see why, not only what. Numbers stay raw here except
inside the sentences, which use units.py.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..spec import checkpointing_label
from ..strategy import DP
from ..units import fmt_bytes, fmt_int, fmt_seconds, fmt_usd
from .result import READY, READY_WITH_CHANGES, RETIRED, TIGHT, WONT_FIT, CheckItem
from ..predict.memory import FITS, NO_FIT, TIGHT as TIGHT_FIT
from ..predict.offload import NOTE as OFFLOAD_NOTE


def batch_change(job, cfg, devices: int, target: int) -> str | None:
    """The micro-batch change, if the platform's split differs from the job's."""
    b, k = cfg.micro_batch, cfg.grad_accum
    if (b, k) == (job.batch_size, job.grad_accum):
        return None
    glob = b * k * devices
    exact = "" if glob == target else f", target {fmt_int(target)}"
    where = f"on each of {devices} devices" if devices > 1 else "on the device"
    return (f"micro-batch {fmt_int(b)} with {fmt_int(k)} accumulation step{'s' if k > 1 else ''} "
            f"{where} (global batch {fmt_int(glob)}{exact}; "
            f"job: micro-batch {fmt_int(job.batch_size)} x {fmt_int(job.grad_accum)})")


def assess(platform, job, cfg, changes: list[str], sessions, storage, cost, steps: int,
           deadline_s: float | None, budget_usd: float | None, target: int,
           headroom: list[str] | tuple[str, ...] = ()):
    """(verdict, checklist, failure reason or ''). `headroom`: for a tight fit, what gives room."""
    p = platform
    items: list[CheckItem] = []
    fail: list[str] = []
    if not p.is_current:
        when = p.retired_on or p.status_as_of
        items.append(CheckItem("fail", f"{p.name} is {p.status} (since {when}); shown for reference"))
    _device(cfg, items, fail, headroom)
    _batch_and_job(p, cfg, target, items)
    _host(p, cfg, items, fail)
    if sessions is not None:
        _sessions(p, sessions, items, fail)
    if storage is not None:
        _storage(storage, sessions, items, fail)
    if cost is not None:
        items.append(CheckItem("info", f"cost: {fmt_usd(cost.total_usd)}"
                               + (f" ({cost.compute_units:.0f} compute units)" if cost.compute_units else "")))
        if budget_usd is not None:
            items.append(CheckItem("pass" if cost.total_usd <= budget_usd else "fail",
                                   f"budget: {fmt_usd(cost.total_usd)} of {fmt_usd(budget_usd)}"))
    if sessions is not None and deadline_s is not None:
        items.append(CheckItem("pass" if sessions.finish_s <= deadline_s else "fail",
                               f"deadline: finishes in {fmt_seconds(sessions.finish_s)} of "
                               f"{fmt_seconds(deadline_s)}"))
    if cfg.interpolated:
        items.append(CheckItem("info", f"micro-batch {fmt_int(cfg.micro_batch)} read off the line through two "
                                       "traced micro-batches (every allocation and op is affine in "
                                       "the batch: the same numbers as a trace)"))
    items.append(CheckItem("info", f"step time rests on {cfg.evaluation.calibration['text']}"))
    items.extend(CheckItem("info", n) for n in cfg.evaluation.time.notes
                 if n.startswith(OFFLOAD_NOTE))
    if not p.is_current:
        verdict = RETIRED
    elif fail:
        verdict = WONT_FIT
    elif cfg.evaluation.tight:
        verdict = TIGHT
    else:
        verdict = READY if not changes else READY_WITH_CHANGES
    return verdict, tuple(items), "; ".join(fail)


def _device(cfg, items: list[CheckItem], fail: list[str], headroom=()) -> None:
    """Device memory, and what the target cannot run (compatibility errors, warnings)."""
    m = cfg.memory
    used, need, cap = m.device_used_bytes, m.required_bytes, m.capacity_bytes
    room = ("short by " + fmt_bytes(need - cap) if not m.fits else
            f"{max(0.0, m.fit_margin):.0%} free" + (", tight" if m.tight else ""))
    items.append(CheckItem("fail" if not m.fits else "warn" if m.tight else "pass",
                           f"memory per device: {fmt_bytes(used)} of {fmt_bytes(cap)} "
                           f"({room}, peak in {m.peak_phase})"))
    if m.fits and m.band is not None:
        items.append(CheckItem("warn" if m.tight else "info", band_text(m)))
    if not m.fits:
        fail.append(f"needs {fmt_bytes(need)} per device, has {fmt_bytes(cap)}")
    if m.tight and headroom:
        items.append(CheckItem("warn", "for headroom: " + "; ".join(headroom)))
    for f in cfg.findings:
        if f.blocks:
            items.append(CheckItem("fail", f.message + (f" -> {f.fix}" if f.fix else "")))
            fail.append(f.message)
        elif f.severity == "warning" and not (f.kind == "memory" and headroom):
            items.append(CheckItem("warn", f.message + (f" -> {f.fix}" if f.fix else "")))


def band_text(m) -> str:
    """The verdict's band in one sentence: what the device holds, the error it carries and
    what it rests on (predict/bands.py)."""
    b = m.band
    return (f"error band: {fmt_bytes(m.held_bytes)} held + {b.p95:.1%} = "
            f"{fmt_bytes(m.banded_bytes)} of {fmt_bytes(m.capacity_bytes)} ("
            f"{'fits' if not m.tight else 'crosses the capacity'}; the 95th percentile of the "
            f"memory error on {b.rows} validated runs, {b.basis}; "
            f"{m.fit_probability:.0%} of them would fit)")


def _batch_and_job(p, cfg, target: int, items: list[CheckItem]) -> None:
    glob = cfg.micro_batch * cfg.grad_accum * p.devices
    items.append(CheckItem("pass" if glob == target else "warn",
                           f"batch: micro-batch {fmt_int(cfg.micro_batch)} x {fmt_int(cfg.grad_accum)} accumulation x "
                           f"{p.devices} device(s) = {fmt_int(glob)} per step (target {fmt_int(target)})"))
    ckpt = cfg.job.grad_checkpointing
    ep = cfg.job.expert_parallel
    items.append(CheckItem("info", f"precision: {cfg.job.precision.label}; strategy: "
                                   f"{cfg.job.strategy.label}; "
                                   + (f"experts split over {ep} GPUs; " if ep > 1 else "")
                                   + checkpointing_label(ckpt)
                                   + (" (reentrant)" if cfg.job.reentrant_checkpointing else "")))


def _host(p, cfg, items: list[CheckItem], fail: list[str]) -> None:
    """Host RAM and data-loading processes against the platform's CPU."""
    m = cfg.memory
    if cfg.host_ok is None:
        items.append(CheckItem("info", f"host RAM: needs {fmt_bytes(m.host_ram_bytes)}; the platform's "
                                       "RAM is not in the catalog"))
    else:
        items.append(CheckItem("pass" if cfg.host_ok else "fail",
                               f"host RAM: needs {fmt_bytes(m.host_ram_bytes)} of "
                               f"{fmt_bytes(p.ram_bytes)} (model copies per process, offloaded state)"))
        if not cfg.host_ok:
            fail.append(f"host RAM {fmt_bytes(p.ram_bytes)} < {fmt_bytes(m.host_ram_bytes)}")
    workers = cfg.job.num_workers
    if workers and p.cpu_cores:
        procs = 1 if cfg.job.strategy is DP else p.devices
        ok = workers * procs + procs <= p.cpu_cores
        items.append(CheckItem("pass" if ok else "warn",
                               f"data loading: {workers} workers x {procs} process(es) + {procs} "
                               f"training process(es) on {p.cpu_cores} CPU cores"
                               + ("" if ok else f"; use num_workers {max(1, (p.cpu_cores - procs) // procs)}")))


def _sessions(p, sessions, items: list[CheckItem], fail: list[str]) -> None:
    """Session limit, checkpoint cadence, background execution, weekly quota."""
    if sessions.sessions == 0:
        items.append(CheckItem("fail", f"a {fmt_seconds(p.session_max_s)} session is used up by "
                                       f"{fmt_seconds(sessions.overhead_s_per_session)} of overhead"))
        fail.append("a session is all overhead")
    elif p.session_max_s is None:
        items.append(CheckItem("pass", f"one session of {fmt_seconds(sessions.accelerator_s)} "
                                       "(no session limit)"))
    else:
        items.append(CheckItem("pass" if sessions.sessions == 1 else "info",
                               f"sessions: {sessions.sessions} of at most {fmt_seconds(p.session_max_s)}"
                               f" ({fmt_seconds(sessions.overhead_s_per_session)} start-up"
                               + (f" incl. {fmt_seconds(sessions.compile_s_per_session)} XLA compile"
                                  if sessions.compile_s_per_session else "")
                               + " each); resume from the last checkpoint"))
    items.append(CheckItem("info", f"checkpoint every {fmt_int(sessions.checkpoint_every_steps)} steps "
                                   f"(~{fmt_seconds(sessions.checkpoint_every_s)})"))
    if not p.background_execution:
        idle = f" (idle timeout {fmt_seconds(p.idle_timeout_s)})" if p.idle_timeout_s else ""
        items.append(CheckItem("warn", f"no background execution: keep the browser tab open and "
                                       f"active{idle}"))
    if sessions.weekly_quota_s:
        items.append(CheckItem("pass" if (sessions.quota_weeks or 0) <= 1 else "warn",
                               f"quota: {fmt_seconds(sessions.accelerator_s)} of "
                               f"{fmt_seconds(sessions.weekly_quota_s)} a week "
                               f"({sessions.quota_weeks:.2f} weeks of quota)"))


def _storage(storage, sessions, items: list[CheckItem], fail: list[str]) -> None:
    """Checkpoint size against the output disk and file limits (needed to resume)."""
    need_ckpt = sessions is not None and sessions.sessions > 1
    what = "adapters + their optimizer state" if storage.adapter_only else "weights + optimizer state"
    limits = []
    ok = True
    if storage.checkpoints_fit_disk is not None:
        limits.append(f"{fmt_bytes(storage.disk_bytes)} of output disk holds "
                      f"{fmt_int(storage.checkpoints_fit_disk)}")
        ok = ok and storage.checkpoints_fit_disk >= 1
    if storage.checkpoints_fit_files is not None:
        limits.append(f"the {fmt_int(storage.output_file_limit)}-file limit holds {fmt_int(storage.checkpoints_fit_files)}")
        ok = ok and storage.checkpoints_fit_files >= 1
    items.append(CheckItem("pass" if ok else ("fail" if need_ckpt else "warn"),
                           f"checkpoint: {fmt_bytes(storage.checkpoint_bytes)} ({what}, "
                           f"{storage.files_per_checkpoint} file(s))"
                           + ("; " + ", ".join(limits) if limits else "; no disk limit stated")))
    if not ok and need_ckpt:
        fail.append("cannot store one checkpoint to resume from")


# --- the summary line and the estimate's verdict: decided here, from the same marks ----------

RUNS = (READY, READY_WITH_CHANGES, TIGHT)     # verdicts under which the job runs
RUNS_AFTER_CHANGES = READY_WITH_CHANGES      # fits; a setting (precision...) must change first


@dataclass(frozen=True)
class Headline:
    """The one-line summary of a plan. `verdict` is always one of the per-platform marks (the
    mark of `platform_id`), or '' when no platform runs the job; `text` says the rest."""
    verdict: str
    platform_id: str
    name: str
    text: str


def headline(doc: dict) -> Headline:
    """The summary of a plan document (`Plan.to_json()`), from the per-platform verdicts: the
    recommended platform; else the best-ranked platform that runs the job (its own mark, with
    why it is not recommended); else why none runs it. It never says that no platform qualifies
    while one is marked as running the job."""
    plats = doc.get("platforms") or []
    win = next((p for p in plats if p["platform_id"] == doc.get("winner")), None)
    if win is not None:
        return Headline(win["verdict"], win["platform_id"], win.get("name", ""), "")
    runs = next((p for p in plats if p["verdict"] in RUNS), None)
    if runs is not None:
        why = runs.get("reason") or "outside the plan's limits"
        return Headline(runs["verdict"], runs["platform_id"], runs.get("name", ""),
                        f"runs the job, but not within every limit: {why}")
    if plats and all(p["verdict"] == RETIRED for p in plats):
        return Headline("", "", "", "no platform qualifies: every platform asked for is retired")
    if not plats:
        return Headline("", "", "", "no platform qualifies: none was planned")
    return Headline("", "", "", f"no platform qualifies: {WONT_FIT} on every current platform, "
                                "even after the fix ladder")


def estimate_verdict(est) -> tuple[str, str]:
    """(verdict, why) for `trainplan estimate`: the memory's fit state in capitals (predict/
    memory.py's states: FITS, TIGHT, DOES NOT FIT), DOES NOT FIT only for memory (or a finding that
    blocks the job outright); an error that a setting change cures -- bf16 on a T4, which runs
    as fp16 -- is READY WITH CHANGES (the plan's word) with the change, not a memory verdict."""
    m = est.memory
    if not m.fits:
        return NO_FIT.upper(), f"needs {fmt_bytes(m.required_bytes)} per device, has {fmt_bytes(m.capacity_bytes)}"
    errors = [f for f in est.findings if f.severity == "error" and f.kind != "memory"]
    blocking = [f for f in errors if f.blocks and not f.fix]
    if blocking:
        return NO_FIT.upper(), blocking[0].message
    if errors:
        f = errors[0]
        return RUNS_AFTER_CHANGES, f.message + (f" -> {f.fix}" if f.fix else "")
    return (TIGHT_FIT if m.tight else FITS).upper(), ""
