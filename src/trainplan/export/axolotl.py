"""`--to axolotl`: the planned job as an axolotl YAML (`axolotl train axolotl.yaml`), in the keys
configs/axolotl.py reads, so that reading it back gives the same job.

    precision       bf16 / fp16 (axolotl loads the weights in that dtype: the pure 16-bit
                    precisions; an AMP plan is written as the same flag, which the header says)
    checkpointing   gradient_checkpointing + gradient_checkpointing_kwargs.use_reentrant
    adapter         adapter lora | qlora, lora_r, lora_alpha, lora_dropout, lora_target_modules
                    (lora_target_linear for all-linear), load_in_4bit / load_in_8bit
    clipping        max_grad_norm (no clipping cannot be written: axolotl passes only a
                    non-zero value, the Trainer then clips to 1.0; the header says so)
    strategy        zero1-3: deepspeed: ds_config.json (written beside it); fsdp: fsdp_version 2
                    with fsdp_config (offload_params, reshard_after_forward); ddp: processes
"""
from __future__ import annotations

from .frameworks import (PLACEHOLDER, Export, deepspeed_file, dump_yaml, every_block_note,
                         header, launcher)

ATTN = {"flash": "flash_attention_2", "sdpa": "sdpa", "eager": "eager", "math": "eager",
        "efficient": "xformers"}
ATTN_KEYS = ("attn_implementation", "flash_attention", "sdp_attention", "xformers_attention",
             "flex_attention", "eager_attention")
NAME = "axolotl.yaml"


def render(e: Export) -> dict[str, str]:
    job, ln = e.job, e.ln
    c = e.base("axolotl")
    notes = e.notes()
    fresh = not c
    c["base_model"] = e.model_name("axolotl", "base_model")
    c.pop("base_model_config", None)
    if fresh:
        c["datasets"] = [{"path": PLACEHOLDER, "type": "alpaca"}]
        c["output_dir"] = "./outputs/out"
        notes.append(f"datasets: replace {PLACEHOLDER} with yours (axolotl's dataset formats)")
    c["sequence_len"] = job.seq_len
    c["micro_batch_size"] = job.batch_size
    c["gradient_accumulation_steps"] = job.grad_accum
    e.trainer_sync(c, notes)
    e.trainer_clipping(c, notes, passes_zero=False)
    c.pop("batch_size", None)
    if not e.same("axolotl", "precision"):
        _precision(c, job, notes)
    if not e.same("axolotl", "grad_checkpointing", "checkpoint_impl"):
        _checkpointing(c, job, notes)
    if not e.same("axolotl", "attention"):
        for k in ATTN_KEYS:
            c.pop(k, None)
        if job.attention in ATTN:
            c["attn_implementation"] = ATTN[job.attention]
    if not e.same("axolotl", "lora", "quantize"):
        _adapter(c, job)
    c["optimizer"] = e.hf_optim("axolotl", "optimizer")
    _strategy(c, e, notes)
    files = {}
    if job.strategy.name.startswith("zero"):
        name, text = deepspeed_file(ln)
        files[name] = text
        c["deepspeed"] = name
    _algorithm(c, job)
    if e.steps:
        c["max_steps"] = e.steps
    files[NAME] = dump_yaml(header(ln, launcher(ln, f"-m axolotl.cli.train {NAME}")
                                   if ln.devices > 1 else f"axolotl train {NAME}", notes), c)
    return files


def _precision(c: dict, job, notes: list[str]) -> None:
    for k in ("bf16", "fp16", "tf32", "bfloat16", "float16", "float32"):
        c.pop(k, None)
    p = job.precision
    if p.is_bf16:
        c["bf16"] = True
    elif p.is_fp16:
        c["fp16"] = True
    elif p.name == "tf32":
        c["tf32"] = True
    else:
        c["bf16"], c["fp16"] = False, False
    if p.amp:
        notes.append(f"planned {p.name} ({p.label}); axolotl loads the weights in "
                     f"{p.half}, so it runs pure {p.compute} (less memory than planned)")


def _checkpointing(c: dict, job, notes: list[str]) -> None:
    c["gradient_checkpointing"] = job.grad_checkpointing != "none"
    c.pop("gradient_checkpointing_kwargs", None)
    if job.grad_checkpointing != "none":
        c["gradient_checkpointing_kwargs"] = {"use_reentrant": job.reentrant_checkpointing}
    if job.grad_checkpointing == "selective":
        notes.append("selective checkpointing planned; axolotl's gradient_checkpointing "
                     "checkpoints whole blocks (more recompute, less memory)")
    notes.extend(every_block_note(job, "axolotl"))


def _adapter(c: dict, job) -> None:
    for k in ("adapter", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules",
              "lora_target_linear", "load_in_4bit", "load_in_8bit"):
        c.pop(k, None)
    if job.lora is None:
        return
    q = job.quantize.name
    c["adapter"] = "qlora" if q.startswith(("nf4", "fp4", "torchao")) else "lora"
    c["lora_r"] = job.lora.rank
    c["lora_alpha"] = int(job.lora.alpha) if job.lora.alpha.is_integer() else job.lora.alpha
    c["lora_dropout"] = job.lora.dropout
    if job.lora.targets == "all-linear":
        c["lora_target_linear"] = True
    else:
        c["lora_target_modules"] = [t.strip() for t in job.lora.targets.split(",") if t.strip()]
    if c["adapter"] == "qlora":
        c["load_in_4bit"] = True
    elif q == "int8":
        c["load_in_8bit"] = True


def _strategy(c: dict, e: Export, notes: list[str]) -> None:
    for k in ("deepspeed", "fsdp", "fsdp_config", "fsdp_version", "dp_shard_size",
              "dp_replicate_size"):
        c.pop(k, None)
    s, ln = e.job.strategy, e.ln
    if s.fsdp:
        c["fsdp_version"] = 2
        c["fsdp_config"] = {"offload_params": ln.offload != "none", "reshard_after_forward": True,
                            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                            "state_dict_type": "FULL_STATE_DICT"}
        if s.hybrid and ln.nodes > 1:     # axolotl's N-D parallelism: shard in a node, replicate
            c["dp_shard_size"] = ln.procs_per_node
            c["dp_replicate_size"] = ln.nodes
    elif s.name == "dp":
        notes.append("DataParallel planned; axolotl runs one process per GPU (DDP)")


def _algorithm(c: dict, job) -> None:
    if job.algorithm == "sft":
        c.pop("rl", None)
        return
    if job.algorithm == "dpo":
        if str(c.get("rl", "")).lower() not in ("dpo", "ipo", "orpo", "simpo", "kto", "gdpo"):
            c["rl"] = "dpo"
        return
    c["rl"] = job.algorithm
    r = job.rollout
    trl = dict(c.get("trl") or {})
    trl.update(num_generations=r.generations, max_completion_length=r.completion_len,
               beta=r.beta, num_iterations=r.iterations)
    trl["use_vllm"] = r.engine != "hf"
    if r.engine != "hf":
        trl["vllm_mode"] = "colocate" if r.engine == "vllm-colocate" else "server"
        if r.engine == "vllm-colocate":
            c["vllm"] = {**(c.get("vllm") or {}), "gpu_memory_utilization":
                         r.gpu_memory_utilization}
    c["trl"] = trl
    c["sequence_len"] = r.prompt_len + r.completion_len
