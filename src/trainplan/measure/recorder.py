"""Time optimizer steps and sample memory on one device, predict the same job with trainplan,
and turn both into one measurement record. Shared by `trainplan measure`, the `record` context
manager and the Hugging Face Trainer callback, so all three write the same fields.

Step time is wall time between consecutive `step()` calls with the device synchronised at each
(`torch.cuda.synchronize`, so queued kernels are counted in the step that launched them). The
first `warmup` steps are dropped: step 1 creates the optimizer state, cuDNN/cuBLAS pick their
algorithms and the caching allocator grows its segments. The reported step time is the median of
the rest (robust to a stray slow step); the mean and every step are kept too.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch

from ..accelerators import get_accelerator
from ..errors import TrainplanError
from ..strategy import SINGLE
from ..spec import Job
from ..predict.calibration import UNMEASURED_TERMS
from .calibrate import user_calibration
from .device import (MemoryProbe, describe_device, library_versions, resolve_accelerator,
                     synchronize)
from .records import append_record, make_record


@dataclass
class Measured:
    steps: int                       # timed steps (after warm-up)
    warmup_steps: int
    step_time_s: float               # median of the timed steps
    step_time_mean_s: float
    step_times_s: list[float]
    samples_per_s: float             # samples per optimizer step / step_time_s
    tokens_per_s: float | None
    peak_allocated_bytes: int | None     # torch.cuda.max_memory_allocated (None on CPU)
    peak_reserved_bytes: int | None      # torch.cuda.max_memory_reserved (None on CPU)
    device_used_bytes: int | None        # NVML / mem_get_info, see device.py
    device_used_source: str | None
    peak_rss_bytes: int | None           # host process peak resident set size
    rss_before_bytes: int | None
    loss_first: float | None
    loss_last: float | None


@dataclass
class Predicted:
    accelerator: str
    step_time_s: float | None            # uncalibrated, one optimizer step
    device_step_time_s: float | None     # the same without communication and data wait
    samples_per_s: float | None
    tokens_per_s: float | None
    tokens_per_sample: int | None
    mfu: float | None
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    device_used_bytes: int
    kernel_semantics: dict
    calibrated_step_time_s: float | None     # with the stored calibration, if there is one
    calibration: dict | None
    # of device_step_time_s, the seconds the device waits on the host issuing its kernels (the
    # host/device queue, predict/host.py): what separates a host error from a kernel error
    host_wait_s: float | None = None
    # the step's kernel time by class (StepTime.device_by_class_s), what `measure --profile`
    # compares with the kernels that ran
    device_by_class_s: dict | None = None


def check_measurable(job: Job) -> None:
    """A measurement is one process on one device: refuse what it cannot run as predicted."""
    if job.gpus > 1 or job.strategy is not SINGLE:
        raise TrainplanError(
            f"trainplan measure runs one process on one device; this job uses --gpus {job.gpus} "
            f"--strategy {job.strategy}.",
            fix="measure the per-device step with --gpus 1 --strategy single (communication is "
                "not measured), or record a real multi-GPU run with trainplan.measure.record")
    if job.offload != "none":
        raise TrainplanError(f"--offload {job.offload} is predicted (DeepSpeed ZeRO-Offload) but "
                             "trainplan measure does not run it.",
                             fix="measure with --offload none")
    if job.algorithm != "sft":
        what, fix = _algorithm_refusal(job)
        raise TrainplanError(what, fix=fix)


def _algorithm_refusal(job: Job) -> tuple[str, str]:
    """Why `trainplan measure` does not time a post-training job's step, and what to measure:
    it runs the traced training step alone, and the prediction of an --algorithm step adds the
    phases around it (predict/algorithms.py), so the two would not be of the same step. A real
    TRL run, whose Trainer steps include every phase, is recorded by TrainplanCallback."""
    from ..algorithm import GENERATES, sequences_per_sample
    algo = job.algorithm
    phases = {"grpo": "generating the completions (and the reference's and old policy's "
                      "forwards where asked)",
              "ppo": "generating, the reference, reward and value forwards and the value "
                     "model's step",
              "dpo": "the reference model's forward"}.get(algo, "its other phases")
    batch = job.batch_size * sequences_per_sample(algo)
    train = f"--algorithm sft --batch-size {batch} --seq-len {job.seq_len}"
    fix = f"time the step {algo.upper()} trains on with {train}"
    if algo in GENERATES and job.rollout is not None:
        fix += (f", and its generation with --task generate --prompt-len "
                f"{job.rollout.prompt_len} --completion-len {job.rollout.completion_len}")
    fix += ("; a real TRL run is recorded whole with trainplan.measure.TrainplanCallback on its "
            "trainer")
    return (f"trainplan measure runs the training step alone; an --algorithm {algo} step also "
            f"runs {phases}, which it would not run, so the measurement and the prediction would "
            "not be of the same step.", fix)


def predict(job: Job, accel_id: str) -> Predicted:
    """trainplan's prediction of `job` on catalog accelerator `accel_id`, without the stored
    calibration (what `trainplan calibrate` fits against) and, separately, with it."""
    from ..predict import evaluate
    accel = get_accelerator(accel_id)
    pjob = job.with_(gpu=accel.id, samples_per_s_per_worker=None)   # synthetic data: no wait
    est = evaluate(pjob, accel)
    t, m, tr = est.time, est.memory, est.trace
    device_s = None
    if t is not None:
        device_s = t.step_time_s - sum(t.breakdown_s.get(k, 0.0) for k in UNMEASURED_TERMS)
    cal = user_calibration().apply(t, accel.id) if t is not None else None
    cal_info = getattr(cal, "calibration", None)
    return Predicted(
        accelerator=accel.id, step_time_s=t.step_time_s if t else None,
        device_step_time_s=device_s, samples_per_s=t.samples_per_s if t else None,
        tokens_per_s=t.tokens_per_s if t else None, tokens_per_sample=tr.tokens_per_sample,
        mfu=t.mfu if t else None, peak_allocated_bytes=m.peak_allocated_bytes,
        peak_reserved_bytes=m.peak_reserved_bytes, device_used_bytes=m.device_used_bytes,
        kernel_semantics={"attention": tr.semantics.attention,
                          "autocast_dtype": tr.semantics.autocast_dtype},
        calibrated_step_time_s=cal.step_time_s if cal_info else None, calibration=cal_info,
        host_wait_s=t.breakdown_s.get("overhead") if t is not None else None,
        device_by_class_s=t.device_by_class_s if t is not None else None)


class Recorder:
    """Times optimizer steps of `job` on `dev`. Call `start()` once the model is on the device,
    `step(loss)` after every optimizer step, then `finish(...)` for the record."""

    def __init__(self, job: Job, dev: torch.device, warmup: int = 3,
                 tokens_per_sample: int | None = None):
        if warmup < 0:
            raise TrainplanError(f"--warmup must be >= 0, got {warmup}.")
        self.job, self.dev, self.warmup = job, dev, warmup
        self.tokens_per_sample = tokens_per_sample
        self.probe = MemoryProbe(dev)
        self.times_s: list[float] = []
        self.losses: list[float] = []
        self._t: float | None = None

    def start(self) -> None:
        self.probe.reset()
        synchronize(self.dev)
        self._t = time.perf_counter()

    def step(self, loss=None) -> float:
        """Close one optimizer step; returns its seconds."""
        if self._t is None:
            raise TrainplanError("Recorder.step() called before start().",
                                 fix="use it inside `with trainplan.measure.record(...)`")
        synchronize(self.dev)
        now = time.perf_counter()
        dt, self._t = now - self._t, now
        self.times_s.append(dt)
        if loss is not None:
            self.losses.append(float(loss.detach().float() if isinstance(loss, torch.Tensor)
                                     else loss))
        self.probe.sample()
        return dt

    def measured(self, tokens_per_sample: int | None = None) -> Measured:
        timed = self.times_s[self.warmup:]
        if not timed:
            raise TrainplanError(
                f"{len(self.times_s)} step(s) recorded, all of them warm-up ({self.warmup}).",
                fix="run more steps than --warmup (e.g. --steps 10 --warmup 3)")
        step = statistics.median(timed)
        samples = self.job.batch_size * self.job.grad_accum
        tps = tokens_per_sample or self.tokens_per_sample
        mem = self.probe.result()
        return Measured(
            steps=len(timed), warmup_steps=self.warmup, step_time_s=step,
            step_time_mean_s=statistics.fmean(timed), step_times_s=timed,
            samples_per_s=samples / step, tokens_per_s=samples * tps / step if tps else None,
            loss_first=self.losses[0] if self.losses else None,
            loss_last=self.losses[-1] if self.losses else None, **mem)

    def finish(self, *, source: str, command: str, accelerator: str | None = None,
               settings: dict | None = None, notes: list[str] | None = None,
               out=None, write: bool = True, extra_measured=None,
               predictor=None) -> tuple[dict, object]:
        """(record, path written or None). `accelerator` (a catalog id or alias) overrides the
        one detected from the device name. `predictor(accel_id)` (a dict of the record's
        predicted fields) replaces the training-step prediction and `extra_measured(measured)`
        adds to what was measured (measure/generate.py: a generate call, not a step)."""
        notes = list(notes or [])
        info = describe_device(self.dev)
        acc, acc_source = resolve_accelerator(info, accelerator)
        if acc is None:
            notes.append(f"{info.type} device {info.name!r} matches no catalog accelerator: "
                         "nothing predicted (pass --accelerator ID to compare with one)")
        elif self.job.gpu and get_accelerator(self.job.gpu).id != acc:
            notes.append(f"the job targets {get_accelerator(self.job.gpu).id}; predicted for "
                         f"{acc}, the device that ran")
        if acc_source == "flag" and info.type == "cpu":
            notes.append(f"measured on the CPU but labelled {acc} with --accelerator: its "
                         "calibration will scale predictions by CPU speed")
        predicted = None
        if acc is not None:
            try:
                predicted = predictor(acc) if predictor else asdict(predict(self.job, acc))
            except TrainplanError as e:
                notes.append(f"no prediction: {e.what}")
        if info.type == "cpu":
            notes.append("CPU: no caching allocator, so peak allocated/reserved are not "
                         "available; peak_rss_bytes is the process's resident peak")
        measured = asdict(self.measured(predicted.get("tokens_per_sample") if predicted else None))
        if extra_measured:
            measured = extra_measured(measured)
        rec = make_record(
            job=self.job, source=source, command=command, device=info.to_dict(),
            accelerator=acc, accelerator_source=acc_source, versions=library_versions(),
            settings=dict(settings or {}, warmup_steps=self.warmup),
            measured=measured, predicted=predicted, notes=notes)
        path = append_record(rec, out) if write else None
        return rec, path
