"""The Hugging Face Trainer's arguments (`transformers.TrainingArguments`), which LLaMA-Factory and
TRL configs hold at their top level and axolotl passes through under its own names: micro-batch,
accumulation, precision, checkpointing, optimizer, steps or epochs, FSDP and a DeepSpeed config.

Precision is the weights' dtype as loaded and the Trainer's flag together (the Trainer's `bf16`
is autocast; the weights stay in whatever dtype the model was loaded in):

    weights loaded in   bf16 / fp16 flag          trainplan
    float32             bf16 | fp16 | neither     bf16-amp | fp16-amp | fp32 (tf32 with tf32: true)
    bfloat16 / float16  any                       bf16 | fp16 (pure: no fp32 master copy)
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import deepspeed as ds_mod
from .common import clip_norm, clipping_text, find_beside, load_file, optimizer
from .reading import Collector, Reading, show

# TrainingArguments keys that change memory or time when set, and what trainplan plans instead
UNMODELLED = {
    "torch_compile": (False, "torch.compile is not modelled: planned eager"),
    "use_liger_kernel": (False, "Liger kernels (fused RMSNorm, RoPE, SwiGLU, chunked "
                                "cross-entropy) are not modelled: planned with the model's own "
                                "layers, whose logits and activations they would not keep"),
    "torch_empty_cache_steps": (None, "emptying the CUDA cache is not modelled (planned with "
                                      "the caching allocator's reserve)"),
    "auto_find_batch_size": (False, "the Trainer halves the micro-batch after an out-of-memory "
                                    "error; planned at the micro-batch given (the plan shows the "
                                    "largest that fits)"),
    "eval_strategy": ("no", "evaluation passes are not planned (their time; their memory is "
                            "below training's)"),
    "evaluation_strategy": ("no", "evaluation passes are not planned (their time; their memory "
                                  "is below training's)"),
    "optim_target_modules": (None, "GaLore/APOLLO-style projected optimizers are not modelled"),
    "tp_size": (0, "tensor parallelism is not modelled"),
    "parallelism_config": (None, "tensor / context parallelism is not modelled"),
}
FSDP_OPTIONS = {"full_shard": "fsdp", "shard_grad_op": "zero2", "hybrid_shard": "hsdp",
                "hybrid_shard_zero2": "zero2", "no_shard": "ddp"}


def precision_from(bf16: Any, fp16: Any, tf32: Any, weights: str | None) -> tuple[str, str]:
    """(trainplan precision, why) from the Trainer's flags and the dtype the weights load in."""
    w = (weights or "float32").replace("torch.", "").lower()
    if w in ("bfloat16", "bf16"):
        return "bf16", "the Trainer's autocast over bf16 weights, no fp32 master copy"
    if w in ("float16", "fp16", "half"):
        return "fp16", "the Trainer's autocast over fp16 weights, no fp32 master copy"
    if bf16:
        return "bf16-amp", "bf16 autocast over fp32 weights"
    if fp16:
        return "fp16-amp", "fp16 autocast over fp32 weights, loss scaling"
    if tf32:
        return "tf32", "fp32 weights, TF32 matmuls"
    return "fp32", "fp32 weights and kernels"


def read_batch(c: Collector, key: str, default: int | None) -> int | None:
    if c.has(key):
        v = c.int_(key, c.take(key))
        c.read(key, v, f"micro-batch {v}", batch_size=v)
        return v
    if default is not None:
        c.assume(f"{key} not set: {default}")
        c.set(batch_size=default)
    return default


def read_accum(c: Collector, key: str = "gradient_accumulation_steps") -> int:
    v = c.int_(key, c.take(key, 1))
    if key in c.data:
        c.read(key, v, f"gradient accumulation {v}", grad_accum=v)
    return v


def read_steps(c: Collector, steps_key: str = "max_steps",
               epochs_key: str = "num_train_epochs", epochs_default: float | None = 3.0) -> None:
    steps = c.take(steps_key)
    if steps is not None and steps not in (-1, 0):
        steps = c.int_(steps_key, steps)
        c.read(steps_key, steps, f"{steps} optimizer steps", steps=steps)
        if epochs_key in c.data:
            c.used.add(epochs_key)      # max_steps wins over epochs in the HF Trainer
        return
    if c.has(epochs_key):
        e = c.number(epochs_key, c.take(epochs_key))
        c.read(epochs_key, c.data[epochs_key], f"{e:g} epochs (with --dataset-size N for the "
                                               "steps)", epochs=e)
    elif epochs_default is not None:
        c.assume(f"{epochs_key} not set: {epochs_default:g}")
        c.set(epochs=epochs_default)


def read_optim(c: Collector, key: str, default: str | None) -> None:
    if c.has(key):
        name = c.take(key)
        opt, why, modelled = optimizer(name)
        if modelled:
            c.read(key, name, f"optimizer {opt}" + (f" ({why})" if why else ""), optimizer=opt)
        else:
            c.unmodelled(key, name, why)
            c.set(optimizer=opt)
    elif default:
        opt, why, _ = optimizer(default)
        c.assume(f"{key} not set: {default}, planned as {opt}" + (f" ({why})" if why else ""))
        c.set(optimizer=opt)


def read_clipping(c: Collector, key: str = "max_grad_norm", default: float | None = 1.0,
                  passes_zero: bool = True) -> float | None:
    """The clipping norm (`Job.max_grad_norm`): the file's, else the framework's `default` (the
    HF Trainer's TrainingArguments.max_grad_norm: 1.0); 0 or null is no clipping, as the Trainer
    reads it (`if args.max_grad_norm is not None and args.max_grad_norm > 0`). `passes_zero`
    False: the framework hands the Trainer only a truthy value (axolotl's
    `if cfg.max_grad_norm:`), so 0 leaves the Trainer's default."""
    if key in c.data:
        raw = c.take(key)
        norm = clip_norm(c, key, raw, "1.0 (the Trainer's default)")
        if not norm and not passes_zero and default:
            c.read(key, raw, f"not passed on (only a non-zero value is): the Trainer's "
                             f"{show(default)} applies, {clipping_text(default)}",
                   max_grad_norm=default)
            return default
        c.read(key, raw, clipping_text(norm), max_grad_norm=norm or None)
        return norm or None
    if default:
        c.assume(f"{key} not set: {show(default)}, {clipping_text(default)}")
        c.set(max_grad_norm=default)
    return default


def read_checkpointing(c: Collector, key: str, default: bool,
                       kwargs_key: str = "gradient_checkpointing_kwargs",
                       reentrant: bool | None = None) -> None:
    """`reentrant`: the framework's own use_reentrant when the file gives none (axolotl: False,
    core/builders/base.py); None leaves it to the job's "auto" (the HF Trainer's)."""
    if key == "gradient_checkpointing" and c.has("activation_checkpointing"):
        key, kwargs_key = "activation_checkpointing", "activation_checkpointing_kwargs"
        c.take("gradient_checkpointing")          # transformers 5's names; the old ones alias
        c.take("gradient_checkpointing_kwargs")
    v = c.take(key)
    on = default if v is None else v
    if v is not None:
        if isinstance(v, str) and v.lower() in ("offload", "offload_disk"):
            c.read(key, v, "full activation checkpointing", grad_checkpointing="full")
            c.unmodelled(key, v, "the checkpointed blocks' inputs are offloaded to the host "
                                 f"({v}): planned kept on the device")
        else:
            c.read(key, v, "full activation checkpointing" if on else "no checkpointing",
                   grad_checkpointing="full" if on else "none")
    elif default:
        c.assume(f"{key} not set: true")
        c.set(grad_checkpointing="full")
    kw = c.take(kwargs_key)
    if isinstance(kw, dict) and kw.get("every_n_layers") not in (None, 1):
        c.unmodelled(kwargs_key, kw, "checkpointing every n-th layer only: planned with every "
                                     "layer checkpointed")
    if isinstance(kw, dict) and "use_reentrant" in kw:
        r = kw["use_reentrant"]
        c.read(kwargs_key, kw, f"{'reentrant' if r else 'non-reentrant'} checkpointing",
               checkpoint_impl="reentrant" if r else "non-reentrant")
    elif on and reentrant is not None:
        c.assume(f"{kwargs_key} not set: use_reentrant {str(reentrant).lower()}")
        c.set(checkpoint_impl="reentrant" if reentrant else "non-reentrant")


def fsdp_options(value: Any) -> list[str]:
    if isinstance(value, str):
        return [w for w in value.replace(",", " ").split() if w]
    if isinstance(value, (list, tuple)):
        return [str(w) for w in value]
    return ["full_shard"] if value is True else []


def read_fsdp(c: Collector, key: str | None, config_key: str, known: set[str] | None = None,
              config_enables: bool = False) -> None:
    """`fsdp: full_shard auto_wrap offload` (or a list) and `fsdp_config: {...}`, its keys with
    or without the `fsdp_` prefix, as transformers and axolotl accept them. The HF Trainer
    turns FSDP on by `fsdp` alone; axolotl also by a non-empty fsdp_config (`config_enables`)."""
    opts = fsdp_options(c.take(key)) if key else []
    sec = c.section(config_key)
    if known is not None:
        sec.known = {k for k in sec.data if str(k).removeprefix("fsdp_") in known
                     or str(k) in known}
    cfg = {str(k).removeprefix("fsdp_"): k for k in sec.data}
    if not opts and not (config_enables and sec.data):
        return
    strategy = next((FSDP_OPTIONS[o] for o in opts if o in FSDP_OPTIONS), "fsdp")
    if opts:
        extra = [o for o in opts if o in ("offload",)]
        c.read(key, c.data.get(key), f"strategy {strategy}"
               + (" (SHARD_GRAD_OP shards gradients and optimizer state as ZeRO-2)"
                  if strategy == "zero2" else "")
               + ("; offload optimizer+params (FSDP's CPU offload)" if extra else ""),
               strategy=strategy, **({"offload": "optimizer+params"} if extra else {}))
        if "hybrid_shard_zero2" in opts:
            c.unmodelled(key, c.data.get(key), "hybrid ZeRO-2 sharding (within a node, "
                         "replicated across nodes): planned as ZeRO-2 over every device")
    else:
        c.set(strategy=strategy)
    if "reshard_after_forward" in cfg:
        k = cfg["reshard_after_forward"]
        v = sec.take(k)
        if v is False or str(v).upper() in ("FALSE", "SHARD_GRAD_OP"):
            sec.read(k, v, "strategy zero2 (weights kept whole after forward, as ZeRO-2)",
                     strategy="zero2")
        else:
            sec.read(k, v, "weights resharded after forward (full sharding)")
    if "sharding_strategy" in cfg:
        k = cfg["sharding_strategy"]
        v = sec.take(k)
        s = FSDP_OPTIONS.get(str(v).lower(), "fsdp")
        sec.read(k, v, f"strategy {s}", strategy=s)
    for name in ("offload_params", "cpu_offload"):
        if name in cfg and sec.data[cfg[name]]:
            sec.read(cfg[name], sec.take(cfg[name]), "offload optimizer+params (FSDP's CPU "
                     "offload: parameters, gradients and the optimizer step on the host)",
                     offload="optimizer+params")
    if "activation_checkpointing" in cfg and sec.data[cfg["activation_checkpointing"]]:
        k = cfg["activation_checkpointing"]
        sec.read(k, sec.take(k), "full activation checkpointing", grad_checkpointing="full")
    if "version" in cfg:
        k = cfg["version"]
        sec.read(k, sec.take(k), f"FSDP{sec.data[k]} (FSDP1 and FSDP2 are planned alike)")


def read_accelerator_config(c: Collector, key: str = "accelerator_config") -> None:
    """`accelerator_config` (TrainingArguments: a mapping, a JSON string or a JSON file), of which
    only `gradient_accumulation_kwargs.sync_each_batch` changes memory or time: the Trainer
    reduces the gradients after every micro-batch instead of entering no_sync before the last
    (transformers trainer.py _inner_training_loop; Strategy.reduces_each_micro_batch). Its other
    keys (split_batches, dispatch_batches, even_batches, ...) split data, not the step: a
    config without sync_each_batch true lists it with the keys of no effect as set."""
    ref = c.data.get(key)
    if ref is None:
        return
    data = ref
    if isinstance(ref, str):
        text = ref.strip()
        try:
            data = json.loads(text) if text.startswith("{") else load_file(
                find_beside(text, c.reading.path, "accelerator config", key), "accelerator config")
        except json.JSONDecodeError as e:
            raise c.error(key, f"is not JSON: {e.msg} at character {e.pos}.") from None
    if not isinstance(data, dict):
        raise c.error(key, f"must be a mapping, a JSON string or a JSON file, got {show(ref)}.")
    kwargs = data.get("gradient_accumulation_kwargs") or {}
    sync = kwargs.get("sync_each_batch") if isinstance(kwargs, dict) else None
    if sync is not None and not isinstance(sync, bool):
        raise c.error(key, f"gradient_accumulation_kwargs.sync_each_batch must be true or "
                           f"false, got {show(sync)}.")
    if sync:
        c.read(key, ref, "gradients reduced after every micro-batch (sync_each_batch)",
               sync_each_batch=True)


def read_deepspeed(c: Collector, key: str, beside: ds_mod.Trainer, flag_path: str | None,
                   gpus: int | None = None) -> Reading | None:
    """The DeepSpeed config the file names under `key` (a path or an inline mapping), or the
    one given with --deepspeed (which wins), read with the trainer's values for "auto"."""
    ref = c.take(key)
    if flag_path:
        data, where = load_file(flag_path, "DeepSpeed config"), flag_path
        if ref is not None:
            c.read(key, ref, f"replaced by --deepspeed {flag_path}")
    elif isinstance(ref, dict):
        data, where = ref, f"{c.reading.path}: {key}"
    elif isinstance(ref, str) and ref.strip():
        path = find_beside(ref, c.reading.path, "DeepSpeed config", "--deepspeed")
        data, where = load_file(path, "DeepSpeed config"), str(path)
        c.read(key, ref, f"DeepSpeed config {path}, read below")
    elif ref is None:
        return None
    else:
        raise c.error(key, f"must be a path to a DeepSpeed JSON or a mapping, got {show(ref)}.")
    inner = ds_mod.read(data, str(where), beside, gpus)
    c.reading.companions.append(inner)
    c.set(**ds_mod.apply(c.reading.settings, inner))
    return inner


def weights_dtype(value: Any) -> str | None:
    """`torch_dtype: bfloat16`, `dtype: torch.float16`, 'auto' ... as a dtype name."""
    if value is None:
        return None
    return str(value).replace("torch.", "").lower()


def base_dir(c: Collector) -> Path:
    return Path(c.reading.path).resolve().parent
