"""The job: what is trained, how, and on what. Read from YAML and/or CLI flags.

Precedence: CLI flags > YAML file > defaults. The YAML takes our flat keys (the same names as the
flags, with `_` for `-`) and also the seeds' own config shape:

    model: {hidden_size, num_layers, num_heads, intermediate_size, positional_encoding, norm,
            activation, dropout, vocab_size, loss}
    training_data: {max_seq_len, micro_batch_size}
    run: {mixed_precision, gradient_accumulation_steps}
    optimizer: {name, lr, ...}
    checkpointing: {activation_checkpointing, use_reentrant}
    hardware: {device, num_workers}
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path

from . import algorithm as algo_mod
from . import optimizer as opt_mod
from . import precision as prec_mod
from . import quantization as quant_mod
from . import strategy as strat_mod
from .algorithm import Rollout
from .campaign import CampaignSpec
from .errors import TrainplanError, unknown
from .models.dims import TransformerDims
from .models.hf_names import normalize_model_ref
from .optimizer import Offload, Optimizer
from .precision import FP32, Precision
from .quantization import Quantization
from .strategy import DDP, SINGLE, Strategy

PRECISIONS = prec_mod.NAMES
STRATEGIES = strat_mod.NAMES
OPTIMIZERS = opt_mod.NAMES
OFFLOADS = opt_mod.OFFLOAD_NAMES
CHECKPOINT_MODES = ("none", "full", "selective")          # and every-K (`every_k`)
CHECKPOINTING = CHECKPOINT_MODES + ("every-K",)
CHECKPOINT_IMPLS = ("auto", "reentrant", "non-reentrant")
ATTENTIONS = ("auto", "eager", "sdpa", "flash", "efficient", "math")
# frozen floating-point parameters kept in the 16-bit dtype under mixed precision (quantization.py):
# none = as stored (fp32: peft's prepare_model_for_kbit_training upcast), embeddings = embeddings
# and output head (TRL's peft_module_casting_to_bf16), all = every frozen parameter
FROZEN_HALF = ("none", "embeddings", "all")
QUANTIZE = quant_mod.NAMES
TASKS = ("causal-lm", "masked-lm", "seq-classification", "seq2seq", "image-classification")

@dataclass(frozen=True)
class Lora:
    rank: int = 16
    alpha: float = 32.0
    targets: str = "q,v"
    dropout: float = 0.05


@dataclass(frozen=True)
class Job:
    """One training job. Sizes are per device: `batch_size` is the micro-batch each device runs."""

    model: str = "transformer"
    name: str | None = None
    transformer: TransformerDims | None = None
    task: str | None = None
    inputs: tuple | None = None          # py: models: [{name, shape, dtype, high}]
    model_args: dict | None = None       # py: models: factory keyword arguments
    batch_size: int = 1
    grad_accum: int = 1
    # with grad_accum > 1, reduce the gradients over the devices after every micro-batch instead of
    # only after the last (accelerate's GradientAccumulationPlugin(sync_each_batch=True); what
    # Composer and torchtune do): Strategy.reduces_each_micro_batch says where it applies
    sync_each_batch: bool = False
    # clip the gradients' global L2 norm to this before every optimizer step
    # (torch.nn.utils.clip_grad_norm_: one pass reading every gradient for its norm, one scaling
    # each in place; the HF Trainer's `max_grad_norm`, 1.0 by default there). None: no clipping,
    # a plain PyTorch loop's default
    max_grad_norm: float | None = None
    seq_len: int | None = None
    image_size: int | None = None
    images_per_sample: int | None = None   # vision-language models: images in each sample
    precision: Precision = FP32          # parsed from any spelling on construction
    optimizer: Optimizer = opt_mod.ADAMW   # parsed from any spelling on construction
    grad_checkpointing: str = "none"
    checkpoint_impl: str = "auto"       # torch.utils.checkpoint's use_reentrant; see below
    attention: str = "auto"
    lora: Lora | None = None
    quantize: Quantization = quant_mod.NONE   # parsed from any spelling on construction
    frozen_half: str = "none"            # frozen parameters in 16 bits under AMP (FROZEN_HALF)
    moe_capacity_factor: float | None = None  # None: dropless, uniform routing (trace/moe.py)
    # the network between nodes, Gbit/s per 8-GPU node each way, as clusters are sold ("400 Gbps
    # EFA"): None is predict/comm.py's default; only jobs over more than one node use it
    internode_gbps: float | None = None
    channels_last: bool = False
    # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True where the job runs (torchtitan's launcher
    # sets it): CUDA's allocator grows one segment instead of caching one per request
    # (trace/derive/expandable.py)
    expandable_segments: bool = False
    frozen: tuple[str, ...] = ()         # module-name prefixes whose parameters are frozen
    gpu: str | None = None
    gpus: int = 1
    strategy: Strategy = SINGLE          # parsed from any spelling on construction
    offload: Offload = opt_mod.NO_OFFLOAD  # parsed from any spelling on construction
    expert_parallel: int = 1             # MoE: experts split over this many of the devices
    algorithm: str = "sft"               # sft | grpo | dpo | ppo (algorithm.py)
    rollout: Rollout | None = None       # grpo / ppo: what each step generates (algorithm.py)
    campaign: CampaignSpec | None = None  # many runs: plan only (campaign.py)
    num_workers: int | None = None
    samples_per_s_per_worker: float | None = None
    steps: int | None = None
    epochs: float | None = None
    dataset_size: int | None = None
    target_batch: int | None = None
    platforms: tuple[str, ...] = ()
    session_overhead_s: float | None = None
    base_dir: Path | None = None
    notes: tuple[str, ...] = ()

    def __post_init__(self):
        """Precision, strategy, quantisation, optimizer and offload are parsed here, once,
        whatever spelling built the job (`_PARSED`)."""
        for name, parse in _PARSED.items():
            object.__setattr__(self, name, parse(getattr(self, name)))

    @property
    def model_label(self) -> str:
        return self.name or self.model

    @property
    def reentrant_checkpointing(self) -> bool:
        """Whether checkpointed blocks use `torch.utils.checkpoint(use_reentrant=True)` (False
        when nothing is checkpointed).

        "auto" follows the framework that sets a job like this up. QLoRA jobs are prepared by
        peft's `prepare_model_for_kbit_training`, which passes no `use_reentrant`, so torch's
        default (True) applies; there the quantised layers' inputs are not kept (the block's
        forward runs without autograd). transformers >= 5, torchtitan, timm and accelerate's FSDP
        checkpoint non-reentrantly, which lets bitsandbytes keep every quantised layer's input.
        """
        if self.grad_checkpointing == "none":
            return False
        if self.checkpoint_impl == "auto":
            return self.quantize != "none" and every_k(self.grad_checkpointing) >= 1
        return self.checkpoint_impl == "reentrant"

    def with_(self, **kw) -> "Job":
        """This job with the fields named changed, as dataclasses.replace makes it (the parsed
        fields parsed, an unknown name refused), without running __init__ over every field: a
        plan over every platform makes thousands (Llama-3.1-70B's: 6,431, 29 us each through
        replace, 3.5 us here; 2026-12-03)."""
        if not kw.keys() <= _FIELDS:
            return replace(self, **kw)       # its TypeError names the field
        new = object.__new__(type(self))
        attrs = new.__dict__
        attrs.update(self.__dict__)
        for name, value in kw.items():
            parse = _PARSED.get(name)
            attrs[name] = value if parse is None else parse(value)
        return new


# the fields a Job parses from any spelling on construction (Job.__post_init__)
_PARSED = {"precision": prec_mod.parse, "quantize": quant_mod.parse,
           "strategy": strat_mod.parse, "optimizer": opt_mod.parse,
           "offload": opt_mod.parse_offload}
_FIELDS = frozenset(f.name for f in fields(Job))


def every_k(mode: str) -> int:
    """Which blocks activation checkpointing recomputes: K for "every-K" (every K-th block in
    full, the others not at all: torchtitan's and torchtune's selective layer mode, `ac_option`
    / `selective_ac_option: K`; fms-fsdp's `selective_checkpointing: 1/K`), 1 for "full", 0 for
    "none" and "selective" (op-level, every block)."""
    if mode == "full":
        return 1
    if isinstance(mode, str) and mode.startswith("every-") and mode[6:].isdigit():
        return int(mode[6:])
    return 0


def checkpointing_label(mode: str) -> str:
    """The mode in words: 'no activation checkpointing', 'full activation checkpointing',
    'activation checkpointing of every 2nd block' (reports, notes)."""
    k = every_k(mode)
    if mode in (None, "none"):
        return "no activation checkpointing"
    if k < 2:
        return f"{mode} activation checkpointing"
    nth = {2: "2nd", 3: "3rd"}.get(k, f"{k}th")
    return f"activation checkpointing of every {nth} block"


def _checkpointing(value) -> str:
    """A checkpointing mode in its canonical spelling: every-1 is full; every-K needs K >= 1."""
    text = str(value).strip().lower()
    k = every_k(text)
    if k == 1:
        return "full"
    if k >= 2 or text in CHECKPOINT_MODES:
        return f"every-{k}" if k else text
    raise unknown("grad_checkpointing", text, CHECKPOINTING, n=1,
                  allowed="none, full, selective, every-K (every K-th block in full, K >= 2)",
                  what=f"--grad-checkpointing {value!r} is not a choice.")


def _choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise unknown(name, str(value), allowed, n=1, allowed=", ".join(allowed),
                      what=f"--{name.replace('_', '-')} {value!r} is not a choice.")


def _positive_int(name: str, value, allow_none=False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise TrainplanError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}.")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# A bound on a run's optimizer steps: a billion is ~4000x the longest published pre-training run
# (PaLM 540B: 255k steps, Chowdhery et al. 2022, Table 2); beyond it a plan's sessions and cost
# mean nothing, and a typo (1e30) is not planned as 2e25 sessions.
MAX_STEPS = 10**9


def check_steps(steps, where: str = "--steps") -> None:
    if steps is None:
        return
    if not _is_int(steps) or steps < 1:
        raise TrainplanError(f"{where} must be a positive whole number of optimizer steps, got "
                             f"{steps!r}.")
    if steps > MAX_STEPS:
        raise TrainplanError(f"{where} {steps:.3g} is out of range: at most {MAX_STEPS:.0e} "
                             "optimizer steps.", fix="check the number of steps (or use "
                             "--epochs with --dataset-size)")


def check_lora(lora: Lora, where: str | None = None) -> None:
    """LoRA's alpha and dropout in range, said as the flags (`where` None) or as the job file's
    `where` ('job.yaml: lora') names them. peft scales each adapter's output by alpha / rank:
    0 switches the adapters off and a negative alpha flips them."""
    if not lora.alpha > 0:
        raise TrainplanError(
            f"{where + ': alpha' if where else '--lora-alpha'} must be a positive number, got "
            f"{lora.alpha:g}: peft scales each adapter's output by alpha / rank, so 0 switches "
            "the adapters off and a negative alpha flips them.",
            fix=f"write it like `alpha: {2 * lora.rank}`" if where else
                f"--lora-alpha {2 * lora.rank} (twice the rank, a common choice), or leave it "
                "out (32)")
    if not 0 <= lora.dropout < 1:
        raise TrainplanError(
            f"{where + ': dropout' if where else 'LoRA dropout'} must be a number in [0, 1), got "
            f"{lora.dropout:g}.",
            fix="write it like `dropout: 0.05`" if where else
                "lora: {dropout: 0.05} in the job file (peft's examples)")


def _max_grad_norm(value) -> float | None:
    """The clipping norm: a positive number, or None for no clipping (0 is None: the HF Trainer
    and DeepSpeed read 0 as no clipping)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 \
            or value == float("inf"):
        raise TrainplanError(f"--max-grad-norm must be a number >= 0, got {value!r}.",
                             allowed="a positive number (the gradients' largest global L2 norm), "
                                     "or 0 for no clipping",
                             fix="--max-grad-norm 1.0 (the HF Trainer's default), or leave it "
                                 "out (no clipping)")
    return float(value) if value > 0 else None


MAX_INTERNODE_GBPS = 100_000       # 8 x 1.6 Tbit/s NICs is 12,800: room, not a typo's 10^9


def validate(job: Job) -> Job:
    """Check every setting; normalise aliases. Raises TrainplanError naming the bad setting."""
    job = job.with_(model=normalize_model_ref(job.model))   # `path/config.json` -> `hf:path/...`
    job = job.with_(grad_checkpointing=_checkpointing(job.grad_checkpointing))
    _choice("checkpoint_impl", job.checkpoint_impl, CHECKPOINT_IMPLS)
    if job.grad_checkpointing == "selective" and job.checkpoint_impl == "reentrant":
        raise TrainplanError("Selective activation checkpointing cannot be reentrant: PyTorch's "
                             "selective checkpointing works only with use_reentrant=False.",
                             fix="use --checkpoint-impl non-reentrant (or auto), or "
                                 "--grad-checkpointing full")
    _choice("attention", job.attention, ATTENTIONS)
    _choice("frozen_half", job.frozen_half, FROZEN_HALF)
    if job.task is not None:
        _choice("task", job.task, TASKS)
    algo_mod.check(job.algorithm, job.rollout, job.seq_len)
    if job.algorithm in algo_mod.GENERATES:
        rollout = job.rollout or Rollout()
        job = job.with_(rollout=rollout, seq_len=job.seq_len or rollout.seq_len)
    check_steps(job.steps, "steps")
    _positive_int("batch_size", job.batch_size)
    _positive_int("grad_accum", job.grad_accum)
    _positive_int("gpus", job.gpus)
    _positive_int("expert_parallel", job.expert_parallel)
    if job.expert_parallel > 1 and job.gpus % job.expert_parallel:
        raise TrainplanError(f"--expert-parallel {job.expert_parallel} does not divide --gpus "
                             f"{job.gpus}.", allowed="a divisor of the number of GPUs (each "
                             "expert-parallel group holds every expert once)",
                             fix=f"use --expert-parallel {job.gpus} or another divisor of it")
    job = job.with_(max_grad_norm=_max_grad_norm(job.max_grad_norm))
    _positive_int("seq_len", job.seq_len, allow_none=True)
    _positive_int("image_size", job.image_size, allow_none=True)
    _positive_int("images_per_sample", job.images_per_sample, allow_none=True)
    if job.moe_capacity_factor is not None:
        from .trace.moe import Routing
        Routing(job.moe_capacity_factor)       # raises TrainplanError for c < 1
    if job.internode_gbps is not None and not (0 < job.internode_gbps <= MAX_INTERNODE_GBPS):
        raise TrainplanError(f"internode_gbps must be a positive number of Gbit/s a node, got "
                             f"{job.internode_gbps:g}.",
                             allowed=f"above 0, at most {MAX_INTERNODE_GBPS:,}",
                             fix="write the nodes' network as sold, e.g. 400 (4 x 100 Gbit/s "
                                 "EFA) or 3200 (8 x 400 Gbit/s InfiniBand)")
    if job.quantize != "none" and job.lora is None:
        raise TrainplanError(f"--quantize {job.quantize} freezes the base weights, so it needs LoRA "
                             "adapters to train.", fix="add --lora-rank 16 (QLoRA)")
    if job.lora is not None:
        if job.lora.rank < 1:
            raise TrainplanError(f"--lora-rank must be >= 1, got {job.lora.rank}.")
        check_lora(job.lora)
    if job.strategy is SINGLE and job.gpus > 1:
        job = job.with_(strategy=DDP)
    if job.model.startswith("py:") and not job.inputs:
        from .models.custom import parse_input_spec
        parse_input_spec(job.inputs)  # raises the explanatory error
    if job.model == "transformer" and job.transformer is None:
        raise TrainplanError("Model 'transformer' needs its dimensions.",
                             fix="add a `model:` mapping with hidden_size, num_layers, num_heads")
    if job.model.startswith("hf:"):    # a bad config.json fails here, before anything is traced
        from .models.hf_validate import check_model_ref
        check_model_ref(job.model)
    return job
