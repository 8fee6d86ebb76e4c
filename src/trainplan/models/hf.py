"""`hf:` source: Hugging Face transformers models from bundled config.json facts (no hub access).

`hf:<hub id>` reads `hf_configs/<org>--<name>.json` (index.csv lists them, with the Auto class used
for training and the published parameter count); `hf:./path/config.json` reads any local config
and takes the class from its `architectures` field.
"""
from __future__ import annotations

import csv
import functools
import importlib
import json
from importlib import resources
from pathlib import Path

import torch

from ..errors import TrainplanError, unknown
from . import ModelBundle, hf_import, loss_from_output

TASK_CLASSES = {
    "causal-lm": "AutoModelForCausalLM",
    "masked-lm": "AutoModelForMaskedLM",
    "seq-classification": "AutoModelForSequenceClassification",
    "seq2seq": "AutoModelForSeq2SeqLM",
    "image-classification": "AutoModelForImageClassification",
}


@functools.cache
def bundled_index() -> dict[str, dict]:
    """hub id (lower-case) -> row of hf_configs/index.csv."""
    path = resources.files("trainplan.models") / "hf_configs" / "index.csv"
    with path.open() as f:
        return {row["hub_id"].lower(): row for row in csv.DictReader(f)}


def bundled_ids() -> list[str]:
    return sorted(row["hub_id"] for row in bundled_index().values())


def load_config_dict(ref: str) -> tuple[dict, str | None, str]:
    """(config dict, Auto class name or None, canonical name) for a hub id or a local path."""
    if ref.endswith(".json") or ref.startswith((".", "/", "~")):
        path = Path(ref).expanduser()
        if path.is_dir():
            path = path / "config.json"
        if not path.exists():
            raise TrainplanError(f"No config file at {path}.",
                                 fix="point hf: at a local config.json (nothing is downloaded)")
        try:
            return json.loads(path.read_text()), None, str(path)
        except json.JSONDecodeError as e:
            raise TrainplanError(f"{path} is not valid JSON (line {e.lineno}): {e.msg}") from None
    row = bundled_index().get(ref.lower())
    if row is None:
        raise unknown("model", f"hf:{ref}", [f"hf:{i}" for i in bundled_ids()],
                      hint="use a bundled id (trainplan catalog models) or hf:./path/config.json "
                           "for any other model; nothing is downloaded")
    fname = row["hub_id"].replace("/", "--") + ".json"
    text = (resources.files("trainplan.models") / "hf_configs" / fname).read_text()
    return json.loads(text), row["auto_class"], row["hub_id"]


AUTO_MAPPINGS = {
    "AutoModel": "MODEL_MAPPING_NAMES",
    "AutoModelForCausalLM": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "AutoModelForMaskedLM": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "AutoModelForSequenceClassification": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "AutoModelForSeq2SeqLM": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "AutoModelForImageClassification": "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
    "AutoModelForImageTextToText": "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
}


def _family_module(model_type: str, kind: str):
    """transformers.models.<family>.<kind>_<family>, imported directly: going through the
    top-level lazy module scans every model's import structure (about 1 s)."""
    from transformers.models.auto.configuration_auto import model_type_to_module_name
    name = model_type_to_module_name(model_type)
    return importlib.import_module(f"transformers.models.{name}.{kind}_{name}")


def make_config(cfg: dict):
    hf_import.prepare()
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    model_type = cfg.get("model_type")
    if model_type not in CONFIG_MAPPING_NAMES:
        raise TrainplanError(
            f"config.json has model_type {model_type!r}, which this transformers does not know.",
            fix="use a model type transformers supports natively, or describe the model with "
                "py:<module>:<factory>")
    kwargs = {k: v for k, v in cfg.items() if k not in ("model_type", "transformers_version")}
    try:
        cls = getattr(_family_module(model_type, "configuration"), CONFIG_MAPPING_NAMES[model_type])
    except (ImportError, AttributeError):
        from transformers import CONFIG_MAPPING
        cls = CONFIG_MAPPING[model_type]
    return cls(**kwargs)


# An `architectures` entry transformers has no class for (remote-code MPT's `MPTForCausalLM`,
# the legacy `T5WithLMHeadModel`) is mapped through the config's model_type: its head suffix
# names the task, the task's Auto mapping names the class transformers has for that model_type.
HEAD_TASKS = (("ForConditionalGeneration", ("AutoModelForSeq2SeqLM", "AutoModelForImageTextToText",
                                            "AutoModelForCausalLM")),
              ("LMHeadModel", ("AutoModelForSeq2SeqLM", "AutoModelForCausalLM")),
              ("ForCausalLM", ("AutoModelForCausalLM",)),
              ("ForMaskedLM", ("AutoModelForMaskedLM",)),
              ("ForSequenceClassification", ("AutoModelForSequenceClassification",)),
              ("ForImageClassification", ("AutoModelForImageClassification",)))


def _family_class(name: str, model_type: str, is_auto: bool):
    from transformers.models.auto import modeling_auto
    cls_name = getattr(modeling_auto, AUTO_MAPPINGS[name], {}).get(model_type) if is_auto else name
    if not cls_name:
        return None
    try:
        module = _family_module(model_type, "modeling")
    except ImportError:
        return None
    if hasattr(module, cls_name):
        return getattr(module, cls_name)
    folded = {n.lower(): n for n in dir(module)}          # MPTForCausalLM -> MptForCausalLM
    return getattr(module, folded[cls_name.lower()]) if cls_name.lower() in folded else None


def resolve_architecture(name: str, model_type: str):
    """(class, note or None) for a config's architecture or an Auto class name.

    Falls back on model_type when transformers has no class of that name: the head suffix picks
    the task (HEAD_TASKS), the task's Auto mapping the class, and the note says what was built.
    """
    cls = _family_class(name, model_type, name in AUTO_MAPPINGS)
    if cls is not None:
        return cls, None
    import transformers
    if name in AUTO_MAPPINGS or hasattr(transformers, name):
        return _auto_class(name), None
    tasks = next((t for suffix, t in HEAD_TASKS if name.endswith(suffix)),
                 ("AutoModelForCausalLM", "AutoModelForSeq2SeqLM", "AutoModelForMaskedLM",
                  "AutoModel"))
    for auto in tasks:
        cls = _family_class(auto, model_type, True)
        if cls is not None:
            return cls, (f"config.json names {name}, which transformers does not have; built "
                         f"{cls.__name__}, transformers' {auto[len('AutoModelFor'):] or 'base'} "
                         f"class for model_type {model_type!r}")
    raise TrainplanError(f"transformers has no class {name!r} and no model for model_type "
                         f"{model_type!r}.",
                         fix="set `architectures` in config.json to a transformers class, or "
                             "pass --task (causal-lm, masked-lm, seq2seq, ...)")


def _auto_class(name: str):
    import transformers
    cls = getattr(transformers, name, None)
    if cls is None:
        raise TrainplanError(f"transformers has no class {name!r}.")
    return cls


def build_hf(job, attention: str = "efficient") -> ModelBundle:
    ref = job.model[3:]
    cfg_dict, auto_name, canonical = load_config_dict(ref)
    config = make_config(cfg_dict)
    if job.task:
        auto_name = TASK_CLASSES[job.task]
    if auto_name is None:
        archs = cfg_dict.get("architectures") or []
        auto_name = archs[0] if archs else "AutoModelForCausalLM"
    cls, mapped = resolve_architecture(auto_name, cfg_dict.get("model_type"))
    if mapped:
        auto_name = cls.__name__
    attn = "eager" if attention == "eager" else "sdpa"
    if job.seq_len and getattr(config, "max_seq_len", None) and job.seq_len > config.max_seq_len:
        # MPT sizes its ALiBi bias from max_seq_len (a setting, not a weight); llm-foundry sets
        # it to the run's sequence length
        config.max_seq_len = job.seq_len
    if job.grad_checkpointing != "none":
        # as transformers' own gradient checkpointing does: a KV cache filled by the forward
        # would make the backward's recomputation see different shapes
        for c in {id(config): config, id(_text_config(config)): _text_config(config)}.values():
            c.use_cache = False
    notes = [mapped] if mapped else []
    with torch.device("meta"):
        try:
            model = _from_config(cls, config, attn)
        except (ValueError, ImportError) as e:
            msg = str(e).lower()
            if attn == "sdpa" and ("sdpa" in msg or "scaled_dot_product_attention" in msg):
                model = _from_config(cls, config, "eager")
                notes.append(f"{cls.__name__} has no SDPA path in transformers: its eager "
                             "attention (s x s scores materialised) is traced on every target")
            else:
                raise TrainplanError(f"transformers could not build {canonical}: {e}") from None
    model.train()
    _check_learned_positions(model, config, job, canonical)
    kind, make_inputs, tokens = _inputs_for(auto_name, config, job)
    return ModelBundle(name=f"hf:{canonical}", module=model, kind=kind, make_inputs=make_inputs,
                       loss=loss_from_output, tokens_per_sample=tokens, notes=notes)


def _check_learned_positions(model, config, job, name: str) -> None:
    """A model with a learned position table (BERT, GPT-2, OPT: an Embedding of
    max_position_embeddings rows, OPT and RoBERTa with an offset of 2) cannot take longer inputs;
    rotary and ALiBi models can."""
    limit = getattr(_text_config(config), "max_position_embeddings", None)
    if not (job.seq_len and limit) or job.seq_len <= limit:
        return
    if any(isinstance(m, torch.nn.Embedding) and m.num_embeddings in (limit, limit + 2)
           for m in model.modules()):
        raise TrainplanError(
            f"{name} has {limit} learned positions; --seq-len {job.seq_len} is longer.",
            allowed=f"--seq-len 1..{limit}",
            fix=f"use --seq-len {limit} (or less), or a model with rotary/ALiBi positions")


def _from_config(cls, config, attn):
    if hasattr(cls, "_from_config"):
        return cls._from_config(config, attn_implementation=attn)
    if hasattr(cls, "from_config"):
        return cls.from_config(config, attn_implementation=attn)
    config._attn_implementation = attn
    return cls(config)


def _text_config(config):
    get = getattr(config, "get_text_config", None)
    return get() if get else config


def _image_size(config, job) -> int:
    vc = getattr(config, "vision_config", None) or config
    return job.image_size or getattr(vc, "image_size", 224)


def _inputs_for(auto_name: str, config, job):
    """(kind, make_inputs(batch), tokens per sample) for the model's training task."""
    seq = job.seq_len or min(getattr(_text_config(config), "max_position_embeddings", 512) or 512,
                             512)
    vocab = getattr(_text_config(config), "vocab_size", 32000)
    n = auto_name.lower()
    if "imageclassification" in n:
        size = _image_size(config, job)
        classes = max(2, getattr(config, "num_labels", 2))
        def img(batch):
            return {"pixel_values": torch.randn(batch, 3, size, size),
                    "labels": torch.randint(0, classes, (batch,))}
        return "vision", img, None
    if getattr(config, "model_type", "") == "clip" or ("vision_config" in config.to_dict()
                                                       and "text_config" in config.to_dict()
                                                       and n in ("automodel", "clipmodel")):
        size = _image_size(config, job)
        text_len = job.seq_len or getattr(config.text_config, "max_position_embeddings", 77)
        def clip(batch):
            return {"input_ids": torch.randint(0, config.text_config.vocab_size, (batch, text_len)),
                    "pixel_values": torch.randn(batch, 3, size, size), "return_loss": True}
        return "vision-language", clip, text_len
    if "sequenceclassification" in n:
        def cls_inputs(batch):
            return {"input_ids": torch.randint(0, vocab, (batch, seq)),
                    "labels": torch.randint(0, max(2, getattr(config, "num_labels", 2)), (batch,))}
        return "encoder", cls_inputs, seq
    if "seq2seq" in n or getattr(config, "is_encoder_decoder", False):
        def s2s(batch):
            return {"input_ids": torch.randint(0, vocab, (batch, seq)),
                    "labels": torch.randint(0, vocab, (batch, seq))}
        return "encoder-decoder", s2s, seq
    kind = "encoder" if "maskedlm" in n else "decoder"
    def lm(batch):
        ids = torch.randint(0, vocab, (batch, seq))
        return {"input_ids": ids, "labels": ids}
    return kind, lm, seq
