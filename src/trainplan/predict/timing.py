"""Step-time model: one optimizer step of a traced job on one accelerator, in seconds.

Every op of the trace is timed (forward, backward, recomputed forward, optimizer), as a roofline
with size-dependent efficiency (op_times):

    t_compute = (flops + f_half) / (peak(dtype, tensor cores?) x clock x e_max)
    t_memory  = (bytes x passes + b_half) / (bandwidth x bw_eff)
    t_op      = max(t_compute, t_memory, host_op_s)

`peak` is the catalog's dense rate for the dtype the kernel computes in; without tensor cores for
that dtype the CUDA-core rate (P100 fp16 = 18.7e12 non-tensor; T4 fp32 = 8.1e12; bf16 where
unsupported runs at the fp32 rate -- the memory layer reports it as unsupported). Depthwise
convolutions have no tensor-core kernels: fp32 CUDA-core rate, their own efficiency. `clock` is
`sustained_clock_fraction` (T4 0.566 under its 70 W cap, S38). fp32 jobs on Ampere+ run
convolutions in TF32 (cuDNN's `allow_tf32` defaults to True), matmuls in fp32 (PyTorch >= 1.12).
`e_max` of tensor-core matmuls is the measured best-shape ceiling of the device where S01 has it
(A100 86.9%, H100 80.3%), else fitted; fused attention uses FlashAttention-2's published 50-73%
of peak (midpoint). `f_half` / `b_half` are the sizes at which a kernel reaches half its
ceiling (too few blocks to fill the SMs, ramp-up and tail). NCHW tensor-core convolutions pay
cuDNN's NHWC transposes (`passes` > 1). `host_op_s` is what eager PyTorch spends on the CPU to
issue one op (Python, dispatcher, launch); kernels run asynchronously, so an op costs the larger
of the two. The fitted parameters come from `scripts/calibrate_time.py` (data/efficiency.json,
with the fit's split and provenance; held-out errors in validation/results/time_validation.md).

One optimizer step = grad_accum x micro-batch + optimizer + exposed communication + data wait.
Collectives (ring algorithm, S02): an all-reduce moves 2(n-1)/n x payload per device, a
reduce-scatter or an all-gather (n-1)/n x payload, at `interconnect_bytes_per_s` x an achievable
fraction (~0.8 of the unidirectional spec on NVLink, S02: A100 234.9 GB/s of 300; lower on PCIe,
S39); across nodes the node's NIC bandwidth. What each strategy can hide is in `_comm`. The input
pipeline (`input_pipeline`) delivers workers x samples_per_s_per_worker and overlaps the step
when it has workers.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from importlib import resources

import numpy as np

from ..errors import TrainplanError
from ..precision import Precision
from ..strategy import DDP, DP, SINGLE

PHASES = ("forward", "backward", "optimizer")
FORWARD, BACKWARD, OPTIMIZER = range(len(PHASES))     # OpTable.phase codes
FAMILIES = ("matmul", "attention", "other")
DTYPES = {"float32": 0, "float16": 1, "bfloat16": 2}          # others (int, bool, "") -> 3
# aten ops that the counter records but that launch no kernel (queries, profiler markers)
DDP_BUCKET_BYTES = 25 * 2**20      # torch DDP bucket_cap_mb default (25 MiB): last bucket is exposed
# FSDP/ZeRO-3: the first unit's all-gather has no compute to hide behind. Modelled as one 200 MiB
# unit (8 DDP buckets), the fitted value of the time model (scripts/calibrate_time.py); the
# largest block's parameter bytes (trace.largest_block_param_bytes, in the meta) are the physical
# quantity it stands for and replace it when the time model is refitted (issue 17).
FIRST_GATHER_BYTES = 8 * DDP_BUCKET_BYTES
NODE_NIC_BYTES_PER_S = 200e9       # per 8-GPU node across nodes: 1600 Gbit/s RoCE (S34 setup)
DEVICES_PER_NODE = 8
# XLA compiles the step graph on the host on the first steps of a session. Sourced range
# (performance_notes.md section 3, S37): 100-110 s (Llama 3.1 8B, vLLM on v5e-8/v4-8), 8 min
# (136K-node graph), up to 25-30 min for large graphs; recompiles on every new shape.
XLA_COMPILE_S = 180.0


@dataclass
class OpTable:
    """Ops of one trace, de-duplicated by (name, family, dtype, phase, group channels, flops,
    bytes) with counts."""

    name: np.ndarray          # aten op name (str), e.g. "mm", "native_layer_norm_backward"
    family: np.ndarray
    dtype: np.ndarray
    phase: np.ndarray
    conv: np.ndarray
    flops: np.ndarray
    bytes: np.ndarray
    count: np.ndarray
    group_channels: np.ndarray = None   # convolutions: input channels per group (1 = depthwise)
    meta: dict = field(default_factory=dict)   # model_flops, gradient_bytes, params_total, ...

    COLS = ("name", "family", "dtype", "phase", "conv", "flops", "bytes", "count",
            "group_channels")

    def __post_init__(self):
        if self.group_channels is None:
            self.group_channels = np.zeros(len(self.flops), dtype=np.int64)

    def to_dict(self) -> dict:
        return {"cols": {c: getattr(self, c).tolist() for c in self.COLS}, "meta": self.meta}

    @classmethod
    def from_dict(cls, d: dict) -> "OpTable":
        c = d["cols"]
        ints = {k: np.asarray(c[k], dtype=np.int64) for k in ("family", "dtype", "phase", "count",
                                                              "group_channels") if k in c}
        return cls(name=np.asarray(c["name"], dtype=object), conv=np.asarray(c["conv"], dtype=bool),
                   flops=np.asarray(c["flops"], float), bytes=np.asarray(c["bytes"], float),
                   meta=d["meta"], **ints)


def summarize(trace) -> OpTable:
    """Aggregate `trace.ops` once (memoised on the trace) so every accelerator reuses it."""
    if isinstance(trace, OpTable):
        return trace
    memo = trace.derived
    if "op_table" in memo:
        return memo["op_table"]
    agg: dict[tuple, int] = {}
    for o in trace.ops:
        if o.flops == 0 and o.bytes == 0:
            continue
        key = (o.name, FAMILIES.index(o.family), DTYPES.get(o.dtype, 3), PHASES.index(o.phase),
               "convolution" in o.name, float(o.flops), float(o.bytes),
               int(getattr(o, "group_channels", 0)))
        agg[key] = agg.get(key, 0) + 1
    keys = list(agg) or [("none", 2, 3, 0, False, 0.0, 0.0, 0)]
    arr = list(zip(*keys))
    table = OpTable(np.array(arr[0], dtype=object), np.array(arr[1]), np.array(arr[2]),
                    np.array(arr[3]), np.array(arr[4], bool), np.array(arr[5], float),
                    np.array(arr[6], float), np.array([agg.get(k, 0) for k in keys]),
                    np.array(arr[7], dtype=np.int64),
                    meta={"model_flops": float(trace.model_flops),
                          "gradient_bytes": float(trace.gradient_bytes),
                          "params_total": int(trace.params_total),
                          "params_trainable": int(trace.params_trainable),
                          "weight_bytes": float(trace.weight_bytes),
                          "largest_block_param_bytes": float(trace.largest_block_param_bytes),
                          "moe_dispatch_elements": int(trace.moe_dispatch_elements),
                          "batch_size": int(trace.batch_size),
                          "tokens_per_sample": trace.tokens_per_sample,
                          "channels_last": bool(trace.semantics.channels_last)})
    memo["op_table"] = table
    return table


@functools.lru_cache(maxsize=1)
def load_efficiency() -> dict:
    """Fitted parameters from data/efficiency.json (see its `provenance`)."""
    data = json.loads(resources.files("trainplan.data").joinpath("efficiency.json").read_text())
    return dict(data["params"], matmul_ceiling=data.get("matmul_ceiling", {}))


@dataclass
class StepTime:
    step_time_s: float
    breakdown_s: dict
    samples_per_s: float
    tokens_per_s: float | None
    mfu: float | None
    bound: str
    xla_compile_s: float | None
    n_devices: int = 1
    notes: list = field(default_factory=list)


def _rates(accel, precision: Precision) -> tuple[np.ndarray, np.ndarray]:
    """Peak FLOP/s and tensor-core flag per (dtype code, conv) -> arrays indexed [dtype, conv]."""
    tc = accel.tensor_cores
    tpu = accel.kind == "tpu"
    fp32 = accel.fp32_flops or 0.0
    peak = np.zeros((4, 2))
    tensor = np.zeros((4, 2), dtype=bool)
    for conv in (0, 1):
        use_tf32 = precision.compute == "tf32" or (conv and precision.compute == "fp32")
        if tpu:
            peak[0, conv], tensor[0, conv] = fp32, True
        elif use_tf32 and "tf32" in tc and accel.tf32_flops:
            peak[0, conv], tensor[0, conv] = accel.tf32_flops, True
        else:
            peak[0, conv] = fp32
        if "fp16" in tc and accel.fp16_tensor_flops:
            peak[1, conv], tensor[1, conv] = accel.fp16_tensor_flops, True
        elif tpu:
            peak[1, conv], tensor[1, conv] = accel.bf16_flops or fp32, True
        else:
            peak[1, conv] = accel.fp16_nontensor_flops or fp32
        if accel.supports_bf16 and accel.bf16_flops:
            peak[2, conv], tensor[2, conv] = accel.bf16_flops, ("bf16" in tc) or tpu
        else:
            peak[2, conv] = fp32
        peak[3, conv] = fp32
    return peak * accel.sustained_clock_fraction, tensor


# Kernel classes: what limits an op once it is memory-bound or tiny (see op_times)
K_MATMUL, K_CONV, K_ATTN, K_NORM, K_OTHER, K_OPTIM, K_DWCONV = range(7)
_NORM_OPS = ("batch_norm", "layer_norm", "group_norm", "rms_norm", "softmax", "_log_softmax")


def kernel_classes(table: OpTable) -> np.ndarray:
    """Per unique op, its kernel class (memoised on the table)."""
    cached = getattr(table, "_kclass", None)
    if cached is not None and len(cached) == len(table.flops):
        return cached
    names = {n: (K_NORM if any(k in n for k in _NORM_OPS) else K_OTHER) for n in set(table.name)}
    k = np.array([names[n] for n in table.name], dtype=np.int64)
    k = np.where(table.family == 0, np.where(table.conv, np.where(table.group_channels == 1,
                                                                  K_DWCONV, K_CONV), K_MATMUL), k)
    k = np.where(table.family == 1, K_ATTN, k)
    k = np.where(table.phase == OPTIMIZER, K_OPTIM, k)
    table._kclass = k
    return k


def matmul_ceiling(accel, p: dict) -> float:
    """Best achievable fraction of the dense tensor peak for a matmul on this accelerator.

    Measured maximum achievable matmul FLOP/s (S01, "MAMF", best shape) where the source has the
    device (A100 SXM 86.9%, A100 PCIe 81.1%, H100 SXM 80.3%), else the fitted `tc_emax`.
    """
    return float(p.get("matmul_ceiling", {}).get(accel.id, p["tc_emax"]))


def op_times(table: OpTable, accel, precision: Precision, p: dict) -> tuple[np.ndarray, np.ndarray]:
    """Per unique op: (device time s, is_compute_bound). Vectorised over the op table.

        t_compute = (flops + f_half) / (peak x e_max)
        t_memory  = bytes x passes / (bandwidth x bw_eff)
        t_device  = max(t_compute, t_memory) + kernel_s

    The compute term is flops / (peak x e(f)) with e(f) = e_max f / (f + f_half): small matmuls
    fill too few SMs (wave quantisation, ramp-up), which costs a fixed f_half / (peak e_max) per
    kernel. `kernel_s` is the fixed device time of any kernel (launch latency, ramp-up, tail),
    which is why small elementwise kernels reach a fraction of the bandwidth that large ones
    do. `passes` > 1 only for tensor-core
    convolutions of an NCHW model: cuDNN's tensor-core kernels are NHWC, so it transposes the
    activations in and out (`nchw_passes` extra passes over the op's bytes).
    """
    peak, tensor = _rates(accel, precision)
    conv = table.conv.astype(int)
    k = kernel_classes(table)
    dw = k == K_DWCONV
    # depthwise convolutions have no tensor-core kernels: CUDA cores at the fp32 rate, at their
    # own (low) efficiency -- direct convolution, per-channel reductions in the weight gradient
    pk = np.where(dw, (accel.fp32_flops or 0.0) * accel.sustained_clock_fraction,
                  peak[table.dtype, conv])
    tc = tensor[table.dtype, conv] & ~dw
    attn = k == K_ATTN
    e_max = np.where(tc, np.where(attn, p["attn_emax"], matmul_ceiling(accel, p)),
                     np.where(dw, p["dwconv_emax"], p["cuda_emax"]))
    f_half = np.where(tc, np.where(attn, p["attn_fhalf"], p["tc_fhalf"]), p["cuda_fhalf"])
    f = table.flops
    with np.errstate(divide="ignore", invalid="ignore"):
        t_c = np.where(f > 0, (f + f_half) / (pk * e_max), 0.0)
    passes = np.ones(len(f))
    if not table.meta.get("channels_last", True):
        passes = np.where(tc & (k == K_CONV), 1.0 + p.get("nchw_passes", 0.0), 1.0)
    bw_eff = np.where(k == K_NORM, p.get("norm_bw_eff", p["bw_eff"]), p["bw_eff"])
    bw = accel.memory_bandwidth_bytes_per_s * bw_eff
    t_m = table.bytes * passes / bw
    return np.maximum(t_c, t_m) + p.get("kernel_s", 0.0), t_c >= t_m


def link_fraction(accel) -> float:
    """Achievable share of the link's per-direction spec for NCCL collectives (S02, S39)."""
    ic = accel.interconnect.lower()
    if ic.startswith("nvlink") or ic == "ici":
        return 0.8          # S02: NCCL busbw 78% (A100 NVLink3), 82% (H200); ICI assumed alike
    return 0.5              # PCIe ring without NVLink: poor utilisation (S39); assumed, not measured


def collective_s(kind: str, payload_bytes: float, n: int, accel) -> float:
    """Ring collective time: all-reduce 2(n-1)/n x payload, reduce-scatter/all-gather (n-1)/n (S02).

    Across nodes (n > 8 GPUs) NCCL runs one ring per NIC (channel); each ring enters and leaves a
    node once, so a NIC carries 1/8 of the ring traffic while NVLink carries all of it: the
    node's aggregate NIC bandwidth stands in for the per-GPU link, t = factor x payload /
    min(link, node NIC). With 1600 Gbit/s per node (S34) that is 200 GB/s, below NVLink 3.
    """
    if n <= 1 or payload_bytes <= 0:
        return 0.0
    bw = accel.interconnect_bytes_per_s or 0.0
    if accel.kind == "gpu" and n > DEVICES_PER_NODE:
        bw = min(bw, NODE_NIC_BYTES_PER_S)
    if bw <= 0:
        raise TrainplanError(f"No interconnect bandwidth for {accel.id!r}.",
                             fix="add interconnect_bytes_per_s to data/accelerators.csv")
    factor = {"all_reduce": 2.0, "reduce_scatter": 1.0, "all_gather": 1.0,
              "all_to_all": 1.0}[kind] * (n - 1) / n
    return factor * payload_bytes / (bw * link_fraction(accel))


def _comm(job, accel, meta, n, t_fwd, t_bwd, t_step_compute) -> tuple[float, float, list]:
    """(exposed communication s, extra host overhead s, notes) for one optimizer step.

    `t_fwd`, `t_bwd`: device time of one micro-batch's forward and backward, the windows a
    strategy can hide its collectives in.
      DDP        all-reduce of the gradients once per step (no_sync on the other micro-batches),
                 bucketed and overlapped with the last backward; the last bucket is exposed.
      ZeRO-1/2   reduce-scatter of the gradients overlapped with backward (ZeRO-2: every
                 micro-batch, to keep only its shard; ZeRO-1: once), then an all-gather of the
                 updated parameters after the optimizer step, exposed.
      FSDP/ZeRO-3 per micro-batch: all-gather the parameters for forward and again for
                 backward, reduce-scatter the gradients; prefetched one unit ahead, so only what
                 exceeds the compute window (plus the first unit's gather) is exposed.
      DP         torch.nn.DataParallel: per micro-batch, broadcast the weights from GPU 0,
                 scatter inputs, gather outputs, reduce gradients to GPU 0; nothing overlaps.
    Expert parallelism adds its all-to-alls (`_all_to_all_s`) on top, exposed.
    """
    strat, notes = job.strategy, []
    if n <= 1 or strat is SINGLE:
        return 0.0, 0.0, notes
    a2a = _all_to_all_s(job, accel, meta)
    if a2a:
        notes.append(f"expert parallelism over {job.expert_parallel} GPUs: 4 all-to-alls of the "
                     "routed tokens per MoE layer and micro-batch, not overlapped")
    exposed, host, more = _data_parallel_comm(job, accel, meta, n, t_fwd, t_bwd)
    return exposed + a2a * max(1, int(job.grad_accum)), host, notes + more


def _all_to_all_s(job, accel, meta) -> float:
    """Expert parallelism: every MoE layer sends each routed (token, expert) pair's hidden state to
    the expert's rank and back (dispatch, combine), in forward and again in backward: 4 x T k h
    elements per layer and micro-batch, of which (ep - 1) / ep leave the rank (DeepSpeed
    sharded_moe.py `_AllToAll`, Megatron `MoEAlltoAllTokenDispatcher`)."""
    ep = job.expert_parallel
    elements = meta.get("moe_dispatch_elements", 0)
    if ep <= 1 or not elements:
        return 0.0
    return 4 * collective_s("all_to_all", elements * job.precision.compute_bytes, ep, accel)


def _data_parallel_comm(job, accel, meta, n, t_fwd, t_bwd) -> tuple[float, float, list]:
    """The data-parallel strategy's collectives (see `_comm`)."""
    strat, notes = job.strategy, []
    k = max(1, int(job.grad_accum))
    grads = meta["gradient_bytes"]
    b = job.precision.compute_bytes
    p_compute = meta["params_total"] * b
    g_compute = meta.get("params_trainable", meta["params_total"]) * b
    if strat is DP:
        per_mb = (collective_s("all_gather", meta["weight_bytes"] * n / (n - 1), n, accel)
                  + collective_s("reduce_scatter", grads * n / (n - 1), n, accel))
        notes.append("DataParallel: one process, GIL-bound threads launch every device's kernels")
        return per_mb * k, 0.0, notes
    if strat is DDP or accel.kind == "tpu" and not strat.shards_weights:
        total = collective_s("all_reduce", grads, n, accel)
        last = collective_s("all_reduce", min(grads, DDP_BUCKET_BYTES), n, accel)
        return last + max(0.0, total - last - t_bwd), 0.0, notes
    if strat.shards_optimizer and not strat.shards_weights:
        total = collective_s("reduce_scatter", grads, n, accel)
        last = collective_s("reduce_scatter", min(grads, DDP_BUCKET_BYTES), n, accel)
        rs = (last + max(0.0, total - last - t_bwd)) * (k if strat.shards_gradients else 1)
        ag = collective_s("all_gather", p_compute, n, accel)
        notes.append(f"ZeRO-{strat.order}: gradients reduce-scattered during backward, updated "
                     "parameters all-gathered after the optimizer step")
        return rs + ag, 0.0, notes
    ag = collective_s("all_gather", p_compute, n, accel)
    rs = collective_s("reduce_scatter", g_compute, n, accel)
    first = collective_s("all_gather", min(p_compute, FIRST_GATHER_BYTES), n, accel)
    per_mb = first + max(0.0, ag - t_fwd) + max(0.0, ag + rs - t_bwd)
    return per_mb * k, 0.0, notes


@dataclass
class InputPipeline:
    """DataLoader throughput that feeds one optimizer step (samples/s per loader)."""

    loaders: int                # DataLoaders (one per training process)
    workers: int                # worker processes per loader (0: loads in the training process)
    samples_per_s: float        # per loader
    samples_per_step: int       # per loader, one optimizer step
    notes: list = field(default_factory=list)

    @property
    def load_s(self) -> float:
        return self.samples_per_step / self.samples_per_s


def input_pipeline(job, n_devices: int, accel,
                   cpu_cores: int | None = None) -> InputPipeline | None:
    """Workers and rate of the job's input pipeline, or None if the job gives no per-worker rate.

    One DataLoader per training process: per device under DDP/FSDP/ZeRO (and on TPUs, one
    process per device), a single one under DataParallel. A loader with w workers delivers
    w x `samples_per_s_per_worker`, but the workers of all loaders share the host's CPU cores
    (minus one per training process): w is capped at (cores - loaders) // loaders.
    `num_workers` unset means PyTorch's default 0: the training process loads each batch itself.
    """
    rate = job.samples_per_s_per_worker
    if not rate:
        return None
    notes = []
    loaders = 1 if job.strategy is DP else n_devices
    on_host = min(loaders, DEVICES_PER_NODE) if accel.kind == "gpu" else min(loaders,
                                                                             accel.devices_per_unit)
    workers = job.num_workers
    if workers is None:
        workers = 0
        notes.append("num_workers not set: PyTorch's default 0 loads every batch in the training "
                     "process, so loading does not overlap compute")
    if cpu_cores and workers > 0:
        cap = max(1, (cpu_cores - on_host) // on_host)
        if workers > cap:
            notes.append(f"{workers} workers per loader but the host's {cpu_cores} CPU cores allow "
                         f"{cap} (minus one core per training process)")
            workers = cap
    samples = job.batch_size * max(1, job.grad_accum) * (n_devices if job.strategy is DP else 1)
    return InputPipeline(loaders, workers, rate * max(1, workers), samples, notes)


def estimate_step_time(trace, accel, job, calibration: dict | None = None,
                       cpu_cores: int | None = None) -> StepTime:
    """Seconds per optimizer step of `job` on `accel` (per device trace, `job.gpus` units).

    Per op the device time (op_times) and the host time to issue it (`host_op_s`: Python,
    dispatcher and launch in eager PyTorch) overlap, since kernels run asynchronously: an op costs
    max(device, host). `cpu_cores` (the platform's) caps DataLoader workers.
    """
    p = calibration or load_efficiency()
    table = summarize(trace)
    meta = table.meta
    n = max(1, int(job.gpus)) * max(1, int(accel.devices_per_unit))
    t_dev, cbound = op_times(table, accel, job.precision, p)
    host = p["host_op_s"] * (n if job.strategy is DP and n > 1 else 1)   # DP: one GIL, n devices
    t = np.maximum(t_dev, host)
    cnt = table.count
    ph = table.phase
    mb = ph != OPTIMIZER                 # forward and backward run once per micro-batch
    tc = t * cnt
    t_fwd = float(np.sum(tc[ph == FORWARD]))
    t_bwd = float(np.sum(tc[ph == BACKWARD]))
    host_bound = t_dev < host
    compute_mb = float(np.sum(tc[mb & cbound & ~host_bound]))
    memory_mb = float(np.sum(tc[mb & ~cbound & ~host_bound]))
    host_mb = float(np.sum(tc[mb & host_bound]))
    opt = float(np.sum(tc[ph == OPTIMIZER]))
    if job.strategy.shards_optimizer and n > 1:
        opt /= n                                            # each rank updates its shard
    k = max(1, int(job.grad_accum))
    device_s = k * (compute_mb + memory_mb + host_mb)
    comm, extra, notes = _comm(job, accel, meta, n, t_fwd, t_bwd, device_s)
    step = device_s + opt + comm + extra
    data_wait = 0.0
    pipe = input_pipeline(job, n, accel, cpu_cores)
    if pipe is not None:
        # workers prefetch while the device computes; without workers loading is serial
        data_wait = pipe.load_s if pipe.workers == 0 else max(0.0, pipe.load_s - step)
        step += data_wait
        notes.extend(pipe.notes)
    breakdown = {"compute": k * compute_mb, "memory_bound": k * memory_mb, "communication": comm,
                 "optimizer": opt, "data_wait": data_wait, "overhead": k * host_mb + extra}
    samples = meta["batch_size"] * k * n / step
    tps = meta["tokens_per_sample"]
    peak = _mfu_peak(accel, job.precision, table)
    mfu = meta["model_flops"] * k / step / peak if peak else None
    kinds = {"compute": breakdown["compute"], "memory": breakdown["memory_bound"]
             + breakdown["overhead"] + opt, "communication": comm, "data": data_wait}
    return StepTime(step, breakdown, samples, samples * tps if tps else None, mfu,
                    max(kinds, key=kinds.get), XLA_COMPILE_S if accel.kind == "tpu" else None,
                    n, notes)


def _mfu_peak(accel, precision: Precision, table: OpTable) -> float | None:
    """Nominal dense peak of the job's compute dtype (not clock-derated: MFU convention, S01).

    If some kernels run at a higher rate than the job's dtype suggests (fp32 jobs whose
    convolutions run in TF32), the highest rate used is the denominator, so MFU <= 1 always.
    """
    dt = precision.compute
    try:
        peak = accel.peak_flops(dt) or accel.peak_flops("fp32")
    except TrainplanError:
        return None
    rates, _ = _rates(accel, precision)
    used = table.flops > 0
    if used.any():
        peak = max(peak, float(np.max(rates[table.dtype[used], table.conv[used].astype(int)]))
                   / accel.sustained_clock_fraction)
    return peak or None
