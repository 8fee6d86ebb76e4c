"""What a sharded strategy keeps on each device, as the libraries allocate it by default.

The trace is of one device running the whole model; `per_device` turns one phase's live bytes by
category into one device's under FSDP or DeepSpeed ZeRO over N devices. Every default it uses is
in data/sharding.json with its source line (docs/sharding_memory.md has the derivations).

PyTorch FSDP, FULL_SHARD with the blocks wrapped (FSDP1 and FSDP2 alike):

    weights, gradients, optimizer states     / N, in the stored dtype (accelerate up-casts the
                                             shards to fp32 under mixed precision: 16 B/param / N)
    forward and backward                     + the root unit (every parameter outside the blocks:
                                               embeddings, final norm, head), unsharded from its
                                               forward to the end of backward
                                             + 2 units in flight (the one computing, the one
                                               all-gathered ahead), unsharded, compute dtype
    backward                                 + the current unit's unsharded gradient
    with gradient accumulation               + every unsharded gradient (no_sync: accelerate and
                                               the HF Trainer accumulate full gradients)

DeepSpeed ZeRO (fp16/bf16 enabled: the model itself is cast to 16 bits, no autocast copies; the
ZeRO optimizer keeps fp32 master weights, counted with the optimizer states as the ZeRO paper's
K = 12 bytes per parameter for Adam):

    stage   weights           gradients                                    states + master
    1       2 B x P           2 B x P (full until the boundary) + 2 B P/N  (K x P) / N
    2       2 B x P           2 B x P / N                                  (K x P) / N
    3       2 B x P / N       2 B x P / N                                  (K x P) / N

plus the contiguous gradient bucket (reduce_bucket_size elements in 16 bits: allocated in each
backward for stages 1-2, kept for stage 3), and for stage 3 the gathered parameters: the block
computing, the prefetch bucket, and what the reuse distance keeps gathered from the end of
forward into backward. In fp32, the same with 4 bytes and no master copy. Bucket sizes are those
of a DeepSpeed config launched through accelerate or the HF Trainer ("auto": hidden^2 elements,
prefetch 0.9 hidden^2), DeepSpeed's own defaults (5e8, 5e7 elements: a 1 GB bucket whatever the
model's size) for a model without a known hidden size.
"""
from __future__ import annotations

import functools
import json
from importlib import resources

from ..strategy import FSDP, ZERO1, ZERO2, ZERO3

FWD_BWD = ("forward", "backward")


@functools.cache
def defaults() -> dict:
    """data/sharding.json: each library default with its source."""
    return json.loads((resources.files("trainplan") / "data" / "sharding.json").read_text())


def value(key: str) -> float:
    return float(defaults()[key]["value"])


def _stored_bytes(trace) -> float:
    """Bytes per trainable parameter as stored (4 under AMP or fp32, 2 in pure fp16/bf16)."""
    return trace.trainable_param_bytes / max(1, trace.params_trainable) or 4.0


def per_device(c: dict[str, float], job, trace, phase: str, n: int) -> None:
    """Rewrite phase categories `c` (single-device bytes) as one of `n` devices holds them under
    job.strategy (FSDP or ZeRO; others are left as they are) and expert parallelism. Mutates `c`."""
    s = job.strategy
    _expert_parallel(c, job, trace)
    if s is FSDP:
        _fsdp(c, job, trace, phase, n)
    elif s in (ZERO1, ZERO2, ZERO3):
        _zero(c, job, trace, phase, n)


def _expert_parallel(c: dict[str, float], job, trace) -> None:
    """Expert parallelism (DeepSpeed-MoE `ep_size`, Megatron `expert_model_parallel_size`,
    torchtitan, transformers' `distributed/expert_parallel.py`): each of `ep` ranks holds
    num_experts / ep experts (DeepSpeed moe/layer.py requires num_experts % ep_size == 0). Where
    the strategy replicates weights, gradients or optimizer states, their expert share falls by
    ep; where it shards them already (ZeRO, FSDP), experts are sharded over the N/ep ranks of
    their expert-data-parallel group, which is the same 1/N. Gradients and states live at a
    phase's peak in proportion, so their expert share (of the trainable bytes) is what falls.
    Activations are unchanged under uniform routing: each rank computes about T x k expert rows
    either way."""
    ep = job.expert_parallel
    if ep == 1 or not trace.expert_param_bytes:
        return
    s, cut = job.strategy, 1 - 1 / ep
    t = trace.expert_trainable_bytes / max(1, trace.trainable_param_bytes)
    if not s.shards_weights:        # every weight is live in every phase
        c["weights"] = max(0.0, c["weights"] - trace.expert_param_bytes * cut)
    if not s.shards_gradients:
        c["gradients"] *= 1 - t * cut
    if not s.shards_optimizer:
        c["optimizer_states"] *= 1 - t * cut


def _fsdp(c: dict[str, float], job, trace, phase: str, n: int) -> None:
    half = job.precision.compute_bytes / _stored_bytes(trace)   # gathered in the compute dtype
    trainable = trace.trainable_param_bytes / max(1, trace.weight_bytes)
    c["weights"] /= n
    c["gradients"] /= n
    c["optimizer_states"] /= n
    if phase == "optimizer":
        c["temporaries"] /= n
        c["weight_casts"] = 0
        return
    unit = trace.largest_block_param_bytes * half
    root = trace.root_param_bytes * half
    c["weight_casts"] = root + value("fsdp_units_in_flight") * unit
    if phase == "backward":
        c["gradients"] += unit * trainable
    if job.grad_accum > 1 and value("fsdp_no_sync_with_accumulation"):
        c["gradients"] += trace.trainable_param_bytes * half


def _buckets(trace) -> tuple[float, float]:
    """(reduce bucket, stage-3 prefetch) in elements: accelerate's / the HF Trainer's "auto"
    values from the hidden size, else DeepSpeed's defaults (data/sharding.json)."""
    h = trace.hidden_size
    if h:
        auto = defaults()["zero_auto_per_hidden_squared"]["value"]
        return auto["reduce_bucket_size"] * h * h, auto["stage3_prefetch_bucket_size"] * h * h
    return value("zero_reduce_bucket_elements"), value("zero3_prefetch_elements")


def _zero(c: dict[str, float], job, trace, phase: str, n: int) -> None:
    b = job.precision.compute_bytes
    stored = _stored_bytes(trace)
    p_t = trace.params_trainable
    s = job.strategy
    # the trace's states are in the stored dtype; DeepSpeed keeps them in fp32, with a fp32
    # master copy of the trainable parameters when the model runs in 16 bits
    states = c["optimizer_states"] * (4 / stored if job.precision.pure_half else 1.0)
    master = p_t * value("zero_master_bytes_per_param") if b == 2 else 0
    c["optimizer_states"] = (states + master) / n
    c["weights"] *= b / stored
    live = c["gradients"] / max(1, trace.gradient_bytes)    # share of gradients live at this peak
    bucket_elements, prefetch = _buckets(trace)
    bucket = bucket_elements * b
    if s is ZERO1 and phase in FWD_BWD:      # reduced into the partition at the boundary
        c["gradients"] = live * b * p_t + b * p_t / n
    else:
        c["gradients"] = b * p_t / n
    if phase == "backward" or s is ZERO3:
        c["gradients"] += bucket
    c["weight_casts"] = 0
    if s is ZERO3:
        c["weights"] /= n
        if phase in FWD_BWD:
            block = trace.largest_block_param_bytes / stored
            gathered = min(trace.params_total, value("zero3_max_reuse_distance_elements") / 2
                           + block + prefetch)
            c["weight_casts"] = b * gathered
    if phase == "optimizer":
        c["temporaries"] /= n
