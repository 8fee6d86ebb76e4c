"""The fix ladder: job changes that make a job fit, cheapest first, each a Job -> Job transform.

The planner applies the rungs one after another on top of each other until the job fits, and
re-plans after each (micro-batch, accumulation, memory, step time), so every rung's effect is
computed, not assumed. Order (cheapest in speed and in how much the training changes first):

    0  smaller micro-batch + gradient accumulation   (part of every plan: planner.py)
    1  memory-efficient attention (SDPA) instead of eager/math attention
    2  selective activation checkpointing, then 3 full checkpointing     (~+33% compute at full)
    4  mixed precision the device supports (bf16 AMP on sm80+/TPU, else fp16 AMP)
    5  8-bit AdamW (bitsandbytes; CUDA only)
    6  LoRA adapters (pretrained hf: models only), then 7 QLoRA (4-bit base; CUDA only)
    8  ZeRO-2, then 9 ZeRO-3 over the devices present (multi-GPU only)
    10 CPU offload of the optimizer state, then 11 of the parameters too (DeepSpeed ZeRO-Offload)
    12 shorter sequences (halved, at most 3 times, not below 64 tokens)

A rung the platform cannot do is never proposed; it is listed in `skipped_fixes` with the reason
(bf16 on a T4, bitsandbytes on a TPU, sharding over one device). Rungs 6, 7 and 12 change what
is trained and say so (`changes_training`).

`compatibility()` runs before any of this: it replaces what the accelerator cannot run at all
(bf16 on a pre-Ampere GPU, FlashAttention-2 below sm80, bitsandbytes or DataParallel on a TPU)
by the closest thing it can, because the job as written would fail there, not just run out of memory.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..accelerators import Accelerator
from ..spec import Lora

MIN_SEQ_LEN = 64
SEQ_HALVINGS = 3


@dataclass(frozen=True)
class Step:
    """A rung that applies: the changed job, what changed, and whether the training changes."""

    rung: str
    title: str
    job: object
    setting: dict = field(default_factory=dict)
    changes_training: bool = False


@dataclass(frozen=True)
class Skip:
    """A rung this platform cannot do, and why."""

    rung: str
    reason: str


def _pretrained(job) -> bool:
    """LoRA adapts pretrained weights: only hub models (hf:) are assumed pretrained."""
    return job.model.startswith("hf:")


def _has_attention(job) -> bool:
    return job.model.startswith("hf:") or job.model.startswith("transformer")


def _step(rung, title, job, changes_training=False, **kw) -> Step:
    return Step(rung, title, job.with_(**kw), dict(kw), changes_training)


def attention(job, accel: Accelerator, devices: int):
    if job.attention not in ("eager", "math") or not _has_attention(job):
        return None
    return _step("attention", "memory-efficient attention (SDPA)", job, attention="sdpa")


def checkpointing_selective(job, accel, devices):
    if job.grad_checkpointing != "none":
        return None
    return _step("checkpointing-selective", "selective activation checkpointing", job,
                 grad_checkpointing="selective")


def checkpointing_full(job, accel, devices):
    if job.grad_checkpointing == "full":
        return None
    return _step("checkpointing-full", "full activation checkpointing", job, grad_checkpointing="full")


def half_precision_for(accel: Accelerator) -> str | None:
    """The AMP dtype the accelerator runs fast: bf16 on TPUs and sm80+, fp16 where it has fp16."""
    if accel.kind == "tpu" or accel.supports_bf16:
        return "bf16-amp"
    if accel.fp16_tensor_flops or accel.fp16_nontensor_flops:
        return "fp16-amp"
    return None


def precision(job, accel, devices):
    if job.precision not in ("fp32", "tf32"):
        return None
    amp = half_precision_for(accel)
    if amp is None:
        return Skip("precision", f"{accel.id} has no fast 16-bit arithmetic")
    return _step("precision", f"mixed precision ({amp.replace('-amp', '')} AMP)", job, precision=amp)


def optimizer_8bit(job, accel, devices):
    if job.optimizer not in ("adamw", "adam"):
        return None
    if accel.kind != "gpu":
        return Skip("optimizer-8bit", f"8-bit AdamW needs bitsandbytes, which is CUDA-only ({accel.id})")
    return _step("optimizer-8bit", "8-bit AdamW (bitsandbytes)", job, optimizer="adamw-8bit")


def lora(job, accel, devices):
    if job.lora is not None:
        return None
    if not _pretrained(job):
        return Skip("lora", f"LoRA adapts pretrained weights; {job.model_label} is trained from scratch")
    return _step("lora", "LoRA adapters (rank 16, all linear layers)", job, changes_training=True,
                 lora=Lora(rank=16, alpha=32.0, targets="all-linear"))


def qlora(job, accel, devices):
    if job.lora is None or job.quantize != "none":
        return None
    if accel.kind != "gpu":
        return Skip("qlora", f"QLoRA's 4-bit base needs bitsandbytes, which is CUDA-only ({accel.id})")
    return _step("qlora", "QLoRA (4-bit NF4 base weights)", job, changes_training=True, quantize="nf4")


def _sharding(stage: str):
    def rung(job, accel, devices):
        order = ("single", "dp", "ddp", "zero1", "zero2", "zero3")
        if job.strategy == "fsdp" or job.strategy not in order or order.index(job.strategy) >= order.index(stage):
            return None
        if devices <= 1:
            return Skip(stage, "sharding needs more than one device")
        if accel.kind == "tpu":
            return Skip(stage, "sharding over TPU cores is not modelled (memory.py shards over GPUs)")
        return _step(stage, f"ZeRO-{stage[-1]} over the {devices} devices (DeepSpeed)", job, strategy=stage)
    return rung


def _offload(level: str):
    def rung(job, accel, devices):
        order = ("none", "optimizer", "optimizer+params")
        if order.index(job.offload) >= order.index(level):
            return None
        if accel.kind != "gpu":
            return Skip(f"offload-{level.split('+')[-1]}", f"CPU offload is a DeepSpeed (CUDA) feature ({accel.id})")
        stage = "zero3" if level == "optimizer+params" else (
            job.strategy if job.strategy in ("zero2", "zero3", "fsdp") else "zero2")
        what = "optimizer state" if level == "optimizer" else "optimizer state and parameters"
        return _step(f"offload-{level.split('+')[-1]}", f"CPU offload of the {what} (ZeRO-Offload)",
                     job, offload=level, strategy=stage)
    return rung


def seq_len(job, accel, devices):
    if job.seq_len is None or job.seq_len // 2 < MIN_SEQ_LEN:
        return None
    return _step("seq-len", f"shorter sequences ({job.seq_len // 2} tokens)", job,
                 changes_training=True, seq_len=job.seq_len // 2)


Rung = Callable[[object, Accelerator, int], "Step | Skip | None"]
LADDER: tuple[Rung, ...] = (
    attention, checkpointing_selective, checkpointing_full, precision, optimizer_8bit, lora, qlora,
    _sharding("zero2"), _sharding("zero3"), _offload("optimizer"), _offload("optimizer+params"),
    *(seq_len,) * SEQ_HALVINGS,
)
RUNGS = ("micro-batch", "attention", "checkpointing-selective", "checkpointing-full", "precision",
         "optimizer-8bit", "lora", "qlora", "zero2", "zero3", "offload-optimizer", "offload-params",
         "seq-len")
SPEED_LADDER: tuple[Rung, ...] = (precision, attention)


def compatibility(job, accel: Accelerator) -> tuple[object, list[str]]:
    """Replace what `accel` cannot run by its nearest equivalent; returns (job, changes)."""
    changes = []
    if accel.kind == "gpu" and job.precision in ("bf16-amp", "bf16") and not accel.supports_bf16:
        new = "fp16-amp" if job.precision == "bf16-amp" else "fp16"
        changes.append(f"precision {new} instead of {job.precision} ({accel.id} has no bf16; "
                       "fp16 needs loss scaling)")
        job = job.with_(precision=new)
    if job.attention == "flash" and accel.kind == "gpu" and not accel.flash_attention_2:
        changes.append(f"attention sdpa instead of flash (FlashAttention-2 needs sm80+, {accel.id} is "
                       f"sm{accel.compute_capability.replace('.', '')})")
        job = job.with_(attention="sdpa")
    if accel.kind == "tpu":
        if job.quantize != "none":
            changes.append(f"LoRA in bf16 instead of QLoRA {job.quantize} (bitsandbytes is CUDA-only)")
            job = job.with_(quantize="none")
        if job.optimizer == "adamw-8bit":
            changes.append("AdamW instead of 8-bit AdamW (bitsandbytes is CUDA-only)")
            job = job.with_(optimizer="adamw")
        if job.offload != "none":
            changes.append("no CPU offload (a DeepSpeed feature; not on TPU)")
            job = job.with_(offload="none")
    return job, changes
