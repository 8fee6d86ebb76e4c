"""A LLaMA-Factory YAML (`llamafactory-cli train config.yaml`), read as LLaMA-Factory reads it
(hiyouga/LLaMA-Factory@c3c0efb: src/llamafactory/hparams/, model/adapter.py `init_adapter`,
model/model_utils/quantization.py, checkpointing.py): its own arguments plus the HF Trainer's
(trainer.py).

    model_name_or_path                 -> model
    stage sft | pt | dpo | kto | rm | ppo -> algorithm sft | sft | dpo | dpo | dpo | ppo
    finetuning_type lora | full | freeze -> LoRA (lora_rank 8, lora_alpha 2 x rank, lora_target
                                          all = every linear layer) | full | the last
                                          freeze_trainable_layers (2) blocks trained
    quantization_bit 4 | 8             -> nf4 / fp4 (quantization_type), double-quantised unless
                                          double_quantization: false / int8 (bitsandbytes)
    cutoff_len (2048)                  -> sequence length
    per_device_train_batch_size (8), gradient_accumulation_steps -> micro-batch, accumulation
    bf16 / fp16 / pure_bf16            -> the weights load in the compute dtype; trainable
                                          parameters are cast to fp32 unless pure_bf16
                                          (adapter.py): full -> bf16-amp, LoRA / freeze -> bf16
                                          (the frozen base stays 16-bit), pure_bf16 -> bf16
    disable_gradient_checkpointing (false), use_reentrant_gc (true) -> full, reentrant
    flash_attn auto | sdpa | fa2 | disabled -> attention
    deepspeed                          -> a DeepSpeed config (deepspeed.py)
"""
from __future__ import annotations

from . import deepspeed as ds_mod
from . import trainer as hf
from .common import known_keys, model_config, model_ref
from .reading import Collector, Reading

STAGES = {"sft": "sft", "pt": "sft", "dpo": "dpo", "kto": "dpo", "rm": "dpo", "ppo": "ppo"}
STAGE_WHY = {"pt": "pre-training: planned as SFT (the same step)",
             "kto": "KTO trains on one completion a sample and runs a no-grad KL forward: "
                    "planned as DPO (two sequences a sample, an upper bound)",
             "rm": "a reward model on chosen and rejected (two sequences a sample, a value "
                   "head, no reference): planned as DPO, whose reference forward it does not pay"}
ATTENTION = {"fa2": "flash", "sdpa": "sdpa", "disabled": "eager", "eager": "eager"}
UNMODELLED = {
    "enable_liger_kernel": (False, "Liger kernels are not modelled"),
    "use_unsloth": (False, "Unsloth's kernels and offloaded checkpointing are not modelled"),
    "use_unsloth_gc": (False, "Unsloth's offloaded checkpointing is not modelled"),
    "use_galore": (False, "GaLore's projected optimizer state is not modelled: planned as "
                          "the optimizer given"),
    "use_apollo": (False, "APOLLO's projected optimizer state is not modelled"),
    "use_badam": (False, "BAdam (one block trained at a time) is not modelled"),
    "use_adam_mini": (False, "Adam-mini's smaller state is not modelled: planned as AdamW"),
    "use_dora": (False, "DoRA's magnitude vectors and extra activations are not modelled: "
                        "planned as LoRA"),
    "additional_target": (None, "modules trained in full beside the adapters are not planned"),
    "use_llama_pro": (False, "LLaMA Pro's added blocks are not modelled"),
    "mixture_of_depths": (None, "mixture-of-depths is not modelled"),
    "shift_attn": (False, "shifted-sparse attention is not modelled"),
    "upcast_layernorm": (False, "fp32 norms are not modelled"),
    "upcast_lmhead_output": (False, "fp32 logits are not modelled"),
    "val_size": (0.0, "evaluation passes are not planned (their time)"),
    "rope_scaling": (None, None),
    "quantization_method": ("bitsandbytes", "only bitsandbytes quantisation is modelled: "
                                            "planned as it"),
}


def looks_like(data: dict) -> bool:
    return "model_name_or_path" in data and bool(
        {"stage", "finetuning_type", "template", "cutoff_len", "lora_target"} & set(data))


def read(data: dict, path: str, deepspeed: str | None = None) -> Reading:
    keys, _ = known_keys("llama-factory")
    c = Collector("llama-factory", path, data, set(keys))
    name = c.take("model_name_or_path")
    model, meaning = model_ref(name, f"LLaMA-Factory config {path}: model_name_or_path",
                               hf.base_dir(c))
    c.read("model_name_or_path", name, meaning, model=model)
    seq = c.take("cutoff_len")
    if seq is None:
        c.assume("cutoff_len not set: 2048")
        seq = 2048
    else:
        ppo = str(c.data.get("stage", "")).lower() == "ppo"
        c.read("cutoff_len", c.int_("cutoff_len", seq), f"prompts of {seq} tokens" if ppo
               else f"sequence length {seq}")
    c.set(seq_len=seq)
    _stage(c)
    mbs = hf.read_batch(c, "per_device_train_batch_size", 8)
    gas = hf.read_accum(c)
    ftype = str(c.take("finetuning_type", "lora")).lower()
    _precision(c, ftype)
    _finetuning(c, ftype, model)
    _quantization(c)
    if c.take("disable_gradient_checkpointing"):
        c.read("disable_gradient_checkpointing", True, "no checkpointing",
               grad_checkpointing="none")
    else:
        reentrant = c.take("use_reentrant_gc", True)
        c.assume("gradient checkpointing on (LLaMA-Factory's default; "
                 "disable_gradient_checkpointing: false)")
        c.set(grad_checkpointing="full",
              checkpoint_impl="reentrant" if reentrant else "non-reentrant")
        if "use_reentrant_gc" in c.data:
            c.read("use_reentrant_gc", reentrant,
                   ("reentrant" if reentrant else "non-reentrant") + " checkpointing")
    att = c.take("flash_attn")
    if att is not None and str(att).lower() in ATTENTION:
        c.read("flash_attn", att, f"attention {ATTENTION[str(att).lower()]}",
               attention=ATTENTION[str(att).lower()])
    packing = c.take("packing", c.take("neat_packing"))
    if packing:
        c.read("packing" if "packing" in c.data else "neat_packing", packing,
               "every sequence is cutoff_len tokens of packed samples, as planned")
    else:
        c.assume("no packing: batches are padded to their longest sample; planned at "
                 "cutoff_len, the longest a batch can be")
    hf.read_optim(c, "optim", "adamw_torch")
    clip = hf.read_clipping(c)
    hf.read_steps(c)
    _dataset_size(c)
    prec = c.reading.settings.get("precision", "fp32")
    beside = ds_mod.Trainer("LLaMA-Factory", micro_batch=mbs, grad_accum=gas,
                            bf16=prec.startswith("bf16"), fp16=prec.startswith("fp16"),
                            max_grad_norm=clip)
    hf.read_fsdp(c, "fsdp", "fsdp_config")
    hf.read_accelerator_config(c)
    hf.read_deepspeed(c, "deepspeed", beside, deepspeed)
    c.unmodelled_table({k: v for k, v in {**hf.UNMODELLED, **UNMODELLED}.items() if v[1]})
    return c.finish()


def _stage(c: Collector) -> None:
    stage = str(c.take("stage", "sft")).lower()
    if stage not in STAGES:
        raise c.error("stage", f"{stage!r} is not a LLaMA-Factory stage.",
                      allowed=", ".join(STAGES))
    algorithm = STAGES[stage]
    pref = str(c.data.get("pref_loss", "sigmoid")).lower()
    if stage in STAGE_WHY:
        c.unmodelled("stage", stage, STAGE_WHY[stage])
    elif stage == "dpo" and pref in ("orpo", "simpo"):
        c.read("stage", stage, "algorithm dpo")
        c.unmodelled("pref_loss", pref, f"{pref.upper()} runs no reference model: planned as "
                                        "DPO, whose reference forward it does not pay")
    else:
        c.read("stage", stage, f"algorithm {algorithm}" if "stage" in c.data else
               "algorithm sft")
    c.set(algorithm=algorithm)
    if algorithm == "ppo":
        new = c.int_("max_new_tokens", c.take("max_new_tokens", 1024))
        prompt = c.data.get("cutoff_len", 2048)
        c.assume(f"PPO rollouts: prompts of cutoff_len ({prompt}) tokens, {new} generated "
                 "(max_new_tokens), one completion a prompt, model.generate")
        if "max_new_tokens" in c.data:
            c.read("max_new_tokens", new, f"{new} generated tokens")
        c.set(rollout={"generations": 1, "prompt_len": prompt, "completion_len": new},
              seq_len=None)


def _precision(c: Collector, ftype: str) -> None:
    bf16, fp16, pure = c.take("bf16"), c.take("fp16"), c.take("pure_bf16")
    if pure:
        c.read("pure_bf16", True, "precision bf16 (weights, gradients and optimizer in bf16)",
               precision="bf16")
        return
    half = "bf16" if bf16 else "fp16" if fp16 else None
    if half is None:
        c.assume("no bf16 / fp16: fp32 weights and kernels")
        c.set(precision="fp32")
        return
    if ftype == "full":
        c.read(half, True, f"precision {half}-amp (trainable parameters cast to fp32, "
                           f"{half} autocast)", precision=f"{half}-amp")
    else:
        c.read(half, True, f"precision {half} (the frozen base loaded in {half}; the "
                           "trainable parameters, cast to fp32, are planned in it too)",
               precision=half)


def _finetuning(c: Collector, ftype: str, model: str) -> None:
    if ftype == "lora":
        rank = c.int_("lora_rank", c.take("lora_rank", 8))
        alpha = c.take("lora_alpha") or rank * 2
        dropout = c.take("lora_dropout", 0.0)
        target = c.take("lora_target", "all")
        spec = "all-linear" if str(target).lower() == "all" else str(target)
        c.read("finetuning_type", "lora", f"LoRA rank {rank}, alpha {alpha:g}, on {spec}",
               lora={"rank": rank, "alpha": float(alpha), "targets": spec,
                     "dropout": float(dropout)})
        for key in ("lora_rank", "lora_alpha", "lora_dropout", "lora_target"):
            if key in c.data:
                c.read(key, c.data[key], "(in the LoRA above)")
    elif ftype == "full":
        c.read("finetuning_type", "full", "every parameter trained")
    elif ftype == "freeze":
        _freeze(c, model)
    else:
        c.unmodelled("finetuning_type", ftype, "not a method trainplan models: planned as "
                                               "full training")


def _freeze(c: Collector, model: str) -> None:
    n = c.take("freeze_trainable_layers", 2)
    modules = str(c.take("freeze_trainable_modules", "all"))
    cfg = model_config(model) or {}
    layers = cfg.get("num_hidden_layers") or (cfg.get("text_config") or {}).get(
        "num_hidden_layers")
    if not isinstance(layers, int) or modules != "all" or c.data.get("freeze_extra_modules"):
        c.unmodelled("finetuning_type", "freeze", "freezing by module name is modelled for "
                     "whole blocks of a bundled model only: planned as full training")
        return
    trained = range(layers - n, layers) if n > 0 else range(0, -n)
    tied = cfg.get("tie_word_embeddings", True)         # a tied head is the embedding's weight
    frozen = ["model.embed_tokens", "model.norm"] + ([] if tied else ["lm_head"]) + [
        f"model.layers.{i}" for i in range(layers) if i not in trained]
    c.read("finetuning_type", "freeze", f"blocks {trained.start}-{trained.stop - 1} of "
           f"{layers} trained, the rest frozen (embeddings, norm, head too)",
           frozen=tuple(frozen))
    if "freeze_trainable_layers" in c.data:
        c.read("freeze_trainable_layers", n, "(in the freeze above)")


def _quantization(c: Collector) -> None:
    bits = c.take("quantization_bit")
    if bits is None:
        return
    method = str(c.data.get("quantization_method", "bitsandbytes")).lower()
    if method not in ("bitsandbytes", "bnb"):
        return                                          # named by the unmodelled table
    if bits == 8:
        c.read("quantization_bit", 8, "8-bit LLM.int8 base weights", quantize="int8")
    elif bits == 4:
        kind = str(c.take("quantization_type", "nf4")).lower()
        dq = c.take("double_quantization", True)
        q = kind + ("-dq" if dq else "")
        c.read("quantization_bit", 4, f"4-bit {kind.upper()} base weights"
               + (", double-quantised" if dq else ""), quantize=q)
    else:
        c.unmodelled("quantization_bit", bits, "only 4- and 8-bit bitsandbytes quantisation "
                                               "is modelled: planned unquantised")


def _dataset_size(c: Collector) -> None:
    n = c.take("max_samples")
    if n is None:
        return
    n = c.int_("max_samples", n)
    sets = [s for s in str(c.data.get("dataset", "")).split(",") if s.strip()] or ["?"]
    size = n * len(sets)
    c.read("max_samples", n, f"dataset size {size} ({n} from each of {len(sets)} dataset(s), "
                             "assuming each holds that many)", dataset_size=size)
