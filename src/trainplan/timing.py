"""Step-time model: one optimizer step of a traced job on one accelerator, in seconds.

Per kernel (roofline with size-dependent efficiency, S01/S40 for achievable matmul rates):

    t_op = max(flops / (peak(dtype) * clock * eff(flops)), bytes / (bandwidth * bw_eff)) + launch
    eff(f) = e_max * f / (f + f_half)          one (e_max, f_half) per kernel class:
             "tc" tensor-core matmul, "cuda" CUDA-core matmul, "attn" fused attention

`peak(dtype)` is the catalog's dense rate for the dtype the kernel computes in; a device without
tensor cores for that dtype gets its CUDA-core rate (P100 fp16 = 18.7e12 non-tensor; T4 fp32 =
8.1e12; bf16 where unsupported runs at the fp32 rate -- the memory layer reports it as unsupported).
`clock` is `sustained_clock_fraction` (T4 0.566 under its 70 W cap, S38). In fp32 jobs on
Ampere+ convolutions run in TF32 (cuDNN's `allow_tf32` defaults to True) while matmuls stay fp32
(PyTorch >= 1.12 default). The parameters are fitted by `scripts/calibrate_time.py` and stored
with the fit's provenance in `data/efficiency.json`.

Every op of `trace.ops` is counted: forward, backward, recomputed forward, and the optimizer's
(memory-bound foreach kernels). One optimizer step = grad_accum x micro-batch + optimizer +
exposed communication + data wait. Collectives (ring algorithm, S02): an all-reduce moves
2(n-1)/n x payload per device, a reduce-scatter or an all-gather (n-1)/n x payload, at
`interconnect_bytes_per_s` x an achievable fraction (~0.8 of the unidirectional spec on NVLink,
S02: A100 234.9 GB/s of 300; lower on PCIe, S39).
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from importlib import resources

import numpy as np

from .errors import TrainplanError

PHASES = ("forward", "backward", "optimizer")
FAMILIES = ("matmul", "attention", "other")
DTYPES = {"float32": 0, "float16": 1, "bfloat16": 2}          # others (int, bool, "") -> 3
# aten ops that the counter records but that launch no kernel (queries, profiler markers)
DDP_BUCKET_BYTES = 25 * 2**20      # torch DDP bucket_cap_mb default (25 MiB): last bucket is exposed
INTER_NODE_BYTES_PER_S = 25e9      # per GPU across nodes: 1600 Gbit/s per 8-GPU node (S34 setup)
DEVICES_PER_NODE = 8
# XLA compiles the step graph on the host on the first steps of a session. Sourced range
# (performance_notes.md section 3, S37): 100-110 s (Llama 3.1 8B, vLLM on v5e-8/v4-8), 8 min
# (136K-node graph), up to 25-30 min for large graphs; recompiles on every new shape.
XLA_COMPILE_S = 180.0


@dataclass
class OpTable:
    """Ops of one trace, de-duplicated by (family, dtype, phase, conv, flops, bytes) with counts."""

    family: np.ndarray
    dtype: np.ndarray
    phase: np.ndarray
    conv: np.ndarray
    flops: np.ndarray
    bytes: np.ndarray
    count: np.ndarray
    meta: dict = field(default_factory=dict)   # model_flops, gradient_bytes, params_total, ...

    def to_dict(self) -> dict:
        cols = ("family", "dtype", "phase", "conv", "flops", "bytes", "count")
        return {"cols": {c: getattr(self, c).tolist() for c in cols}, "meta": self.meta}

    @classmethod
    def from_dict(cls, d: dict) -> "OpTable":
        c = d["cols"]
        ints = {k: np.asarray(c[k], dtype=np.int64) for k in ("family", "dtype", "phase", "count")}
        return cls(conv=np.asarray(c["conv"], dtype=bool), flops=np.asarray(c["flops"], float),
                   bytes=np.asarray(c["bytes"], float), meta=d["meta"], **ints)


def summarize(trace) -> OpTable:
    """Aggregate `trace.ops` once (memoised on the trace) so every accelerator reuses it."""
    cached = getattr(trace, "_op_table", None)
    if cached is not None:
        return cached
    if isinstance(trace, OpTable):
        return trace
    agg: dict[tuple, int] = {}
    for o in trace.ops:
        if o.flops == 0 and o.bytes == 0:
            continue
        key = (FAMILIES.index(o.family), DTYPES.get(o.dtype, 3), PHASES.index(o.phase),
               "convolution" in o.name, float(o.flops), float(o.bytes))
        agg[key] = agg.get(key, 0) + 1
    keys = list(agg) or [(2, 3, 0, False, 0.0, 0.0)]
    arr = list(zip(*keys))
    table = OpTable(np.array(arr[0]), np.array(arr[1]), np.array(arr[2]), np.array(arr[3], bool),
                    np.array(arr[4], float), np.array(arr[5], float),
                    np.array([agg.get(k, 0) for k in keys]),
                    meta={"model_flops": float(trace.model_flops),
                          "gradient_bytes": float(trace.gradient_bytes),
                          "params_total": int(trace.params_total),
                          "weight_bytes": float(trace.weight_bytes),
                          "batch_size": int(trace.batch_size),
                          "tokens_per_sample": trace.tokens_per_sample,
                          "channels_last": bool(trace.semantics.channels_last)})
    try:
        trace._op_table = table
    except AttributeError:
        pass
    return table


@functools.lru_cache(maxsize=1)
def load_efficiency() -> dict:
    """Fitted parameters from data/efficiency.json (see its `provenance`)."""
    text = resources.files("trainplan.data").joinpath("efficiency.json").read_text()
    return json.loads(text)["params"]


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


def _rates(accel, precision: str) -> tuple[np.ndarray, np.ndarray]:
    """Peak FLOP/s and tensor-core flag per (dtype code, conv) -> arrays indexed [dtype, conv]."""
    tc = accel.tensor_cores
    tpu = accel.kind == "tpu"
    fp32 = accel.fp32_flops or 0.0
    peak = np.zeros((4, 2))
    tensor = np.zeros((4, 2), dtype=bool)
    for conv in (0, 1):
        use_tf32 = precision == "tf32" or (conv and precision == "fp32")
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


def op_times(table: OpTable, accel, precision: str, p: dict) -> tuple[np.ndarray, ...]:
    """Per unique op: (compute-or-memory time, launch time, is_compute_bound). Vectorised."""
    peak, tensor = _rates(accel, precision)
    conv = table.conv.astype(int)
    pk = peak[table.dtype, conv]
    tc = tensor[table.dtype, conv]
    e_max = np.where(table.family == 1, np.where(tc, p["attn_emax"], p["cuda_emax"]),
                     np.where(tc, p["tc_emax"], p["cuda_emax"]))
    f_half = np.where(table.family == 1, np.where(tc, p["attn_fhalf"], p["cuda_fhalf"]),
                      np.where(tc, p["tc_fhalf"], p["cuda_fhalf"]))
    if not table.meta.get("channels_last", True):
        # NCHW convolutions on tensor cores pay cuDNN's layout transposes (NVIDIA: tensor-core
        # convolutions want NHWC); one fitted factor
        e_max = np.where(tc & table.conv, e_max * p.get("nchw_conv_eff", 1.0), e_max)
    f = table.flops
    eff = e_max * f / (f + f_half)
    with np.errstate(divide="ignore", invalid="ignore"):
        t_c = np.where(f > 0, f / (pk * eff), 0.0)
    t_m = table.bytes / (accel.memory_bandwidth_bytes_per_s * p["bw_eff"])
    return np.maximum(t_c, t_m), np.full(len(f), p["launch_s"]), t_c >= t_m


def link_fraction(accel) -> float:
    """Achievable share of the link's per-direction spec for NCCL collectives (S02, S39)."""
    ic = accel.interconnect.lower()
    if ic.startswith("nvlink") or ic == "ici":
        return 0.8          # S02: NCCL busbw 78% (A100 NVLink3), 82% (H200); ICI assumed alike
    return 0.5              # PCIe ring without NVLink: poor utilisation (S39); assumed, not measured


def collective_s(kind: str, payload_bytes: float, n: int, accel) -> float:
    """Ring collective time: all-reduce 2(n-1)/n x payload, reduce-scatter/all-gather (n-1)/n (S02).

    Across nodes (n > 8 GPUs) the slower inter-node link per GPU bounds the ring.
    """
    if n <= 1 or payload_bytes <= 0:
        return 0.0
    bw = accel.interconnect_bytes_per_s or 0.0
    if accel.kind == "gpu" and n > DEVICES_PER_NODE:
        bw = min(bw, INTER_NODE_BYTES_PER_S)
    if bw <= 0:
        raise TrainplanError(f"No interconnect bandwidth for {accel.id!r}.",
                             fix="add interconnect_bytes_per_s to data/accelerators.csv")
    factor = {"all_reduce": 2.0, "reduce_scatter": 1.0, "all_gather": 1.0}[kind] * (n - 1) / n
    return factor * payload_bytes / (bw * link_fraction(accel))


def _comm(job, accel, meta, n, t_fwd, t_bwd, t_step_compute) -> tuple[float, float, list]:
    """(exposed communication s, extra host overhead s, notes) for one optimizer step."""
    strat, notes = job.strategy, []
    if n <= 1 or strat == "single":
        return 0.0, 0.0, notes
    grads = meta["gradient_bytes"]
    half = job.precision in ("fp16-amp", "bf16-amp", "fp16", "bf16")
    p_compute = meta["params_total"] * (2 if half else 4)
    if strat == "dp":
        # torch.nn.DataParallel, each micro-batch: replicate weights from GPU 0 (broadcast),
        # scatter inputs, gather outputs, reduce gradients to GPU 0; nothing overlaps.
        per_mb = (collective_s("all_gather", meta["weight_bytes"] * n / (n - 1), n, accel)
                  + collective_s("reduce_scatter", grads * n / (n - 1), n, accel))
        notes.append("DataParallel: one process, GIL-bound threads launch every device's kernels")
        return per_mb * job.grad_accum, 0.0, notes
    if strat in ("ddp", "zero1", "zero2") or accel.kind == "tpu" and strat != "fsdp":
        total = collective_s("all_reduce", grads, n, accel)   # zero1/2: RS + AG = same bytes
        last = collective_s("all_reduce", min(grads, DDP_BUCKET_BYTES), n, accel)
        exposed = last + max(0.0, total - last - t_bwd)        # overlap with the last backward
        if strat in ("zero1", "zero2"):
            notes.append("ZeRO-1/2: reduce-scatter grads overlapped with backward, "
                         "all-gather of updated params after the step")
        return exposed, 0.0, notes
    # fsdp / zero3: all-gather params in forward and backward, reduce-scatter grads, per
    # micro-batch, prefetched while the previous unit computes: 3 (n-1)/n x params (compute dtype)
    ag = collective_s("all_gather", p_compute, n, accel)
    rs = collective_s("reduce_scatter", p_compute, n, accel)
    first = collective_s("all_gather", min(p_compute, DDP_BUCKET_BYTES * 8), n, accel)
    per_mb = first + max(0.0, ag - t_fwd) + max(0.0, ag + rs - t_bwd)
    return per_mb * job.grad_accum, 0.0, notes


def estimate_step_time(trace, accel, job, calibration: dict | None = None) -> StepTime:
    """Seconds per optimizer step of `job` on `accel` (per device trace, `job.gpus` units)."""
    p = calibration or load_efficiency()
    table = summarize(trace)
    meta = table.meta
    n = max(1, int(job.gpus)) * max(1, int(accel.devices_per_unit))
    t, launch, cbound = op_times(table, accel, job.precision, p)
    cnt = table.count
    ph = table.phase
    mb = ph < 2
    t_fwd = float(np.sum((t * cnt)[ph == 0]))
    t_bwd = float(np.sum((t * cnt)[ph == 1]))
    compute_mb = float(np.sum((t * cnt)[mb & cbound]))
    memory_mb = float(np.sum((t * cnt)[mb & ~cbound]))
    launch_mb = float(np.sum((launch * cnt)[mb]))
    opt = float(np.sum(((t + launch) * cnt)[ph == 2]))
    if job.strategy in ("zero1", "zero2", "zero3", "fsdp") and n > 1:
        opt /= n                                            # each rank updates its shard
    k = max(1, int(job.grad_accum))
    if job.strategy == "dp" and n > 1:
        launch_mb *= n                                      # one Python thread per device, GIL
    device_s = k * (compute_mb + memory_mb + launch_mb)
    comm, extra, notes = _comm(job, accel, meta, n, t_fwd, t_bwd, device_s)
    step = device_s + opt + comm + extra
    samples_dev = meta["batch_size"] * k
    data_wait = 0.0
    if job.samples_per_s_per_worker:
        workers = job.num_workers or 0
        feeds = samples_dev * (n if job.strategy == "dp" else 1)
        load_s = feeds / (job.samples_per_s_per_worker * max(1, workers))
        data_wait = load_s if workers == 0 else max(0.0, load_s - step)  # workers overlap
        step += data_wait
    breakdown = {"compute": k * compute_mb, "memory_bound": k * memory_mb, "communication": comm,
                 "optimizer": opt, "data_wait": data_wait, "overhead": k * launch_mb + extra}
    samples = samples_dev * n / step
    tps = meta["tokens_per_sample"]
    peak = _mfu_peak(accel, job.precision, table)
    mfu = meta["model_flops"] * k / step / peak if peak else None
    kinds = {"compute": breakdown["compute"], "memory": breakdown["memory_bound"]
             + breakdown["overhead"] + opt, "communication": comm, "data": data_wait}
    return StepTime(step, breakdown, samples, samples * tps if tps else None, mfu,
                    max(kinds, key=kinds.get), XLA_COMPILE_S if accel.kind == "tpu" else None,
                    n, notes)


def _mfu_peak(accel, precision: str, table: OpTable) -> float | None:
    """Nominal dense peak of the job's compute dtype (not clock-derated: MFU convention, S01).

    If some kernels run at a higher rate than the job's dtype suggests (fp32 jobs whose
    convolutions run in TF32), the highest rate used is the denominator, so MFU <= 1 always.
    """
    dt = {"fp16-amp": "fp16", "fp16": "fp16", "bf16-amp": "bf16", "bf16": "bf16",
          "tf32": "tf32"}.get(precision, "fp32")
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
