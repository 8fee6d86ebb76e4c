"""Checks on an `hf:` model's config.json, and transformers' own errors turned into ours.

A local config (`hf:./path/config.json`) can hold anything: a list instead of a mapping, sizes
given as text, zero or negative sizes, a hidden size the heads do not divide, a `model_type` that
does not match its fields. transformers then fails deep inside (TypeError, "negative dimension",
ZeroDivisionError, AttributeError on a config class that lacks a field). `check_config` names the
bad field first; `guarded` wraps the model build so that whatever transformers still raises is one
message naming the config file, not a traceback.
"""
from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from pathlib import Path

from ..errors import TrainplanError
from ..paths import atomic_write, cache_dir
from .hf_names import load_config_dict

# Sizes that must be positive whole numbers when present. The core ones (width, depth, heads,
# vocabulary) may not be null either; the others may be null (transformers then derives them:
# GPT-2's n_inner, Llama's head_dim and num_key_value_heads).
CORE_SIZES = ("hidden_size", "n_embd", "d_model", "dim", "num_hidden_layers", "n_layer",
              "num_layers", "n_layers", "num_attention_heads", "n_head", "n_heads", "num_heads",
              "vocab_size")
OTHER_SIZES = ("intermediate_size", "n_inner", "d_ff", "hidden_dim", "ffn_dim", "d_kv",
               "head_dim", "num_key_value_heads", "encoder_layers", "decoder_layers",
               "encoder_attention_heads", "decoder_attention_heads", "encoder_ffn_dim",
               "decoder_ffn_dim", "max_position_embeddings", "n_positions", "n_ctx", "image_size",
               "patch_size", "num_channels", "num_local_experts", "num_experts",
               "num_experts_per_tok", "num_labels")
WIDTHS = ("hidden_size", "n_embd", "d_model", "dim")
MAX_LAYERS = 1024       # every block is built (on the meta device): 5,000 take minutes
HEADS = ("num_attention_heads", "n_head", "n_heads", "num_heads")
LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
EXAMPLE = "hf:openai-community/gpt2 (or a copy of its config.json, trainplan catalog models)"


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _json(v) -> str:
    try:
        return json.dumps(v)
    except (TypeError, ValueError):
        return repr(v)


def _kind(v) -> str:
    return {"NoneType": "null", "str": "a string", "dict": "an object", "list": "a list",
            "bool": "a boolean", "int": "an integer", "float": "a number"}.get(
                type(v).__name__, type(v).__name__)


def _sub_configs(cfg: dict, path: str = ""):
    """(json path, mapping) for the config and its nested model configs (text_config, ...)."""
    yield path, cfg
    for k, v in cfg.items():
        if isinstance(v, dict) and k.endswith(("_config", "encoder", "decoder")):
            yield from _sub_configs(v, f"{path}{k}.")


def check_config(cfg, source: str) -> None:
    """Raise TrainplanError for the first field of `cfg` transformers cannot build from."""
    if not isinstance(cfg, dict):
        raise TrainplanError(
            f"{source} must hold a JSON object of config fields, got {_kind(cfg)}.",
            allowed='a transformers config.json: {"model_type": "gpt2", "n_embd": 768, ...}',
            fix=f"point hf: at a model's config.json, e.g. start from {EXAMPLE}")
    model_type = cfg.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise TrainplanError(f"{source}: model_type must be a string, got {_json(model_type)}.",
                             fix='write it like "model_type": "gpt2"')
    archs = cfg.get("architectures")
    if archs is not None and not (isinstance(archs, list)
                                  and all(isinstance(a, str) and a for a in archs)):
        raise TrainplanError(f"{source}: architectures must be a list of class names, got "
                             f"{_json(archs)}.",
                             fix='write it like "architectures": ["GPT2LMHeadModel"]')
    for path, sub in _sub_configs(cfg):
        _check_sizes(sub, source, path)


def _check_sizes(cfg: dict, source: str, path: str) -> None:
    for key in CORE_SIZES + OTHER_SIZES:
        if key not in cfg or (cfg[key] is None and key in OTHER_SIZES):
            continue
        v = cfg[key]
        if not _is_int(v) or v <= 0:
            what = "is zero or negative" if _is_int(v) else f"is {_kind(v)}"
            raise TrainplanError(f"{source}: {path}{key} must be a positive whole number; "
                                 f"{_json(v)} {what}.",
                                 fix=f'write it like "{key}": {_typical(key)} (no quotes)')
    for key in LAYERS + ("encoder_layers", "decoder_layers"):
        if _is_int(cfg.get(key)) and cfg[key] > MAX_LAYERS:
            raise TrainplanError(
                f"{source}: {path}{key} {cfg[key]} is more blocks than any published model "
                f"(building them would take minutes).", allowed=f"1..{MAX_LAYERS}",
                fix=f"check {key}; the deepest released language models have about 130 blocks")
    width = next((k for k in WIDTHS if _is_int(cfg.get(k))), None)
    heads = next((k for k in HEADS if _is_int(cfg.get(k))), None)
    # an explicit per-head size (Gemma's head_dim, T5's d_kv) frees the width from the heads
    explicit = cfg.get("head_dim") is not None or cfg.get("d_kv") is not None
    if width and heads and not explicit and cfg[width] % cfg[heads]:
        w, h = cfg[width], cfg[heads]
        near = sorted((d for d in range(max(1, h - 64), min(w, h + 64) + 1) if w % d == 0),
                      key=lambda d: abs(d - h))[:3] or [1]     # a bounded search, never slow
        raise TrainplanError(
            f"{source}: {path}{width} {w} is not divisible by {path}{heads} {h} (each head "
            "gets an equal slice of the hidden size).",
            allowed=f"{heads} dividing {w}, e.g. {', '.join(map(str, sorted(near)))}",
            fix=f"change {heads} (or {width}), or give head_dim explicitly")
    kv = cfg.get("num_key_value_heads")
    if heads and _is_int(kv) and cfg[heads] % kv:
        raise TrainplanError(
            f"{source}: {path}{heads} {cfg[heads]} is not divisible by num_key_value_heads {kv} "
            "(grouped-query attention shares each key/value head among a whole group).",
            fix=f"use num_key_value_heads dividing {cfg[heads]} (1, or {cfg[heads]} for none)")


def _typical(key: str) -> int:
    return {"vocab_size": 50257, "num_hidden_layers": 12, "n_layer": 12, "num_layers": 12,
            "n_layers": 12}.get(key, 12 if "head" in key else 768)


_FIELDS_FILE = "config_fields.json"


def _config_fields(model_type: str) -> set[str] | None:
    """The field names (and attribute_map aliases) of transformers' config class for
    `model_type`; None when transformers does not know it (make_config says so). Kept in the
    cache folder by transformers' release (`_fields_cache`): read from transformers, they import
    it and PyTorch (2-3 s), on every run of a job with a local config.json, warm plans included."""
    known, path = _fields_cache()
    if model_type not in known:
        fields = _read_config_fields(model_type)
        known[model_type] = sorted(fields) if fields is not None else None
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(path, json.dumps(known, sort_keys=True))
            except OSError:          # a cache: the next run reads transformers again
                pass
    fields = known[model_type]
    return set(fields) if fields is not None else None


def _fields_cache() -> tuple[dict, Path | None]:
    """(model_type -> its config fields or None, the file they are kept in) for the installed
    transformers release; ({}, None) where it cannot be told or the cache is not writable."""
    from importlib import metadata
    try:
        version = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return {}, None
    path = cache_dir() / f"{version}-{_FIELDS_FILE}"
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    return (known if isinstance(known, dict) else {}), path


def _read_config_fields(model_type: str) -> set[str] | None:
    """`_config_fields`, read off transformers' config class."""
    from . import hf_import
    hf_import.prepare()
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    if model_type not in CONFIG_MAPPING_NAMES:
        return None
    from .hf import _family_module
    try:
        cls = getattr(_family_module(model_type, "configuration"), CONFIG_MAPPING_NAMES[model_type])
    except (ImportError, AttributeError):
        return None
    if getattr(cls, "sub_configs", None):   # composite (Qwen2.5-VL): takes its text config's
        return None                         # fields flat too, in any layout
    known = set(getattr(cls, "attribute_map", None) or {})
    for c in cls.__mro__:
        known |= set(getattr(c, "__annotations__", {}))
        init = c.__dict__.get("__init__")
        if init is not None:
            try:
                known |= set(inspect.signature(init).parameters)
            except (TypeError, ValueError):
                pass
    return known


def check_fields_match(cfg: dict, source: str) -> None:
    """A config whose size fields are another family's (GPT-2's n_embd/n_layer/n_head under
    model_type "llama") would build the model_type's default sizes, or fail; say so instead."""
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str):
        return
    present = [k for k in WIDTHS + LAYERS + HEADS if k in cfg]
    known = _config_fields(model_type) if present else None
    if not known or any(k in known for k in present):
        return
    expected = [k for k in WIDTHS + LAYERS + HEADS if k in known]
    raise TrainplanError(
        f"{source}: model_type {model_type!r} does not match the config's fields: its "
        f"{', '.join(present)} are not {model_type} settings, so they would be ignored.",
        allowed=f"{model_type}'s own names: {', '.join(expected) or 'see its config class'}",
        fix="set model_type to the family these fields come from (the one in "
            "`architectures`), or rename the fields")


def check_model_ref(model: str) -> None:
    """Check the config an `hf:` model name points at (a bundled id or a local file); a no-op for
    other sources. Called when the job is validated, before anything is traced."""
    if not model.startswith("hf:"):
        return
    cfg, auto_class, canonical = load_config_dict(model[3:])
    check_config(cfg, canonical)
    if auto_class is None:          # a local file (bundled configs are known to match)
        check_fields_match(cfg, canonical)


def _mismatch(cfg: dict) -> str | None:
    """Why model_type and architectures disagree, or None (unknown classes are not judged)."""
    model_type, archs = cfg.get("model_type"), cfg.get("architectures") or []
    if not (isinstance(model_type, str) and archs and isinstance(archs[0], str)):
        return None
    try:
        from transformers.models.auto import modeling_auto
    except Exception:   # noqa: BLE001 -- only a hint
        return None
    owners = {mt for name in dir(modeling_auto) if name.endswith("_MAPPING_NAMES")
              for mt, cls in (getattr(modeling_auto, name) or {}).items()
              if archs[0] in ((cls,) if isinstance(cls, str) else tuple(cls or ()))}
    if owners and model_type not in owners:
        return (f"its model_type {model_type!r} does not match architectures {archs[0]!r} "
                f"(a model_type {', '.join(repr(o) for o in sorted(owners)[:3])} class)")
    return None


def build_error(e: Exception, cfg, source: str) -> TrainplanError:
    """transformers' exception while building from `cfg` -> one message naming the config."""
    text = " ".join(str(e).split())
    if len(text) > 300:
        text = text[:297] + "..."
    why = _mismatch(cfg) if isinstance(cfg, dict) else None
    what = f"transformers could not build a model from {source}"
    if why:
        return TrainplanError(f"{what}: {why}. transformers said: {type(e).__name__}: {text}",
                              fix="set model_type to the one the architecture belongs to, or "
                                  "architectures to a class of this model_type")
    return TrainplanError(f"{what}: {type(e).__name__}: {text}",
                          fix="check the field the message names against the model's published "
                              f"config.json, e.g. start from {EXAMPLE}")


def guarded(build: Callable) -> Callable:
    """Decorator for `build_hf(job, ...)`: check the config first, and turn any exception
    transformers raises while building into a TrainplanError naming the config."""
    @functools.wraps(build)
    def build_checked(job, *args, **kwargs):
        cfg, _, source = load_config_dict(job.model[3:])
        check_config(cfg, source)
        check_fields_match(cfg, source)
        try:
            return build(job, *args, **kwargs)
        except TrainplanError:
            raise
        except (KeyboardInterrupt, MemoryError, RecursionError):
            raise
        except Exception as e:   # noqa: BLE001 -- transformers' code on the user's config
            raise build_error(e, cfg, source) from None
    return build_checked
