"""The fix ladder: job changes that make a job fit, cheapest first, each a Job -> Job transform.

The planner applies the rungs one after another on top of each other until the job fits, and
re-plans after each (micro-batch, accumulation, memory, step time), so every rung's effect is
computed, not assumed. Order (cheapest in speed and in how much the training changes first):

    0  smaller micro-batch + gradient accumulation   (part of every plan: planner.py)
    1  memory-efficient attention (SDPA) instead of eager/math attention
    2  selective activation checkpointing, then 3 full checkpointing     (~+33% compute at full)
    4  mixed precision the device supports (bf16 AMP on sm80+/TPU, else fp16 AMP)
    5  8-bit AdamW (bitsandbytes; CUDA only)
    5b GRPO without LoRA: beta 0, no reference copy of the weights
    6  LoRA adapters (pretrained hf: models only), then 7 QLoRA (4-bit base; CUDA only)
    8  ZeRO-2, then 9 ZeRO-3 over the devices present (multi-GPU only)
    9b GRPO/PPO under ZeRO-3: generation gathers layer by layer, not the whole model
    10 CPU offload of the optimizer state, then 11 of the parameters too (DeepSpeed ZeRO-Offload)
    12 shorter sequences (halved, at most 3 times, not below 64 tokens); a generating job
       halves its prompts and completions. Not tried where what no length changes (weights,
       optimizer states, gradients in the update, the runtime: MemoryEstimate.floor_bytes)
       already exceeds the device

A rung the platform cannot do is never kept; it is listed in `skipped_fixes` with the reason:
the planner checks every rung's job against the prediction core's compatibility table
(predict/compat.py: bitsandbytes or offload on a TPU, sharding over one device), the same table
that adapts the job to the platform before any of this (bf16 on a pre-Ampere GPU,
FlashAttention-2 below sm80) and gives `estimate` its findings. Rungs 6, 7 and 12 change what is
trained and say so (`changes_training`), as does 5b.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ..accelerators import Accelerator
from ..algorithm import KEYS as ROLLOUT_KEYS
from ..precision import BF16_AMP, FP16_AMP, Precision
from ..spec import Lora
from ..strategy import ZERO2, ZERO3, Strategy

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


_ROLLOUT_KEYS = tuple(sorted(ROLLOUT_KEYS))     # a rung's rollout settings, as flat keys


def apply(job, setting: dict):
    """`job` with a rung's setting: Job fields, and a rollout's lengths as flat keys."""
    kw = {k: v for k, v in setting.items() if k not in _ROLLOUT_KEYS}
    rollout = {k: v for k, v in setting.items() if k in _ROLLOUT_KEYS}
    if rollout:
        kw["rollout"] = replace(job.rollout, **rollout)
    return job.with_(**kw)


def _step(rung, title, job, changes_training=False, **kw) -> Step:
    """The rung's job; `setting` names precision and strategy by their canonical spelling."""
    setting = {k: v.name if isinstance(v, (Precision, Strategy)) else v for k, v in kw.items()}
    return Step(rung, title, apply(job, kw), setting, changes_training)


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


def half_precision_for(accel: Accelerator) -> Precision | None:
    """The AMP the accelerator runs fast: bf16 on TPUs and sm80+, fp16 where it has fp16."""
    if accel.kind == "tpu" or accel.supports_bf16:
        return BF16_AMP
    if accel.fp16_tensor_flops or accel.fp16_nontensor_flops:
        return FP16_AMP
    return None


def precision(job, accel, devices):
    if not job.precision.full:
        return None
    amp = half_precision_for(accel)
    if amp is None:
        return Skip("precision", f"{accel.id} has no fast 16-bit arithmetic")
    return _step("precision", amp.label, job, precision=amp)


def optimizer_8bit(job, accel, devices):
    if job.optimizer not in ("adamw", "adam"):
        return None
    return _step("optimizer-8bit", "8-bit AdamW (bitsandbytes)", job, optimizer="adamw-8bit")


def reference_off(job, accel, devices):
    """GRPO with beta > 0 and no LoRA keeps a full second copy of the weights for the reference
    model; beta 0 (TRL's default since 0.18) loads none. With LoRA the reference is the base with
    adapters off, so there is nothing to drop."""
    r = job.rollout
    if r is None or r.beta == 0 or job.algorithm != "grpo" or job.lora is not None:
        return None
    return _step("beta-0", "no reference model (beta 0, TRL's default)", job,
                 changes_training=True, beta=0.0)


def gather_per_token(job, accel, devices):
    """Under ZeRO-3, TRL gathers the whole model for generation and holds it
    (ds3_gather_for_generation, default true); turned off, each forward gathers the layers it
    needs: the full copy never sits on one device, at the price of a gather per generated token
    (TRL GRPOConfig's docstring says so: 'slower generation')."""
    r = job.rollout
    if r is None or r.engine != "hf" or not r.gather_for_generation or devices < 2 \
            or not job.strategy.name.startswith("zero3"):
        return None
    return _step("gather-per-token", "generation without gathering the whole model "
                 "(ds3_gather_for_generation false; slower generation)", job,
                 gather_for_generation=False)


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
    return _step("qlora", "QLoRA (4-bit NF4 base weights, double-quantised)", job,
                 changes_training=True, quantize="nf4-dq")


def _sharding(stage: Strategy):
    def rung(job, accel, devices):
        if job.strategy.order >= stage.order:
            return None
        if accel.kind == "tpu":
            return Skip(stage.name, "sharding over TPU cores is not modelled (memory.py shards "
                                    "over GPUs)")
        return _step(stage.name, f"ZeRO-{stage.order} over the {devices} devices (DeepSpeed)", job,
                     strategy=stage)
    return rung


def _offload(level: str):
    def rung(job, accel, devices):
        order = ("none", "optimizer", "optimizer+params")
        if order.index(job.offload) >= order.index(level):
            return None
        stage = ZERO3 if level == "optimizer+params" else (
            job.strategy if job.strategy.shards_gradients else ZERO2)
        what = "optimizer state" if level == "optimizer" else "optimizer state and parameters"
        return _step(f"offload-{level.split('+')[-1]}", f"CPU offload of the {what} (ZeRO-Offload)",
                     job, offload=level, strategy=stage)
    return rung


def seq_len(job, accel, devices):
    """Halve the sequence; a generating job (GRPO, PPO) halves its prompt and its completion,
    as seed 004's own advice does (4096 + 768 -> 2048 + 384 tokens)."""
    if job.seq_len is None or job.seq_len // 2 < MIN_SEQ_LEN:
        return None
    if job.rollout is not None:
        r = job.rollout
        if min(r.prompt_len, r.completion_len) // 2 < MIN_SEQ_LEN // 2:
            return None
        p, c = r.prompt_len // 2, r.completion_len // 2
        return _step("seq-len", f"shorter prompts and completions ({p} + {c} tokens)", job,
                     changes_training=True, prompt_len=p, completion_len=c, seq_len=p + c)
    return _step("seq-len", f"shorter sequences ({job.seq_len // 2} tokens)", job,
                 changes_training=True, seq_len=job.seq_len // 2)


Rung = Callable[[object, Accelerator, int], "Step | Skip | None"]
LADDER: tuple[Rung, ...] = (
    attention, checkpointing_selective, checkpointing_full, precision, optimizer_8bit,
    reference_off, lora, qlora, _sharding(ZERO2), _sharding(ZERO3), gather_per_token,
    _offload("optimizer"), _offload("optimizer+params"),
    *(seq_len,) * SEQ_HALVINGS,
)
SPEED_LADDER: tuple[Rung, ...] = (precision, attention)
