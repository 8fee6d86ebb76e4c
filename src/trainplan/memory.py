"""Per-device memory of a job on an accelerator, from a traced step.

The trace gives, for one device running the whole model, the live bytes by category at the peak of
each phase (forward, backward, optimizer). A multi-device strategy changes some categories:

    single, ddp, dp : weights, gradients, optimizer states whole on every device
    zero1           : optimizer states / N                      (Rajbhandari et al. 2020, P_os)
    zero2           : optimizer states and gradients / N        (P_os+g; one reduce bucket kept)
    zero3, fsdp     : weights, gradients, states / N, plus the gathered layers in flight
                      (2 x the largest block: the current and the prefetched one)
    offload optimizer        : states (and ZeRO's fp32 grads) live in host RAM
    offload optimizer+params : weights too; only gathered layers stay on the device

and adds its own buffers: DDP's gradient buckets (a flat copy of all gradients unless
gradient_as_bucket_view=True; PyTorch DDP docs), DataParallel's outputs gathered on GPU 0.
The per-device peak is the largest transformed phase peak.

Three figures, as PyTorch users know them:
    peak_allocated_bytes  torch.cuda.max_memory_allocated()
    peak_reserved_bytes   torch.cuda.max_memory_reserved(): allocated plus the caching allocator's
                          fragmentation, from replaying the traced allocations (allocator.py)
    device_used_bytes     reserved + CUDA context and kernels: what nvidia-smi shows
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources

from .accelerators import Accelerator
from .allocator import replay
from .trace.tracer import Trace


@dataclass
class Finding:
    severity: str      # error | warning | info
    message: str
    fix: str | None = None

    def to_dict(self) -> dict:
        return {"severity": self.severity, "message": self.message, "fix": self.fix}


@dataclass
class MemoryEstimate:
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    device_used_bytes: int
    capacity_bytes: int
    breakdown_bytes: dict[str, int]       # weights, gradients, optimizer_states, activations,
                                          # temporaries, framework_overhead (sums to device used)
    peak_phase: str
    host_ram_bytes: int                   # host memory the job needs (offload, per-process copies)
    gpu0_extra_bytes: int = 0             # DataParallel: what GPU 0 holds beyond the others
    findings: list[Finding] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.device_used_bytes <= self.capacity_bytes

    @property
    def headroom_bytes(self) -> int:
        return self.capacity_bytes - self.device_used_bytes


def overheads() -> dict:
    """Framework overheads as data (data/overheads.json), each with its source."""
    text = (resources.files("trainplan") / "data" / "overheads.json").read_text()
    return json.loads(text)


def framework_overhead_bytes(accel: Accelerator) -> int:
    o = overheads()
    if accel.kind == "tpu":
        return int(o["xla_runtime_bytes"]["value"])
    return int(o["cuda_context_bytes"]["value"])


def _transform(cats: dict[str, int], job, trace: Trace, phase: str) -> dict[str, int]:
    """One phase's live bytes by category -> the same on one device under job.strategy."""
    n = max(1, job.gpus)
    s = job.strategy
    c = {k: float(v) for k, v in cats.items()}
    shard_states = s in ("zero1", "zero2", "zero3", "fsdp")
    shard_grads = s in ("zero2", "zero3", "fsdp")
    shard_weights = s in ("zero3", "fsdp")
    if shard_states:
        c["optimizer_states"] /= n
        if phase == "optimizer":   # the step's temporaries scale with the shard it updates
            c["temporaries"] /= n
    if shard_grads:
        bucket = min(trace.gradient_bytes, 2 * 25 * 2**20)   # one reduce bucket in flight
        c["gradients"] = c["gradients"] / n + (bucket if phase == "backward" else 0)
    if shard_weights:
        gathered = 2 * trace.largest_block_param_bytes
        c["weights"] = c["weights"] / n
        # FSDP mixed precision gathers in the compute dtype instead of caching casts
        c["weight_casts"] = gathered if phase != "optimizer" else 0
    if job.offload in ("optimizer", "optimizer+params"):
        c["optimizer_states"] = 0
        if phase == "optimizer":
            c["temporaries"] = 0
    if job.offload == "optimizer+params":
        c["weights"] = 0 if shard_weights else c["weights"]
    if s == "ddp" and n > 1:
        c["gradients"] += trace.gradient_bytes   # bucket copies, allocated at DDP construction
    return {k: int(v) for k, v in c.items()}


def estimate_memory(trace: Trace, accel: Accelerator, job) -> MemoryEstimate:
    """Per-device memory of `job` (as traced) on `accel`; see the module docstring."""
    phases = trace.phase_peaks or {trace.peak_phase: (trace.peak_allocated_bytes,
                                                       trace.peak_breakdown_bytes)}
    best_phase, best = None, None
    for phase, (_total, cats) in phases.items():
        t = _transform(cats, job, trace, phase)
        if best is None or sum(t.values()) > sum(best.values()):
            best_phase, best = phase, t
    allocated = sum(best.values())
    # fragmentation measured on the single-device replay, applied to this strategy's peak
    peak_alloc_sim, peak_reserved_sim = replay(trace.alloc_events)
    frag = peak_reserved_sim / peak_alloc_sim if peak_alloc_sim else 1.0
    reserved = int(allocated * frag)
    overhead = framework_overhead_bytes(accel)
    gpu0_extra = 0
    if job.strategy == "dp" and job.gpus > 1:
        # GPU 0 gathers every replica's outputs and holds the only optimizer state
        gpu0_extra = (job.gpus - 1) * _output_bytes(trace)
    breakdown = {
        "weights": best["weights"],
        "gradients": best["gradients"],
        "optimizer_states": best["optimizer_states"],
        "activations": best["activations"],
        "temporaries": best["temporaries"] + best["weight_casts"] + (reserved - allocated),
        "framework_overhead": overhead,
    }
    host = _host_ram(trace, job, accel)
    est = MemoryEstimate(
        peak_allocated_bytes=allocated + gpu0_extra, peak_reserved_bytes=reserved + gpu0_extra,
        device_used_bytes=reserved + gpu0_extra + overhead,
        capacity_bytes=accel.usable_memory_bytes, breakdown_bytes=breakdown,
        peak_phase=best_phase, host_ram_bytes=host, gpu0_extra_bytes=gpu0_extra)
    return est


def _output_bytes(trace: Trace) -> int:
    """Bytes of the model's output for one micro-batch (logits), from the last forward module."""
    rows = [m for m in trace.modules if m.depth == 1]
    return int(rows[-1].activation_bytes) if rows else 0


def _host_ram(trace: Trace, job, accel: Accelerator) -> int:
    """Host RAM the job needs beyond the data pipeline.

    Each training process loads the model on the host before moving it (TPU: 8 processes, one per
    core, pytorch/xla #1870; DataParallel/DDP: one copy per process). Offloaded states live there.
    """
    procs = accel.devices_per_unit * max(1, job.gpus) if accel.kind == "tpu" else (
        max(1, job.gpus) if job.strategy != "dp" else 1)
    host = procs * trace.weight_bytes
    if job.offload in ("optimizer", "optimizer+params"):
        host += trace.optimizer_state_bytes + trace.gradient_bytes
    if job.offload == "optimizer+params":
        host += trace.weight_bytes
    return int(host)
