"""A job on one platform: devices and strategy, micro-batch and accumulation, memory, step time,
the fix ladder when it does not fit, then sessions, quota, checkpoints and cost.

Devices and strategy. A platform gives `accelerator_count` units of `devices_per_unit` devices
(Kaggle T4 x2: 2 GPUs; TPU v5e-8: 8 chips). The job runs on all of them:
  - one device: a multi-device strategy has nothing to spread over and is planned as `single`
    (ZeRO with CPU offload stays: ZeRO-Offload works on one GPU);
  - several devices and a job that says `single`: data parallel over all of them (DDP via
    `torchrun --nproc-per-node N` on GPUs, one process per core/chip on TPUs), listed as a change;
    that is what a user choosing a 2-GPU platform expects. DataParallel on a TPU becomes DDP;
  - otherwise the job's own strategy (dp, ddp, zero1-3, fsdp) over all the devices.

Global batch. The job's global batch is `target_batch`, or batch_size x grad_accum x devices as
the job is written. On a platform with d devices each device must process P = ceil(G / d)
samples per optimizer step. If micro-batch P fits it runs with no accumulation; otherwise the
largest micro-batch c < P that fits is found and split as b x k with k = ceil(P / b), preferring
a b that divides P (exact global batch) when one exists in [c/2, c] (8 x 4 rather than 11 x 3 for
P = 32). The largest micro-batch is the prediction core's one search (predict/evaluate.py,
`largest_micro_batch`, capped at P - 1), the same `estimate` runs.

Steps: `steps`, or ceil(epochs x dataset_size / global batch). Time: steps x step time
(timing.py) plus per-session overhead (sessions.py; the XLA compile time of a TPU step graph is
paid again every session). Cost: cost.py. Checkpoints: storage.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..accelerators import get_accelerator
from ..errors import TrainplanError
from ..platforms import Platform, host_cpu
from ..predict import BUNDLED_ONLY, Calibration, Evaluation, Traces, evaluate, largest_micro_batch
from ..predict.evaluate import step_memory
from ..predict import compat
from ..trace.derive import anchors_for
from ..predict.algorithms import request_rollout
from ..predict.target import devices as devices_of, semantics_for
from ..strategy import DDP, DP, SINGLE
from ..units import MiB, fmt_bytes, fmt_mib
from . import cost as cost_mod
from . import sessions as ses
from . import storage as sto
from ..predict.memory import FITS, NO_FIT, TIGHT, MemoryEstimate
from .fixes import LADDER, SPEED_LADDER, Skip, Step
from .fixes import row as fixes_row
from .result import Fix, Sessions, Storage

KEEP_MIN_BYTES = 64 * MiB   # a rung that frees less is reported, not kept (it has a cost)


@dataclass(frozen=True)
class Config:
    """One configuration on a platform: the prediction core's evaluation of the job at micro-batch
    b with k accumulation steps, and the platform's host limits."""

    evaluation: Evaluation
    platform: Platform

    @property
    def job(self):
        return self.evaluation.job

    @property
    def trace(self):
        return self.evaluation.trace

    @property
    def memory(self):
        return self.evaluation.memory

    @property
    def time(self):
        return self.evaluation.time

    @property
    def findings(self):
        return self.evaluation.findings

    @property
    def interpolated(self) -> bool:
        return self.evaluation.interpolated

    @property
    def micro_batch(self) -> int:
        return self.job.batch_size

    @property
    def grad_accum(self) -> int:
        return self.job.grad_accum

    @property
    def host_ok(self) -> bool | None:
        ram = self.platform.ram_bytes
        return None if ram is None else self.memory.host_ram_bytes <= ram

    @property
    def device_fits(self) -> bool:
        return self.evaluation.fits

    @property
    def fits(self) -> bool:
        return self.device_fits and self.host_ok is not False

    @property
    def comfortable(self) -> bool:
        """Fits with the verdict's band free (not tight: predict/memory.py)."""
        return self.fits and not self.evaluation.tight

    @property
    def used_bytes(self) -> int:
        """What the fix ladder compares: the least device memory the step runs in."""
        return self.memory.required_bytes


def job_devices(job) -> int:
    """Devices the job as written runs on: gpus x devices per unit of its accelerator."""
    per_unit = get_accelerator(job.gpu).devices_per_unit if job.gpu else 1
    return max(1, job.gpus) * per_unit


def target_batch(job) -> int:
    """The global batch per optimizer step: `target_batch`, else as the job is written."""
    if job.target_batch:
        return int(job.target_batch)
    return job.batch_size * job.grad_accum * job_devices(job)


def steps_for(job, global_batch: int) -> tuple[int, str]:
    """(optimizer steps, where they come from)."""
    if job.steps:
        return int(job.steps), "steps"
    if job.epochs and job.dataset_size:
        return (max(1, math.ceil(job.epochs * job.dataset_size / global_batch - 1e-9)),
                "epochs x dataset_size / global batch")
    raise TrainplanError("A plan needs the length of the run.",
                         fix="give --steps N, or --epochs E with --dataset-size N (or `steps:` / "
                             "`epochs:` and `dataset_size:` in the job file)")


def platform_job(job, platform: Platform) -> tuple[object, list[str]]:
    """The job adapted to the platform's devices (see the module docstring) and to what its
    accelerator can run (predict/compat.py); returns the changes."""
    accel = platform.accelerator
    devices, changes = platform.devices, []
    strategy = job.strategy
    if devices == 1 and strategy in (DP, DDP):
        if job_devices(job) > 1:
            changes.append(f"one device: run without {strategy.label.split(' (')[0]}")
        strategy = SINGLE
    elif devices > 1 and strategy is SINGLE:
        how = (f"one process per {accel.id} core/chip (torch_xla)" if accel.kind == "tpu" else
               f"torchrun --nproc-per-node {devices}")
        changes.append(f"data parallel (DDP) over the {devices} devices: {how}; the job says single")
        strategy = DDP
    jp = job.with_(gpu=accel.id, gpus=platform.accelerator_count, strategy=strategy)
    jp, compat_changes = compat.adapt(jp, accel)
    return jp, changes + compat_changes


def preferred_micro_batch(largest: int, per_device: int) -> int:
    """b <= largest fitting micro-batch: a divisor of the per-device batch in [largest/2, largest]
    if there is one (exact global batch), else `largest`."""
    for b in range(largest, 0, -1):
        if 2 * b < largest:
            break
        if per_device % b == 0:
            return b
    return largest


def _evaluation_key(jb, platform: Platform) -> tuple:
    """What decides an evaluation (`Planner.evaluate`): the job, the accelerator, the host's
    cores and its CPU's speed (last)."""
    return repr(jb), platform.accelerator_id, platform.cpu_cores, host_cpu(platform.id).speed


class Planner:
    """Plans one job on platforms; traces are shared across platforms and fix-ladder rungs."""

    def __init__(self, job, traces: Traces | None = None, progress=None,
                 calibration: Calibration = BUNDLED_ONLY):
        self.job = job
        self.traces = traces or Traces(progress)
        self.calibration = calibration
        self.target_batch = target_batch(job)
        self._configs: dict[tuple, Config] = {}
        self._largest: dict[tuple, int | None] = {}
        self._evaluations: dict[tuple, Evaluation] = {}

    # --- one configuration ----------------------------------------------------------------
    def per_device(self, platform: Platform) -> int:
        return max(1, math.ceil(self.target_batch / platform.devices))

    def evaluate(self, jv, platform: Platform, batch: int, accum: int) -> Config:
        """`jv` at micro-batch `batch` with `accum` accumulation steps on the platform, evaluated
        once per plan for what decides it (the job, the accelerator, the host's cores and
        speed): platforms renting the same machine share it (a 70B plan over every platform
        asked 1,431 evaluations of 1,083 configurations)."""
        jb = jv.with_(batch_size=batch, grad_accum=accum)
        key = _evaluation_key(jb, platform)
        ev = self._evaluations.get(key)
        if ev is None:
            ev = self._evaluations[key] = evaluate(
                jb, platform.accelerator, self.calibration, self.traces,
                cpu_cores=platform.cpu_cores, strict=False, host_speed=key[-1])
        return Config(ev, platform)

    def memory(self, jv, platform: Platform, batch: int,
               accum: int) -> tuple[bool, MemoryEstimate]:
        """(interpolated?, memory) as `evaluate` gives them for the same arguments: read off an
        evaluation already made, else without predicting the step time where the memory does
        not rest on it (predict/evaluate.py `step_memory`; a memory curve's points)."""
        jb = jv.with_(batch_size=batch, grad_accum=accum)
        ev = self._evaluations.get(_evaluation_key(jb, platform))
        if ev is None:
            made = step_memory(jb, platform.accelerator, self.traces)
            if made is not None:
                return made
            ev = self.evaluate(jv, platform, batch, accum).evaluation
        return ev.interpolated, ev.memory

    def largest(self, jv, platform: Platform, accumulate: bool, limit: int,
                margin: bool = False) -> int | None:
        """The core's largest micro-batch for variant `jv` on the platform's accelerator
        (`margin`: the largest that is not tight)."""
        job = jv.with_(grad_accum=2 if accumulate else 1)
        accel = platform.accelerator
        key = (repr(job), accel.id, limit, margin)
        if key not in self._largest:
            self._largest[key] = largest_micro_batch(job, accel, self.traces, limit, margin)
        return self._largest[key]

    def configure(self, jv, platform: Platform) -> Config:
        """Micro-batch and accumulation for variant `jv` on `platform` (module docstring)."""
        key = (repr(jv), platform.accelerator_id, platform.accelerator_count, platform.cpu_cores,
               host_cpu(platform.id).speed)
        if key not in self._configs:
            P = self.per_device(platform)
            cfg = self.evaluate(jv, platform, P, 1)
            if not cfg.evaluation.fits or cfg.evaluation.tight:
                cfg = self._split(jv, platform, P, cfg)
            self._configs[key] = cfg
        return Config(self._configs[key].evaluation, platform)   # this platform's host limits

    def _split(self, jv, platform: Platform, P: int, cfg: Config) -> Config:
        """Micro-batch b < P with accumulation: the largest with the band free, else (when P
        itself does not fit) the largest that fits; a tight P stays P where no smaller
        micro-batch leaves the band free."""
        if P == 1 or cfg.evaluation.blocked:
            return cfg
        b = self.largest(jv, platform, accumulate=True, limit=P - 1, margin=True)
        if b is None and cfg.evaluation.fits:
            return cfg
        b = b or self.largest(jv, platform, accumulate=True, limit=P - 1)
        b = preferred_micro_batch(b, P) if b else 1
        return self.evaluate(jv, platform, b, math.ceil(P / b))

    def prime(self, jobs_platforms, accumulate: bool = False) -> None:
        """Trace at once, on all cores, what many platforms share: per traced variant and kernel
        semantics, what evaluating the per-device batch P reads (trace/derive/anchoring.py: the two
        anchors, and micro-batch 1 where P is 1), and a generating job's rollout forwards at P;
        with `accumulate`, the steps with gradients accumulating."""
        requests = []
        for jv, p in jobs_platforms:
            sem = semantics_for(jv, p.accelerator)
            jt = jv.with_(grad_accum=2 if accumulate else 1)
            requests += [(jt, sem, a) for a in anchors_for(jt, self.per_device(p))]

        def rollouts():        # a generating job's rollout at P, traced beside the steps
            for jv, p in jobs_platforms:
                at_p = jv.with_(batch_size=self.per_device(p), grad_accum=1)
                request_rollout(at_p, p.accelerator, devices_of(at_p, p.accelerator))
        self.traces.prefetch(requests, [] if accumulate else self.traces.asked(rollouts))

    # --- the ladder -------------------------------------------------------------------------
    def ladder(self, jv, platform: Platform, cfg: Config, rungs=LADDER, need=None,
               same_training: bool = False):
        """Apply rungs on top of each other until `need(cfg)` holds (default: it fits), and
        evaluate each rung tried alone on the job as it came (`_alone`). Returns (job, config,
        fixes, skipped). A rung that changes nothing measurable (memory when fitting, step time
        when speeding up) is tried, reported, and not kept; shorter sequences are reported
        untried where the memory no length lowers does not fit, an optimizer rung where the
        most it can free is neither worth keeping nor enough to fit (`_out_of_reach`).
        `same_training`: only the rungs that keep what is trained are climbed."""
        need = need or (lambda c: c.fits)
        speed = rungs is SPEED_LADDER
        base_job, base = jv, cfg
        fixes, skipped, no_length = [], [], False
        for rung in rungs:
            if need(cfg):
                break
            r = rung(jv, platform.accelerator, platform.devices, trace=cfg.trace)
            if r is None:
                continue
            if isinstance(r, Skip):
                skipped.append(f"{r.rung}: {r.reason}")
                continue
            if same_training and r.changes_training:
                continue
            if r.rung == "sync-each-batch" and cfg.grad_accum <= 1:
                continue        # nothing accumulates here: no_sync holds no gradient
            broken = compat.violation(r.job, platform.accelerator)
            if broken is not None:          # the target cannot run this rung (compat.py)
                skipped.append(f"{r.rung}: {broken.message}")
                continue
            mem = cfg.memory
            if r.rung == "seq-len" and not speed:
                if no_length:
                    continue
                if mem.floor_bytes > mem.capacity_bytes:
                    no_length = True
                    fixes.append(_untried(r, cfg, "weights, gradients and optimizer state alone "
                                          f"need {fmt_bytes(mem.floor_bytes)} of "
                                          f"{fmt_bytes(mem.capacity_bytes)} at any length: no "
                                          "shorter sequence fits; not tried"))
                    continue
            bound = _at_most_saves(r.rung, cfg)
            if not speed and bound is not None and _out_of_reach(cfg, bound):
                fixes.append(_untried(r, cfg, f"saves at most {fmt_mib(bound)} here (the "
                                      "trace's optimizer state); not tried"))
                continue
            try:
                new = self.configure(r.job, platform)
            except TrainplanError as err:
                skipped.append(f"{r.rung}: {err.what}")
                continue
            if speed:
                useful = new.fits and new.time.step_time_s < cfg.time.step_time_s * (1 - 1e-3)
            else:   # worth its cost: it meets `need` now, or frees >= KEEP_MIN_BYTES and 1% of
                gain = cfg.used_bytes - new.used_bytes     # the memory
                useful = need(new) or gain >= max(KEEP_MIN_BYTES, 0.01 * cfg.used_bytes)
            alone = None if speed else self._alone(rung, base_job, base, platform)
            fixes.append(_fix(r, cfg, new, alone, base, "" if useful else
                              "no gain here; not kept"))
            if useful:
                jv, cfg = r.job, new
        return jv, cfg, fixes, skipped

    def _alone(self, rung, base_job, base: Config, platform: Platform) -> Config | None:
        """The rung applied alone to the job as it came to the ladder, at its micro-batch and
        accumulation (None where it applies only on top of rungs before it, or the target
        cannot run it alone)."""
        r = rung(base_job, platform.accelerator, platform.devices, trace=base.trace)
        if not isinstance(r, Step) or compat.violation(r.job, platform.accelerator) is not None:
            return None
        try:
            return self.evaluate(r.job, platform, base.micro_batch, base.grad_accum)
        except TrainplanError:
            return None

    # --- sessions, storage, cost -----------------------------------------------------------
    def sessions(self, cfg: Config, steps: int) -> Sessions:
        p, t = cfg.platform, cfg.time
        work = steps * t.step_time_s
        compile_s = float(getattr(t, "xla_compile_s", None) or 0.0)
        setup = self.job.session_overhead_s
        overhead = (ses.DEFAULT_SESSION_OVERHEAD_S if setup is None else float(setup)) + compile_s
        n = ses.sessions_needed(work, p.session_max_s, overhead)
        usable = ses.usable_session_s(p.session_max_s, overhead)
        every_s = ses.checkpoint_every_s(usable, p.idle_timeout_s, p.background_execution)
        accel_s = ses.accelerator_s(work, n or 0, overhead)
        return Sessions(
            session_max_s=p.session_max_s, overhead_s_per_session=overhead,
            compile_s_per_session=compile_s, usable_s_per_session=usable, sessions=n or 0,
            checkpoint_every_s=every_s,
            checkpoint_every_steps=ses.checkpoint_every_steps(every_s, t.step_time_s),
            idle_timeout_s=p.idle_timeout_s, background_execution=p.background_execution,
            accelerator_s=accel_s, weekly_quota_s=p.weekly_quota_s,
            quota_weeks=ses.quota_weeks(accel_s, p.weekly_quota_s),
            calendar_weeks=ses.calendar_weeks(accel_s, p.weekly_quota_s),
            finish_s=ses.finish_s(accel_s, p.weekly_quota_s))

    @staticmethod
    def storage(cfg: Config) -> Storage:
        p, job = cfg.platform, cfg.job
        weights, states = sto.checkpoint_parts(cfg.trace, job.lora is not None)
        files = sto.files_per_checkpoint(job.strategy, p.devices)
        ckpt = weights + states
        return Storage(checkpoint_bytes=ckpt, weights_bytes=weights, optimizer_state_bytes=states,
                       adapter_only=job.lora is not None, files_per_checkpoint=files,
                       disk_bytes=p.disk_bytes, output_file_limit=p.output_file_limit,
                       checkpoints_fit_disk=sto.checkpoints_that_fit(ckpt, p.disk_bytes),
                       checkpoints_fit_files=sto.checkpoints_within_file_limit(files, p.output_file_limit))

    @staticmethod
    def cost(cfg: Config, s: Sessions):
        return cost_mod.run_cost(cfg.platform, s.accelerator_s, s.finish_s)


def fit_state(cfg: Config) -> str:
    """fits / tight / does not fit, as the verdict reads them (memory.py, with the host's RAM)."""
    if not cfg.fits:
        return NO_FIT
    return TIGHT if cfg.evaluation.tight else FITS


def _row(rung: str) -> dict:
    try:
        return fixes_row(rung)
    except StopIteration:
        return {}


def _fix(r, before: Config, after: Config, alone: Config | None, base: Config,
         note: str) -> Fix:
    """The ladder's row for rung step `r`: `before` -> `after` on top of the rungs before it,
    and `alone` on the job as it came to the ladder (`base`)."""
    row = _row(r.rung)
    return Fix(r.rung, r.title, r.setting, after.fits, after.micro_batch, after.grad_accum,
               before.used_bytes, after.used_bytes, before.time.step_time_s,
               after.time.step_time_s, r.changes_training, note, fit_state=fit_state(after),
               cost=row.get("cost", ""),
               device_used_bytes_alone=alone.used_bytes if alone is not None else None,
               saved_bytes_alone=base.used_bytes - alone.used_bytes if alone is not None else None,
               fit_state_alone=fit_state(alone) if alone is not None else "",
               step_time_s_alone=alone.time.step_time_s if alone is not None else None,
               user_change=row.get("user_change", ""), source=row.get("source", ""))


def _untried(r, cfg: Config, note: str) -> Fix:
    """The ladder's row for rung step `r` not tried on `cfg`, and why (`note`)."""
    row = _row(r.rung)
    return Fix(r.rung, r.title, r.setting, False, None, None, cfg.used_bytes, None,
               cfg.time.step_time_s, None, r.changes_training, note, cost=row.get("cost", ""),
               user_change=row.get("user_change", ""), source=row.get("source", ""))


def _out_of_reach(cfg: Config, bound: float) -> bool:
    """Whether a rung that frees at most `bound` bytes (`_at_most_saves`) is neither kept nor
    the answer, so that it need not be tried: it frees too little to be kept (under
    KEEP_MIN_BYTES and 1% of the memory), and freeing all of it leaves the step as the ladder
    found it: over the device where it does not fit (the least it runs in), in the band where it
    fits tightly (what the device holds plus the band: predict/memory.py `tight`). A step a few
    hundred KB over the device is tried with 8-bit AdamW before its LoRA rank is halved."""
    m = cfg.memory
    if bound >= max(KEEP_MIN_BYTES, 0.01 * cfg.used_bytes):
        return False
    return (m.banded_bytes if m.fits else m.required_bytes) - bound > m.capacity_bytes


def _at_most_saves(rung: str, cfg: Config) -> float | None:
    """An upper bound, from the current trace, on what a rung can free (None: no bound known).
    8-bit AdamW stores 2 of AdamW's 8 state bytes per parameter: it frees at most 3/4 of the
    optimizer state (less when sharded or offloaded)."""
    if rung == "optimizer-8bit":
        return 0.75 * cfg.trace.optimizer_state_bytes
    if rung == "optimizer-paged":       # its states leave what must fit (memory.py)
        return float(cfg.trace.optimizer_state_bytes)
    return None
