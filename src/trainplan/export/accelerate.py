"""`--to accelerate`: an accelerate config YAML (`accelerate launch --config_file
accelerate_config.yaml train.py`): distributed type, mixed precision, the FSDP or DeepSpeed
plugin settings, gradient accumulation, processes and machines."""
from __future__ import annotations

import shlex

import yaml

from ..strategy import DDP, DP
from .common import DEFAULT_PORT, Launch


# accelerate's fp8_config per FP8 recipe (precision.py): `accelerate launch` exports each key as
# ACCELERATE_FP8_<KEY>, which TERecipeKwargs / AORecipeKwargs read (huggingface/accelerate
# @16cb6eb, utils/launch.py `setup_fp8_env`, utils/dataclasses.py). Its TE path builds
# DelayedScaling (or MXFP8BlockScaling), its AO path torchao's default (tensorwise) config.
FP8_CONFIG = {"te-delayed": {"backend": "TE", "fp8_format": "HYBRID", "amax_history_len": 1024},
              "te-mxfp8": {"backend": "TE", "use_mxfp8_block_scaling": True},
              "te-current": {"backend": "TE"},
              "torchao-tensorwise": {"backend": "AO"},
              "torchao-rowwise": {"backend": "AO"}}
# recipes accelerate's config cannot name: what the script has to pass itself
FP8_IN_SCRIPT = {
    "te-current": "accelerate builds only TE's DelayedScaling/MXFP8: run the forward under "
                  "transformer_engine.pytorch.autocast(recipe=Float8CurrentScaling()) in the "
                  "script",
    "torchao-rowwise": "pass Accelerator(kwargs_handlers=[AORecipeKwargs(config="
                       "Float8LinearConfig.from_recipe_name('rowwise'))])"}


def mixed_precision(ln: Launch) -> str:
    """accelerate's mixed_precision: the autocast dtype of an AMP plan, 'fp8' for an FP8 plan;
    'no' otherwise (a pure fp16/bf16 plan casts the model itself, as the header says)."""
    p = ln.precision
    if p.fp8:
        return "fp8"
    if p.amp:
        return "fp16" if p.is_fp16 else "bf16"
    return "no"


def config(ln: Launch) -> dict:
    s = ln.strategy
    procs = ln.nodes * ln.procs_per_node
    c: dict = {"compute_environment": "LOCAL_MACHINE", "debug": False,
               "mixed_precision": mixed_precision(ln), "num_machines": ln.nodes,
               "num_processes": procs, "machine_rank": 0, "main_training_function": "main",
               "rdzv_backend": "static" if ln.nodes == 1 else "c10d",
               "same_network": True, "use_cpu": False, "downcast_bf16": "no",
               "enable_cpu_affinity": False, "gpu_ids": "all"}
    if ln.nodes > 1:
        c.update(main_process_ip="NODE0_ADDRESS", main_process_port=DEFAULT_PORT)
    if ln.precision.fp8:
        c["fp8_config"] = dict(FP8_CONFIG[ln.precision.fp8])
    if ln.accelerator_kind == "tpu":
        c.update(distributed_type="XLA", num_processes=ln.devices)
        c.pop("gpu_ids")
    elif s.fsdp:
        c["distributed_type"] = "FSDP"
        c["fsdp_config"] = {
            "fsdp_version": 1,
            "fsdp_sharding_strategy": "HYBRID_SHARD" if s.hybrid else "FULL_SHARD",
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_backward_prefetch": "BACKWARD_PRE", "fsdp_forward_prefetch": False,
            "fsdp_offload_params": ln.offload != "none",
            "fsdp_state_dict_type": "SHARDED_STATE_DICT", "fsdp_sync_module_states": True,
            "fsdp_use_orig_params": True, "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_activation_checkpointing": ln.grad_checkpointing not in ("none", "")}
    elif s.name.startswith("zero"):
        c["distributed_type"] = "DEEPSPEED"
        stage = s.order
        ds = {"zero_stage": stage, "gradient_accumulation_steps": ln.grad_accum,
              "gradient_clipping": ln.max_grad_norm or 0.0,
              "offload_optimizer_device": "cpu" if ln.offload != "none" else "none",
              "offload_param_device": "cpu" if ln.offload == "optimizer+params" else "none",
              "zero3_init_flag": stage == 3}
        if stage == 3:
            ds["zero3_save_16bit_model"] = True
        if ln.nodes > 1:
            ds["deepspeed_multinode_launcher"] = "standard"
        c["deepspeed_config"] = ds
    elif s is DDP and procs > 1:
        c["distributed_type"] = "MULTI_GPU"
    else:   # single, or DataParallel (one process; the script wraps the model itself)
        c["distributed_type"] = "NO"
        c["num_processes"] = 1
    return c


def render(ln: Launch) -> dict[str, str]:
    note = ""
    if ln.strategy is DP:
        note = ("# DataParallel: one process over all GPUs (the script wraps the model in "
                "torch.nn.DataParallel); accelerate runs it as one process.\n")
    if ln.precision.fp8 in FP8_IN_SCRIPT:
        note += f"# {ln.precision.name}: {FP8_IN_SCRIPT[ln.precision.fp8]}\n"
    ga = (f"# gradient accumulation: {ln.grad_accum} -- pass "
          f"Accelerator(gradient_accumulation_steps={ln.grad_accum}) (the DeepSpeed plugin "
          "carries it itself)\n")
    if ln.syncs_each_micro_batch:     # not a key of accelerate's config file: the script's
        ga = (f"# gradient accumulation: {ln.grad_accum}, the gradients reduced after every "
              "micro-batch as planned -- pass Accelerator(gradient_accumulation_plugin="
              f"GradientAccumulationPlugin(num_steps={ln.grad_accum}, sync_each_batch=True))\n")
    text = (ln.header() + note + ga + "# launch: accelerate launch --config_file "
            "accelerate_config.yaml " + shlex.join(ln.script_command())
            + ("  (on each node, with --machine_rank N and main_process_ip set to node 0)"
               if ln.nodes > 1 else "") + "\n"
            + yaml.safe_dump(config(ln), sort_keys=True))
    return {"accelerate_config.yaml": text}
