"""Which config an `hf:` model name means, without importing PyTorch or transformers.

`hf:<hub id>` reads `hf_configs/<org>--<name>.json` (index.csv lists them, with the Auto class used
for training and the published parameter count); ids are matched case-insensitively, a bare name
(`hf:gpt2`) finds the one bundled id it ends, and ALIASES maps fine-tunes and renamed repos to the
bundled config of the same architecture. `hf:./path/config.json` (or a folder holding one) reads
any local config. Any other hub id's config.json comes from the Hugging Face cache, or is
downloaded only when the user opts in (models/hub.py); otherwise the error says how to get it.
Building the model from the config is models/hf.py's; a misspelt name is answered here, before
the seconds PyTorch takes to import.
"""
from __future__ import annotations

import csv
import difflib
import functools
import json
import re
from importlib import resources
from pathlib import Path

from ..errors import TrainplanError, suggestion


@functools.cache
def bundled_index() -> dict[str, dict]:
    """hub id (lower-case) -> row of hf_configs/index.csv."""
    path = resources.files("trainplan.models") / "hf_configs" / "index.csv"
    with path.open() as f:
        return {row["hub_id"].lower(): row for row in csv.DictReader(f)}


def bundled_ids() -> list[str]:
    return sorted(row["hub_id"] for row in bundled_index().values())


# Hub ids built from a bundled config because their architecture is the bundled model's: every
# dimension, the vocabulary and the attention layout are the same, only the weights (a fine-tune)
# or the repo's name differ. One row per id: id -> (bundled id, how the two relate); the note on
# every result says which bundled config was used. (Qwen2.5-1.5B/7B/14B-Instruct set
# max_position_embeddings 32768 where the base sets 131072: a rotary limit that sizes no weight.)
# Deliberately NOT aliased (other dimensions): google/flan-t5-* (T5 v1.1: gated GELU, other
# sizes), mistralai/Mistral-7B-Instruct-v0.2 and later (rope_theta 1e6, no sliding window; v0.3
# has a larger vocabulary), Qwen2.5-Coder/Math, google/vit-*-in21k (another head), the Llama
# original-format repos meta-llama/Llama-2-7b (no config.json), bigscience/* (no bundled BLOOM/T0).
INSTRUCT = "an instruction-tuned fine-tune of"
CHAT = "a chat fine-tune of"
RENAMED = "the former id of"
RENAMED_INSTRUCT = "the former id of an instruction-tuned fine-tune of"
RETRAINED = "a retraining (on other data) of"

ALIASES: dict[str, tuple[str, str]] = {
    "google-bert/bert-large-uncased-whole-word-masking": ("google-bert/bert-large-uncased",
                                                          RETRAINED),
    "meta-llama/Llama-2-7b-chat-hf": ("meta-llama/Llama-2-7b-hf", CHAT),
    "meta-llama/Llama-2-13b-chat-hf": ("meta-llama/Llama-2-13b-hf", CHAT),
    "meta-llama/Meta-Llama-3-8B-Instruct": ("meta-llama/Meta-Llama-3-8B", INSTRUCT),
    "meta-llama/Meta-Llama-3-70B-Instruct": ("meta-llama/Meta-Llama-3-70B", INSTRUCT),
    "meta-llama/Meta-Llama-3.1-8B": ("meta-llama/Llama-3.1-8B", RENAMED),
    "meta-llama/Meta-Llama-3.1-70B": ("meta-llama/Llama-3.1-70B", RENAMED),
    "meta-llama/Llama-3.1-8B-Instruct": ("meta-llama/Llama-3.1-8B", INSTRUCT),
    "meta-llama/Llama-3.1-70B-Instruct": ("meta-llama/Llama-3.1-70B", INSTRUCT),
    "meta-llama/Meta-Llama-3.1-8B-Instruct": ("meta-llama/Llama-3.1-8B", RENAMED_INSTRUCT),
    "meta-llama/Meta-Llama-3.1-70B-Instruct": ("meta-llama/Llama-3.1-70B", RENAMED_INSTRUCT),
    "meta-llama/Llama-3.2-1B-Instruct": ("meta-llama/Llama-3.2-1B", INSTRUCT),
    "meta-llama/Llama-3.2-3B-Instruct": ("meta-llama/Llama-3.2-3B", INSTRUCT),
    "TinyLlama/TinyLlama-1.1B-Chat-v1.0": ("TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T",
                                           CHAT),
    "mistralai/Mistral-7B-Instruct-v0.1": ("mistralai/Mistral-7B-v0.1", INSTRUCT),
    "mistralai/Mixtral-8x7B-Instruct-v0.1": ("mistralai/Mixtral-8x7B-v0.1", INSTRUCT),
    "Qwen/Qwen2.5-0.5B-Instruct": ("Qwen/Qwen2.5-0.5B", INSTRUCT),
    "Qwen/Qwen2.5-1.5B-Instruct": ("Qwen/Qwen2.5-1.5B", INSTRUCT),
    "Qwen/Qwen2.5-3B-Instruct": ("Qwen/Qwen2.5-3B", INSTRUCT),
    "Qwen/Qwen2.5-7B-Instruct": ("Qwen/Qwen2.5-7B", INSTRUCT),
    "Qwen/Qwen2.5-14B-Instruct": ("Qwen/Qwen2.5-14B", INSTRUCT),
    "google/gemma-2b-it": ("google/gemma-2b", INSTRUCT),
    "google/gemma-7b-it": ("google/gemma-7b", INSTRUCT),
    "google/gemma-2-2b-it": ("google/gemma-2-2b", INSTRUCT),
    "google/gemma-2-9b-it": ("google/gemma-2-9b", INSTRUCT),
    "tiiuae/falcon-7b-instruct": ("tiiuae/falcon-7b", INSTRUCT),
    "mosaicml/mpt-7b-instruct": ("mosaicml/mpt-7b", INSTRUCT),
    "mosaicml/mpt-7b-chat": ("mosaicml/mpt-7b", CHAT),
    "stabilityai/stablelm-2-1_6b-chat": ("stabilityai/stablelm-2-1_6b", CHAT),
    "EleutherAI/pythia-1b-deduped": ("EleutherAI/pythia-1b", RETRAINED),
}

# a hub id: `name` or `org/name` (letters, digits, . _ -)
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")


def _alias_index() -> dict[str, str]:
    """lower-case alias -> its spelling in ALIASES."""
    return {a.lower(): a for a in ALIASES}


@functools.cache
def _names() -> dict[str, tuple[str, ...]]:
    """lower-case name after the org (gpt2, llama-3.2-1b-instruct) -> the bundled or aliased ids
    that end in it."""
    names: dict[str, list[str]] = {}
    for full in bundled_ids() + sorted(ALIASES):
        names.setdefault(full.rsplit("/", 1)[-1].lower(), []).append(full)
    return {k: tuple(v) for k, v in names.items()}


DEFAULT_SEQ_LEN = 512


def default_seq_len(max_position_embeddings: int | None) -> int:
    """The sequence a job that names none is traced at: 512 tokens, or the model's own limit
    when that is shorter (models/hf.py)."""
    return min(max_position_embeddings or DEFAULT_SEQ_LEN, DEFAULT_SEQ_LEN)


def known_ids() -> list[str]:
    """Every id `hf:` resolves without the network: bundled ids and their aliases."""
    return sorted(bundled_ids() + list(ALIASES))


def resolve_bundled(ref: str) -> tuple[str, str, str | None] | None:
    """(bundled hub id, the id as named, note or None) for a bundled id, an alias or a bare name
    (the part after the org, when one id ends in it), all case-insensitive; None otherwise."""
    key = ref.lower()
    if key in bundled_index():
        return bundled_index()[key]["hub_id"], bundled_index()[key]["hub_id"], None
    if key in _alias_index():
        alias = _alias_index()[key]
        return ALIASES[alias][0], alias, f"hf:{alias}: {_alias_note(alias)}"
    if "/" in key:
        return None
    hits = _names().get(key, ())
    if len(hits) > 1:
        raise TrainplanError(f"Model name hf:{ref} is ambiguous: "
                             + ", ".join(f"hf:{h}" for h in hits) + " end in it.",
                             fix="name the model with its organisation, e.g. hf:" + hits[0])
    if not hits:
        return None
    named = hits[0]
    if named in ALIASES:
        return ALIASES[named][0], named, f"hf:{ref} is {named}, {_alias_note(named)}"
    return named, named, f"hf:{ref} is {named}"


def _alias_note(alias: str) -> str:
    target, relation = ALIASES[alias]
    return (f"built from the bundled config of {target}: {alias.split('/')[-1]} is {relation} "
            f"{target.split('/')[-1]}, with the same architecture")


def close_ids(ref: str, n: int = 3) -> list[str]:
    """Bundled and aliased ids that look like ref, best first: compared whole and by the name
    after the org (hf:gpt-2 -> openai-community/gpt2)."""
    key = ref.lower()
    kname = key.rsplit("/", 1)[-1]
    scored = []
    for full in known_ids():
        c = full.lower()
        cname = c.rsplit("/", 1)[-1]
        score = max(difflib.SequenceMatcher(None, key, c).ratio(),
                    difflib.SequenceMatcher(None, kname, cname).ratio())
        if len(kname) >= 3 and (kname in cname or cname in kname):   # llama-3-8b: Meta-Llama-3-8B
            shorter, longer = sorted((len(kname), len(cname)))
            score = max(score, 0.9 + 0.1 * shorter / longer)
        if score >= 0.6:
            scored.append((-score, full in ALIASES, full))       # bundled first on a tie
    return [full for *_, full in sorted(scored)[:n]]


def _did_you_mean(ref: str) -> str:
    """The bundled ids like `ref` (`close_ids`), as errors.suggestion names them."""
    return suggestion(ref, (), show=lambda m: f"'hf:{m}'", matches=close_ids(ref))


def is_local_ref(ref: str) -> bool:
    """An `hf:` reference to a local config.json, or to a folder holding one (a folder wins over
    a hub id of the same spelling, as in transformers' from_pretrained)."""
    if ref.endswith(".json") or ref.startswith((".", "/", "~")):
        return True
    path = Path(ref).expanduser()
    try:
        return path.is_dir() and (path / "config.json").is_file()
    except (OSError, ValueError):     # a name too long for a path, a NUL: not a local folder
        return False


def normalize_model_ref(model: str) -> str:
    """`--model path/config.json` or `--model dir` (holding a config.json) -> `hf:<path>`; any
    other model string unchanged (its source prefix is checked when the model is built)."""
    from . import SOURCES
    prefixes = tuple(s for s in SOURCES if s.endswith(":")) + ("transformer:",)
    if not model or model == "transformer" or model.startswith(prefixes):
        return model
    try:
        local = (Path(model).expanduser() / "config.json").is_file()
    except (OSError, ValueError):     # a name too long for a path, a NUL: not a local folder
        local = False
    if model.lower().endswith(".json") or local:
        return f"hf:{model}"
    return model


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise TrainplanError(f"{path} is not valid JSON (line {e.lineno}): {e.msg}") from None
    except UnicodeDecodeError:
        raise TrainplanError(f"{path} is not a config.json: it is not UTF-8 text.") from None
    except OSError as e:
        raise TrainplanError(f"Cannot read {path}: {e.strerror or e}.") from None
    if not isinstance(data, dict):
        raise TrainplanError(f"{path} is not a config.json: it holds a JSON "
                             f"{type(data).__name__}, not an object.")
    return data


def resolve_config(ref: str) -> tuple[dict, str | None, str, str | None]:
    """(config dict, Auto class name or None, canonical name, note or None) for what follows
    `hf:`. In order: a local config.json (or a folder holding one); a bundled id, an alias of one
    or a bare name (resolve_bundled); any other hub id's config.json from the Hugging Face cache;
    with the user's opt-in, downloaded (models/hub.py). Nothing touches the network without it."""
    from . import hub
    if is_local_ref(ref):
        path = Path(ref).expanduser()
        if path.is_dir():
            path = path / "config.json"
        if not path.exists():
            raise TrainplanError(f"No config file at {path}.",
                                 fix="point hf: at a local config.json, or at a folder that "
                                     "holds one")
        return _read_json(path), None, str(path), None
    found = resolve_bundled(ref)
    if found is not None:
        hub_id, named, note = found
        row = bundled_index()[hub_id.lower()]
        fname = row["hub_id"].replace("/", "--") + ".json"
        text = (resources.files("trainplan.models") / "hf_configs" / fname).read_text()
        return json.loads(text), row["auto_class"], named, note
    if not HUB_ID.fullmatch(ref):
        raise TrainplanError(f"Unknown model 'hf:{ref}': not a hub id (org/name) nor a local "
                             f"file.{_did_you_mean(ref)}",
                             allowed="a bundled hub id (trainplan catalog models) or an id it "
                                     "aliases, hf:./path/config.json, or any hub id with "
                                     "--allow-download",
                             fix="use a bundled id, or pass the path of a config.json")
    path = hub.cached_config(ref)
    if path is None:
        if not hub.download_allowed():
            raise TrainplanError(
                f"Unknown model 'hf:{ref}': trainplan bundles no config for it, and downloading "
                f"is off.{_did_you_mean(ref)}",
                allowed="a bundled hub id (trainplan catalog models) or an id it aliases, "
                        "hf:./path/config.json, or any hub id with --allow-download",
                fix=hub.how_to_get(ref))
        path = hub.download_config(ref, close=_did_you_mean(ref))
    return (_read_json(path), None, ref,
            f"hf:{ref}: config.json {hub.origin(ref)} ({path}); only the config, no weights")


# Architectures whose attention adds a learned bias to the scores (T5's relative position bias,
# a trainable Embedding: the bias needs a gradient). transformers gave them an SDPA path only with
# huggingface/transformers#47014 (merged July 2026: the 5.2x releases; T5Attention now hands
# `position_bias` to `sdpa_attention_forward`, which folds it into a float mask). Every release
# before ran them eager: `attn_implementation="sdpa"` raised ValueError, the default fell back to
# eager (modeling_utils `get_correct_attn_implementation`). Where the SDPA path exists PyTorch
# cannot take flash (no mask) nor cuDNN (it refuses a mask that requires grad:
# sdp_utils_cpp.h `check_attn_mask_shape`); the memory-efficient kernel takes the bias and its
# gradient from torch 2.1 (pytorch/pytorch#104310) and the math path materialises the scores.
# The measured case this rests on: T5-base, batch 16, 512 tokens, bf16 autocast, transformers
# 5.17 on an H200: 25.8 GiB allocated, as the eager step (predict/target.py `semantics_for`).
EAGER_BEFORE_SDPA_PORT = frozenset({"t5", "mt5", "umt5", "longt5", "switch_transformers",
                                    "pop2piano", "udop"})


@functools.cache
def model_type(model: str) -> str:
    """The config's model_type of an `hf:` model ("" for other sources or when unknown)."""
    if not model.startswith("hf:"):
        return ""
    try:
        return str(resolve_config(model[3:])[0].get("model_type", ""))
    except TrainplanError:
        return ""


def load_config_dict(ref: str) -> tuple[dict, str | None, str]:
    """(config dict, Auto class name or None, canonical name) for a hub id or a local path."""
    return resolve_config(ref)[:3]


DEPTH_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")


def config_depth(job) -> int | None:
    """The deepest block count the job's config names (its text config's and its own), or None
    where the config cannot be read (building the model will say why)."""
    try:
        cfg = load_config_dict(job.model[3:])[0]
    except (TrainplanError, OSError, ValueError):
        return None
    depths = [v for c in (cfg, cfg.get("text_config")) if isinstance(c, dict)
              for k, v in c.items() if k in DEPTH_KEYS and isinstance(v, int)]
    return max(depths, default=None)


# vision-language families whose samples carry images (models/hf.py builds their inputs)
QWEN_VL_TYPES = ("qwen2_vl", "qwen2_5_vl")
