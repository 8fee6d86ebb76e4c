"""What ZeRO-Offload adds to a step: the optimizer's update on the host CPU and the copies over
the host link (DeepSpeed `offload_optimizer` / `offload_param` with device "cpu").

With the optimizer state offloaded (Ren et al., "ZeRO-Offload", USENIX ATC'21, section 4.1: the
single-GPU schedule; DeepSpeed's stage 1-3 offload code), each rank keeps its partition of the
fp32 parameters and both Adam moments in host memory. Per optimizer step:

    backward   each micro-batch's reduced gradient partition (the engine's dtype: DeepSpeed runs
               the model in 16 bits under fp16/bf16, sharding.py) is copied device -> host as its
               bucket is ready (async, pinned): hidden under the backward, what exceeds it exposed
    update     DeepSpeed's CPUAdam over the rank's P / N trainable parameters, after the last
               backward; the device waits (DeepSpeed's default: no delayed parameter update)
    copy back  the updated parameters (the model's dtype) host -> device, then ZeRO's all-gather
               (comm.py); under offload_param they stay on the host and are fetched below

    t_update = (P / N) / min(cores_per_rank x r_core, r_max)

`r_core`: parameters one core updates a second (data/offload.json, scripts/cpu_adam_rate.py:
torch's fused CPU AdamW, the same one-pass SIMD update as CPUAdam). Adam reads parameter,
gradient and both moments and writes three back (28 bytes per parameter), so a core runs at
the memory bandwidth it gets, and a whole host at its memory system's: `r_max`, the fastest
published CPUAdam step of one process (DeepSpeed PR #735: 11.6B parameters in 8.2 s). Cores per
rank: the platform's cores over the ranks on that host (data/platforms.csv `cpu_cores`), else
the reference host's 16 per GPU (a DGX A100). The rank's GPU runs no optimizer kernels.

With the parameters offloaded too (ZeRO-3 `offload_param`), every forward and backward (and a
checkpointed block's recomputation) fetches the rank's W / N parameter bytes host -> device
before the all-gather, prefetched under the compute: what exceeds the micro-batch's forward and
backward is exposed.

PyTorch FSDP's CPU offload (`CPUOffload(offload_params=True)`, what accelerate's and torchtune's
offload flags set, export/) keeps the parameters, their gradients and the optimizer on the host
whatever is asked: the parameters are fetched as above, the gradients copied down after each
reduce-scatter, and the update is torch.optim's own on CPU tensors (its single-tensor loop, the
default there: `torch_adam_params_per_s_per_core`), the parameters updated in place on the host.

Links: PCIe lanes x the generation's rate per lane x the measured fraction of it a pinned copy
reaches (0.88: S02's PCIe 5 x16 H2D, 55.43 of 63.0 GB/s), per direction; NVLink-C2C (GB200) at
its per-direction rate. Not modelled: the paper's delayed parameter update (DPU), which overlaps
the update with the next step's forward and backward (not DeepSpeed's default schedule); NVMe
offload; several processes' updates contending for one host's memory beyond `r_max` each.
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from importlib import resources

from .comm import DEVICES_PER_NODE


NOTE = "CPU offload: "      # how the step's note on it begins (plan/verdict.py shows it)


@functools.cache
def _data() -> dict:
    return json.loads((resources.files("trainplan") / "data" / "offload.json").read_text())


def host_link_bytes_per_s(accel) -> tuple[float, str]:
    """(bytes/s per direction a pinned copy reaches between host and device, how it was read)."""
    d = _data()
    given = accel.host_link
    link = given.lower()
    for name, rate in d["link_bytes_per_s"].items():
        if not name.startswith("_") and link.startswith(name):
            return rate, given
    m = re.match(r"pcie(\d)\s*x(\d+)", link)
    lanes = d["pcie_lane_bytes_per_s"]
    if m and f"pcie{m.group(1)}" in lanes:
        return lanes[f"pcie{m.group(1)}"] * int(m.group(2)) * d["pcie_efficiency"], given
    return (lanes["pcie4"] * 16 * d["pcie_efficiency"],
            f"{given or 'unknown link'} taken as pcie4 x16")


def cpu_adam_params_per_s(cores_per_rank: float, fused: bool = True) -> float:
    """Parameters a rank's Adam update on the host runs through a second with `cores_per_rank`
    cores (module docstring): DeepSpeed's CPUAdam (`fused`), else torch.optim's single-tensor
    loop, whose memory bound is lower by the ratio of the two per-core rates."""
    d = _data()
    fast = d["cpu_adam_params_per_s_per_core"]
    per_core = fast if fused else d["torch_adam_params_per_s_per_core"]
    return min(max(1.0, cores_per_rank) * per_core,
               d["cpu_adam_params_per_s_max"] * per_core / fast)


@dataclass(frozen=True)
class Offloaded:
    """Seconds ZeRO-Offload adds to one optimizer step (module docstring)."""

    update_s: float = 0.0        # CPUAdam on the host (replaces the GPU's optimizer kernels)
    link_s: float = 0.0          # host-link copies not hidden under compute
    notes: list = field(default_factory=list)

    @property
    def replaces_device_update(self) -> bool:
        return self.update_s > 0.0


def offload_time(job, accel, meta: dict, n: int, t_fwd: float, t_bwd: float,
                 cpu_cores: int | None) -> Offloaded:
    """What offloading adds to one step of `job` on `n` devices of `accel` (module docstring).
    `t_fwd`, `t_bwd`: one micro-batch's forward and backward, the windows copies hide in."""
    off = job.offload
    if not off.states:
        return Offloaded()
    fsdp = job.strategy.fsdp          # CPUOffload: parameters, gradients and update on the host
    shards = job.strategy.optimizer_shards(n)
    ranks_here = min(n, DEVICES_PER_NODE)
    if cpu_cores:
        cores, whose = cpu_cores / ranks_here, "the platform's"
    else:
        cores, whose = _data()["reference_cores_per_device"], "the reference host's"
    params = meta["params_trainable"] / shards
    update = params / cpu_adam_params_per_s(cores, fused=not fsdp)
    link, how = host_link_bytes_per_s(accel)
    k = max(1, int(job.grad_accum))
    # DeepSpeed's engine runs the model in the compute dtype; FSDP keeps its flat parameters and
    # their gradients on the host as stored (fp32 under AMP)
    b = job.precision.compute_bytes
    grads = meta["gradient_bytes"] / shards if fsdp else params * b
    exposed = k * max(0.0, grads / link - t_bwd)              # device -> host, under backward
    passes = 0
    if off.params or fsdp:
        passes = 3 if job.grad_checkpointing != "none" else 2
        # the engine's weights: cast to its dtype, 4-bit storage keeping its bytes
        weights = (meta["weight_bytes"] if fsdp else
                   min(meta["weight_bytes"], meta["params_total"] * b)) / max(1, n)
        exposed += k * max(0.0, passes * weights / link - (t_fwd + t_bwd))
    else:                          # the updated partition back, serial (DeepSpeed stage 1-2)
        exposed += grads / link
    runs = "torch.optim on FSDP's CPU offload" if fsdp else "DeepSpeed CPUAdam"
    notes = [f"{NOTE}the optimizer update runs on the host ({runs}, "
             f"{params / 1e6:,.0f}M parameters per process on {cores:g} of {whose} cores: "
             f"{update * 1e3:,.0f} ms), copies over {how} at {link / 1e9:.1f} GB/s"]
    if passes:
        notes[-1] += f"; the parameters fetched from the host {passes} times per micro-batch"
    return Offloaded(update, exposed, notes)
