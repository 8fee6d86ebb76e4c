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
                                               (packed quantised weights as stored)
                                             + reserved only (FSDP1): up to 2 units freed with
                                               record_stream that the allocator cannot reuse yet
    backward                                 + the current unit's unsharded gradient, and the
                                               previous one's under reduce-scatter
    with gradient accumulation               + every unsharded gradient, where the micro-batches
                                               before the last run under no_sync (accelerate's
                                               and the HF Trainer's default; not with
                                               sync_each_batch, Composer or torchtune:
                                               Strategy.reduces_each_micro_batch)
    saving a checkpoint (FULL_STATE_DICT,     weights and optimizer states / N, no gradients,
    accelerate's FSDP1 default)              + the largest unit gathered in the stored dtype and
                                               its local shard copied: unit x (1 + 1/N)

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

from ..strategy import ZERO1, ZERO2, ZERO3

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
    job.strategy (FSDP or ZeRO; others are left as they are) and expert parallelism. Mutates `c`.
    FSDP's hybrid sharding (hsdp) is FSDP over the devices of one node, each node holding a
    replica (strategy.py)."""
    s = job.strategy
    _expert_parallel(c, job, trace)
    if s.fsdp:
        _fsdp(c, job, trace, phase, s.shard_devices(n))
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


def _fsdp_units(job, trace) -> tuple[float, float]:
    """(largest unit, root unit) as FSDP all-gathers them: in the compute dtype, packed quantised
    weights as stored (tracer.py `_unit_bytes`); traces without those figures scale the stored
    bytes by compute / stored."""
    half = job.precision.compute_bytes / _stored_bytes(trace)
    unit = trace.largest_block_gathered_bytes or trace.largest_block_param_bytes * half
    root = trace.root_gathered_bytes or trace.root_param_bytes * half
    return float(unit), float(root)


def _fsdp(c: dict[str, float], job, trace, phase: str, n: int) -> None:
    half = job.precision.compute_bytes / _stored_bytes(trace)
    trainable = trace.trainable_param_bytes / max(1, trace.weight_bytes)
    c["weights"] /= n
    c["gradients"] /= n
    c["optimizer_states"] /= n
    if phase == "optimizer":
        c["temporaries"] /= n
        c["weight_casts"] = 0
        return
    unit, root = _fsdp_units(job, trace)
    c["weight_casts"] = root + value("fsdp_units_in_flight") * unit
    c[STREAM_HELD] = value("fsdp_pending_free_units") * unit
    if phase == "backward":
        c["gradients"] += (1 + value("fsdp_reduce_scatter_units_in_flight")) * unit * trainable
    if holds_full_gradients(job):
        c["gradients"] += trace.trainable_param_bytes * half


def holds_full_gradients(job) -> bool:
    """FSDP with accumulation under no_sync: every unsharded gradient is held from the first
    micro-batch to the last (module docstring; Strategy.reduces_each_micro_batch)."""
    return (job.strategy.fsdp and job.grad_accum > 1
            and not job.strategy.reduces_each_micro_batch(job.sync_each_batch))


# bytes the caching allocator holds reserved but not allocated at a phase's peak (blocks freed
# with record_stream on another stream): they count in what the device must hold, not in
# max_memory_allocated (memory.py)
STREAM_HELD = "stream_held"


def checkpoint_phase(c: dict[str, float], job, trace, n: int) -> dict[str, float] | None:
    """What one device holds while a checkpoint is saved, from the optimizer phase's categories
    on that device (`c`): None where saving gathers nothing (module docstring; data/sharding.json
    `fsdp_full_state_dict_on_save`)."""
    n = job.strategy.shard_devices(n)
    if not job.strategy.fsdp or n < 2 or not value("fsdp_full_state_dict_on_save"):
        return None
    unit = float(max(trace.largest_block_param_bytes, trace.root_param_bytes))
    out = dict.fromkeys(c, 0.0)
    out["weights"], out["optimizer_states"] = c["weights"], c["optimizer_states"]
    out["temporaries"] = unit * (1 + 1 / n)
    return out


def largest_trainable_tensor_bytes(trace) -> int:
    """Bytes of the largest trainable parameter tensor (bounded by the largest leaf module's
    trainable parameters: a leaf holds one weight and maybe a bias), in the trainable dtype. A
    trace stitched from a cut one (trace/derive/stitch.py) has that one's leaves and copies of
    its last block's, so the largest is read off the cut trace's module table, not the whole
    stack's (made where first read: an 80-block model's, for each of the ~200 sharded
    evaluations of a plan over every platform)."""
    rows = (trace.derived.whole_of or trace).modules
    parents = {m.name.rsplit(".", 1)[0] for m in rows if "." in m.name}
    leaves = [m for m in rows if m.name != "(total)" and m.name not in parents]
    largest = max((m.trainable_params for m in leaves), default=trace.params_trainable)
    per_param = trace.trainable_param_bytes / max(1, trace.params_trainable)
    return int(largest * per_param)


def _engine_weights(c_weights: float, trace, b: int, stored: float) -> float:
    """The weights once DeepSpeed's engine has cast the module to `b` bytes (fp16/bf16 enabled:
    engine.py:1224-1237 `module.half()` / `.bfloat16()`, which casts floating-point tensors
    only): every floating-point weight in b bytes, packed quantised weights (uint8) as they are.
    Scaled to the share of the weights live at this phase. Traces without the split scale all
    weights by b / stored."""
    if not (trace.floating_weight_elements or trace.packed_weight_bytes):
        return c_weights * b / stored
    cast = trace.packed_weight_bytes + trace.floating_weight_elements * b
    return c_weights * cast / max(1, trace.weight_bytes)


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
    c["weights"] = _engine_weights(c["weights"], trace, b, stored)
    live = c["gradients"] / max(1, trace.gradient_bytes)    # share of gradients live at this peak
    bucket_elements, prefetch = _buckets(trace)
    bucket = bucket_elements * b
    # ZeRO-Offload (stages 1-2): the gradient partition lives in pinned host memory; the device
    # keeps one parameter's gradient buffer (stage_1_and_2.py:473-485
    # temp_grad_buffer_for_gpu_offload, the size of the largest parameter) beside the bucket
    offload = job.offload != "none" and s is not ZERO3
    partition = largest_trainable_tensor_bytes(trace) * b / stored if offload else b * p_t / n
    if s is ZERO1 and phase in FWD_BWD:      # reduced into the partition at the boundary
        c["gradients"] = live * b * p_t + partition
    else:
        c["gradients"] = partition
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
