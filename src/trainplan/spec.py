"""The job: what is trained, how, and on what. Read from YAML and/or CLI flags.

Precedence: CLI flags > YAML file > defaults. The YAML takes our flat keys (the same names as the
flags, with `_` for `-`) and also the seeds' own config shape:

    model: {hidden_size, num_layers, num_heads, intermediate_size, positional_encoding, norm,
            activation, dropout, vocab_size}
    training_data: {max_seq_len, micro_batch_size}
    run: {mixed_precision, gradient_accumulation_steps}
    optimizer: {name, lr, ...}
    checkpointing: {activation_checkpointing, use_reentrant}
    hardware: {device, num_workers}
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from . import precision as prec_mod
from . import quantization as quant_mod
from . import strategy as strat_mod
from .errors import TrainplanError, close_matches
from .models.reference import TransformerDims
from .precision import FP32, Precision
from .quantization import Quantization
from .strategy import DDP, SINGLE, Strategy

PRECISIONS = prec_mod.NAMES
STRATEGIES = strat_mod.NAMES
OPTIMIZERS = ("adamw", "adam", "sgd", "sgd-momentum", "adafactor", "adamw-8bit", "lion",
              "paged-adamw", "paged-adamw-8bit")
OFFLOADS = ("none", "optimizer", "optimizer+params")
CHECKPOINTING = ("none", "full", "selective")
CHECKPOINT_IMPLS = ("auto", "reentrant", "non-reentrant")
ATTENTIONS = ("auto", "eager", "sdpa", "flash", "efficient", "math")
QUANTIZE = quant_mod.NAMES
TASKS = ("causal-lm", "masked-lm", "seq-classification", "seq2seq", "image-classification")
# other spellings of an optimizer (bitsandbytes' class names, the HF Trainer's `optim` values)
OPTIMIZER_ALIASES = {"adamw8bit": "adamw-8bit", "adam8bit": "adamw-8bit",
                     "8bit-adamw": "adamw-8bit", "adamw-bnb-8bit": "adamw-8bit",
                     "paged-adamw-32bit": "paged-adamw", "paged-adamw8bit": "paged-adamw-8bit"}

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
    seq_len: int | None = None
    image_size: int | None = None
    precision: Precision = FP32          # parsed from any spelling on construction
    optimizer: str = "adamw"
    grad_checkpointing: str = "none"
    checkpoint_impl: str = "auto"       # torch.utils.checkpoint's use_reentrant; see below
    attention: str = "auto"
    lora: Lora | None = None
    quantize: Quantization = quant_mod.NONE   # parsed from any spelling on construction
    moe_capacity_factor: float | None = None  # None: dropless, uniform routing (trace/moe.py)
    channels_last: bool = False
    frozen: tuple[str, ...] = ()         # module-name prefixes whose parameters are frozen
    gpu: str | None = None
    gpus: int = 1
    strategy: Strategy = SINGLE          # parsed from any spelling on construction
    offload: str = "none"
    expert_parallel: int = 1             # MoE: experts split over this many of the devices
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
        """Precision, strategy and quantisation are parsed here, once, whatever spelling built
        the job."""
        object.__setattr__(self, "precision", prec_mod.parse(self.precision))
        object.__setattr__(self, "quantize", quant_mod.parse(self.quantize))
        object.__setattr__(self, "strategy", strat_mod.parse(self.strategy))

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
            return self.quantize != "none" and self.grad_checkpointing == "full"
        return self.checkpoint_impl == "reentrant"

    def with_(self, **kw) -> "Job":
        return replace(self, **kw)


_FIELDS = {f.name for f in fields(Job)} - {"base_dir", "notes"}
_SEED_KEYS = {"training_data", "run", "hardware", "checkpointing", "objectives", "encoding",
              "regularizers", "training"}


def _line_of(node, key: str) -> int | None:
    """1-based line of `key` in a composed YAML mapping node."""
    if isinstance(node, yaml.MappingNode):
        for k, _v in node.value:
            if getattr(k, "value", None) == key:
                return k.start_mark.line + 1
    return None


def load_yaml(path: str | Path) -> tuple[dict, Any]:
    path = Path(path)
    if not path.exists():
        raise TrainplanError(f"Job file {path} does not exist.",
                             fix="give a path to a YAML job, e.g. examples/graphmer-se.yaml")
    text = path.read_text()
    try:
        data = yaml.safe_load(text)
        node = yaml.compose(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise TrainplanError(f"{path} is not valid YAML{where}: {problem}.",
                             fix="check indentation and that every `key: value` has a space "
                                 "after the colon") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise TrainplanError(f"{path} must be a YAML mapping of job settings, got "
                             f"{type(data).__name__}.")
    return data, node


def _dims_from(d: dict, where: str) -> TransformerDims:
    keys = {f.name for f in fields(TransformerDims)}
    aliases = {"num_hidden_layers": "num_layers", "num_attention_heads": "num_heads",
               "num_key_value_heads": "num_kv_heads", "type": "kind", "ffn_size": "intermediate_size",
               "tie_word_embeddings": "tie_embeddings", "position_embedding": "positional_encoding"}
    kw = {}
    ignored = []
    for k, v in d.items():
        k2 = aliases.get(k, k)
        if k2 in keys:
            kw[k2] = v
        else:
            ignored.append(k)
    for req in ("hidden_size", "num_layers", "num_heads"):
        if req not in kw:
            raise TrainplanError(f"{where}: a transformer needs {req}.",
                                 fix="give hidden_size, num_layers and num_heads")
    checks = {"norm": ("layernorm", "rmsnorm"), "activation": ("gelu", "swiglu"),
              "positional_encoding": ("learned", "rotary", "rope", "alibi"),
              "kind": ("encoder", "decoder")}
    for k, allowed in checks.items():
        if k in kw and str(kw[k]).lower() not in allowed:
            raise TrainplanError(f"{where}: {k} {kw[k]!r} is not supported.",
                                 allowed=", ".join(allowed))
        if k in kw:
            kw[k] = str(kw[k]).lower()
    if kw.get("positional_encoding") == "rope":
        kw["positional_encoding"] = "rotary"
    for k in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "vocab_size"):
        if k in kw and (not isinstance(kw[k], int) or kw[k] <= 0):
            raise TrainplanError(f"{where}: {k} must be a positive integer, got {kw[k]!r}.")
    if kw["hidden_size"] % kw["num_heads"]:
        raise TrainplanError(f"{where}: hidden_size {kw['hidden_size']} is not divisible by "
                             f"num_heads {kw['num_heads']}.")
    dims = TransformerDims(**kw)
    return dims


def _model_keys(data: dict, kw: dict, notes: list[str], source: str) -> None:
    """`model:` as a name, as `{source|name}`, or as the seeds' transformer dimensions."""
    model = data.pop("model", None)
    if isinstance(model, dict):
        if "source" in model or "name" in model:
            kw["model"] = model.get("source") or model.get("name")
        else:
            extra = {k: model[k] for k in ("hgat", "use_rel_attention_bias") if k in model}
            if extra:
                notes.append("not modelled: " + ", ".join(f"{k}={v}" for k, v in extra.items()) +
                             " (relation-aware attention bias; its parameters are negligible, its "
                             "extra bias tensor is not traced)")
            kw["model"] = "transformer"
            kw["transformer"] = _dims_from(model, f"{source}: model")
    elif model is not None:
        kw["model"] = str(model)
    if "transformer" in data:
        kw["transformer"] = _dims_from(data.pop("transformer"), f"{source}: transformer")


def _seed_sections(data: dict, kw: dict, source: str) -> None:
    """The seeds' nested sections: training_data, run, optimizer, checkpointing, hardware."""
    td = data.pop("training_data", None) or {}
    if "max_seq_len" in td:
        kw["seq_len"] = td["max_seq_len"]
    if "micro_batch_size" in td:
        kw["batch_size"] = td["micro_batch_size"]
    run = data.pop("run", None) or {}
    if "mixed_precision" in run:     # accelerate's meaning: fp16 is mixed precision (precision.py)
        kw["precision"] = prec_mod.parse(run["mixed_precision"], mixed=True,
                                         where=f"{source}: run: mixed_precision")
    if "gradient_accumulation_steps" in run:
        kw["grad_accum"] = run["gradient_accumulation_steps"]
    if "steps" in run or "max_steps" in run:
        kw["steps"] = run.get("steps", run.get("max_steps"))
    if "epochs" in run:
        kw["epochs"] = run["epochs"]
    opt = data.pop("optimizer", None)
    if isinstance(opt, dict):
        kw["optimizer"] = str(opt.get("name", "adamw")).lower()
    elif opt is not None:
        kw["optimizer"] = str(opt).lower()
    ck = data.pop("checkpointing", None)
    if isinstance(ck, dict):
        ac = ck.get("activation_checkpointing", False)
        kw["grad_checkpointing"] = ac if isinstance(ac, str) else ("full" if ac else "none")
        if "use_reentrant" in ck:
            kw["checkpoint_impl"] = "reentrant" if ck["use_reentrant"] else "non-reentrant"
    hw = data.pop("hardware", None) or {}
    if "num_workers" in hw:
        kw["num_workers"] = hw["num_workers"]


def _lora(lora, source: str) -> Lora:
    if not isinstance(lora, dict):
        raise TrainplanError(f"{source}: lora must be a mapping {{rank, alpha, targets}}.")
    targets = lora.get("targets", "q,v")
    if isinstance(targets, list):
        targets = ",".join(map(str, targets))
    return Lora(rank=int(lora.get("rank", 16)), alpha=float(lora.get("alpha", 32)),
                targets=str(targets), dropout=float(lora.get("dropout", 0.05)))


def _flat_keys(data: dict, kw: dict, notes: list[str]) -> None:
    """Our own flat keys (the CLI flags' names); the seeds' descriptive sections are dropped."""
    for k in list(data):
        key = k.replace("-", "_")
        if key in _FIELDS:
            v = data.pop(k)
            if key in ("platforms", "frozen", "inputs") and isinstance(v, list):
                v = tuple(v)
            kw[key] = v
        elif k == "notes":   # the job file's own notes (a string or a list): shown with results
            v = data.pop(k)
            notes.extend([str(v)] if isinstance(v, str) else [str(x) for x in v or ()])
        elif k in _SEED_KEYS or k in ("objectives", "encoding", "regularizers", "description"):
            data.pop(k)


def job_from_dict(data: dict, node=None, source: str = "job", base_dir: Path | None = None) -> Job:
    """Flat keys (as the CLI flags) or the seeds' nested shape -> Job (not yet validated)."""
    data = dict(data)
    kw: dict[str, Any] = {}
    notes: list[str] = []
    _model_keys(data, kw, notes, source)
    _seed_sections(data, kw, source)
    if data.get("lora") is not None:
        kw["lora"] = _lora(data.pop("lora"), source)
    data.pop("lora", None)
    _flat_keys(data, kw, notes)
    if data:
        k = next(iter(data))
        line = _line_of(node, k)
        where = f"{source}, line {line}" if line else source
        matches = close_matches(k, sorted(_FIELDS))
        hint = f" Did you mean {', '.join(matches)}?" if matches else ""
        raise TrainplanError(f"{where}: unknown setting {k!r}.{hint}",
                             allowed=", ".join(sorted(_FIELDS)))
    kw["notes"] = tuple(notes)
    kw["base_dir"] = base_dir
    try:
        return Job(**kw)
    except TypeError as e:
        raise TrainplanError(f"{source}: {e}") from None


def load_job(path: str | Path) -> Job:
    data, node = load_yaml(path)
    return job_from_dict(data, node, source=str(path), base_dir=Path(path).resolve().parent)


def _choice(name: str, value, allowed) -> None:
    if value not in allowed:
        m = close_matches(str(value), allowed)
        hint = f" Did you mean {m[0]!r}?" if m else ""
        raise TrainplanError(f"--{name.replace('_', '-')} {value!r} is not a choice.{hint}",
                             allowed=", ".join(allowed))


def _positive_int(name: str, value, allow_none=False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise TrainplanError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}.")


def validate(job: Job) -> Job:
    """Check every setting; normalise aliases. Raises TrainplanError naming the bad setting."""
    name = str(job.optimizer).lower().replace("_", "-")
    job = job.with_(optimizer=OPTIMIZER_ALIASES.get(name, name))
    _choice("optimizer", job.optimizer, OPTIMIZERS)
    _choice("offload", job.offload, OFFLOADS)
    _choice("grad_checkpointing", job.grad_checkpointing, CHECKPOINTING)
    _choice("checkpoint_impl", job.checkpoint_impl, CHECKPOINT_IMPLS)
    if job.grad_checkpointing == "selective" and job.checkpoint_impl == "reentrant":
        raise TrainplanError("Selective activation checkpointing cannot be reentrant: PyTorch's "
                             "selective checkpointing works only with use_reentrant=False.",
                             fix="use --checkpoint-impl non-reentrant (or auto), or "
                                 "--grad-checkpointing full")
    _choice("attention", job.attention, ATTENTIONS)
    if job.task is not None:
        _choice("task", job.task, TASKS)
    _positive_int("batch_size", job.batch_size)
    _positive_int("grad_accum", job.grad_accum)
    _positive_int("gpus", job.gpus)
    _positive_int("expert_parallel", job.expert_parallel)
    if job.expert_parallel > 1 and job.gpus % job.expert_parallel:
        raise TrainplanError(f"--expert-parallel {job.expert_parallel} does not divide --gpus "
                             f"{job.gpus}.", allowed="a divisor of the number of GPUs (each "
                             "expert-parallel group holds every expert once)",
                             fix=f"use --expert-parallel {job.gpus} or another divisor of it")
    _positive_int("seq_len", job.seq_len, allow_none=True)
    _positive_int("image_size", job.image_size, allow_none=True)
    if job.moe_capacity_factor is not None:
        from .trace.moe import Routing
        Routing(job.moe_capacity_factor)       # raises TrainplanError for c < 1
    if job.quantize != "none" and job.lora is None:
        raise TrainplanError(f"--quantize {job.quantize} freezes the base weights, so it needs LoRA "
                             "adapters to train.", fix="add --lora-rank 16 (QLoRA)")
    if job.lora is not None:
        if job.lora.rank < 1:
            raise TrainplanError(f"--lora-rank must be >= 1, got {job.lora.rank}.")
    if job.strategy is SINGLE and job.gpus > 1:
        job = job.with_(strategy=DDP)
    if job.model.startswith("py:") and not job.inputs:
        from .models.custom import parse_input_spec
        parse_input_spec(job.inputs)  # raises the explanatory error
    if job.model == "transformer" and job.transformer is None:
        raise TrainplanError("Model 'transformer' needs its dimensions.",
                             fix="add a `model:` mapping with hidden_size, num_layers, num_heads")
    return job
