"""A job from a YAML file: our flat keys (the flags' names with `_` for `-`) and the seeds' own
config shape (spec.py's docstring lists both); every value's type checked with the key's file and
line, every unknown key named with the close matches. `load_job(path)` and `job_from_dict(data)`
give a `Job` (spec.py), which `validate` then checks as a whole.
"""
from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from . import algorithm as algo_mod
from . import campaign as camp_mod
from . import precision as prec_mod
from .errors import TrainplanError, unknown
from .models.dims import TransformerDims
from .spec import Job, Lora, check_lora

_FIELDS = {f.name for f in fields(Job)} - {"base_dir", "notes"}
_DEFAULTS = {f.name: f.default for f in fields(Job)}
_SEED_KEYS = {"training_data", "run", "hardware", "checkpointing", "objectives", "encoding",
              "regularizers", "training"}


# The type each flat YAML key must have (checked before the Job is built, so a wrong shape is one
# message naming the key and its line, not a TypeError deep inside).
_INT_KEYS = ("batch_size", "grad_accum", "seq_len", "image_size", "images_per_sample", "gpus",
             "expert_parallel", "num_workers", "steps", "dataset_size", "target_batch")
_NUMBER_KEYS = ("epochs", "samples_per_s_per_worker", "session_overhead_s", "moe_capacity_factor",
                "internode_gbps", "max_grad_norm")
_TEXT_KEYS = ("model", "name", "task", "optimizer", "grad_checkpointing", "checkpoint_impl",
              "attention", "gpu", "offload", "algorithm", "frozen_half")
_SCALAR_KEYS = ("precision", "quantize", "strategy")   # a name; quantize may also be false
_LIST_KEYS = ("platforms", "frozen")                  # a list of names, or one name


def _where(source: str, node, key: str) -> str:
    line = _line_of(node, key)
    return f"{source}, line {line}" if line else source


def _kind(v) -> str:
    return {"NoneType": "nothing", "str": "text", "dict": "a mapping", "list": "a list",
            "bool": "true/false", "int": "an integer", "float": "a number"}.get(
                type(v).__name__, type(v).__name__)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _shape_error(where: str, key: str, want: str, v, example: str) -> TrainplanError:
    return TrainplanError(f"{where}: {key} must be {want}, got {v!r} ({_kind(v)}).",
                          fix=f"write it like `{example}`")


def _section(data: dict, key: str, node, source: str, example: str) -> dict:
    """A seeds' section (`run:`, `training_data:`, ...): a mapping, or absent/empty."""
    v = data.pop(key, None)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise _shape_error(_where(source, node, key), key, "a mapping of settings", v, example)
    return v


def _check_types(kw: dict, node, source: str) -> None:
    """Every flat setting has the type its flag has."""
    for k, v in kw.items():
        if v is None:
            continue
        where = _where(source, node, k)
        if k in _INT_KEYS and not _is_int(v):
            raise _shape_error(where, k, "a whole number", v, f"{k}: 4")
        if k in _NUMBER_KEYS and not _is_number(v):
            raise _shape_error(where, k, "a number", v, f"{k}: 1.5")
        if k in _TEXT_KEYS and not isinstance(v, str):
            raise _shape_error(where, k, "text (a name)", v, f"{k}: <name>")
        if k in _SCALAR_KEYS and isinstance(v, (list, tuple, dict, bool)) and not (
                k == "quantize" and v is False):     # (run: mixed_precision is parsed already)
            raise _shape_error(where, k, "a name", v, f"{k}: <name>")
        if k in ("channels_last", "expandable_segments", "sync_each_batch") and \
                not isinstance(v, bool):
            raise _shape_error(where, k, "true or false", v, f"{k}: true")
        if k in _LIST_KEYS and not (isinstance(v, str) or (
                isinstance(v, tuple) and all(isinstance(x, str) for x in v))):
            raise _shape_error(where, k, "a list of names", v, f"{k}: [a, b]")
        if k == "model_args" and not (isinstance(v, dict) and all(isinstance(x, str) for x in v)):
            raise _shape_error(where, k, "a mapping of keyword arguments", v,
                               f"{k}: {{channels: 64}}")
        if k == "inputs":
            _check_inputs(v, where)


def _check_inputs(v, where: str) -> None:
    example = "inputs: [{name: x, shape: [batch, 3, 224, 224], dtype: float32}]"
    if not isinstance(v, tuple):
        raise _shape_error(where, "inputs", "a list of {name, shape, dtype}", v, example)
    for i, item in enumerate(v):
        if not isinstance(item, dict):
            raise _shape_error(where, f"inputs[{i}]", "a mapping {name, shape, dtype}", item,
                               example)
        shape = item.get("shape")
        if not isinstance(shape, list) or not all(
                d == "batch" or (_is_int(d) and d > 0) for d in shape):
            raise _shape_error(where, f"inputs[{i}] shape",
                               "a list of positive whole numbers and `batch`", shape,
                               "shape: [batch, 3, 224, 224]")
        if "high" in item and not (_is_int(item["high"]) and item["high"] > 0):
            raise _shape_error(where, f"inputs[{i}] high", "a positive whole number",
                               item["high"], "high: 32000")
        if "name" in item and not isinstance(item["name"], str):
            raise _shape_error(where, f"inputs[{i}] name", "text", item["name"], "name: x")


def _line_of(node, key: str) -> int | None:
    """1-based line of `key` in a composed YAML mapping node."""
    if isinstance(node, yaml.MappingNode):
        for k, _v in node.value:
            if getattr(k, "value", None) == key:
                return k.start_mark.line + 1
    return None


def load_yaml(path: str | Path) -> tuple[dict, Any]:
    path = Path(path)
    try:
        if not path.exists():
            raise TrainplanError(f"Job file {path} does not exist.",
                                 fix="give a path to a YAML job, e.g. examples/graphmer-se.yaml")
        if path.is_dir():
            raise TrainplanError(f"Job file {path} is a folder, not a YAML file.",
                                 fix="give a path to a YAML job, e.g. examples/graphmer-se.yaml")
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise TrainplanError(f"Cannot read job file {path}: {e.strerror or e}.",
                             fix="give a readable YAML job file") from None
    except UnicodeDecodeError as e:
        raise TrainplanError(f"Job file {path} is not text (byte {e.start} is not UTF-8): a "
                             "binary file?", fix="give a YAML job file") from None
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


# a transformer's dimensions as a user would write them (BERT-base's; 4 KV heads as GQA)
_EXAMPLE = {"hidden_size": 768, "num_layers": 12, "num_heads": 12, "intermediate_size": 3072,
            "vocab_size": 30522, "num_kv_heads": 4, "max_position_embeddings": 512}


def _dims_from(d: dict, where: str) -> TransformerDims:
    if not isinstance(d, dict):
        raise _shape_error(where, "the transformer", "a mapping of dimensions", d,
                           "model: {hidden_size: 768, num_layers: 12, num_heads: 12}")
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
              "kind": ("encoder", "decoder"), "loss": ("torch", "fused")}
    for k, allowed in checks.items():
        if k in kw and str(kw[k]).lower() not in allowed:
            raise unknown(k, str(kw[k]), allowed, what=f"{where}: {k} {kw[k]!r} is not supported.",
                          allowed=", ".join(allowed))
        if k in kw:
            kw[k] = str(kw[k]).lower()
    if kw.get("positional_encoding") == "rope":
        kw["positional_encoding"] = "rotary"
    for k in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "vocab_size",
              "num_kv_heads", "max_position_embeddings"):
        if k in kw and (not _is_int(kw[k]) or kw[k] <= 0) and not (
                kw[k] is None and k in ("intermediate_size", "num_kv_heads")):
            raise TrainplanError(f"{where}: {k} must be a positive integer, got {kw[k]!r}.",
                                 fix=f"write it like `{k}: {_EXAMPLE[k]}`")
    if kw["num_layers"] > 1024:      # every block is built: thousands take minutes
        raise TrainplanError(f"{where}: num_layers {kw['num_layers']} is more blocks than any "
                             "published model.", allowed="1..1024", fix="check num_layers")
    for k in ("tie_embeddings", "bias"):
        if k in kw and not isinstance(kw[k], bool):
            raise _shape_error(where, k, "true or false", kw[k], f"{k}: true")
    if "dropout" in kw and not (_is_number(kw["dropout"]) and 0 <= kw["dropout"] < 1):
        raise _shape_error(where, "dropout", "a number in [0, 1)", kw["dropout"], "dropout: 0.1")
    if kw["hidden_size"] % kw["num_heads"]:
        raise TrainplanError(f"{where}: hidden_size {kw['hidden_size']} is not divisible by "
                             f"num_heads {kw['num_heads']}.",
                             fix="pick num_heads that divides hidden_size (e.g. hidden_size 768 "
                                 "with num_heads 12)")
    if kw.get("num_kv_heads") and kw["num_heads"] % kw["num_kv_heads"]:
        raise TrainplanError(f"{where}: num_heads {kw['num_heads']} is not divisible by "
                             f"num_kv_heads {kw['num_kv_heads']}.",
                             fix="pick num_kv_heads that divides num_heads")
    dims = TransformerDims(**kw)
    return dims


def _model_keys(data: dict, kw: dict, notes: list[str], source: str, node=None) -> None:
    """`model:` as a name, as `{source|name}`, or as the seeds' transformer dimensions."""
    model = data.pop("model", None)
    if isinstance(model, dict):
        if "source" in model or "name" in model:
            kw["model"] = model.get("source") or model.get("name")
            if not isinstance(kw["model"], str):
                raise _shape_error(_where(source, node, "model"), "model: source", "text (a name)",
                                   kw["model"], "model: {source: hf:openai-community/gpt2}")
        else:
            extra = {k: model[k] for k in ("hgat", "use_rel_attention_bias") if k in model}
            if extra:
                notes.append("not modelled: " + ", ".join(f"{k}={v}" for k, v in extra.items()) +
                             " (relation-aware attention bias; its parameters are negligible, its "
                             "extra bias tensor is not traced)")
            kw["model"] = "transformer"
            kw["transformer"] = _dims_from(model, f"{source}: model")
    elif isinstance(model, (list, bool)) or (model is not None and not isinstance(model, str)):
        raise _shape_error(_where(source, node, "model"), "model",
                           "a name or a mapping of transformer dimensions", model,
                           "model: hf:openai-community/gpt2")
    elif model is not None:
        kw["model"] = model
    if "transformer" in data:
        kw["transformer"] = _dims_from(data.pop("transformer"), f"{source}: transformer")


def _seed_sections(data: dict, kw: dict, source: str, node=None) -> None:
    """The seeds' nested sections: training_data, run, optimizer, checkpointing, hardware."""
    td = _section(data, "training_data", node, source,
                  "training_data: {max_seq_len: 512, micro_batch_size: 8}")
    if "max_seq_len" in td:
        kw["seq_len"] = td["max_seq_len"]
    if "micro_batch_size" in td:
        kw["batch_size"] = td["micro_batch_size"]
    run = _section(data, "run", node, source,
                   "run: {mixed_precision: bf16, gradient_accumulation_steps: 4}")
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
        opt = opt.get("name", "adamw")
    if opt is not None and not isinstance(opt, str):
        raise _shape_error(_where(source, node, "optimizer"), "optimizer",
                           "a name or a mapping {name: ...}", opt, "optimizer: adamw")
    if opt is not None:
        kw["optimizer"] = opt.lower()
    ck = _section(data, "checkpointing", node, source,
                  "checkpointing: {activation_checkpointing: true}")
    if ck:
        ac = ck.get("activation_checkpointing", False)
        if not isinstance(ac, (str, bool)) and ac is not None:
            raise _shape_error(_where(source, node, "checkpointing"),
                               "checkpointing: activation_checkpointing",
                               "true, false or none/full/selective", ac,
                               "activation_checkpointing: true")
        kw["grad_checkpointing"] = ac if isinstance(ac, str) else ("full" if ac else "none")
        if "use_reentrant" in ck:
            kw["checkpoint_impl"] = "reentrant" if ck["use_reentrant"] else "non-reentrant"
    hw = _section(data, "hardware", node, source, "hardware: {num_workers: 4}")
    if "num_workers" in hw:
        kw["num_workers"] = hw["num_workers"]


def _lora(lora, source: str) -> Lora:
    example = "lora: {rank: 16, alpha: 32, targets: q_proj,v_proj}"
    if not isinstance(lora, dict):
        raise TrainplanError(f"{source}: lora must be a mapping {{rank, alpha, targets}}, got "
                             f"{lora!r} ({_kind(lora)}).", fix=f"write it like `{example}`")
    rank, alpha = lora.get("rank", 16), lora.get("alpha", 32)
    dropout, targets = lora.get("dropout", 0.05), lora.get("targets", "q,v")
    if not _is_int(rank):
        raise _shape_error(f"{source}: lora", "rank", "a whole number", rank, "rank: 16")
    for k, v in (("alpha", alpha), ("dropout", dropout)):
        if not _is_number(v):
            raise _shape_error(f"{source}: lora", k, "a number", v, f"{k}: 0.05")
    if isinstance(targets, list) and all(isinstance(t, str) for t in targets):
        targets = ",".join(targets)
    if not isinstance(targets, str):
        raise _shape_error(f"{source}: lora", "targets", "module names (a list or a,b,c)",
                           targets, "targets: [q_proj, v_proj]")
    lora = Lora(rank=rank, alpha=float(alpha), targets=targets, dropout=float(dropout))
    check_lora(lora, f"{source}: lora")        # named where the file wrote it
    return lora


def _flat_keys(data: dict, kw: dict, notes: list[str], source: str = "job") -> None:
    """Our own flat keys (the CLI flags' names); the seeds' descriptive sections are dropped."""
    for k in list(data):
        key = k.replace("-", "_")
        if key in _FIELDS:
            v = data.pop(k)
            if v is None and _DEFAULTS.get(key) is not None:   # `batch_size:` left empty
                continue
            if key in ("platforms", "frozen", "inputs") and isinstance(v, list):
                v = tuple(v)
            elif key in ("platforms", "frozen") and isinstance(v, str):   # "a,b" as [a, b]
                v = tuple(x.strip() for x in v.split(",") if x.strip())
            kw[key] = v
        elif k == "notes":   # the job file's own notes (a string or a list): shown with results
            v = data.pop(k)
            if v is not None and not isinstance(v, (str, list)):
                raise _shape_error(source, "notes", "text or a list of text", v,
                                   'notes: ["first note", "second note"]')
            notes.extend([str(v)] if isinstance(v, str) else [str(x) for x in v or ()])
        elif k in _SEED_KEYS or k in ("objectives", "encoding", "regularizers", "description"):
            data.pop(k)


def job_from_dict(data: dict, node=None, source: str = "job", base_dir: Path | None = None) -> Job:
    """Flat keys (as the CLI flags) or the seeds' nested shape -> Job (not yet validated)."""
    data = dict(data)
    kw: dict[str, Any] = {}
    notes: list[str] = []
    _model_keys(data, kw, notes, source, node)
    _seed_sections(data, kw, source, node)
    if data.get("lora") is not None:
        kw["lora"] = _lora(data.pop("lora"), source)
    data.pop("lora", None)
    if data.get("rollout") is not None:
        kw["rollout"] = algo_mod.parse_rollout(data.pop("rollout"),
                                               _where(source, node, "rollout"))
    data.pop("rollout", None)
    if data.get("campaign") is not None:
        kw["campaign"] = camp_mod.parse_campaign(data.pop("campaign"),
                                                 _where(source, node, "campaign"))
    data.pop("campaign", None)
    _flat_keys(data, kw, notes, source)
    if data:
        k = next(iter(data))
        line = _line_of(node, k)
        where = f"{source}, line {line}" if line else source
        raise unknown("setting", k, sorted(_FIELDS), what=f"{where}: unknown setting {k!r}.",
                      show=str, allowed=", ".join(sorted(_FIELDS)))
    _check_types(kw, node, source)
    # a name's error says where it was written, not the flag's name (spec.Job parses them too)
    from . import optimizer as opt_mod, quantization as quant_mod, strategy as strat_mod
    for key, parse in (("precision", prec_mod.parse), ("quantize", quant_mod.parse),
                       ("strategy", strat_mod.parse), ("optimizer", opt_mod.parse)):
        if isinstance(kw.get(key), str):
            kw[key] = parse(kw[key], where=f"{_where(source, node, key)}: {key}")
    kw["notes"] = tuple(notes)
    kw["base_dir"] = base_dir
    try:
        return Job(**kw)
    except TypeError as e:
        raise TrainplanError(f"{source}: {e}") from None


def load_job(path: str | Path) -> Job:
    data, node = load_yaml(path)
    return job_from_dict(data, node, source=str(path), base_dir=Path(path).resolve().parent)
