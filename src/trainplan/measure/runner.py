"""Run real training steps of exactly the job trainplan predicts, on the local device.

The model comes from the same source code the tracer uses (`models.build_model` and the tracer's
`prepare_model`: precision, LoRA/QLoRA, frozen prefixes), built for real: the sources build under
`with torch.device("meta")`, which is itself a TorchFunctionMode that fills `device="meta"` into
factory calls; `OnDevice`, a mode beneath it, turns that `meta` into the real device, so every
module initialises its weights and buffers (rotary tables, position ids) on the device exactly as
its own code does. Then, as in the tracer: activation checkpointing on the same blocks
(`trace/checkpointing.py`), the same optimizer (`trace/optimizers.py`, foreach), channels-last,
and one optimizer step = grad_accum x (forward + loss + backward) + the job's gradient clipping
(`max_grad_norm`; under fp16 after GradScaler's unscale_) + step + zero_grad(set_to_none).

What the device runs natively instead of the tracer's emulation of it: CUDA autocast
(`torch.autocast`), the SDPA backend PyTorch picks (forced with `sdpa_kernel` only when the job
names one), fused dropout. fp16 AMP adds a GradScaler, as a real fp16 job must. fp32 jobs run with
PyTorch's defaults (TF32 off for matmuls, on for cuDNN convolutions); tf32 jobs turn both on.
Inputs are the source's synthetic batch (`ModelBundle.make_inputs`), made once on the device and
reused, so data loading is not measured.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import shlex
import sys

import torch
from torch.overrides import TorchFunctionMode

from ..accelerators import get_accelerator
from ..errors import TrainplanError
from ..predict.target import semantics_for
from ..models import ModelBundle, build_model
from ..models.lora import LoraEmbedding, LoraLinear, QuantizedWeight, QuantLinear
from ..models.reference import INIT_STD
from ..spec import Job
from ..trace.checkpointing import apply_checkpointing
from ..trace.optimizers import build_optimizer, clip_gradients
from ..trace.semantics import KernelSemantics, attention_backend_for
from ..trace.prepare import autocast_dtype, prepare_model
from .device import describe_device, resolve_accelerator, resolve_device
from .profile import OPTIMIZER_RANGE, phase, profiled_step
from .recorder import Recorder, check_measurable


class OnDevice(TorchFunctionMode):
    """Under `torch.device("meta")`, create tensors on `device` instead (see module docstring)."""

    def __init__(self, device: torch.device):
        super().__init__()
        self.device = device

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        d = kwargs.get("device")
        if d is not None and torch.device(d).type == "meta":
            kwargs["device"] = self.device
        return func(*args, **kwargs)


def _fused_rms_norm_release() -> bool:
    """Whether this PyTorch runs CUDA's fused RMSNorm kernel (KernelSemantics.fused_rms_norm)."""
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key("aten::_fused_rms_norm", "CUDA")
    except RuntimeError:        # no such op: a release before the kernel
        return False


def local_semantics(job: Job, dev: torch.device, accel_id: str | None) -> KernelSemantics:
    """The kernel semantics the tracer would use for this device (the catalog row's if known),
    with the RMSNorm this PyTorch runs: the one being measured."""
    if accel_id is not None:
        sem = semantics_for(job, get_accelerator(accel_id))
        if dev.type == "cuda":
            sem = dataclasses.replace(sem, fused_rms_norm=_fused_rms_norm_release())
        return sem
    cc = None
    if dev.type == "cuda":
        major, minor = torch.cuda.get_device_capability(dev)
        cc = major + minor / 10
    return KernelSemantics(attention=attention_backend_for(cc, job.attention)
                           if dev.type == "cuda" else "math",
                           autocast_dtype=autocast_dtype(job.precision),
                           channels_last=bool(job.channels_last),
                           cuda_softmax=dev.type == "cuda",
                           fused_rms_norm=dev.type == "cuda" and _fused_rms_norm_release())


def on_device(job, steps: int, device, accelerator, progress):
    """What a measurement starts from: the checked job's (device, its description, the catalog
    accelerator it is, the kernel semantics it runs, a progress callback that has said what is
    being built). `measure` (training steps) and `measure --task generate` share it."""
    if steps < 1:
        raise TrainplanError(f"--steps must be >= 1, got {steps}.")
    check_measurable(job)
    dev = resolve_device(device)
    info = describe_device(dev)
    acc, _ = resolve_accelerator(info, accelerator)
    sem = local_semantics(job, dev, acc)
    say = progress or (lambda msg: None)
    say(f"building {job.model_label} on {dev} ({info.name})")
    return dev, info, acc, sem, say


def build_on_device(job: Job, sem: KernelSemantics, dev: torch.device) -> tuple[ModelBundle, list]:
    """The job's model, prepared as the tracer prepares it, with real weights on `dev`.
    Returns (bundle, checkpointed block names)."""
    with OnDevice(dev):
        bundle = build_model(job, attention=sem.attention)
        prepare_model(job, bundle)
    model = bundle.module
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers())
            if t.device.type == "meta"]
    if left:
        raise TrainplanError(f"{bundle.name}: {len(left)} tensors stayed on the meta device "
                             f"({', '.join(left[:3])}).",
                             fix="the model creates them outside torch factory functions; "
                                 "describe it with py:<module>:<factory>")
    _init_adapters(model)
    _dequantize_for_real(model)
    model.train()
    blocks = apply_checkpointing(model, job.grad_checkpointing,
                                 reentrant=job.reentrant_checkpointing)
    if sem.channels_last:
        model.to(memory_format=torch.channels_last)
    return bundle, blocks


@torch.no_grad()
def _init_adapters(model: torch.nn.Module) -> None:
    """peft's LoRA init: A random, B zero (so the adapted model starts as the base model)."""
    for m in model.modules():
        if isinstance(m, LoraLinear):
            torch.nn.init.zeros_(m.lora_B.weight)
        elif isinstance(m, LoraEmbedding):
            torch.nn.init.zeros_(m.lora_A)
            torch.nn.init.normal_(m.lora_B)


def _dequantize_for_real(model: torch.nn.Module) -> None:
    """QLoRA's emulated base weights return `torch.empty` (right for the tracer: bytes, no
    values). A real run would multiply by uninitialised memory, possibly NaN, and an fp16
    GradScaler would then skip every optimizer step; instead each use writes a full-size weight
    of small random values (std 0.02, models/reference.py INIT_STD), as bitsandbytes' dequantize
    kernel writes one. Not zeros: a GPU held at its power limit runs a matmul of zeros faster
    than one of real values (Horace He, "Strangely, Matrix Multiplications on GPUs Run Faster
    When Given 'Predictable' Data", thonking.ai, 2024: 295 against 257 TFLOPS on an A100), so
    the measured step would be a step no real model runs. Frozen biases (created empty) are
    zeroed."""
    for m in model.modules():
        if isinstance(m, QuantLinear) and m.bias is not None:
            with torch.no_grad():
                m.bias.zero_()
        if isinstance(m, QuantizedWeight):
            m.dequantize = functools.partial(_random_weight, m)


def _random_weight(q: QuantizedWeight) -> torch.Tensor:
    """What a real run's dequantisation writes: the block scales rebuilt first where the traced
    kernels rebuild them (double quantisation, QuantizedWeight.absmax), then a full-size weight."""
    q.absmax()
    return torch.empty(q.shape, dtype=q.dtype, device=q.packed.device).normal_(0, INIT_STD)


@contextlib.contextmanager
def allocator_settings(job: Job, dev: torch.device):
    """The CUDA caching allocator as the job runs it: with expandable segments where the job asks
    (`expandable_segments`: what PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True sets, switched
    for this run by `torch.cuda.memory._set_allocator_settings`, PyTorch >= 2.1, and switched
    back after). Yields what the run's settings record: the setting in force, and the
    environment's PYTORCH_CUDA_ALLOC_CONF where one is set (it applies to every run)."""
    env = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    out = {"alloc_conf_env": env} if env else {}
    if dev.type != "cuda" or not job.expandable_segments:
        yield out
        return
    torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    try:
        yield dict(out, expandable_segments=True)
    finally:
        torch.cuda.memory._set_allocator_settings("expandable_segments:False")


@contextlib.contextmanager
def precision_switches(job: Job, dev: torch.device):
    """fp32: PyTorch's defaults (matmul TF32 off, cuDNN TF32 on); tf32: both on. Restored after."""
    if dev.type != "cuda":
        yield {}
        return
    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    tf32 = job.precision.compute == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = True
    try:
        yield {"matmul_allow_tf32": tf32, "cudnn_allow_tf32": True,
               "cudnn_benchmark": bool(torch.backends.cudnn.benchmark)}
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def _sdpa_context(job: Job, dev: torch.device):
    """Force the SDPA backend only when the job names one (on CUDA)."""
    if dev.type != "cuda" or job.attention not in ("flash", "efficient", "math"):
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
               "math": SDPBackend.MATH}[job.attention]
    return sdpa_kernel(backend)


def make_inputs(job: Job, bundle: ModelBundle, dev: torch.device, sem: KernelSemantics) -> dict:
    """The source's synthetic batch, created on `dev`; float inputs take the model's dtype in
    pure fp16/bf16 jobs (a real loop casts them; the tracer's fake kernels do not check)."""
    with torch.device(dev):
        inputs = bundle.make_inputs(job.batch_size)
    half = getattr(torch, job.precision.stored) if job.precision.pure_half else None
    out = {}
    for k, v in inputs.items():
        if isinstance(v, torch.Tensor):
            if v.is_floating_point() and half is not None:
                v = v.to(half)
            if sem.channels_last and v.dim() == 4:
                v = v.contiguous(memory_format=torch.channels_last)
        out[k] = v
    return out


def run_measurement(job: Job, steps: int = 10, warmup: int = 3, device: str | None = None,
                    accelerator: str | None = None, out=None, command: str | None = None,
                    progress=None, write: bool = True, profile: bool = False
                    ) -> tuple[dict, object]:
    """Run `warmup + steps` optimizer steps of `job` and return (record, path it was appended to).

    `accelerator` (catalog id) names the device for the prediction; by default it is detected
    from the CUDA device name. `out` is the JSON-lines file (default $TRAINPLAN_HOME).
    `profile`: one more step, untimed, under PyTorch's profiler (measure/profile.py): the
    record's `measured.profile`, its device time by kernel class.
    """
    dev, info, acc, sem, say = on_device(job, steps, device, accelerator, progress)
    with allocator_settings(job, dev) as alloc:
        return _measured(job, steps, warmup, dev, sem, say, alloc, accelerator, out, command,
                         write, profile)


def _measured(job, steps, warmup, dev, sem, say, alloc, accelerator, out, command, write,
              profile=False):
    """`run_measurement`'s steps, under the job's allocator settings."""
    bundle, blocks = build_on_device(job, sem, dev)
    model = bundle.module
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise TrainplanError(f"{bundle.name} has no trainable parameter in this job.",
                             fix="unfreeze something, or add LoRA adapters")
    opt = build_optimizer(job.optimizer, params)
    amp = autocast_dtype(job.precision)
    scaler = torch.amp.GradScaler("cuda") if amp == torch.float16 and dev.type == "cuda" else None
    inputs = make_inputs(job, bundle, dev, sem)
    fwd = {k: v for k, v in inputs.items() if not k.startswith("_")}
    autocast = (lambda: torch.autocast(dev.type, dtype=amp)) if amp else contextlib.nullcontext

    def one_step():
        for _ in range(job.grad_accum):
            with autocast():
                loss = bundle.loss(model(**fwd), inputs)
            (scaler.scale(loss) if scaler else loss).backward()
        with phase(OPTIMIZER_RANGE):       # a range only in a profiled step (profile.py)
            if scaler and job.max_grad_norm:
                scaler.unscale_(opt)           # clip the true gradients (torch's AMP recipe)
            clip_gradients(params, job.max_grad_norm)
            if scaler:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            opt.zero_grad(set_to_none=True)
        return loss.detach()

    notes = list(bundle.notes)
    if job.quantize.on or job.optimizer.bnb:
        notes.append("QLoRA / 8-bit and paged AdamW run trainplan's emulation of bitsandbytes (the "
                     "ops the tracer counts, dequantize as a full-size write), not its kernels")
    if amp is not None and dev.type == "cpu":
        notes.append(f"CPU autocast ({job.precision}) follows CPU autocast rules, not CUDA's")
    rec = Recorder(job, dev, warmup, tokens_per_sample=bundle.tokens_per_sample)
    with precision_switches(job, dev) as switches, _sdpa_context(job, dev):
        say(f"running {warmup} warm-up + {steps} timed steps")
        rec.start()
        for i in range(warmup + steps):
            try:
                loss = one_step()
            except torch.OutOfMemoryError:
                raise _oom(job, dev, i + 1) from None
            rec.step(loss)
        if profile:
            say("profiling one more step (not timed)")
            prof = profiled_step(one_step, dev)
            if prof is None:
                notes.append("--profile: PyTorch's profiler saw no CUDA kernel (no CUPTI in this "
                             "build or driver?); nothing to compare by kernel class")
    settings = {"steps": steps, "device": str(dev), "grad_scaler": scaler is not None,
                "sdpa_backend_forced": job.attention if _forced(job, dev) else None,
                "checkpointed_blocks": len(blocks), "inputs": "synthetic, reused every step",
                **switches, **alloc}
    del model, opt, inputs, fwd, bundle
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    say("predicting the same job with trainplan")
    return rec.finish(source="measure", command=command or shlex.join(sys.argv),
                      accelerator=accelerator, settings=settings, notes=notes, out=out,
                      write=write,
                      extra_measured=(lambda m: dict(m, profile=prof)) if profile and prof
                      else None)


def _oom(job: Job, dev: torch.device, step: int) -> TrainplanError:
    from ..units import fmt_bytes
    peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None
    total = torch.cuda.get_device_properties(dev).total_memory if dev.type == "cuda" else None
    return TrainplanError(
        f"{job.model_label} ran out of device memory in optimizer step {step} (micro-batch "
        f"{job.batch_size}; peak allocated {fmt_bytes(peak)} of {fmt_bytes(total)}).",
        fix="lower --batch-size or add --grad-checkpointing full; `trainplan estimate` predicts "
            "the largest micro-batch that fits")


def _forced(job: Job, dev: torch.device) -> bool:
    return dev.type == "cuda" and job.attention in ("flash", "efficient", "math")
