"""`hf:` source: Hugging Face transformers models from config.json facts (never weights).

What an `hf:` name refers to (bundled ids, aliases, bare names, local files, the hub cache and the
opt-in download) is models/hf_names.py's, which imports no PyTorch; this module builds the model
from that config: the config class, the architecture's class (its `architectures` entry, or the
model_type's where transformers lacks it), the model on the meta device, and its inputs.
"""
from __future__ import annotations

import functools
import importlib
import math

import torch

from ..errors import TrainplanError
from . import ModelBundle, hf_import, hf_validate, loss_from_output, masked_lm_batch
from .hf_names import QWEN_VL_TYPES, default_seq_len, resolve_config
from .meta import on_meta

TASK_CLASSES = {
    "causal-lm": "AutoModelForCausalLM",
    "masked-lm": "AutoModelForMaskedLM",
    "seq-classification": "AutoModelForSequenceClassification",
    "seq2seq": "AutoModelForSeq2SeqLM",
    "image-classification": "AutoModelForImageClassification",
}


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


def resolve_architecture(name: str | None, model_type: str):
    """(class, note or None) for a config's architecture or an Auto class name.

    Falls back on model_type when transformers has no class of that name, or the config names
    none (`architectures` absent, as in microsoft/deberta-v3-large's): the head suffix picks the
    task (HEAD_TASKS; causal LM first where there is no name), the task's Auto mapping the
    class, and the note says what was built.
    """
    if name is not None:
        cls = _family_class(name, model_type, name in AUTO_MAPPINGS)
        if cls is not None:
            return cls, None
        import transformers
        if name in AUTO_MAPPINGS or hasattr(transformers, name):
            return _auto_class(name), None
    tasks = next((t for suffix, t in HEAD_TASKS if name and name.endswith(suffix)),
                 ("AutoModelForCausalLM", "AutoModelForSeq2SeqLM", "AutoModelForMaskedLM",
                  "AutoModel"))
    for auto in tasks:
        cls = _family_class(auto, model_type, True)
        if cls is not None:
            named = (f"names {name}, which transformers does not have" if name else
                     "names no architecture")
            return cls, (f"config.json {named}; built {cls.__name__}, transformers' "
                         f"{auto[len('AutoModelFor'):] or 'base'} class for model_type "
                         f"{model_type!r}")
    what = f"transformers has no class {name!r}" if name else "config.json names no architecture"
    raise TrainplanError(f"{what} and transformers has no model for model_type {model_type!r}.",
                         fix="set `architectures` in config.json to a transformers class, or "
                             "pass --task (causal-lm, masked-lm, seq2seq, ...)")


def _task_class(task: str, model_type: str | None) -> str | None:
    """The class transformers builds for `task` on this model_type, None where it has none."""
    from transformers.models.auto import modeling_auto
    return getattr(modeling_auto, AUTO_MAPPINGS[TASK_CLASSES[task]], {}).get(model_type)


def _check_task(task: str, model_type: str | None, name: str, arch: str | None) -> None:
    """--task must name a head transformers has for the family: its Auto class would otherwise
    fail on the config with an error about another model ("Could not import module
    'Gemma3nConfig'" for T5 as a causal LM). The fix names the config's own task first."""
    if _task_class(task, model_type):
        return
    ok = sorted((t for t in TASK_CLASSES if _task_class(t, model_type)),
                key=lambda t: _task_class(t, model_type) != arch)
    raise TrainplanError(f"{name} ({model_type}) has no {task} model in transformers.",
                         allowed=", ".join(ok) if ok else "no task of trainplan's",
                         fix=f"use --task {ok[0]}, or leave --task out to build the class its "
                             f"config.json names" if ok else
                             "leave --task out, or describe the model with py:<module>:<factory>")


def _pad_for_classification(cls, config) -> str | None:
    """A decoder's sequence classifier reads each sequence's score at its last token that is not
    padding, and without a pad id refuses a batch of more than one ("Cannot handle batch sizes >
    1 if no padding token is defined": GPT-2, Llama, Mistral, Qwen2). Every fine-tuning recipe
    sets it (transformers' text-classification example: `model.config.pad_token_id =
    tokenizer.pad_token_id`, the tokenizer's pad being its EOS where it has no other), and so do
    we: the EOS id, else 0. Returns the note, or None where nothing was set."""
    if not cls.__name__.endswith("ForSequenceClassification"):
        return None
    text = _text_config(config)
    if getattr(text, "pad_token_id", 0) is not None:
        return None
    eos = getattr(text, "eos_token_id", None)
    eos = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
    text.pad_token_id = eos if isinstance(eos, int) else 0
    if text is not config and getattr(config, "pad_token_id", 0) is None:
        config.pad_token_id = text.pad_token_id
    return (f"config.json sets no pad_token_id: set to {text.pad_token_id} "
            f"({'its EOS' if isinstance(eos, int) else 'no EOS either'}), as fine-tuning a "
            "sequence classifier does (without one it takes batches of one only)")


def _auto_class(name: str):
    import transformers
    cls = getattr(transformers, name, None)
    if cls is None:
        raise TrainplanError(f"transformers has no class {name!r}.")
    return cls


def _planned_class(job):
    """(config dict, canonical id, source note, Auto or class name, class, note or None): the
    class build_hf builds for the job, its --task's where it names one, else its config's."""
    hf_import.prepare()
    cfg_dict, auto_name, canonical, source_note = resolve_config(job.model[3:])
    if job.task:
        auto_name = TASK_CLASSES[job.task]
        _check_task(job.task, cfg_dict.get("model_type"), canonical,
                    (cfg_dict.get("architectures") or [None])[0])
    if auto_name is None:
        archs = cfg_dict.get("architectures") or []
        auto_name = archs[0] if archs else None
    cls, mapped = resolve_architecture(auto_name, cfg_dict.get("model_type"))
    if mapped:
        auto_name = cls.__name__
    return cfg_dict, canonical, source_note, auto_name, cls, mapped


def language_model_class(job) -> tuple[str, bool]:
    """(the class the job trains, whether it is a causal or image-text-to-text language model:
    what the SFT/RL frameworks load, `AutoModelForCausalLM` or `AutoModelForImageTextToText`)."""
    from transformers.models.auto import modeling_auto
    cls = _planned_class(job)[4]
    names = set()
    for table in (modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                  modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES):
        for v in table.values():
            names.update(v if isinstance(v, (list, tuple)) else (v,))
    return cls.__name__, cls.__name__ in names


@hf_validate.guarded          # config checks; transformers' errors -> TrainplanError
def build_hf(job, attention: str = "efficient") -> ModelBundle:
    cfg_dict, canonical, source_note, auto_name, cls, mapped = _planned_class(job)
    config = make_config(cfg_dict)
    attn = "eager" if attention == "eager" else "sdpa"
    flash_note = None
    if job.attention == "flash" and attention == "flash":
        if getattr(cls, "_supports_flash_attn", False):
            from .hf_flash import register
            attn = register()        # transformers' flash_attention_2, as the GPU runs it
        else:                        # transformers refuses flash_attention_2 for it
            flash_note = (f"{cls.__name__} has no flash_attention_2 path in transformers: "
                          "--attention flash is traced as its SDPA path, flash kernel where a "
                          "call can take it")
    if job.seq_len and getattr(config, "max_seq_len", None) and job.seq_len > config.max_seq_len:
        # MPT sizes its ALiBi bias from max_seq_len (a setting, not a weight); llm-foundry sets
        # it to the run's sequence length
        config.max_seq_len = job.seq_len
    if job.grad_checkpointing != "none":
        # as transformers' own gradient checkpointing does: a KV cache filled by the forward
        # would make the backward's recomputation see different shapes
        for c in {id(config): config, id(_text_config(config)): _text_config(config)}.values():
            c.use_cache = False
    notes = [n for n in (source_note, mapped, flash_note) if n]
    pad = _pad_for_classification(cls, config)
    if pad:
        notes.append(pad)
    from .hf_names import EAGER_BEFORE_SDPA_PORT
    if attention == "eager" and job.attention != "eager" and \
            getattr(config, "model_type", "") in EAGER_BEFORE_SDPA_PORT:
        notes.append(f"{getattr(config, 'model_type', '')}'s relative position bias: "
                     "transformers ran this architecture eager until its SDPA port (July 2026, "
                     "5.2x releases), so its eager attention (s x s scores materialised) is "
                     "planned; on a release with the port, --attention efficient plans PyTorch's "
                     "memory-efficient kernel, which takes the bias and its gradient")
    with on_meta():
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
    resize = _resized(config, job, model)
    kind, make_inputs, tokens = _inputs_for(auto_name, config, job, model, resize)
    mtype = getattr(config, "model_type", "")
    if kind in ("vision", "vision-language") and resize:
        own = (getattr(config, "vision_config", None) or config).image_size
        notes.append(f"images of {job.image_size} px: the checkpoint's {own} px position table "
                     "interpolated in every forward (the forward's interpolate_pos_encoding, "
                     "transformers' way to run the model on images of another size)")
    if job.image_size and hasattr(config, "vision_config") and kind not in ("vision",
                                                                             "vision-language"):
        from .vision_tokens import image_tokens
        try:
            per = f"{image_tokens(config, job.image_size).tokens_per_image} tokens per image; "
        except TrainplanError:
            per = ""
        notes.append(f"images in a language model's sequence are traced for Qwen2-VL/2.5-VL "
                     f"only: this {mtype} step runs "
                     f"its language model on text alone ({per}the vision tower's activations "
                     "are not counted)")
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


def _resized(config, job, model) -> dict:
    """The forward's keyword for images of another size than the checkpoint's: ViT, CLIP and
    their kin build a position table for their config's image_size and refuse other sizes
    ("Input image size (384*384) doesn't match model (224*224)") unless the forward is asked to
    interpolate it (`interpolate_pos_encoding=True`: the same weights, one bicubic resize a step;
    transformers' ViTEmbeddings.interpolate_pos_encoding: "to be able to use the model on higher
    resolution images"). Models without the keyword take any size or say they cannot."""
    vc = getattr(config, "vision_config", None) or config
    own = getattr(vc, "image_size", None)
    if not job.image_size or own is None or job.image_size == own or model is None:
        return {}
    import inspect
    try:
        takes = "interpolate_pos_encoding" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        takes = False
    return {"interpolate_pos_encoding": True} if takes else {}


def _inputs_for(auto_name: str, config, job, model=None, resize: dict | None = None):
    """(kind, make_inputs(batch), tokens per sample) for the model's training task; `resize`:
    the image forward's keyword for another image size (`_resized`)."""
    resize = resize or {}
    seq = job.seq_len or default_seq_len(getattr(_text_config(config), "max_position_embeddings",
                                                 None))
    vocab = getattr(_text_config(config), "vocab_size", 32000)
    n = auto_name.lower()
    if getattr(config, "model_type", "") in QWEN_VL_TYPES and _images_per_sample(job):
        return _qwen_vl_inputs(config, job, model, seq)
    if getattr(config, "model_type", "") in GRID_VL_TYPES and _images_per_sample(job):
        return _grid_vl_inputs(config, job, seq)
    if "imageclassification" in n:
        size = _image_size(config, job)
        classes = max(2, getattr(config, "num_labels", 2))
        def img(batch):
            return {"pixel_values": torch.randn(batch, 3, size, size),
                    "labels": torch.randint(0, classes, (batch,)), **resize}
        return "vision", img, None
    if getattr(config, "model_type", "") == "clip" or ("vision_config" in config.to_dict()
                                                       and "text_config" in config.to_dict()
                                                       and n in ("automodel", "clipmodel")):
        size = _image_size(config, job)
        text_len = job.seq_len or getattr(config.text_config, "max_position_embeddings", 77)
        def clip(batch):
            return {"input_ids": torch.randint(0, config.text_config.vocab_size, (batch, text_len)),
                    "pixel_values": torch.randn(batch, 3, size, size), "return_loss": True,
                    **resize}
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
    if "maskedlm" in n:
        mask_id = getattr(config, "mask_token_id", None)
        mask_id = mask_id if isinstance(mask_id, int) and 0 <= mask_id < vocab else vocab - 1
        def mlm(batch):
            return masked_lm_batch(torch.randint(0, vocab, (batch, seq)), mask_id)
        return "encoder", mlm, seq
    def lm(batch):
        ids = torch.randint(0, vocab, (batch, seq))
        return {"input_ids": ids, "labels": ids}
    return "decoder", lm, seq


# ---- vision-language inputs: images in the sample (Qwen2-VL / Qwen2.5-VL) ----------------------

def _images_per_sample(job) -> int:
    """Images in each sample: job.images_per_sample, else 1 with an image size, 0 without."""
    if not job.image_size:
        return 0
    return 1 if job.images_per_sample is None else job.images_per_sample


class _HostInts(torch.Tensor):
    """A small integer tensor whose values the model reads on the host: image_grid_thw,
    cu_seqlens, input_ids. Qwen-VL's forward turns them into Python ints (`.tolist()` for the
    split sizes and the per-window attention lengths, `repeat_interleave` for cu_seqlens, the
    placeholder check's `.sum()`), which fake tensors cannot do: they have shapes, no values.

    A torch function whose tensor arguments are all host tensors runs on real data with every
    dispatch mode popped (no fake tensor, and nothing counted: it is host bookkeeping, as on a
    real run where these come from Python lists); its tensor results stay host tensors. When
    another tensor takes part (the embedding lookup, masked_scatter, the loss: fake tensors in a
    trace, the device's in `trainplan measure`), the op runs as usual on plain tensors, the fake
    mode converting the host tensor (allow_non_fake_inputs): from there on only its shape
    matters."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        from torch.utils._python_dispatch import _disable_current_modes
        from torch.utils._pytree import tree_leaves, tree_map_only
        kwargs = kwargs or {}
        if all(isinstance(t, cls) for t in tree_leaves((args, kwargs))
               if isinstance(t, torch.Tensor)):
            with _disable_current_modes():
                return super().__torch_function__(func, types, args, kwargs)
        with torch._C.DisableTorchFunctionSubclass():
            args, kwargs = tree_map_only(cls, lambda t: t.as_subclass(torch.Tensor),
                                         (args, kwargs))
            return func(*args, **kwargs)


def _host(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(_HostInts)


def _largest_fitting_side(config, budget: int) -> int | None:
    """The largest square side (a multiple of the merged patch, 28 px) whose image takes at most
    `budget` tokens, None if even the smallest image does not fit."""
    from .vision_tokens import image_tokens
    factor = config.vision_config.patch_size * config.vision_config.spatial_merge_size
    k = math.isqrt(max(budget, 0))
    while k > 0 and image_tokens(config, k * factor).tokens_per_image > budget:
        k -= 1
    return k * factor or None


def _qwen_vl_sample(config, job, img, n_img: int, seq: int):
    """(ids, token types, labels) of one Qwen-VL sample (`_qwen_vl_inputs`): the images' tokens
    with their vision markers first, then text; an error where the images do not fit."""
    image_id = config.image_token_id
    start_id = getattr(config, "vision_start_token_id", None)
    end_id = getattr(config, "vision_end_token_id", None)
    markers = [t for t in (start_id, end_id) if t is not None]
    per_image = img.tokens_per_image + len(markers)
    if n_img * per_image > seq:
        need = n_img * per_image
        side = _largest_fitting_side(config, seq // n_img - len(markers))
        smaller = f", or --image-size {side} or less" if side else ""
        raise TrainplanError(
            f"{n_img} image(s) of {job.image_size}px need {need} tokens ({img.tokens_per_image} "
            f"image tokens + {len(markers)} vision markers each; {img.note}), more than the "
            f"sequence's {seq}: seq_len is the whole LM sequence, image tokens included.",
            allowed=f"seq_len >= {need} for {n_img} image(s) of {job.image_size}px",
            fix=f"use --seq-len {need} or more (plus room for text), fewer images per "
                f"sample{smaller}")
    vision_ids = [t for t in (image_id, start_id, end_id, getattr(config, "video_token_id", None),
                              getattr(config, "vision_token_id", None)) if isinstance(t, int)]
    # text ids below every vision token id (the ids the model's code looks for)
    ordinary = max(2, min(vision_ids + [_text_config(config).vocab_size]))
    row, types = [], []
    for _ in range(n_img):
        body = ([start_id] if start_id is not None else []) + [image_id] * img.tokens_per_image \
            + ([end_id] if end_id is not None else [])
        row += body
        types += [0] * (start_id is not None) + [1] * img.tokens_per_image \
            + [0] * (end_id is not None)
    text = seq - len(row)
    row += [(i * 7919) % ordinary for i in range(text)]
    types += [0] * text
    row_t = torch.tensor(row, dtype=torch.long)
    types_t = torch.tensor(types, dtype=torch.int)
    label_row = torch.where(torch.tensor(types) == 0, row_t, -100)
    for t in markers:
        label_row = torch.where(row_t == t, -100, label_row)
    return row_t, types_t, label_row


def _qwen_vl_inputs(config, job, model, seq: int):
    """Qwen2-VL / Qwen2.5-VL training inputs with `images_per_sample` images of job.image_size.

    Each sample is what Qwen2VLProcessor writes, images first: per image <|vision_start|>, the
    image token repeated tokens_per_image times, <|vision_end|>; then text up to seq_len.
    job.seq_len is the whole LM sequence, image tokens included (what the language model
    processes); images that do not fit are an error. Labels are the ids with the image and vision
    marker positions set to -100, as Qwen-VL fine-tuning scripts mask them (the loss's shapes do
    not change). pixel_values is (images x patches, 3 * temporal_patch_size * patch^2), one row
    per patch as the processor flattens them, image_grid_thw one [1, h/patch, w/patch] row per
    image, and position_ids the model's own 3-D M-RoPE positions (get_rope_index, run on the
    host). What needs values stays real (_HostInts); the window layout of Qwen2.5-VL's tower
    (index, cu_window_seqlens) and the tower's rotary positions are computed by transformers'
    own helpers (vision_utils) on the host and passed as the `image_*` precomputed kwargs
    transformers provides for tracing (accepts_precomputed_kwargs). The tower then runs in the
    traced step on fake pixel_values: patch embedding, every block, the merger.
    """
    from .vision_tokens import image_tokens
    img = image_tokens(config, job.image_size)
    n_img = _images_per_sample(job)
    row_t, types_t, label_row = _qwen_vl_sample(config, job, img, n_img, seq)
    vc = config.vision_config
    windowed = getattr(config, "model_type", "") == "qwen2_5_vl"

    host = {"input_ids", "image_grid_thw", "image_cu_window_seqlens"}

    @functools.lru_cache(maxsize=4)
    def host_inputs(batch: int, device: torch.device) -> dict:
        """Everything but pixel_values, real, built on the CPU once per micro-batch size and
        placed on `device` (the CPU in a trace; the GPU in `trainplan measure`)."""
        from torch.utils._python_dispatch import _disable_current_modes
        from transformers import vision_utils
        with _disable_current_modes(), torch.device("cpu"):
            ids = row_t.expand(batch, -1).contiguous()
            grid = torch.tensor([img.grid] * (batch * n_img), dtype=torch.long)
            out = {"input_ids": ids, "labels": label_row.expand(batch, -1).contiguous(),
                   "image_grid_thw": grid}
            if model is not None:
                out["position_ids"] = model.model.get_rope_index(
                    ids, mm_token_type_ids=types_t.expand(batch, -1), image_grid_thw=grid)[0]
            out["image_position_ids"] = vision_utils.get_vision_position_ids(
                grid, vc.spatial_merge_size)
            if windowed:
                out["image_window_index"], out["image_cu_window_seqlens"] = \
                    vision_utils.get_vision_window_index(grid, vc.spatial_merge_size,
                                                         vc.window_size, vc.patch_size)
            return {k: _host(v.to(device)) if k in host else v.to(device)
                    for k, v in out.items()}

    def qwen_vl(batch):
        inputs = dict(host_inputs(batch, torch.get_default_device()))
        inputs["pixel_values"] = torch.randn(batch * n_img * img.patches_per_image,
                                             img.patch_values)
        return inputs
    return "vision-language", qwen_vl, seq


# ---- vision-language inputs: fixed-grid towers (LLaVA) ------------------------------------------

GRID_VL_TYPES = ("llava",)


def _grid_vl_inputs(config, job, seq: int):
    """LLaVA training inputs with `images_per_sample` images: the processor resizes every image
    to the tower's image_size (models/vision_tokens.py), so pixel_values is (images, 3, size,
    size) whatever job.image_size says, and each image's place in the sequence is its
    tokens_per_image image tokens (LlavaProcessor expands one <image> to that many), images
    first, then text up to seq_len. Labels are -100 on the image positions. input_ids stay real
    (_HostInts): LlavaModel.get_placeholder_mask counts the image tokens (`.sum()`) and checks
    them against the features, which needs values; the tower and projector run on fake
    pixel_values in the traced step."""
    from .vision_tokens import image_tokens
    img = image_tokens(config, job.image_size)
    n_img = _images_per_sample(job)
    image_id = getattr(config, "image_token_id", None)
    if image_id is None:
        image_id = config.image_token_index
    need = n_img * img.tokens_per_image
    if need > seq:
        raise TrainplanError(
            f"{n_img} image(s) need {need} tokens ({img.tokens_per_image} each; {img.note}), "
            f"more than the sequence's {seq}: seq_len is the whole LM sequence, image tokens "
            "included.", fix=f"use --seq-len {need} or more (plus room for text), or fewer "
                             "images per sample")
    vocab = _text_config(config).vocab_size
    text = [t for t in ((i * 7919) % vocab for i in range(seq - need + 1)) if t != image_id]
    row = torch.tensor([image_id] * need + text[:seq - need], dtype=torch.long)
    labels = torch.where(row == image_id, -100, row)
    size = config.vision_config.image_size

    def llava(batch):
        from torch.utils._python_dispatch import _disable_current_modes
        with _disable_current_modes(), torch.device("cpu"):
            ids = row.expand(batch, -1).contiguous()
            lab = labels.expand(batch, -1).contiguous()
        device = torch.get_default_device()
        return {"input_ids": _host(ids.to(device)), "labels": lab.to(device),
                "pixel_values": torch.randn(batch * n_img, 3, size, size)}
    return "vision-language", llava, seq
