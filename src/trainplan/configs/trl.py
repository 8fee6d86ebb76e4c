"""A TRL config: `SFTConfig`, `DPOConfig` or `GRPOConfig` as YAML (the `trl sft|dpo|grpo
--config` files, TrlParser recipes) or JSON (`TrainingArguments.to_json_string()`), read as TRL
reads it (huggingface/trl@f2cd577: trl/trainer/{base,sft,dpo,grpo}_config.py, model_config.py,
trainer/utils.py `create_model_from_path`). The HF Trainer's keys are trainer.py's.

Which trainer: GRPO when the file sets any of num_generations, max_completion_length, use_vllm,
reward_funcs, vllm_mode; DPO for beta, max_prompt_length, precompute_ref_log_probs, loss_type,
rpo_alpha, or a path with /dpo/ in it; SFT otherwise.

    model_name_or_path (ModelConfig)   -> model (a to_json_string() file names none: --model)
    dtype / torch_dtype / model_init_kwargs.dtype (float32: create_model_from_path's default;
      auto: the checkpoint's) + bf16 (TRL's default: true unless fp16) -> precision (trainer.py)
    gradient_checkpointing (TRL's default true) -> full checkpointing
    use_peft, lora_r 16, lora_alpha 32, lora_dropout 0.05, lora_target_modules -> LoRA
    load_in_4bit (bnb_4bit_quant_type nf4, use_bnb_nested_quant false) / load_in_8bit -> nf4 / int8
    SFT max_length 1024 (max_seq_length) -> sequence length
    DPO max_length 1024                -> each of chosen and rejected (2 sequences a sample)
    GRPO num_generations 8, max_completion_length 512, max_prompt_length (older TRL; else
      trainplan's 512), beta 0.0, num_iterations 1, use_vllm false, vllm_mode colocate,
      vllm_gpu_memory_utilization 0.3, ds3_gather_for_generation true -> rollout
"""
from __future__ import annotations

from pathlib import Path

from . import deepspeed as ds_mod
from . import trainer as hf
from .common import checkpoint_dtype, known_keys, model_ref
from .reading import Collector, Reading

GRPO_KEYS = {"num_generations", "max_completion_length", "use_vllm", "reward_funcs",
             "vllm_mode", "num_iterations", "vllm_gpu_memory_utilization",
             "generation_batch_size", "steps_per_generation"}
DPO_KEYS = {"max_prompt_length", "precompute_ref_log_probs", "rpo_alpha", "loss_type",
            "ref_model_init_kwargs", "reference_free", "generate_during_eval"}
TRL_MARKERS = GRPO_KEYS | DPO_KEYS | {"dataset_text_field", "packing", "max_seq_length",
                                      "use_peft", "dataset_name", "completion_only_loss",
                                      "assistant_only_loss", "dataset_kwargs", "model_init_kwargs",
                                      "padding_free", "lora_r", "beta"}
HF_MARKERS = {"per_device_train_batch_size", "gradient_accumulation_steps", "output_dir",
              "learning_rate", "num_train_epochs", "logging_steps", "lr_scheduler_type"}
UNMODELLED = {
    "use_dora": (False, "DoRA's magnitude vectors and extra activations are not modelled: "
                        "planned as LoRA"),
    "lora_modules_to_save": (None, "modules trained in full beside the adapters are not "
                                   "planned"),
    "padding_free": (False, "padding-free batches (flattened, no padding) are planned as "
                            "full-length sequences"),
    "precompute_ref_log_probs": (False, "the reference log-probs computed before training are "
                                        "planned inside every step"),
    "sync_ref_model": (False, "syncing the reference model is not modelled"),
    "activation_offloading": (False, "activation offloading is not modelled"),
}


def looks_like(data: dict) -> bool:
    keys = set(data)
    return bool(TRL_MARKERS & keys) or len(HF_MARKERS & keys) >= 2


def which(data: dict, path: str) -> str:
    keys = set(data)
    if GRPO_KEYS & keys or "/grpo/" in path.replace("\\", "/").lower():
        return "grpo"
    if DPO_KEYS & keys or ("beta" in keys and "max_length" in keys) or \
            "/dpo/" in path.replace("\\", "/").lower():
        return "dpo"
    return "sft"


def read(data: dict, path: str, deepspeed: str | None = None) -> Reading:
    keys, _ = known_keys("trl")
    algorithm = which(data, path)
    plain = not (TRL_MARKERS & set(data)) and "model_name_or_path" not in data
    c = Collector("hf-trainer" if plain else "trl", path, data, set(keys))
    trainer = "the HF Trainer (TrainingArguments)" if plain else {
        "grpo": "GRPOTrainer", "dpo": "DPOTrainer"}.get(algorithm, "SFTTrainer")
    c.assume(f"trainer: {trainer} (from the keys the file sets)")
    c.set(algorithm=algorithm)
    name = c.take("model_name_or_path")
    model = None
    if name is not None:
        model, meaning = model_ref(name, f"TRL config {path}: model_name_or_path",
                                   hf.base_dir(c))
        c.read("model_name_or_path", name, meaning, model=model)
    else:
        c.assume("no model_name_or_path: give the model with --model")
    mbs = hf.read_batch(c, "per_device_train_batch_size", 8)
    gas = hf.read_accum(c)
    _precision(c, model, plain)
    hf.read_checkpointing(c, "gradient_checkpointing", not plain)
    _attention(c)
    _peft(c)
    hf.read_optim(c, "optim", "adamw_torch_fused")
    clip = hf.read_clipping(c)
    hf.read_steps(c)
    if plain:
        c.assume("the sequence length is the training script's (TrainingArguments has none): "
                 "pass --seq-len, else trainplan's default")
    else:
        _lengths(c, algorithm)
    prec = c.reading.settings.get("precision", "fp32")
    beside = ds_mod.Trainer("the TRL config", micro_batch=mbs, grad_accum=gas,
                            bf16=prec.startswith("bf16"), fp16=prec.startswith("fp16"),
                            max_grad_norm=clip)
    hf.read_fsdp(c, "fsdp", "fsdp_config")
    hf.read_accelerator_config(c)
    hf.read_deepspeed(c, "deepspeed", beside, deepspeed)
    c.unmodelled_table({k: v for k, v in {**hf.UNMODELLED, **UNMODELLED}.items() if v[1]})
    return c.finish()


def _precision(c: Collector, model: str | None, plain: bool) -> None:
    init = c.section("model_init_kwargs") if isinstance(c.data.get("model_init_kwargs"),
                                                        dict) else None
    key, raw = None, None
    for k in ("dtype", "torch_dtype"):       # torch_dtype: TRL's name before 0.20
        if c.has(k) and key is None:
            key, raw = k, c.take(k)
        else:
            c.take(k)
    if raw is None and init is not None:
        for k in ("dtype", "torch_dtype"):
            if init.has(k):
                key, raw = f"model_init_kwargs.{k}", init.take(k)
                break
    weights = hf.weights_dtype(raw)
    if weights == "auto":
        weights = checkpoint_dtype(model) if model else None
        note = f"auto: the checkpoint's {weights or 'dtype (unknown here: fp32 assumed)'}"
    elif weights is None:
        weights = "float32"
        note = None
        c.assume("the model loads in float32 (" + (
            "the training script's choice; transformers < 5 loads fp32"
            if plain else "create_model_from_path's default dtype") + ")")
    else:
        note = None
    bf16, fp16, tf32 = c.take("bf16"), c.take("fp16"), c.take("tf32")
    if bf16 is None and not plain:
        bf16 = not fp16
        c.assume(f"bf16 not set: {str(bf16).lower()} (TRL's default: bf16 unless fp16)")
    name, why = hf.precision_from(bf16, fp16, tf32, weights)
    if key is not None:
        text = f"weights loaded in {weights or 'float32'}" + (f" ({note})" if note else "")
        if "." in key:
            init.read(key.split(".", 1)[1], raw, text, precision=name)
        else:
            c.read(key, raw, text, precision=name)
    c.set(precision=name)
    for k, v in (("bf16", bf16), ("fp16", fp16), ("tf32", tf32)):
        if k in c.data and v:
            c.read(k, v, f"precision {name}: {why}")


def _attention(c: Collector) -> None:
    impl = c.take("attn_implementation")
    table = {"flash_attention_2": "flash", "flash_attention_3": "flash", "sdpa": "sdpa",
             "eager": "eager", "kernels-community/flash-attn": "flash",
             "kernels-community/vllm-flash-attn3": "flash"}
    if impl is not None:
        att = table.get(str(impl).lower())
        if att:
            c.read("attn_implementation", impl, f"attention {att}", attention=att)
        else:
            c.unmodelled("attn_implementation", impl, "not an attention kernel trainplan "
                                                      "models: planned with the target's "
                                                      "default")


def _peft(c: Collector) -> None:
    use = c.take("use_peft")
    q4, q8 = c.take("load_in_4bit"), c.take("load_in_8bit")
    if not use:
        if q4 or q8:
            c.unmodelled("load_in_4bit" if q4 else "load_in_8bit", True, "a quantised base "
                         "needs use_peft to train; planned unquantised")
        return
    r = c.int_("lora_r", c.take("lora_r", 16))
    alpha = c.take("lora_alpha", 32)
    dropout = c.take("lora_dropout", 0.05)
    targets = c.take("lora_target_modules")
    if targets is None:
        spec = "q_proj,v_proj"
        c.assume("no lora_target_modules: peft's default for the architecture (q_proj, v_proj "
                 "in Llama/Mistral/Qwen2/Gemma)")
    else:
        spec = ",".join(targets) if isinstance(targets, list) else str(targets)
    c.read("use_peft", True, f"LoRA rank {r}, alpha {alpha}, on {spec}",
           lora={"rank": r, "alpha": float(alpha), "targets": spec, "dropout": float(dropout)})
    for key in ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules"):
        if key in c.data:
            c.read(key, c.data[key], "(in the LoRA above)")
    if q4:
        kind = str(c.take("bnb_4bit_quant_type", "nf4")).lower()
        dq = bool(c.take("use_bnb_nested_quant", False))
        c.read("load_in_4bit", True, f"4-bit {kind.upper()} base weights"
               + (", double-quantised" if dq else ""), quantize=kind + ("-dq" if dq else ""))
    elif q8:
        c.read("load_in_8bit", True, "8-bit LLM.int8 base weights", quantize="int8")


def _lengths(c: Collector, algorithm: str) -> None:
    if algorithm == "grpo":
        _rollout(c)
        return
    key = "max_length" if c.has("max_length") else "max_seq_length" if c.has(
        "max_seq_length") else None
    n = c.int_(key, c.take(key)) if key else 1024
    if key:
        c.read(key, n, f"sequence length {n}" + (" (each of chosen and rejected)"
                                                 if algorithm == "dpo" else ""))
    else:
        c.assume("max_length not set: 1024")
    c.set(seq_len=n)
    if algorithm == "dpo" and c.has("beta"):
        c.read("beta", c.take("beta"), "DPO's KL coefficient (the reference model runs "
                                       "either way)")
    if c.take("packing"):
        c.read("packing", True, "every sequence is max_length tokens of packed samples, as "
                                "planned")


def _rollout(c: Collector) -> None:
    kw: dict = {}
    spec = (("num_generations", "generations", 8, "completions a prompt"),
            ("max_completion_length", "completion_len", 512, "generated tokens"),
            ("max_prompt_length", "prompt_len", 512, "prompt tokens"),
            ("num_iterations", "iterations", 1, "iterations a generation"))
    for key, field, default, what in spec:
        if c.has(key):
            kw[field] = c.int_(key, c.take(key))
            c.read(key, kw[field], f"{kw[field]} {what}")
        else:
            kw[field] = default
            c.assume(f"{key} not set: {default}" + (" (TRL no longer truncates prompts: "
                                                    "trainplan's default length)"
                                                    if key == "max_prompt_length" else ""))
    beta = c.take("beta", 0.0)
    kw["beta"] = c.number("beta", beta)
    if "beta" in c.data:
        c.read("beta", beta, f"KL coefficient {beta}" + (": the reference model runs"
                                                         if kw["beta"] > 0 else ""))
    if c.take("use_vllm"):
        mode = str(c.take("vllm_mode", "colocate")).lower()
        kw["engine"] = "vllm-colocate" if mode == "colocate" else "vllm-server"
        c.read("use_vllm", True, f"generation engine {kw['engine']}")
        if "vllm_mode" in c.data:
            c.read("vllm_mode", c.data["vllm_mode"], f"engine {kw['engine']}")
        if c.has("vllm_gpu_memory_utilization") and mode == "colocate":
            u = c.number("vllm_gpu_memory_utilization", c.take("vllm_gpu_memory_utilization"))
            kw["gpu_memory_utilization"] = u
            c.read("vllm_gpu_memory_utilization", u, f"vLLM holds {u:.0%} of each device")
    if c.has("ds3_gather_for_generation"):
        g = bool(c.take("ds3_gather_for_generation"))
        kw["gather_for_generation"] = g
        c.read("ds3_gather_for_generation", g, "ZeRO-3 gathers the whole model to generate"
               if g else "ZeRO-3 generates gathering layer by layer")
    c.set(rollout=kw, seq_len=None)


def is_json(path: str) -> bool:
    return Path(path).suffix.lower() == ".json"
