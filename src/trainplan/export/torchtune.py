"""`--to torchtune`: the planned job as a torchtune recipe config (`tune run [--nproc_per_node N]
<recipe> --config torchtune.yaml`), in the keys configs/torchtune.py reads.

    model           the builder of the same architecture (configs/torchtune.py MODELS), lora_ /
                    qlora_ for adapters (torchtune quantises the base with torchao NF4), with
                    lora_attn_modules, apply_lora_to_mlp, apply_lora_to_output, rank, alpha
    precision       dtype bf16 | fp32 (torchtune has no autocast and no fp16 training: an AMP plan
                    is written as its dtype; an fp16 plan cannot run in torchtune)
    strategy        one device: *_single_device; several: *_distributed (FSDP2), weights kept
                    whole after forward for ZeRO-1/2 plans (fsdp_reshard_after_forward false),
                    fsdp_cpu_offload for offload
    checkpointing   enable_activation_checkpointing
    clipping        clip_grad_norm (null: none)
"""
from __future__ import annotations

from ..configs.torchtune import ATTN, MODELS, family
from ..errors import TrainplanError
from ..predict.sharding import holds_full_gradients
from ..spec import every_k
from .frameworks import Export, dump_yaml, header

BUILDERS = {hub.lower(): base for base, hub in MODELS.items()}
TOKENIZERS = {"llama3_2": "llama3.llama3_tokenizer", "llama3_1": "llama3.llama3_tokenizer",
              "llama3": "llama3.llama3_tokenizer", "llama2": "llama2.llama2_tokenizer",
              "mistral": "mistral.mistral_tokenizer", "qwen2_5": "qwen2_5.qwen2_5_tokenizer",
              "gemma": "gemma.gemma_tokenizer", "gemma2": "gemma.gemma_tokenizer",
              "phi3": "phi3.phi3_mini_tokenizer"}
MODEL_TYPES = {"llama3_2": "LLAMA3_2", "llama3_1": "LLAMA3", "llama3": "LLAMA3",
               "llama2": "LLAMA2", "mistral": "MISTRAL", "qwen2_5": "QWEN2", "gemma": "GEMMA",
               "gemma2": "GEMMA2", "phi3": "PHI3_MINI"}
MLP = {"gate_proj", "up_proj", "down_proj", "w1", "w2", "w3", "mlp"}
NAME = "torchtune.yaml"


def render(e: Export) -> dict[str, str]:
    job, ln = e.job, e.ln
    base = BUILDERS.get(e.hub_id.lower())
    if base is None:
        raise TrainplanError(f"torchtune has no model builder trainplan knows for {e.hub_id}.",
                             allowed=", ".join(sorted(MODELS.values())),
                             fix="export --to trl, axolotl or llama-factory")
    c = e.base("torchtune")
    notes = e.notes()
    fam = family(base)
    c["model"] = _model(job, fam, base, c.get("model") or {})
    if not c.get("tokenizer"):
        c["tokenizer"] = {"_component_": f"torchtune.models.{TOKENIZERS[fam]}",
                          "path": f"/tmp/{e.hub_id.split('/')[-1]}/REPLACE_WITH_TOKENIZER_PATH"}
        c["checkpointer"] = {"_component_": "torchtune.training.FullModelHFCheckpointer",
                             "checkpoint_dir": f"/tmp/{e.hub_id.split('/')[-1]}/",
                             "checkpoint_files": ["REPLACE_WITH_CHECKPOINT_FILES"],
                             "output_dir": "/tmp/torchtune-output", "model_type": MODEL_TYPES[fam]}
        c["dataset"] = {"_component_": "torchtune.datasets.alpaca_cleaned_dataset",
                        "packed": False}
        c["output_dir"] = "/tmp/torchtune-output"
        notes.append(f"download the model (tune download {e.hub_id}) and set the tokenizer "
                     "path and checkpoint files")
    c["tokenizer"]["max_seq_len"] = job.seq_len
    c["batch_size"] = job.batch_size
    c["gradient_accumulation_steps"] = job.grad_accum
    c["clip_grad_norm"] = job.max_grad_norm          # null: none (the recipes' default)
    if holds_full_gradients(job):
        notes.append("torchtune reduce-scatters the gradients on every micro-batch (planned: "
                     "on the last only, full gradients held): less memory, more communication")
    if e.steps:
        c["epochs"], c["max_steps_per_epoch"] = 1, e.steps
    else:
        c.pop("max_steps_per_epoch", None)
        c["epochs"] = c.get("epochs", 1) if job.epochs is None else job.epochs
    c["dtype"] = _dtype(job, ln, notes)
    c["enable_activation_checkpointing"] = job.grad_checkpointing != "none"
    c.pop("ac_mode", None)
    c.pop("ac_option", None)
    k = every_k(job.grad_checkpointing)
    if k >= 2:                                  # torchtune's selective layer mode
        c["ac_mode"], c["ac_option"] = "selective", k
    if job.grad_checkpointing == "selective":
        notes.append("selective checkpointing planned; torchtune checkpoints whole layers")
    opt = dict(c.get("optimizer") or {})
    if opt.get("_component_", "").lower() != job.optimizer.torchtune.lower():
        opt = {"_component_": job.optimizer.torchtune, "lr": opt.get("lr", 2e-5)}
    c["optimizer"] = opt
    recipe = _recipe(c, job, ln, notes)
    devices = ln.nodes * ln.procs_per_node
    run = "tune run " + (f"--nnodes {ln.nodes} " if ln.nodes > 1 else "") + (
        f"--nproc_per_node {ln.procs_per_node} " if devices > 1 else "") + \
        f"{recipe} --config {NAME}"
    return {NAME: dump_yaml(header(ln, run, notes), c)}


def _model(job, fam: str, base: str, old: dict) -> dict:
    if job.lora is None:
        return {"_component_": f"torchtune.models.{fam}.{base}"}
    prefix = "qlora_" if job.quantize.bits else "lora_"
    targets = {t.strip() for t in job.lora.targets.split(",") if t.strip()}
    if job.lora.targets == "all-linear":
        targets = {"q_proj", "k_proj", "v_proj", "o_proj", "mlp"}
    inverse = {v: k for k, v in ATTN.items()}
    attn = [inverse[t] for t in ("q_proj", "k_proj", "v_proj", "o_proj") if t in targets]
    m = {k: v for k, v in old.items() if k not in ("_component_",)}
    m.update({"_component_": f"torchtune.models.{fam}.{prefix}{base}",
              "lora_attn_modules": attn, "apply_lora_to_mlp": bool(targets & MLP),
              "apply_lora_to_output": "lm_head" in targets, "lora_rank": job.lora.rank,
              "lora_alpha": job.lora.alpha, "lora_dropout": job.lora.dropout})
    return m


def _dtype(job, ln, notes: list[str]) -> str:
    p = job.precision
    if p.is_fp16:
        raise TrainplanError(f"The plan runs fp16 on {ln.accelerator_id}, which has no bf16; "
                             "torchtune trains in bf16 or fp32 only.",
                             fix="export --to trl or axolotl, or plan on a GPU with bf16")
    if p.amp:
        notes.append(f"planned {p.name}; torchtune casts the model to {p.half} (no fp32 "
                     "master weights: less memory than planned)")
    if p.name == "tf32":
        notes.append("TF32 matmuls planned; torchtune's fp32 follows PyTorch's TF32 setting")
    return "bf16" if p.is_bf16 else "fp32"


def _recipe(c: dict, job, ln, notes: list[str]) -> str:
    if job.algorithm not in ("sft", "dpo"):
        raise TrainplanError(f"torchtune has no {job.algorithm.upper()} recipe that runs what "
                             "trainplan plans.", fix="export --to trl or axolotl")
    distributed = ln.devices > 1
    for k in ("fsdp_cpu_offload", "fsdp_reshard_after_forward"):
        c.pop(k, None)
    if distributed:
        if job.strategy.name in ("zero1", "zero2"):
            c["fsdp_reshard_after_forward"] = False
            if job.strategy.name == "zero1":
                notes.append("ZeRO-1 planned; torchtune's FSDP2 also shards the gradients")
        elif job.strategy.name in ("ddp", "dp"):
            notes.append(f"{job.strategy.name.upper()} planned; torchtune's distributed recipes "
                         "shard with FSDP2 (less memory than planned)")
        if ln.offload != "none":
            c["fsdp_cpu_offload"] = True
            if ln.offload == "optimizer":
                notes.append("optimizer offload planned; FSDP2's CPU offload moves the "
                             "parameters too")
    elif ln.offload != "none":
        notes.append("CPU offload planned; torchtune's single-device recipes have none")
    kind = "lora" if job.lora is not None else "full"
    where = "distributed" if distributed else "single_device"
    if job.algorithm == "dpo":
        if kind == "full" and not distributed:
            raise TrainplanError("torchtune's full DPO recipe is distributed only.",
                                 fix="plan on several devices, or with LoRA")
        return f"{kind}_dpo_{where}"
    return f"{kind}_finetune_{where}"
