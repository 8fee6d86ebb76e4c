"""`--to llama-factory`: the planned job as a LLaMA-Factory YAML (`llamafactory-cli train
llama_factory.yaml`), in the keys configs/llamafactory.py reads.

    precision       bf16 / fp16 (full training: trainable parameters in fp32 under autocast, the
                    AMP precisions); pure_bf16 for a pure bf16 full fine-tune
    adapter         finetuning_type lora, lora_rank, lora_alpha, lora_dropout, lora_target (all
                    for all-linear); quantization_bit 4 / 8 with quantization_type and
                    double_quantization
    checkpointing   on by LLaMA-Factory's default; disable_gradient_checkpointing: true for none,
                    use_reentrant_gc for the kind
    clipping        max_grad_norm (0: none; the Trainer's own default is 1.0)
    strategy        zero1-3: deepspeed: ds_config.json beside it; fsdp: accelerate_config.yaml
                    beside it (LLaMA-Factory runs FSDP through `accelerate launch`)
"""
from __future__ import annotations

from ..errors import TrainplanError
from .frameworks import (PLACEHOLDER, Export, deepspeed_file, dump_yaml, every_block_note,
                         header, launcher)

ATTN = {"flash": "fa2", "sdpa": "sdpa", "eager": "disabled", "math": "disabled"}
STAGE = {"sft": "sft", "dpo": "dpo", "ppo": "ppo"}
NAME = "llama_factory.yaml"


def render(e: Export) -> dict[str, str]:
    job, ln = e.job, e.ln
    c = e.base("llama-factory")
    notes = e.notes()
    if not c:
        c.update(do_train=True, dataset=PLACEHOLDER, template="default",
                 output_dir="saves/trainplan")
        notes.append(f"dataset: replace {PLACEHOLDER} with a dataset of data/dataset_info.json "
                     "and template with your model's")
    if job.algorithm not in STAGE:
        raise TrainplanError(f"LLaMA-Factory has no {job.algorithm.upper()} stage.",
                             allowed=", ".join(STAGE), fix="export --to trl or --to axolotl")
    c["model_name_or_path"] = e.model_name("llama-factory", "model_name_or_path")
    stage = STAGE[job.algorithm]
    if not (job.algorithm == "dpo" and str(c.get("stage")) in ("dpo", "kto", "rm")):
        c["stage"] = stage
    c["cutoff_len"] = job.rollout.prompt_len if job.rollout else job.seq_len
    if job.rollout:
        c["max_new_tokens"] = job.rollout.completion_len
    c["per_device_train_batch_size"] = job.batch_size
    c["gradient_accumulation_steps"] = job.grad_accum
    e.trainer_sync(c, notes)
    e.trainer_clipping(c, notes)
    _method(c, job)
    _precision(c, job, notes)
    c.pop("disable_gradient_checkpointing", None)
    c.pop("use_reentrant_gc", None)
    if job.grad_checkpointing == "none":
        c["disable_gradient_checkpointing"] = True
    else:
        c["use_reentrant_gc"] = job.reentrant_checkpointing
    if job.grad_checkpointing == "selective":
        notes.append("selective checkpointing planned; LLaMA-Factory checkpoints whole blocks")
    notes.extend(every_block_note(job, "LLaMA-Factory"))
    c.pop("flash_attn", None)
    if job.attention in ATTN:
        c["flash_attn"] = ATTN[job.attention]
    c["optim"] = e.hf_optim("llama-factory", "optim")
    if e.steps:
        c["max_steps"] = e.steps
    files = {}
    c.pop("deepspeed", None)
    command = f"llamafactory-cli train {NAME}"
    if job.strategy.name.startswith("zero"):
        name, text = deepspeed_file(ln)
        files[name] = text
        c["deepspeed"] = name
    elif job.strategy.fsdp:
        from .accelerate import render as accelerate_render
        files.update(accelerate_render(ln))
        command = f"accelerate launch --config_file accelerate_config.yaml src/train.py {NAME}"
    if ln.devices > 1 and not job.strategy.fsdp:   # LLaMA-Factory's torchrun variables
        nodes = f" NNODES={ln.nodes} NODE_RANK=$NODE_RANK MASTER_ADDR=$NODE0_ADDRESS" \
            if ln.nodes > 1 else ""
        command = f"FORCE_TORCHRUN=1 NPROC_PER_NODE={ln.procs_per_node}{nodes} {command}"
    files[NAME] = dump_yaml(header(ln, command, notes), c)
    return files


def _method(c: dict, job) -> None:
    for k in ("lora_rank", "lora_alpha", "lora_dropout", "lora_target", "quantization_bit",
              "quantization_type", "double_quantization", "quantization_method"):
        c.pop(k, None)
    if job.lora is None:
        c["finetuning_type"] = "freeze" if job.frozen and c.get("finetuning_type") == "freeze" \
            else "full"
        return
    c["finetuning_type"] = "lora"
    c["lora_rank"] = job.lora.rank
    c["lora_alpha"] = int(job.lora.alpha) if job.lora.alpha.is_integer() else job.lora.alpha
    c["lora_dropout"] = job.lora.dropout
    c["lora_target"] = "all" if job.lora.targets == "all-linear" else job.lora.targets
    q = job.quantize
    if q.bits:
        c["quantization_bit"] = q.bits
        c["quantization_method"] = "bnb"
        if q.bits == 4:
            c["quantization_type"] = "fp4" if q.name.startswith("fp4") else "nf4"
            c["double_quantization"] = bool(q.double_quant)


def _precision(c: dict, job, notes: list[str]) -> None:
    for k in ("bf16", "fp16", "pure_bf16"):
        c.pop(k, None)
    p = job.precision
    full = job.lora is None
    if p.is_bf16:
        c["pure_bf16" if full and p.pure_half else "bf16"] = True
    elif p.is_fp16:
        c["fp16"] = True
        if full and p.pure_half:
            notes.append("pure fp16 planned; LLaMA-Factory keeps fp32 trainable parameters "
                         "under fp16 autocast")
    elif p.name == "tf32":
        notes.append("TF32 matmuls planned: add tf32: true where your transformers has it")
    if not full and p.amp:
        notes.append(f"planned {p.name}; LLaMA-Factory loads the frozen base in {p.half} "
                     "(less memory than planned)")
