"""An accelerate config YAML (`accelerate launch --config_file`): processes, strategy, precision.

    distributed_type NO | MULTI_GPU | DEEPSPEED | FSDP -> strategy single | ddp | zero<stage> |
                                                         fsdp (by its sharding strategy)
    num_processes (all machines' together)             -> devices
    mixed_precision no | fp16 | bf16                   -> fp32 | fp16-amp | bf16-amp (accelerate's
                                                         meaning: autocast, fp32 weights)
    deepspeed_config: zero_stage, offload_*_device,    -> strategy, offload, accumulation; a
      gradient_accumulation_steps, deepspeed_config_file  deepspeed_config_file is read whole
    fsdp_config: fsdp_sharding_strategy /              -> fsdp (FULL_SHARD; FSDP2 resharding
      fsdp_reshard_after_forward, fsdp_offload_params,    after forward), zero2 (SHARD_GRAD_OP /
      fsdp_activation_checkpointing                       no resharding: gradients and state
                                                          sharded, weights kept whole), ddp
                                                          (NO_SHARD), hsdp (HYBRID_SHARD);
                                                          offload optimizer+params; full
                                                          checkpointing

accelerate's own defaults for what the file leaves out (`DeepSpeedPlugin.__post_init__`, zero
stage 2, and `FullyShardedDataParallelPlugin`, FULL_SHARD; src/accelerate/utils/dataclasses.py,
huggingface/accelerate@16cb6eb) are applied and said.
"""
from __future__ import annotations

from pathlib import Path

from .. import precision as prec_mod
from ..errors import TrainplanError
from . import deepspeed as ds_mod
from .common import clip_norm, clipping_text, find_beside, known_keys, load_file
from .reading import Collector, Reading, show

SHARDING = {"FULL_SHARD": "fsdp", "1": "fsdp", "SHARD_GRAD_OP": "zero2", "2": "zero2",
            "NO_SHARD": "ddp", "3": "ddp", "HYBRID_SHARD": "hsdp", "4": "hsdp",
            "HYBRID_SHARD_ZERO2": "zero2", "5": "zero2"}
TOP_UNMODELLED = {
    "dynamo_config": ({}, "torch.compile is not modelled: planned eager"),
    "parallelism_config": ({}, "tensor / context parallelism is not modelled"),
    "megatron_lm_config": ({}, "Megatron-LM parallelism is not modelled"),
    "fp8_config": ({}, "fp8 training is not modelled: planned in bf16"),
    "use_cpu": (False, "training on the CPU is not modelled"),
}


def looks_like(data: dict) -> bool:
    return "distributed_type" in data or ("compute_environment" in data and
                                          "mixed_precision" in data)


def read(data: dict, path: str) -> Reading:
    keys, sections = known_keys("accelerate")
    c = Collector("accelerate", path, data, set(keys))
    machines = c.take("num_machines", 1)
    n = c.take("num_processes")
    if n is not None and n != -1:
        n = c.int_("num_processes", n)
        c.read("num_processes", n, f"{n} device(s)" + (f" over {machines} machines"
                                                     if machines and machines > 1 else ""),
               gpus=n)
    mp = c.take("mixed_precision")
    if mp is not None:
        text = str(mp).lower()
        if text == "fp8":
            c.unmodelled("mixed_precision", mp, "fp8 training is not modelled: planned as bf16 "
                                                "mixed precision")
            c.set(precision="bf16-amp")
        else:
            p = prec_mod.parse(mp, mixed=True, where=f"accelerate config {path}: "
                                                    "mixed_precision")
            c.read("mixed_precision", mp, f"precision {p.name} ({p.label})", precision=p.name)
    kind = str(c.take("distributed_type", "NO")).upper()
    if kind in ("NO", "MULTI_GPU", "MULTI_NPU", "MULTI_XPU", "MULTI_MLU", "MULTI_MUSA",
                "MULTI_HPU", "MULTI_SDAA"):
        strategy = "single" if kind == "NO" else "ddp"
        c.read("distributed_type", kind, f"strategy {strategy}", strategy=strategy)
    elif kind == "DEEPSPEED":
        _deepspeed(c, sections)
    elif kind == "FSDP":
        _fsdp(c, sections)
    elif kind in ("XLA", "TPU"):
        c.read("distributed_type", kind, "XLA (TPU): one process per core, data parallel",
               strategy="ddp")
    else:
        c.unmodelled("distributed_type", kind, "not a strategy trainplan models: planned as "
                                               "DDP")
        c.set(strategy="ddp")
    for key, (default, why) in TOP_UNMODELLED.items():
        v = c.data.get(key)
        if v not in (None, default, False, {}) and not (key == "dynamo_config" and str(
                (v or {}).get("dynamo_backend", "NO")).upper() == "NO"):
            c.unmodelled(key, v, why)
    return c.finish()


def _deepspeed(c: Collector, sections: dict) -> None:
    sec = c.section("deepspeed_config", set(sections.get("deepspeed_config", ())))
    file = sec.take("deepspeed_config_file")
    if file and str(file).lower() != "none":
        where = find_beside(str(file), c.reading.path, "DeepSpeed config", "--deepspeed")
        gas = sec.data.get("gradient_accumulation_steps")
        beside = ds_mod.Trainer("accelerate", grad_accum=gas if isinstance(gas, int) else None,
                                strict=False,
                                bf16=c.reading.settings.get("precision") == "bf16-amp",
                                fp16=c.reading.settings.get("precision") == "fp16-amp")
        inner = ds_mod.read(load_file(where, "DeepSpeed config"), str(where), beside,
                            c.reading.settings.get("gpus"))
        sec.read("deepspeed_config_file", file, "read below")
        c.reading.companions.append(inner)
        c.set(**ds_mod.apply({}, inner))
        c.read("distributed_type", "DEEPSPEED", "DeepSpeed, as its config file says")
        return
    stage = sec.take("zero_stage")
    if stage is None:
        stage = 2
        sec.assume("zero_stage not given: 2 (accelerate's DeepSpeedPlugin default)")
    stage = ds_mod.check_stage(stage, f"accelerate config {c.reading.path}: zero_stage")
    strategy = {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}[stage]
    c.read("distributed_type", "DEEPSPEED", f"DeepSpeed ZeRO stage {stage}", strategy=strategy)
    if "zero_stage" in sec.data:
        sec.read("zero_stage", stage, f"strategy {strategy}")
    opt = str(sec.take("offload_optimizer_device", "none")).lower()
    par = str(sec.take("offload_param_device", "none")).lower()
    offload = "none"
    if opt in ("cpu", "nvme"):
        offload = "optimizer"
        sec.read("offload_optimizer_device", opt, "offload optimizer")
    if par in ("cpu", "nvme") and stage == 3:
        offload = "optimizer+params"
        sec.read("offload_param_device", par, "offload optimizer+params")
    for key, dev in (("offload_optimizer_device", opt), ("offload_param_device", par)):
        if dev == "nvme":
            sec.unmodelled(key.replace("device", "nvme_path"),
                           sec.data.get(key.replace("device", "nvme_path")),
                           "NVMe offload: planned as CPU offload")
    c.set(offload=offload)
    clip = sec.take("gradient_clipping")
    if clip not in (None, "auto", "none"):   # accelerate's DeepSpeedPlugin: DeepSpeed clips
        clip = clip_norm(sec, "gradient_clipping", clip)
        sec.read("gradient_clipping", clip, clipping_text(clip), max_grad_norm=clip or None)
    gas = sec.take("gradient_accumulation_steps")
    if gas not in (None, "auto"):
        gas = sec.int_("gradient_accumulation_steps", gas)
        sec.read("gradient_accumulation_steps", gas, f"gradient accumulation {gas}",
                 grad_accum=gas)


def _fsdp(c: Collector, sections: dict) -> None:
    sec = c.section("fsdp_config", set(sections.get("fsdp_config", ())))
    version = sec.take("fsdp_version", 1)
    strategy, how = "fsdp", "FULL_SHARD (accelerate's default)"
    if "fsdp_sharding_strategy" in sec.data:
        raw = sec.take("fsdp_sharding_strategy")
        text = str(raw).upper()
        if text not in SHARDING:
            raise sec.error("fsdp_sharding_strategy", f"{show(raw)} is not an FSDP sharding "
                            "strategy.", allowed="FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, "
                                                 "HYBRID_SHARD, HYBRID_SHARD_ZERO2")
        strategy, how = SHARDING[text], str(raw)
        if text in ("HYBRID_SHARD_ZERO2", "5"):
            sec.unmodelled("fsdp_sharding_strategy", raw, "hybrid ZeRO-2 sharding (within a "
                           "node, replicated across nodes): planned as ZeRO-2 over every device")
        else:
            sec.read("fsdp_sharding_strategy", raw, f"strategy {strategy}")
    reshard = sec.take("fsdp_reshard_after_forward")
    if reshard is not None:
        text = str(reshard).upper()
        if reshard is False or text == "FALSE" or text in ("SHARD_GRAD_OP", "2"):
            strategy, how = "zero2", "weights kept whole after forward, as ZeRO-2"
        elif text in SHARDING:
            strategy, how = SHARDING[text], text
        else:
            strategy, how = "fsdp", "weights resharded after forward: full sharding"
        sec.read("fsdp_reshard_after_forward", reshard, f"strategy {strategy} ({how})")
    c.read("distributed_type", "FSDP", f"FSDP{version}: strategy {strategy}", strategy=strategy)
    if "fsdp_version" in sec.data:
        sec.read("fsdp_version", version, f"FSDP{version} (FSDP1 and FSDP2 are planned alike)")
    if sec.take("fsdp_offload_params"):
        sec.read("fsdp_offload_params", True, "offload optimizer+params (FSDP's CPU offload "
                 "moves the parameters, gradients and optimizer step to the host)",
                 offload="optimizer+params")
    ac = sec.take("fsdp_activation_checkpointing")
    if ac:
        sec.read("fsdp_activation_checkpointing", ac, "full activation checkpointing",
                 grad_checkpointing="full")


def read_file(path: str) -> Reading:
    data = load_file(path, "accelerate config")
    if not looks_like(data):
        raise TrainplanError(f"{path} is not an accelerate config: it has no distributed_type.",
                             fix="give the file `accelerate config` wrote (default "
                                 "~/.cache/huggingface/accelerate/default_config.yaml)")
    return read(data, str(Path(path)))
