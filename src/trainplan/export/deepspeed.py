"""`--to deepspeed`: a DeepSpeed JSON config (ZeRO stage, offload, micro-batch, accumulation,
fp16 with dynamic loss scaling or bf16), the `deepspeed` launch line and, multi-node, a hostfile
template.

JSON has no comments: the header is the `_comment` list at the top of `ds_config.json`
(DeepSpeed ignores keys it does not know, see test) and a `#` header in `deepspeed.sh` and
`hostfile`. Bucket sizes are left at DeepSpeed's defaults: the plan's memory and time do not
depend on them (it models ZeRO's sharded states and collectives, not bucket sizes), said in the
header. A DDP plan exports ZeRO stage 0 (data parallel, no sharding); FSDP exports stage 3, the
same sharding (strategy.py: "as zero3"); hybrid FSDP too, with a note: DeepSpeed has no replicas
of a node-sharded state (ZeRO++'s hpZ keeps only a second copy of the weights), so ZeRO-3 shards
over every GPU, with less memory and more traffic between nodes than planned. The script, its
arguments and the environment are shell-quoted in `deepspeed.sh`."""
from __future__ import annotations

import json

from .common import DEFAULT_PORT, Launch
from .torchrun import _shell, env_lines


def zero_stage(ln: Launch) -> int:
    return 3 if ln.strategy.fsdp else ln.strategy.order


def config(ln: Launch) -> dict:
    stage = zero_stage(ln)
    world = ln.nodes * ln.procs_per_node
    c: dict = {
        "_comment": ln.header("").splitlines() + [
            "Bucket sizes: DeepSpeed's defaults; the plan does not depend on them."],
        "train_micro_batch_size_per_gpu": ln.micro_batch_size,
        "gradient_accumulation_steps": ln.grad_accum,
        "train_batch_size": ln.micro_batch_size * ln.grad_accum * world,
        "gradient_clipping": ln.max_grad_norm or 0.0,      # DeepSpeed's 0: no clipping
        "steps_per_print": max(1, ln.checkpoint_every_steps),
        "wall_clock_breakdown": False,
        "zero_optimization": {"stage": stage},
    }
    if ln.strategy.hybrid and ln.nodes > 1:
        c["_comment"].append("Planned: FSDP hybrid sharding (within each node, replicas across "
                             "nodes). DeepSpeed has no such stage: ZeRO-3 here shards over every "
                             "GPU, holding less memory and sending more between nodes.")
    z = c["zero_optimization"]
    if stage >= 1 and ln.offload != "none":
        z["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if stage == 3:
        if ln.offload == "optimizer+params":
            z["offload_param"] = {"device": "cpu", "pin_memory": True}
        z["stage3_gather_16bit_weights_on_model_save"] = True
    if stage >= 2:
        z.update(overlap_comm=True, contiguous_gradients=True)
    p = ln.precision
    if p.is_fp16:
        # dynamic loss scaling (loss_scale 0), DeepSpeed's documented defaults
        c["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16,
                     "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1}
    elif p.is_bf16:
        c["bf16"] = {"enabled": True}
    return c


def render(ln: Launch) -> dict[str, str]:
    out = {"ds_config.json": json.dumps(config(ln), indent=2) + "\n"}
    world_note = ""
    if ln.nodes > 1:
        out["hostfile"] = (ln.header() + "# one line per node: its address and its GPUs (slots); "
                           "node 0 hosts the rendezvous\n"
                           + "".join(f"node-{i} slots={ln.procs_per_node}\n" for i in range(ln.nodes)))
        launch = (f"deepspeed --hostfile hostfile --num_nodes {ln.nodes} --num_gpus "
                  f"{ln.procs_per_node} --master_port {DEFAULT_PORT}")
        world_note = "# replace node-0.. in hostfile with your hosts (passwordless ssh between them)\n"
    else:
        launch = f"deepspeed --num_gpus {ln.procs_per_node}"
    out["deepspeed.sh"] = ("#!/usr/bin/env bash\n" + ln.header() + world_note + "set -euo pipefail\n"
                           'cd "$(dirname "$0")"\n' + env_lines(ln)
                           + f"exec {launch} {_shell(ln.script_command())} "
                           "--deepspeed ds_config.json \"$@\"\n")
    return out
