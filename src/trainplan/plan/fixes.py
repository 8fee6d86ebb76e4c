"""The fix ladder: job changes that make a job fit, in the order a practitioner takes them, each a
Job -> Job transform whose effect is the library's own.

The order is data (data/fix_ladder.json, one row a rung): by what a rung costs the user -- a
setting in the same script first, then another optimizer class, then training other parameters
(LoRA, a smaller rank, QLoRA, a frozen embedding), then shorter sequences, then a new launcher over
the devices present (DeepSpeed ZeRO), and DeepSpeed on one device with the CPU running the
optimizer (ZeRO-Offload) last, only where nothing simpler fits -- and within a cost by step time.
Each row says what the user changes, what the library then does and the source line it rests on.

    flag       attention (SDPA), mixed precision, 16-bit frozen weights (no peft fp32 upcast),
               FSDP gradients reduced on every micro-batch (sync_each_batch), selective then
               full checkpointing, GRPO generation gathered layer by layer
    optimizer  8-bit AdamW, then paged 8-bit AdamW (bitsandbytes)
    training   GRPO without a reference (beta 0), LoRA, a smaller LoRA (half the rank, or
               attention only), a frozen input embedding, QLoRA (4-bit NF4 base)
    data       shorter sequences (halved, at most 3 times, not below 64 tokens; a generating job
               halves prompts and completions). Not tried where what no length changes
               (weights, optimizer states, gradients in the update, the runtime:
               MemoryEstimate.floor_bytes) already exceeds the device
    launcher   ZeRO-2, then ZeRO-3 over the devices present (multi-GPU only)
    launcher-one-device   CPU offload of the optimizer state, then of the parameters

The planner (planner.py) applies the rungs one after another on top of each other until the job
fits, re-planning after each, and evaluates each rung alone on the job as it came to the ladder:
every rung shows its own saving and its cumulative one, and "fits" only where that state fits.
A rung the platform cannot do is never kept; it is listed in `skipped_fixes` with the reason
(predict/compat.py: bitsandbytes or offload on a TPU, sharding over one device). Rungs that
change what is trained say so (`changes_training`).

Effects (predict/ models them; the rows cite the library lines): DeepSpeed's fp16/bf16 engine
casts the whole module to 16 bits (engine.py `module.half()`): every floating-point weight, never
4-bit storage (uint8, not a float), so a ZeRO rung of a job under mixed precision also carries
`frozen_half: all`; ZeRO-1/2/3 partition the trainable parameters' state only (sharding.py);
offload moves optimizer state (and for ZeRO-3 the parameters) to the host; paged optimizer
states live outside the allocator (memory.py).
"""
from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from importlib import resources

from ..accelerators import Accelerator
from ..algorithm import KEYS as ROLLOUT_KEYS
from ..named import Named
from ..optimizer import ADAM, ADAMW, ADAMW_8BIT, PAGED_ADAMW_8BIT, parse_offload
from ..precision import BF16_AMP, FP16_AMP, Precision
from ..predict.compat import offload_run, offloaded_optimizer
from ..spec import Lora
from ..strategy import ZERO2, ZERO3, Strategy

MIN_SEQ_LEN = 64


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


def describe(setting: dict) -> str:
    """A rung's setting as a reader sees it: 'lora: rank 8, alpha 16, q,k,v,o; frozen_half:
    all'."""
    def text(v) -> str:
        if isinstance(v, bool):         # as the job file writes it
            return "true" if v else "false"
        if isinstance(v, Lora):
            return f"rank {v.rank}, alpha {v.alpha:g}, {v.targets}"
        if isinstance(v, (tuple, list)):
            return ", ".join(str(x) for x in v)
        if isinstance(v, float):
            return f"{v:g}"
        return str(v)
    return "; ".join(f"{k}: {text(v)}" for k, v in setting.items())


def _step(rung, title, job, changes_training=False, **kw) -> Step:
    """The rung's job; `setting` names precision and strategy by their canonical spelling."""
    setting = {k: v.name if isinstance(v, Named) else v for k, v in kw.items()}
    return Step(rung, title, apply(job, kw), setting, changes_training)


def attention(job, accel: Accelerator, devices: int, trace=None):
    if job.attention not in ("eager", "math") or not _has_attention(job):
        return None
    return _step("attention", "memory-efficient attention (SDPA)", job, attention="sdpa")


def checkpointing_selective(job, accel, devices, trace=None):
    if job.grad_checkpointing != "none":
        return None
    return _step("checkpointing-selective", "selective activation checkpointing", job,
                 grad_checkpointing="selective")


def checkpointing_full(job, accel, devices, trace=None):
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


def precision(job, accel, devices, trace=None):
    if not job.precision.full:
        return None
    amp = half_precision_for(accel)
    if amp is None:
        return Skip("precision", f"{accel.id} has no fast 16-bit arithmetic")
    return _step("precision", amp.label, job, precision=amp)


def frozen_half(job, accel, devices, trace=None):
    """Frozen parameters in 16 bits instead of fp32 under mixed precision: peft's
    prepare_model_for_kbit_training upcast is optional (quantization.py)."""
    if job.lora is None or not job.precision.amp or job.frozen_half == "all":
        return None
    return _step("frozen-half", "frozen embeddings, norms and head in 16 bits (no fp32 upcast)",
                 job, frozen_half="all")


def sync_each_batch(job, accel, devices, trace=None):
    """FSDP with gradient accumulation under accelerate or the HF Trainer holds every unsharded
    gradient from the first micro-batch to the last (no_sync); syncing each micro-batch keeps
    shards only, for a reduce-scatter per micro-batch (Strategy.reduces_each_micro_batch). Tried
    only where the plan accumulates (planner.Planner.ladder)."""
    if devices < 2 or job.sync_each_batch or not job.strategy.fsdp:
        return None
    return _step("sync-each-batch", "gradients reduce-scattered after every micro-batch", job,
                 sync_each_batch=True)


def optimizer_8bit(job, accel, devices, trace=None):
    if job.optimizer not in (ADAMW, ADAM):
        return None
    return _step("optimizer-8bit", ADAMW_8BIT.label, job, optimizer=ADAMW_8BIT)


def optimizer_paged(job, accel, devices, trace=None):
    if job.optimizer not in (ADAMW, ADAM, ADAMW_8BIT):
        return None
    return _step("optimizer-paged", PAGED_ADAMW_8BIT.label, job, optimizer=PAGED_ADAMW_8BIT)


def reference_off(job, accel, devices, trace=None):
    """GRPO with beta > 0 and no LoRA keeps a full second copy of the weights for the reference
    model; beta 0 (TRL's default since 0.18) loads none. With LoRA the reference is the base with
    adapters off, so there is nothing to drop."""
    r = job.rollout
    if r is None or r.beta == 0 or job.algorithm != "grpo" or job.lora is not None:
        return None
    return _step("beta-0", "no reference model (beta 0, TRL's default)", job,
                 changes_training=True, beta=0.0)


def gather_per_token(job, accel, devices, trace=None):
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


def lora(job, accel, devices, trace=None):
    if job.lora is not None:
        return None
    if not _pretrained(job):
        return Skip("lora", f"LoRA adapts pretrained weights; {job.model_label} is trained from scratch")
    return _step("lora", "LoRA adapters (rank 16, all linear layers)", job, changes_training=True,
                 lora=Lora(rank=16, alpha=32.0, targets="all-linear"))


def lora_smaller(job, accel, devices, trace=None):
    """Half the LoRA rank (not below 4); at rank 4 already, adapters on attention only."""
    lo = job.lora
    if lo is None:
        return None
    if lo.rank > 4:
        rank = max(4, lo.rank // 2)
        return _step("lora-smaller", f"smaller LoRA (rank {rank})", job, changes_training=True,
                     lora=replace(lo, rank=rank, alpha=lo.alpha * rank / lo.rank))
    if lo.targets == "all-linear":
        return _step("lora-smaller", "LoRA on attention only (q, k, v, o)", job,
                     changes_training=True, lora=replace(lo, targets="q,k,v,o"))
    return None


# input embeddings of the bundled architectures (trace module names)
EMBEDDINGS = ("embed_tokens", "wte", "word_embeddings", "shared", "embed_in", "tok_embeddings")


def freeze_embeddings(job, accel, devices, trace=None):
    """Full fine-tuning: freeze the input embeddings (and a head tied to them)."""
    if job.lora is not None or trace is None or not job.model.startswith("hf:"):
        return None
    names = [m.name for m in trace.modules if m.name.rsplit(".", 1)[-1] in EMBEDDINGS
             and m.trainable_params]
    if not names or all(n in job.frozen for n in names):
        return None
    return _step("freeze-embeddings", "frozen input embeddings", job, changes_training=True,
                 frozen=tuple(dict.fromkeys(job.frozen + tuple(names))))


def qlora(job, accel, devices, trace=None):
    if job.lora is None or job.quantize != "none":
        return None
    return _step("qlora", "QLoRA (4-bit NF4 base weights, double-quantised)", job,
                 changes_training=True, quantize="nf4-dq")


def _sharding(stage: Strategy):
    def rung(job, accel, devices, trace=None):
        if job.strategy.order >= stage.order:
            return None
        if accel.kind == "tpu":
            return Skip(stage.name, "sharding over TPU cores is not modelled (memory.py shards "
                                    "over GPUs)")
        return _step(stage.name, f"ZeRO-{stage.order} over the {devices} devices (DeepSpeed)", job,
                     strategy=stage, **_engine_cast(job))
    return rung


def _engine_cast(job) -> dict:
    """DeepSpeed's fp16/bf16 engine casts the whole module to 16 bits (engine.py module.half()):
    a job with frozen parameters under mixed precision then holds them in 16 bits."""
    return {"frozen_half": "all"} if job.lora is not None and job.precision.amp \
        and job.frozen_half != "all" else {}


def _offload(level: str):
    """ZeRO-Offload of the optimizer state (and the parameters). The offloaded update runs
    DeepSpeed's CPU Adam (fp32 states in host RAM): accelerate and the HF Trainer put it in
    place of a bitsandbytes optimizer, whose kernels do not run on the CPU, and DeepSpeed alone
    refuses one (predict/compat.py `offload-runs-cpu-adam`); so an 8-bit or paged AdamW kept by
    an earlier rung gives way to AdamW, what runs."""
    def rung(job, accel, devices, trace=None):
        fsdp = job.strategy.fsdp
        want = offload_run(job, level)     # FSDP's CPU offload moves the parameters too
        if job.offload.order >= parse_offload(want).order:
            return None
        if fsdp:
            stage = job.strategy
        elif want == "optimizer+params":
            stage = ZERO3
        else:
            stage = job.strategy if job.strategy.shards_gradients else ZERO2
        what = "optimizer state" if want == "optimizer" else "optimizer state and parameters"
        title = f"CPU offload of the {what} " + ("(FSDP's CPUOffload)" if fsdp else
                                                 "(ZeRO-Offload)")
        runs = offloaded_optimizer(job)
        swap = {} if runs is job.optimizer else {"optimizer": runs}
        if swap:
            title += f", {runs.label} on the CPU in place of {job.optimizer}"
        return _step(f"offload-{level.split('+')[-1]}", title, job, offload=want,
                     strategy=stage, **swap, **_engine_cast(job))
    return rung


def seq_len(job, accel, devices, trace=None):
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


Rung = Callable[..., "Step | Skip | None"]   # (job, accel, devices, trace=None)


@functools.cache
def table() -> dict:
    """data/fix_ladder.json: the rungs in order, with cost, step-time cost, what the user changes,
    what the library does and its source."""
    return json.loads((resources.files("trainplan") / "data" / "fix_ladder.json").read_text())


RUNGS: dict[str, Rung] = {
    "attention": attention, "precision": precision, "frozen-half": frozen_half,
    "sync-each-batch": sync_each_batch, "checkpointing-selective": checkpointing_selective,
    "checkpointing-full": checkpointing_full, "gather-per-token": gather_per_token,
    "optimizer-8bit": optimizer_8bit, "optimizer-paged": optimizer_paged,
    "beta-0": reference_off, "lora": lora, "lora-smaller": lora_smaller,
    "freeze-embeddings": freeze_embeddings, "qlora": qlora, "seq-len": seq_len,
    "zero2": _sharding(ZERO2), "zero3": _sharding(ZERO3),
    "offload-optimizer": _offload("optimizer"), "offload-params": _offload("optimizer+params"),
}


def row(rung_id: str) -> dict:
    """The table's row of a rung."""
    return next(r for r in table()["rungs"] if r["rung"] == rung_id)


LADDER: tuple[Rung, ...] = tuple(RUNGS[r["rung"]] for r in table()["rungs"]
                                 for _ in range(int(r.get("repeat", 1))))
SPEED_LADDER: tuple[Rung, ...] = (precision, attention)
