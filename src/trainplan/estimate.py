"""A job on one accelerator: kernel semantics, compatibility findings, memory, step time, and the
largest micro-batch that fits. Traces are cached per (kernel semantics, batch), so a job is traced
again only where the target's kernels differ (attention backend, autocast dtype).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .accelerators import Accelerator
from .errors import TrainplanError
from .measure.calibrate import apply_calibration
from .memory import Finding, MemoryEstimate, estimate_memory
from .timing import estimate_step_time
from .trace.semantics import KernelSemantics, attention_backend_for
from .trace.tracer import Trace, trace_step

SCHEMA_VERSION = "1.0"


def _cc(accel: Accelerator) -> float | None:
    try:
        return float(accel.compute_capability)
    except (TypeError, ValueError):
        return None


def semantics_for(job, accel: Accelerator) -> KernelSemantics:
    """What the accelerator's kernels do for this job (see trace/semantics.py)."""
    autocast = {"fp16-amp": torch.float16, "bf16-amp": torch.bfloat16}.get(job.precision)
    if accel.kind == "tpu":
        # XLA computes in bf16 whatever AMP dtype is asked; attention is fused
        autocast = torch.bfloat16 if autocast is not None else None
        attention = "efficient" if job.attention in ("auto", "sdpa", "flash") else job.attention
    else:
        attention = attention_backend_for(_cc(accel), job.attention)
        if attention == "flash" and not accel.flash_attention_2:
            attention = "efficient"
    return KernelSemantics(attention=attention, autocast_dtype=autocast,
                           channels_last=bool(job.channels_last))


def check_compatible(job, accel: Accelerator) -> list[Finding]:
    """Raise for impossible combinations; return findings (reason + fix) for the rest."""
    out: list[Finding] = []
    bnb = job.quantize != "none" or job.optimizer == "adamw-8bit"
    if accel.kind == "tpu" and bnb:
        raise TrainplanError(
            f"{accel.id} cannot run bitsandbytes ({'QLoRA ' + job.quantize if job.quantize != 'none' else '8-bit AdamW'}): "
            "its kernels are CUDA-only.",
            fix="on a TPU use LoRA in bf16 (--quantize none) and --optimizer adamw or adafactor")
    if job.strategy in ("zero1", "zero2", "zero3", "fsdp") and job.gpus * accel.devices_per_unit <= 1 \
            and job.offload == "none":
        raise TrainplanError(
            f"--strategy {job.strategy} on one device shards nothing.",
            fix="add --gpus N (N > 1), or --offload optimizer to move optimizer state to the host")
    if job.strategy == "dp" and accel.kind == "tpu":
        raise TrainplanError("DataParallel (--strategy dp) is CUDA-only.",
                             fix="TPUs replicate over their cores: use --strategy ddp")
    if accel.kind == "gpu" and job.precision in ("bf16-amp", "bf16") and not accel.supports_bf16:
        out.append(Finding("error", f"{accel.id} has no bf16 (needs sm80+; compute capability "
                                    f"{accel.compute_capability}); bf16 would be emulated or fail.",
                           "use --precision fp16-amp (with loss scaling)"))
    if job.attention == "flash" and accel.kind == "gpu" and not accel.flash_attention_2:
        out.append(Finding("warning", f"FlashAttention-2 needs sm80+ and {accel.id} is sm"
                                      f"{accel.compute_capability.replace('.', '')}; PyTorch "
                                      "falls back to the memory-efficient kernel.",
                           "use --attention sdpa (same memory, no flash-attn install)"))
    if accel.kind == "gpu" and job.precision in ("fp32", "tf32") and "fp16" in accel.tensor_cores \
            and "tf32" not in accel.tensor_cores:
        out.append(Finding("info", f"{accel.id}'s tensor cores do fp16 only; fp32 runs at "
                                   f"{accel.peak_flops('fp32') / 1e12:.1f} TFLOP/s.",
                           "use --precision fp16-amp for tensor-core speed"))
    if accel.kind == "gpu" and accel.tensor_cores in ("", "none") and job.precision.startswith("fp16"):
        out.append(Finding("info", f"{accel.id} has no tensor cores: fp16 saves memory but gains "
                                   "little speed.", None))
    if job.strategy == "dp" and job.gpus > 1:
        out.append(Finding("warning", "DataParallel gathers outputs and keeps the optimizer on GPU 0 "
                                      "(more memory there) and runs one Python thread per GPU.",
                           "use DDP (torchrun --nproc-per-node N): --strategy ddp"))
    if accel.kind == "tpu" and job.precision == "fp16-amp":
        out.append(Finding("info", "TPUs compute in bf16; fp16 AMP is traced as bf16.", None))
    if job.precision in ("fp16", "bf16"):
        out.append(Finding("info", f"pure {job.precision} keeps no fp32 master weights: "
                                   "small updates can round away.",
                           "use --precision " + job.precision + "-amp unless memory forbids"))
    return out


@dataclass
class Estimate:
    job: object
    accel: Accelerator
    trace: Trace
    memory: MemoryEstimate
    time: object | None
    max_batch_size: int | None
    findings: list[Finding] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.memory.fits and not any(f.severity == "error" for f in self.findings)


class Analyzer:
    """Traces a job once per distinct kernel semantics and batch, and estimates it anywhere."""

    def __init__(self, job, progress=None):
        self.job = job
        self._traces: dict[tuple, Trace] = {}
        self._progress = progress

    def trace(self, sem: KernelSemantics, batch: int) -> Trace:
        key = (sem.key(), batch)
        if key not in self._traces:
            if self._progress:
                self._progress(self.trace_message(sem, batch))
            self._traces[key] = trace_step(self.job, sem, batch)
        return self._traces[key]

    def trace_message(self, sem: KernelSemantics, batch: int) -> str:
        return (f"tracing {self.job.model_label} (batch {batch}, {sem.attention} attention, "
                f"{sem.autocast_dtype or 'no autocast'})")

    def needs_trace(self, sem: KernelSemantics, batch: int) -> bool:
        return (sem.key(), batch) not in self._traces

    def store(self, sem: KernelSemantics, batch: int, trace: Trace) -> None:
        """Keep a trace made elsewhere (trace/parallel.py) for this job at (sem, batch)."""
        self._traces[(sem.key(), batch)] = trace

    def estimate(self, accel: Accelerator, with_max_batch: bool = True,
                 calibration=None, measured_calibration: bool = True) -> Estimate:
        """`calibration`: efficiency parameters for timing.py (default: data/efficiency.json).
        `measured_calibration`: apply the user's correction for this accelerator from
        `trainplan calibrate` (measure/calibrate.py), unless explicit parameters are given."""
        findings = check_compatible(self.job, accel)
        sem = semantics_for(self.job, accel)
        tr = self.trace(sem, self.job.batch_size)
        mem = estimate_memory(tr, accel, self.job)
        findings += gpu0_findings(mem)
        time = step_time(tr, accel, self.job, calibration,
                         measured_calibration=measured_calibration)
        mb = self.max_batch(accel, sem) if with_max_batch else None
        if not mem.fits:
            findings.append(Finding(
                "error", f"needs {mem.device_used_bytes / 2**30:.2f} GiB per device, "
                         f"{accel.id} has {mem.capacity_bytes / 2**30:.2f} GiB",
                f"largest micro-batch that fits: {mb}" if mb else
                "see `trainplan plan` for the fix ladder (checkpointing, LoRA, ZeRO, offload)"))
        return Estimate(self.job, accel, tr, mem, time, mb, findings)

    def used_at(self, accel: Accelerator, sem: KernelSemantics, batch: int) -> int:
        return estimate_memory(self.trace(sem, batch), accel, self.job).device_used_bytes

    def max_batch(self, accel: Accelerator, sem: KernelSemantics | None = None,
                  limit: int = 1 << 16) -> int | None:
        """Largest micro-batch whose device memory fits, or None if batch 1 does not.

        For a fixed shape memory is affine in batch (activations scale, model states do not), so
        two traces give the line; the prediction is then checked with a trace at that batch and
        walked down (bisection on traces) where the line was optimistic.
        """
        sem = sem or semantics_for(self.job, accel)
        cap = accel.usable_memory_bytes
        b0, b1 = self.job.batch_size, self.job.batch_size * 2
        u0, u1 = self.used_at(accel, sem, b0), self.used_at(accel, sem, b1)
        slope = max(1.0, (u1 - u0) / (b1 - b0))

        def affine(b: int) -> float:
            return u0 + slope * (b - b0)

        lo = max([b for b, u in ((b0, u0), (b1, u1)) if u <= cap], default=0)
        hi = min([b for b, u in ((b0, u0), (b1, u1)) if u > cap], default=None)
        guess = int(b0 + (cap - u0) // slope)
        for _ in range(8):
            upper = hi - 1 if hi is not None else limit
            b = max(lo + 1, min(guess, upper))
            if b > upper:
                break
            if self.used_at(accel, sem, b) <= cap:
                lo = b
                if affine(b + 1) > cap:   # the line held at three batches: trust its next step
                    break
                guess = b * 2
            else:
                hi = b
                guess = (lo + b) // 2 if lo else b // 2
            if hi is not None and hi <= lo + 1:
                break
        return lo or None


def gpu0_findings(mem: MemoryEstimate) -> list[Finding]:
    """DataParallel's imbalance, when the memory model found one."""
    if not mem.gpu0_extra_bytes:
        return []
    return [Finding("warning", f"GPU 0 holds {mem.gpu0_extra_bytes / 2**30:.2f} GiB more than the "
                               "others (DataParallel gathers outputs there).",
                    "use DDP (torchrun): --strategy ddp")]


def step_time(trace: Trace, accel: Accelerator, job, calibration: dict | None = None,
              cpu_cores: int | None = None, measured_calibration: bool = True):
    """timing.py's step time, corrected by the user's `trainplan calibrate` factor for this
    accelerator unless explicit efficiency parameters are given (measure/calibrate.py)."""
    t = estimate_step_time(trace, accel, job, calibration, cpu_cores=cpu_cores)
    if measured_calibration and calibration is None:
        t = apply_calibration(t, accel.id)
    return t


def to_json(est: Estimate) -> dict:
    """The estimate as stable JSON (keys other tools rely on: see tests/test_contract.py)."""
    m, t, tr, job = est.memory, est.time, est.trace, est.job
    out = {
        "schema_version": SCHEMA_VERSION,
        "model": tr.model,
        "accelerator": est.accel.id,
        "devices": job.gpus * est.accel.devices_per_unit,
        "strategy": job.strategy,
        "fits": est.fits,
        "per_device": {
            "peak_allocated_bytes": m.peak_allocated_bytes,
            "peak_reserved_bytes": m.peak_reserved_bytes,
            "device_used_bytes": m.device_used_bytes,
            "capacity_bytes": m.capacity_bytes,
            "headroom_bytes": m.headroom_bytes,
            "peak_phase": m.peak_phase,
            "breakdown_bytes": m.breakdown_bytes,
            "gpu0_extra_bytes": m.gpu0_extra_bytes,
        },
        "host_ram_bytes": m.host_ram_bytes,
        "max_batch_size": est.max_batch_size,
        "batch_size": job.batch_size,
        "grad_accum": job.grad_accum,
        "params": {"total": tr.params_total, "trainable": tr.params_trainable},
        "flops_per_micro_batch": tr.flops_per_step,
        "kernel_semantics": {"attention": tr.semantics.attention,
                             "autocast_dtype": str(tr.semantics.autocast_dtype).replace("torch.", "")
                             if tr.semantics.autocast_dtype else None},
        "findings": [f.to_dict() for f in est.findings],
        "notes": list(tr.notes),
        "step_time_s": t.step_time_s if t else None,
        "throughput": {"samples_per_s": t.samples_per_s if t else None,
                       "tokens_per_s": t.tokens_per_s if t else None},
        "mfu": t.mfu if t else None,
        "step_breakdown_s": dict(t.breakdown_s) if t else None,
        "bound": getattr(t, "bound", None) if t else None,
        "xla_compile_s": getattr(t, "xla_compile_s", None) if t else None,
        "calibration": getattr(t, "calibration", None) if t else None,
    }
    return out
