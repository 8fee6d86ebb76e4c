"""What the config readers share: loading a YAML or JSON file, the frameworks' key lists, which
bundled model a hub id means, and the optimizer names of the Hugging Face Trainer (`optim`), which
axolotl, LLaMA-Factory and TRL all pass through.
"""
from __future__ import annotations

import functools
import json
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ..errors import TrainplanError
from ..models import hf_names
from .reading import show

# --- files --------------------------------------------------------------------------------------


def load_file(path: str | Path, what: str = "config") -> dict:
    """A YAML or JSON mapping (JSON is YAML, but a JSON file's error should say JSON)."""
    path = Path(path)
    if not path.exists():
        raise TrainplanError(f"The {what} file {path} does not exist.",
                             fix="check the path (relative paths are read from the current "
                                 "folder)")
    if path.is_dir():
        raise TrainplanError(f"{path} is a folder, not a {what} file.")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:     # the same words as a job file's (spec.py)
        raise TrainplanError(f"{path} is not text (byte {e.start} is not UTF-8): a binary file?",
                             fix=f"give a YAML or JSON {what} file") from None
    except OSError as e:
        raise TrainplanError(f"Cannot read {path}: {e.strerror or e}.",
                             fix=f"give a readable {what} file") from None
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as e:
        raise TrainplanError(f"{path} is not valid JSON (line {e.lineno}): {e.msg}.") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise TrainplanError(f"{path} is not valid YAML{where}: "
                             f"{getattr(e, 'problem', None) or e}.") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise TrainplanError(f"{path} must be a YAML mapping of settings, not a "
                             f"{type(data).__name__}.", fix="write `key: value` lines")
    return data


def find_beside(ref: str, config_path: str | Path, what: str, flag: str) -> Path:
    """A path a config names (`deepspeed: deepspeed_configs/zero3.json`), as the framework
    resolves it: from the folder it is run in; also tried from the config's own folder and the
    folders above it (a config inside a framework's checkout names files from the checkout's
    root, where its README runs it)."""
    p = Path(ref).expanduser()
    if p.is_absolute():
        if p.is_file():
            return p
    else:
        here = Path(config_path).resolve().parent
        for base in (Path.cwd(), here, *here.parents):
            if (base / p).is_file():
                return _shown(base / p)
    raise TrainplanError(f"{config_path} names the {what} {ref}, which is not here (looked from "
                         "the current folder, the config's folder and the folders above it).",
                         fix=f"pass it with {flag} PATH")


def _shown(path: Path) -> Path:
    """`path` relative to the current folder when it is under it (as a person would type it)."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return path


@functools.cache
def known_keys(kind: str) -> tuple[frozenset, dict]:
    """(top-level keys, {section: keys}) of a framework's config schema
    (data/config_keys/<kind>.json, written by scripts/config_keys.py)."""
    text = (resources.files("trainplan") / "data" / "config_keys" / f"{kind}.json").read_text()
    doc = json.loads(text)
    return frozenset(doc["keys"]), {k: frozenset(v) for k, v in doc.get("sections", {}).items()}


# --- models -------------------------------------------------------------------------------------

def model_ref(name: Any, where: str, base: Path | None = None) -> tuple[str, str]:
    """(job model `hf:...`, what it means) for a model a config names: a bundled hub id or an id
    it aliases; a re-upload in another organisation under the same name as exactly one bundled
    model (NousResearch/Llama-2-7b-hf: meta-llama/Llama-2-7b-hf); a local folder or config.json;
    else the id itself (read from the Hugging Face cache, or downloaded with --allow-download;
    validation says which with close matches)."""
    if not isinstance(name, str) or not name.strip():
        raise TrainplanError(f"{where}: the model must be a hub id or a path, got {name!r}.")
    ref = name.strip()
    local = Path(ref).expanduser()
    if not local.is_absolute() and base is not None and (base / local).exists():
        local = base / local
    if (local / "config.json").is_file() or (ref.endswith(".json") and local.is_file()):
        return f"hf:{local}", f"model hf:{local}"
    found = hf_names.resolve_bundled(ref)
    if found is not None:
        hub_id, named, _note = found
        if named.lower() == ref.lower() and hub_id.lower() == ref.lower():
            return f"hf:{hub_id}", f"model hf:{hub_id} (bundled config)"
        return f"hf:{named}", f"model hf:{named} (bundled config of {hub_id})"
    if "/" in ref:
        org, short = ref.split("/", 1)
        hits = [i for i in hf_names.known_ids() if i.rsplit("/", 1)[-1].lower() == short.lower()]
        if len(hits) == 1:
            return (f"hf:{hits[0]}", f"model hf:{hits[0]}: {org}'s {short} is a re-upload under "
                    "the same name (assumed the same architecture)")
    return f"hf:{ref}", f"model hf:{ref} (not bundled: from the Hugging Face cache or "\
                        "--allow-download)"


def model_config(model: str) -> dict | None:
    """The bundled or local config.json of an `hf:` model, None when trainplan has none (torch is
    not imported)."""
    if not model.startswith("hf:"):
        return None
    ref = model[3:]
    try:
        if hf_names.is_local_ref(ref) or hf_names.resolve_bundled(ref) is not None:
            return hf_names.resolve_config(ref)[0]
    except TrainplanError:
        return None
    return None


def planned_seq_len(model: str) -> int | None:
    """The sequence trainplan traces an `hf:` model at when the job names none
    (hf_names.default_seq_len); None when trainplan has no config for it here."""
    cfg = model_config(model)
    if cfg is None:
        return None
    text = cfg.get("text_config") or cfg
    return hf_names.default_seq_len(text.get("max_position_embeddings"))


def checkpoint_dtype(model: str) -> str | None:
    """The dtype a checkpoint was published in (config.json's torch_dtype / dtype), which
    `from_pretrained(dtype="auto")` loads it in."""
    cfg = model_config(model) or {}
    text = cfg.get("torch_dtype") or cfg.get("dtype") or (cfg.get("text_config") or {}).get(
        "torch_dtype")
    return text if isinstance(text, str) else None


# --- the Hugging Face Trainer's `optim` names ---------------------------------------------------
# transformers.training_args.OptimizerNames -> trainplan optimizer, and what differs.
FOREACH = "planned as PyTorch's foreach AdamW, whose whole-group temporaries the fused kernel " \
          "does not keep"
HF_OPTIM = {
    "adamw_torch": ("adamw", ""),
    "adamw_torch_fused": ("adamw", FOREACH),
    "adamw_hf": ("adamw", ""),
    "adamw_apex_fused": ("adamw", FOREACH),
    "adamw_torch_xla": ("adamw", ""),
    "adamw_torch_npu_fused": ("adamw", FOREACH),
    "adamw_bnb_8bit": ("adamw-8bit", ""),
    "adamw_8bit": ("adamw-8bit", ""),
    "paged_adamw_8bit": ("paged-adamw-8bit", ""),
    "paged_adamw_32bit": ("paged-adamw", ""),
    "paged_adamw": ("paged-adamw", ""),
    "adafactor": ("adafactor", ""),
    "sgd": ("sgd", ""),
    "lion_32bit": ("lion", ""),
    "paged_lion_32bit": ("lion", "paged (unified-memory) states planned on the device"),
    "lion_8bit": ("lion", "8-bit states planned in the parameters' dtype"),
    "paged_lion_8bit": ("lion", "8-bit paged states planned in the parameters' dtype"),
}


def optimizer(name: Any) -> tuple[str, str, bool]:
    """(trainplan optimizer, what differs, modelled) for an HF Trainer `optim` name; an optimizer
    trainplan does not model is planned as AdamW (modelled False)."""
    text = str(name).strip().lower()
    if text in HF_OPTIM:
        opt, why = HF_OPTIM[text]
        return opt, why, True
    return "adamw", "not an optimizer trainplan models: planned as AdamW (two fp32 states a " \
                    "parameter)", False


def clip_norm(c, key: str, raw: Any, example: str = "1.0") -> float:
    """A clipping norm as a file gives it: a number >= 0 (null is 0, no clipping), else one
    error naming `key` (`c`: the reader's Collector); `example`: the value the fix suggests."""
    norm = 0.0 if raw is None else c.number(key, raw)
    if not norm >= 0:
        raise c.error(key, f"must be a number >= 0, got {show(raw)}.",
                      fix=f"{key}: {example}, or 0 for no clipping")
    return norm


def clipping_text(norm: float | None) -> str:
    """What a clipping norm plans, in words (None or 0: no clipping)."""
    return (f"gradients clipped to global norm {show(norm)} before every step (a pass reading "
            "every gradient, one scaling it)") if norm else "no gradient clipping"
