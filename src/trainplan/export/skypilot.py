"""`--to skypilot`: a SkyPilot task YAML (`sky launch sky_task.yaml`) and, where the plan expects
interruptions (more than one session, or `--spot`), a managed-job variant on spot instances with
a checkpoint bucket mounted (`sky jobs launch sky_task_spot.yaml`).

Accelerator names are SkyPilot's (`T4:2`, `A100-80GB:8`); `ACCELERATORS` maps the catalog's ids.
Disk: room for `KEEP_ON_DISK` of the plan's checkpoints plus `DISK_BASE_GB`, at least 256 GB.
Values are YAML-dumped; `run` and `setup` are shell scripts, quoted as torchrun.sh is."""
from __future__ import annotations

import math

import yaml

from .common import DEFAULT_PORT, Launch, slug
from .torchrun import _shell, torchrun_args

ACCELERATORS = {
    "t4": "T4", "p100": "P100", "v100-sxm2-16gb": "V100", "v100-sxm2-32gb": "V100-32GB",
    "a100-sxm4-40gb": "A100", "a100-pcie-40gb": "A100", "a100-sxm4-80gb": "A100-80GB",
    "a100-pcie-80gb": "A100-80GB", "a10g": "A10G", "a10": "A10", "l4": "L4", "l40s": "L40S",
    "h100-sxm": "H100", "h100-pcie": "H100", "h200": "H200", "rtx-3060": "RTX3060",
    "rtx-3090": "RTX3090", "rtx-4090": "RTX4090", "rtx-a6000": "RTXA6000",
    "tpu-v2-8": "tpu-v2-8", "tpu-v3-8": "tpu-v3-8", "tpu-v5e-8": "tpu-v5litepod-8", "tpu-v5e-1": "tpu-v5litepod-1",
}
KEEP_ON_DISK = 3
DISK_BASE_GB = 100
CKPT_DIR = "/checkpoints"


def accelerators(ln: Launch) -> str:
    name = ACCELERATORS.get(ln.accelerator_id, ln.accelerator_id.upper())
    count = 1 if ln.accelerator_kind == "tpu" else ln.procs_per_node
    return f"{name}:{count}"


def disk_gb(ln: Launch) -> int:
    ck = (ln.checkpoint_bytes or 0) * KEEP_ON_DISK / 1e9
    return max(256, int(math.ceil(ck + DISK_BASE_GB)))


def task(ln: Launch, spot: bool) -> dict:
    if ln.nodes > 1:
        args = torchrun_args(ln, endpoint=f"$MASTER_ADDR:{DEFAULT_PORT}",
                             node_rank="$SKYPILOT_NODE_RANK", rdzv_id="$SKYPILOT_TASK_ID")
        run = ('MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | head -n1)\n'
               "torchrun " + _shell(args) + " " + _shell(ln.script_command()) + "\n")
    elif ln.procs_per_node > 1:
        run = "torchrun " + _shell(torchrun_args(ln)) + " " + _shell(ln.script_command()) + "\n"
    else:
        run = "python " + _shell(ln.script_command()) + "\n"
    envs = dict(ln.env())
    envs["TRAINPLAN_CHECKPOINT_DIR"] = CKPT_DIR if spot else "checkpoints"
    res: dict = {"accelerators": accelerators(ln), "disk_size": disk_gb(ln)}
    t: dict = {"name": slug(ln.job_name, limit=60),
               "num_nodes": ln.nodes, "resources": res, "workdir": ".", "envs": envs,
               "setup": "pip install -r requirements.txt || true\n", "run": run}
    if spot:
        res["use_spot"] = True
        res["job_recovery"] = {"strategy": "EAGER_NEXT_REGION", "max_restarts_on_errors": 3}
        t["file_mounts"] = {CKPT_DIR: {"name": "CHANGE-ME-trainplan-checkpoints", "mode": "MOUNT"}}
    return t


def render(ln: Launch, spot: bool | None = None) -> dict[str, str]:
    hdr = ln.header() + (f"# Disk: {KEEP_ON_DISK} checkpoints of the plan's size + "
                         f"{DISK_BASE_GB} GB, at least 256 GB.\n")
    out = {"sky_task.yaml": hdr + "# sky launch -c trainplan sky_task.yaml\n"
           + yaml.safe_dump(task(ln, False), sort_keys=False)}
    if spot or (spot is None and ln.sessions > 1):
        out["sky_task_spot.yaml"] = (
            hdr + "# Managed job on spot instances: preempted runs restart and trainplan.guard "
            f"resumes from {CKPT_DIR} (a bucket: rename CHANGE-ME). sky jobs launch "
            "sky_task_spot.yaml\n" + yaml.safe_dump(task(ln, True), sort_keys=False))
    return out
