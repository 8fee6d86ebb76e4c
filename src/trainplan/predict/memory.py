"""Per-device memory of a job on an accelerator, from a traced step.

The trace gives, for one device running the whole model, the live bytes by category at the peak of
each phase (forward, backward, optimizer). A multi-device strategy changes some categories:

    single, ddp, dp : weights, gradients, optimizer states whole on every device
    zero1-3, fsdp   : as DeepSpeed and PyTorch allocate them (sharding.py, data/sharding.json)
    offload optimizer        : states (and ZeRO's fp32 grads) live in host RAM
    offload optimizer+params : weights too; only gathered layers stay on the device

and adds its own buffers: DDP's gradient buckets (a flat copy of all gradients unless
gradient_as_bucket_view=True; PyTorch DDP docs), DataParallel's outputs gathered on GPU 0.
The per-device peak is the largest transformed phase peak.

Three figures, as PyTorch users know them:
    peak_allocated_bytes  torch.cuda.max_memory_allocated()
    peak_reserved_bytes   torch.cuda.max_memory_reserved(): allocated plus the caching allocator's
                          fragmentation, from replaying the traced allocations (trace/derive/)
    device_used_bytes     reserved + CUDA context and kernels (+ NCCL's own buffers when
                          several GPUs communicate): what nvidia-smi shows

The framework release changes memory without changing the model (`Runtime`, presets in
data/overheads.json; the default is today's PyTorch):
    zero_grad_set_to_none  False before PyTorch 2.0: zero_grad() zeroes the gradients in place, so
                           all of them stay allocated through the next forward (+ gradient bytes in
                           the forward and backward phases)
    optimizer_foreach      False before PyTorch 2.0 (and for transformers.AdamW): the step loops
                           over parameters, so its temporaries are those of one parameter
    cuda_lazy_loading      False before PyTorch 1.13 / CUDA 11.7: every kernel is loaded into the
                           context when it is created (1343 MiB on a V100 instead of ~426 MiB)
    softmax_saves_input    True up to PyTorch 1.10: softmax / log_softmax also keep their input
                           for backward (+ the attention scores once more per layer)

A job fits when the CUDA context plus the least the allocator must reserve fits the device:
near the limit the allocator gives cached free segments back and retries (allocator.py), so the
step needs less than its unconstrained peak reserved. `required_bytes` = context + allocated +
the replay's pinned fragmentation (segments a live block keeps: trace/derive/allocator.py): the smallest
device the step runs on, whatever the device asked about, so the fit answer and the largest
micro-batch do not depend on it. Fragmentation is measured on the single-device replay and
scaled by the share of it a strategy's device holds. On a
device with room the allocator never releases anything, and `device_used_bytes` is context +
the unconstrained reserved (nvidia-smi); where that exceeds the device but the step still fits, the
allocator fills the device and the figure is its capacity.

The verdict carries the prediction's own error (bands.py: data/fit_bands.json, the 95th
percentile of how far the prediction fell short on validated runs of the job's regime and device
class). `held_bytes` = context + the unconstrained reserved memory, what the device will actually
hold after a few steps; the band adds its shortfall to the allocator's part of it:

    fits          held + band <= capacity
    tight         required <= capacity, but held + band > capacity (including a step that fits
                  only because the allocator releases its cache at the limit): OOM-prone
    does not fit  required > capacity

`fit_margin` = 1 - held / capacity, and `fit_probability` the share of the band's runs whose
shortfall would still fit (bands.py).
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources

from ..accelerators import Accelerator
from ..strategy import DDP, DP
from ..trace.derive import Fragmentation, fragmentation, rules_for
from ..trace.facts import Trace
from . import bands, sharding
from .sharding import largest_trainable_tensor_bytes


@dataclass(frozen=True)
class MemoryEstimate:
    peak_allocated_bytes: int
    peak_reserved_bytes: int              # on a device with room (the allocator never releases)
    device_used_bytes: int                # what this device shows: reserved + context, at most
                                          # its capacity when the allocator must release cache
    required_bytes: int                   # the least device memory the step runs in (fit test)
    capacity_bytes: int
    breakdown_bytes: dict[str, int]       # weights, gradients, optimizer_states, activations,
                                          # temporaries, framework_overhead (sums to device used)
    peak_phase: str
    host_ram_bytes: int                   # host memory the job needs (offload, per-process copies)
    gpu0_extra_bytes: int = 0             # DataParallel: what GPU 0 holds beyond the others
    held_bytes: int = 0                   # context + unconstrained reserved: what the device holds
    # the part of required_bytes that no shorter sequence or smaller micro-batch lowers: the
    # weights, the optimizer states the device holds and (in the update) the gradients, in the
    # phase where they sum highest, and the runtime outside the allocator
    floor_bytes: int = 0
    overhead_bytes: int = 0               # the runtime outside the allocator (context, NCCL)
    band: bands.Band | None = None        # the verdict's error band (bands.py)
    allocator: str = "cuda"               # the allocator model replayed (allocator.py Rules)

    @property
    def fits(self) -> bool:
        """Fits on paper: the least the step runs in is at most the capacity."""
        return self.required_bytes <= self.capacity_bytes

    @property
    def fit_margin(self) -> float:
        """Fraction of the capacity left free by what the device will hold (negative: the
        allocator must give cached blocks back to run the step, or it does not fit)."""
        return 1.0 - self.held_bytes / self.capacity_bytes if self.capacity_bytes else -1.0

    @property
    def banded_bytes(self) -> int:
        """What the device holds with room plus the band: what FITS must leave under capacity."""
        if self.band is None:
            return self.held_bytes
        return bands.banded(self.held_bytes, self.overhead_bytes, self.band)

    @property
    def band_bytes(self) -> int:
        return self.banded_bytes - self.held_bytes

    @property
    def fit_probability(self) -> float:
        """Share of the band's validated runs whose shortfall would still fit (bands.py)."""
        if not self.fits:
            return 0.0
        if self.band is None:
            return 1.0 if self.held_bytes <= self.capacity_bytes else 0.0
        return bands.fit_probability(self.held_bytes, self.overhead_bytes, self.capacity_bytes,
                                     self.band)

    @property
    def tight(self) -> bool:
        """Fits on paper, but the band (or the allocator's cache) crosses the capacity."""
        return self.fits and self.banded_bytes > self.capacity_bytes

    @property
    def fit_state(self) -> str:
        return FITS if self.fits and not self.tight else TIGHT if self.fits else NO_FIT

    @property
    def headroom_bytes(self) -> int:
        return self.capacity_bytes - self.device_used_bytes


FITS, TIGHT, NO_FIT = "fits", "tight", "does not fit"


@dataclass(frozen=True)
class Runtime:
    """Framework defaults that change memory but not the model; see the module docstring."""

    name: str = "torch2"
    zero_grad_set_to_none: bool = True
    optimizer_foreach: bool = True
    cuda_lazy_loading: bool = True
    softmax_saves_input: bool = False


@functools.cache
def overheads() -> dict:
    """Framework overheads as data (data/overheads.json), each with its source."""
    text = (resources.files("trainplan") / "data" / "overheads.json").read_text()
    return json.loads(text)


def runtime(name: str | None = None) -> Runtime:
    """A runtime preset of data/overheads.json by name (None: the default, today's PyTorch)."""
    r = overheads()["runtimes"]
    name = name or r["default"]
    if name not in r["presets"]:
        from ..errors import TrainplanError
        raise TrainplanError(f"No runtime preset {name!r}.", allowed=", ".join(r["presets"]))
    p = r["presets"][name]
    return Runtime(name, bool(p["zero_grad_set_to_none"]), bool(p["optimizer_foreach"]),
                   bool(p["cuda_lazy_loading"]), bool(p["softmax_saves_input"]))


def framework_overhead_bytes(accel: Accelerator, rt: Runtime | None = None,
                             devices: int = 1) -> int:
    """Device memory outside PyTorch's allocator: the CUDA context with its loaded kernels, and
    NCCL's buffers when `devices` GPUs communicate (data/overheads.json). ROCm: the HIP context
    (no sourced figure: the CUDA one, a lower bound) and RCCL's buffers; MPS: none sourced."""
    o = overheads()
    if accel.kind == "tpu":
        return int(o["xla_runtime_bytes"]["value"])
    if accel.backend == "mps":
        return int(o["mps_runtime_bytes"]["value"])
    rt = rt or runtime()
    if accel.backend == "rocm":
        rccl = o["rccl_buffers_bytes"]["value"]
        comm = 0 if devices < 2 else rccl["2"] if devices == 2 else rccl["3+"]
        return int(o["hip_context_bytes"]["value"]) + int(comm)
    key = "cuda_context_lazy_bytes" if rt.cuda_lazy_loading else "cuda_context_bytes"
    nccl = o["nccl_buffers_bytes"]["value"]
    comm = 0 if devices < 2 else nccl["2"] if devices == 2 else nccl["3+"]
    return int(o[key]["value"]) + int(comm)


SOFTMAX_OPS = ("_softmax", "_log_softmax")


def softmax_input_bytes(trace: Trace) -> tuple[int, int]:
    """(bytes of the forward's softmax / log_softmax inputs, the largest such sum of one
    checkpointed block's rerun): what autograd keeps when softmax's backward references its input.

    An op's input is as large as its output (autocast computes softmax in fp32 from an fp32 cast),
    so it is half the bytes the op moves. Inside a checkpointed block the forward keeps nothing;
    backward reruns one block at a time and keeps that block's inputs until its backward is done.
    """
    blocks = tuple(trace.checkpointed_blocks)
    saved, rerun = 0.0, {}
    for r in trace.ops:
        if r.name not in SOFTMAX_OPS:
            continue
        name = r.module.split(".", 1)[1] if "." in r.module else ""
        block = next((b for b in blocks if name == b or name.startswith(b + ".")), None)
        if r.phase == "forward" and not r.recompute and block is None:
            saved += r.bytes / 2
        elif r.recompute and block is not None:
            rerun[block] = rerun.get(block, 0.0) + r.bytes / 2
    return int(saved), int(max(rerun.values(), default=0.0))


def _apply_runtime(c: dict[str, float], job, trace: Trace, phase: str, rt: Runtime) -> None:
    """What an older framework keeps that the traced (today's) step frees; see module docstring.

    zero_grad(set_to_none=False) keeps every gradient allocated from the first backward on, so the
    forward and backward peaks carry all of them (the trace sets them to None: only those already
    produced at the peak are counted). A per-parameter optimizer loop makes the temporaries of one
    tensor at a time: the foreach step's temporaries scale by largest tensor / all trainable bytes
    (both allocate the same temporaries per element; pytorch/pytorch#97712). Softmax inputs
    kept for backward (PyTorch <= 1.10) add to the activations from the end of forward on; the
    backward peak, near its start, still holds them.
    """
    if rt.softmax_saves_input and phase in ("forward", "backward"):
        saved, rerun = softmax_input_bytes(trace)
        c["activations"] += saved + (rerun if phase == "backward" else 0)
    if not rt.zero_grad_set_to_none and phase in ("forward", "backward"):
        c["gradients"] = max(c["gradients"], float(trace.gradient_bytes))
    # only torch.optim's steps run multi-tensor (optimizer.py); the others are per-parameter loops
    if not rt.optimizer_foreach and phase == "optimizer" and job.optimizer.foreach:
        share = largest_trainable_tensor_bytes(trace) / max(1, trace.trainable_param_bytes)
        c["temporaries"] *= min(1.0, share)


def _transform(cats: dict[str, int], job, trace: Trace, phase: str,
               rt: Runtime | None = None, devices: int | None = None,
               ddp_buckets: bool = True) -> dict[str, int]:
    """One phase's live bytes by category -> the same on one device under job.strategy, sharded
    over `devices` (default job.gpus; a TPU unit counts each of its cores or chips)."""
    n = max(1, devices if devices is not None else job.gpus)
    s = job.strategy
    c = {k: float(v) for k, v in cats.items()}
    _apply_runtime(c, job, trace, phase, rt or runtime())
    sharding.per_device(c, job, trace, phase, n)
    if job.offload.states:
        c["optimizer_states"] = 0
        if phase == "optimizer":
            c["temporaries"] = 0
    if job.offload.params:
        c["weights"] = 0 if s.shards_weights else c["weights"]
    if s is DDP and n > 1 and ddp_buckets:
        c["gradients"] += trace.gradient_bytes   # bucket copies, allocated at DDP construction
    return {k: int(v) for k, v in c.items()}


def fragmentation_between(at_lo: Fragmentation, at_hi: Fragmentation, lo: int, hi: int,
                          batch: int) -> Fragmentation:
    """Fragmentation at `batch` from the replays at two micro-batches lo < hi (trace/derive/
    replays.py): that of lo, growing along the line to hi's where hi's is larger, never
    shrinking. The replay's fragmentation
    jumps by a segment here and there as sizes change (a 20 MiB segment that happens to be shared
    or not); read off this line it grows with what the step allocates, so memory is
    non-decreasing in the micro-batch and the fit answer cannot flip back as b grows."""
    t = max(0.0, (batch - lo) / (hi - lo))

    def line(a: int, b: int) -> int:
        return int(a + t * max(0, b - a))
    return Fragmentation(line(at_lo.pinned, at_hi.pinned), line(at_lo.reserved, at_hi.reserved))


def estimate_memory(trace: Trace, accel: Accelerator, job, rt: Runtime | None = None,
                    frag: Fragmentation | None = None) -> MemoryEstimate:
    """Per-device memory of `job` (as traced) on `accel` under framework runtime `rt` (default:
    today's PyTorch); see the module docstring. `frag`: the allocator's fragmentation to apply
    (default: this trace's own replay; predict/evaluate.py passes the line through its anchors)."""
    rt = rt or runtime()
    phases = trace.phase_peaks or {trace.peak_phase: (trace.peak_allocated_bytes,
                                                       trace.peak_breakdown_bytes)}
    best_phase, best = None, None
    devices = max(1, job.gpus) * accel.devices_per_unit
    paged_states = job.optimizer.paged
    fixed = 0
    candidates, stream_held = [], {}
    for phase, (_total, cats) in phases.items():
        # torch_xla all-reduces gradients in place (no DDP bucket copies)
        t = _transform(cats, job, trace, phase, rt, devices, ddp_buckets=accel.kind != "tpu")
        stream_held[phase] = t.pop(sharding.STREAM_HELD, 0)
        candidates.append((phase, t))
        # what this phase holds at any sequence length and micro-batch: the weights, the
        # optimizer states the device holds, and during the update every gradient
        fixed = max(fixed, t["weights"] + (0 if paged_states else t["optimizer_states"])
                    + (t["gradients"] if phase == "optimizer" else 0))
        saving = sharding.checkpoint_phase(t, job, trace, devices) if phase == "optimizer" \
            else None
        if saving is not None:       # a sharded checkpoint gathered when it is saved
            candidates.append(("checkpoint", {k: int(v) for k, v in saving.items()}))
            fixed = max(fixed, int(sum(saving.values())) - (saving["optimizer_states"]
                                                            if paged_states else 0))
    for phase, t in candidates:
        if best is None or sum(t.values()) > sum(best.values()):
            best_phase, best = phase, t
    held_extra = stream_held.get(best_phase, 0)
    allocated = sum(best.values())
    # paged optimizer states live in CUDA unified memory, outside the caching allocator: on the
    # device while there is room, paged to host RAM by the driver when it runs short
    paged = best["optimizer_states"] if paged_states else 0
    allocated -= paged
    # the single-device replay's fragmentation, scaled to what this strategy's device holds
    rules = rules_for(accel.backend, job.expandable_segments)
    frag = frag or fragmentation(trace, rules)
    share = allocated / trace.peak_allocated_bytes if trace.peak_allocated_bytes else 1.0
    reserved = allocated + int(frag.reserved * min(1.0, share)) + held_extra
    needed = allocated + int(frag.pinned * min(1.0, share)) + held_extra
    overhead = framework_overhead_bytes(accel, rt, devices)
    gpu0_extra = 0
    if job.strategy is DP and job.gpus > 1:
        # GPU 0 gathers every replica's outputs and holds the only optimizer state
        gpu0_extra = (job.gpus - 1) * _output_bytes(trace)
    capacity = accel.usable_memory_bytes
    required = needed + gpu0_extra + overhead
    used = reserved + gpu0_extra + overhead + paged
    if required <= capacity < used:
        used = capacity     # the allocator fills the device, then gives cached blocks back
    breakdown = {
        "weights": best["weights"],
        "gradients": best["gradients"],
        "optimizer_states": best["optimizer_states"],
        "activations": best["activations"],
        "temporaries": best["temporaries"] + best["weight_casts"] + gpu0_extra,
        "fragmentation": max(0, used - overhead - allocated - paged - gpu0_extra),
        "framework_overhead": overhead,
    }
    return MemoryEstimate(
        peak_allocated_bytes=allocated + gpu0_extra, peak_reserved_bytes=reserved + gpu0_extra,
        device_used_bytes=used, required_bytes=required, capacity_bytes=capacity,
        breakdown_bytes=breakdown, peak_phase=best_phase,
        host_ram_bytes=_host_ram(trace, job, accel), gpu0_extra_bytes=gpu0_extra,
        held_bytes=reserved + gpu0_extra + overhead,      # paged states never cause an OOM
        floor_bytes=fixed + overhead, overhead_bytes=overhead,
        band=bands.band_for(job, accel, moe=bool(trace.expert_param_bytes)),
        allocator=rules.name)


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
        max(1, job.gpus) if job.strategy is not DP else 1)
    host = procs * trace.weight_bytes
    if job.offload.states:
        host += trace.optimizer_state_bytes + trace.gradient_bytes
    if job.offload.params:
        host += trace.weight_bytes
    return int(host)
