"""`--to trl`: the planned job as a TRL CLI config (`trl sft|dpo|grpo --config trl_config.yaml`):
ModelConfig, the trainer's config and TrainingArguments in one flat YAML, the keys
configs/trl.py reads.

    precision       dtype (the weights as loaded: bfloat16 / float16 for the pure precisions,
                    float32 under AMP) with bf16 / fp16 (the Trainer's autocast) / tf32
    adapter         use_peft, lora_r, lora_alpha, lora_dropout, lora_target_modules;
                    load_in_4bit with bnb_4bit_quant_type and use_bnb_nested_quant / load_in_8bit
    lengths         max_length (SFT; DPO: each of chosen and rejected); GRPO num_generations,
                    max_completion_length, beta, num_iterations, use_vllm, vllm_mode,
                    vllm_gpu_memory_utilization, ds3_gather_for_generation (TRL's GRPOConfig has
                    no prompt length since it stopped truncating prompts: kept from the source
                    config when it had one, else said in the header)
    clipping        max_grad_norm (0: none; the Trainer's own default is 1.0)
    strategy        zero1-3: deepspeed: ds_config.json beside it; fsdp: fsdp "full_shard
                    auto_wrap" (+ offload) with fsdp_config
"""
from __future__ import annotations

from .frameworks import (PLACEHOLDER, Export, deepspeed_file, dump_yaml, every_block_note,
                         header, launcher)

ATTN = {"flash": "flash_attention_2", "sdpa": "sdpa", "eager": "eager", "math": "eager"}
DTYPE = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}
NAME = "trl_config.yaml"
DROP = ("torch_dtype", "dtype", "bf16", "fp16", "tf32", "attn_implementation", "use_peft",
        "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "load_in_4bit",
        "load_in_8bit", "bnb_4bit_quant_type", "use_bnb_nested_quant", "deepspeed", "fsdp",
        "fsdp_config", "max_seq_length", "gradient_checkpointing_kwargs")


def render(e: Export) -> dict[str, str]:
    job, ln = e.job, e.ln
    c = e.base("trl")
    notes = e.notes()
    if not c:
        c.update(dataset_name=PLACEHOLDER, output_dir="trl-output")
        notes.append(f"dataset_name: replace {PLACEHOLDER} with a hub dataset id")
    for k in DROP:
        c.pop(k, None)
    c["model_name_or_path"] = e.model_name("trl", "model_name_or_path")
    p = job.precision
    c["dtype"] = DTYPE[p.stored]
    c["bf16"] = p.is_bf16
    c["fp16"] = p.is_fp16
    if p.name == "tf32":
        c["tf32"] = True
    c["per_device_train_batch_size"] = job.batch_size
    c["gradient_accumulation_steps"] = job.grad_accum
    e.trainer_sync(c, notes)
    e.trainer_clipping(c, notes)
    c["gradient_checkpointing"] = job.grad_checkpointing != "none"
    if job.grad_checkpointing != "none":
        c["gradient_checkpointing_kwargs"] = {"use_reentrant": job.reentrant_checkpointing}
    if job.grad_checkpointing == "selective":
        notes.append("selective checkpointing planned; the Trainer checkpoints whole blocks")
    notes.extend(every_block_note(job, "the Trainer"))
    if job.attention in ATTN:
        c["attn_implementation"] = ATTN[job.attention]
    _peft(c, job)
    c["optim"] = e.hf_optim("trl", "optim")
    if e.steps:
        c["max_steps"] = e.steps
    _lengths(c, job, notes)
    files = {}
    if job.strategy.name.startswith("zero"):
        name, text = deepspeed_file(ln)
        files[name] = text
        c["deepspeed"] = name
    elif job.strategy.fsdp:
        shard = "hybrid_shard" if job.strategy.hybrid else "full_shard"
        c["fsdp"] = f"{shard} auto_wrap" + (" offload" if ln.offload != "none" else "")
        # hybrid sharding is FSDP1's HYBRID_SHARD (FSDP2 takes it as a 2-D device mesh)
        c["fsdp_config"] = {"fsdp_version": 1} if job.strategy.hybrid else \
            {"fsdp_version": 2, "reshard_after_forward": True}
    trainer = {"sft": "sft", "dpo": "dpo", "grpo": "grpo"}.get(job.algorithm)
    if trainer is None:
        from ..errors import TrainplanError
        raise TrainplanError(f"TRL's CLI has no {job.algorithm.upper()} command.",
                             allowed="sft, dpo, grpo", fix="export --to torchrun and run "
                                                           "your own TRL script")
    files[NAME] = dump_yaml(header(ln, launcher(ln, f"trl {trainer} --config {NAME}")
                                   if ln.devices > 1 else f"trl {trainer} --config {NAME}",
                                   notes), c)
    return files


def _peft(c: dict, job) -> None:
    if job.lora is None:
        c["use_peft"] = False
        return
    c["use_peft"] = True
    c["lora_r"] = job.lora.rank
    c["lora_alpha"] = int(job.lora.alpha) if job.lora.alpha.is_integer() else job.lora.alpha
    c["lora_dropout"] = job.lora.dropout
    t = job.lora.targets
    c["lora_target_modules"] = "all-linear" if t == "all-linear" else [
        x.strip() for x in t.split(",") if x.strip()]
    q = job.quantize
    if q.bits == 4:
        c["load_in_4bit"] = True
        c["bnb_4bit_quant_type"] = "fp4" if q.name.startswith("fp4") else "nf4"
        c["use_bnb_nested_quant"] = bool(q.double_quant)
    elif q.bits == 8:
        c["load_in_8bit"] = True


def _lengths(c: dict, job, notes: list[str]) -> None:
    if job.algorithm != "grpo":
        c["max_length"] = job.seq_len
        if job.algorithm == "dpo":
            c.setdefault("beta", 0.1)         # DPOConfig's default; marks the file as DPO's
        return
    r = job.rollout
    c.update(num_generations=r.generations, max_completion_length=r.completion_len,
             beta=r.beta, num_iterations=r.iterations, use_vllm=r.engine != "hf")
    if "max_prompt_length" in c:
        c["max_prompt_length"] = r.prompt_len
    else:
        notes.append(f"prompts planned at {r.prompt_len} tokens: TRL's GRPOConfig does not "
                     "truncate them, so keep your prompts that long")
    if r.engine != "hf":
        c["vllm_mode"] = "colocate" if r.engine == "vllm-colocate" else "server"
        if r.engine == "vllm-colocate":
            c["vllm_gpu_memory_utilization"] = r.gpu_memory_utilization
    if job.strategy.name == "zero3":
        c["ds3_gather_for_generation"] = r.gather_for_generation
