"""Step-time model: one optimizer step of a traced job on one accelerator, in seconds.

Every op of the trace is timed (forward, backward, recomputed forward, optimizer), as a roofline
with size-dependent efficiency (op_times):

    t_compute = (flops + f_half) / (peak(dtype, tensor cores?) x clock x e_max)
    t_memory  = bytes x passes / (bandwidth x bw_eff)
    t_op      = max(t_compute, t_memory) + kernel_s
    t_phase   = (1 - host_overlap) x sum of max(t_op, host_op_s)
                + host_overlap x max(sum of t_op, ops x host_op_s)   (forward, backward, optimizer)

`peak` is the catalog's dense rate for the dtype the kernel computes in; without tensor cores for
that dtype the CUDA-core FP32 rate (T4 fp32 = 8.1e12; P100 fp16 = its fp32 9.3e12, since PyTorch's
half GEMMs and cuDNN's half convolutions accumulate in fp32 -- Accelerator.peak_flops; bf16 where
unsupported runs at the fp32 rate -- the memory layer reports it as unsupported). Depthwise
convolutions have no tensor-core kernels: fp32 CUDA-core rate, their own efficiency. `clock` is
`sustained_clock_fraction` (T4 0.566 under its 70 W cap, S38). fp32 jobs on Ampere+ run
convolutions in TF32 (cuDNN's `allow_tf32` defaults to True), matmuls in fp32 (PyTorch >= 1.12;
NGC containers set TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1, which is `--precision tf32`).
`e_max` of tensor-core matmuls is the device's measured matmul ceiling (matmul_ceiling), else
the median measured one; tensor-core convolutions reach `conv_rel` of it, less with few channels
per group; fused attention by GPU generation (attention_emax). `bw_eff` is the measured STREAM
fraction of the spec bandwidth (0.86-0.92 on V100, A100, H100, RTX 4090; not fitted). `f_half`
is the size at which a kernel reaches half its ceiling (too few blocks to fill the SMs, ramp-up
and tail).
NCHW tensor-core convolutions pay cuDNN's NHWC transposes (`passes` > 1). `host_op_s` is what
eager PyTorch spends on the CPU to issue one op (Python, dispatcher, launch); kernels run
asynchronously, so the host runs partly ahead (estimate_step_time). fp16 AMP adds
GradScaler's unscale pass over the gradients. The fitted parameters come from
`scripts/calibrate_time.py` (data/efficiency.json, with its provenance); errors on sources the fit
never saw (leave-one-source-out and leave-one-GPU-out) in validation/results/time_validation.md.

One optimizer step = grad_accum x micro-batch + optimizer + exposed communication (comm.py) +
data wait. The input pipeline (`input_pipeline`) delivers workers x samples_per_s_per_worker and
overlaps the step when it has workers.
"""
from __future__ import annotations

import functools
import json
from collections import Counter
from dataclasses import dataclass, field
from importlib import resources

import numpy as np

from ..errors import TrainplanError
from ..precision import Precision
from ..strategy import DP
from .comm import DEVICES_PER_NODE, exposed_comm

PHASES = ("forward", "backward", "optimizer")
FORWARD, BACKWARD, OPTIMIZER = range(len(PHASES))     # OpTable.phase codes
FAMILIES = ("matmul", "attention", "other")
DTYPES = {"float32": 0, "float16": 1, "bfloat16": 2,          # others (int, bool, "") -> 3
          "float8_e4m3fn": 4, "float8_e5m2": 4, "float8_e4m3fnuz": 4, "float8_e5m2fnuz": 4}
# aten ops that the counter records but that launch no kernel (queries, profiler markers)
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
    # a trace stitched from a cut one holds each of the last block's records once per block
    # (predict/depth.py): each record's key is made once, its count from the ids, in C
    times = Counter(map(id, trace.ops))
    for o in {id(o): o for o in trace.ops}.values():     # in order of first appearance
        if o.flops == 0 and o.bytes == 0:
            continue
        key = (o.name, FAMILIES.index(o.family), DTYPES.get(o.dtype, 3), PHASES.index(o.phase),
               "convolution" in o.name, float(o.flops), float(o.bytes),
               int(getattr(o, "group_channels", 0)))
        agg[key] = agg.get(key, 0) + times[id(o)]
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
def _efficiency_file() -> dict:
    return json.loads(resources.files("trainplan.data").joinpath("efficiency.json").read_text())


@functools.lru_cache(maxsize=1)
def load_efficiency() -> dict:
    """Fitted parameters from data/efficiency.json (see its `provenance`)."""
    data = _efficiency_file()
    return dict(data["params"], matmul_ceiling=data.get("matmul_ceiling", {}),
                attn_generation=data.get("attn_generation", {}))


def bundled_accuracy() -> dict | None:
    """The bundled fit's error on sources it never saw (efficiency.json `accuracy`, written by
    scripts/validate_time.py): leave-one-source-out median and p90 absolute error."""
    return _efficiency_file().get("accuracy")


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
    forward_s: float = 0.0      # one micro-batch's forward alone (a reference model's pass)


def _rates(accel, precision: Precision) -> tuple[np.ndarray, np.ndarray]:
    """Peak FLOP/s and tensor-core flag per (dtype code, conv) -> arrays indexed [dtype, conv]
    (codes: DTYPES; 4 = FP8, the catalog's `fp8_flops`)."""
    tc = accel.tensor_cores
    tpu = accel.kind == "tpu"
    fp32 = accel.fp32_flops or 0.0
    peak = np.zeros((5, 2))
    tensor = np.zeros((5, 2), dtype=bool)
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
            peak[1, conv] = fp32      # fp32 accumulation: the FP32 FMA rate (peak_flops)
        if accel.supports_bf16 and accel.bf16_flops:
            peak[2, conv], tensor[2, conv] = accel.bf16_flops, ("bf16" in tc) or tpu
        else:
            peak[2, conv] = fp32
        peak[3, conv] = fp32
        # FP8 GEMMs (aten._scaled_mm, trace/fp8.py): the catalog's dense FP8 peak
        fp8 = accel.fp8_flops or 0.0
        peak[4, conv], tensor[4, conv] = (fp8, True) if fp8 else (fp32, False)
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

    Measured, not fitted, where a source has the device (efficiency.json `matmul_ceiling`, sources
    in docs/kernel_ceilings_research.md): S01's maximum achievable matmul FLOP/s (best shape;
    A100 SXM 86.9%, A100 PCIe 81.1%, H100 SXM 80.3%, H200 "the same"), else the best square
    torch.mm of zzc0721/torch-performance-test-data @9d82827 (a lower bound: RTX 4090 and 3090
    reach their fp32-accumulate spec, their boost clocks running above the spec clock; V100
    0.76, L40S 0.74, RTX A6000 0.79, H100 PCIe 0.66, L4 0.58). Other devices: `tc_emax`, the
    median measured ceiling. Tensor-core convolutions reach `conv_rel` of it (cuDNN's implicit
    GEMM against cuBLAS, fitted).
    """
    return float(p.get("matmul_ceiling", {}).get(accel.id, p["tc_emax"]))


def attention_emax(accel, p: dict) -> float:
    """Fused attention's ceiling (fraction of the dense peak): `attn_emax` (fitted) times the
    generation's measured ratio (efficiency.json `attn_generation`): FlashAttention-2, PyTorch's
    flash SDPA kernel, reaches 50-73% of the A100's peak (Dao 2023, arXiv:2307.08691) but "only
    35% utilization on H100" (Shah et al. 2024, FlashAttention-3, arXiv:2407.08608): it does not
    use Hopper's wgmma and TMA, so sm90 runs it at 0.35 / 0.615 of Ampere's fraction."""
    return float(p["attn_emax"] * p.get("attn_generation", {}).get(
        str(accel.compute_capability), 1.0))


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
    attn = k == K_ATTN
    # fp32 fused attention (the memory-efficient kernel; flash has no fp32) ignores allow_tf32:
    # on sm80+ it multiplies with CUTLASS's 3xTF32 (OpMultiplyAddFastF32, mem_eff_attention
    # gemm_kernel_utils.h `DefaultGemmType<float>`), three TF32 MMAs per product, else SIMT FP32
    fp32_attn = attn & (table.dtype == 0) & (accel.kind == "gpu")
    if fp32_attn.any():
        rate = max((accel.tf32_flops or 0.0) / 3.0, accel.fp32_flops or 0.0)
        pk = np.where(fp32_attn, rate * accel.sustained_clock_fraction, pk)
    tc = (tensor[table.dtype, conv] & ~dw) | (fp32_attn & bool(accel.tf32_flops))
    # a tensor-core convolution is an implicit GEMM reducing over its input channels per group
    # (x the kernel window): few channels (ResNeXt's 4 a group, RegNet's, a 3-channel stem)
    # fill a fraction of a tile's depth, so it reaches gc / (gc + gconv_half) of the ceiling
    gc = np.maximum(table.group_channels.astype(float), 1.0)
    conv_eff = p.get("conv_rel", 1.0) * gc / (gc + p.get("gconv_half", 0.0))
    ceiling = matmul_ceiling(accel, p) * np.where(k == K_CONV, conv_eff, 1.0)
    e_max = np.where(tc, np.where(attn, attention_emax(accel, p), ceiling),
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
    dispatcher and launch in eager PyTorch) overlap, since kernels run asynchronously. If the
    host could always queue ops ahead of the device, a phase (forward, backward, optimizer) would
    take max(sum of device times, ops x host_op_s); if it never could (a synchronisation after
    every op), the sum over ops of max(device, host). Real eager steps sit between: the queue
    drains at every synchronisation (mask checks, `.item()`, data-dependent shapes) and behind
    every run of small ops. `host_overlap` (fitted, 0..1) is the share of the way from the
    second to the first.
    `cpu_cores` (the platform's) caps DataLoader workers.
    """
    p = calibration or load_efficiency()
    table = summarize(trace)
    meta = table.meta
    n = max(1, int(job.gpus)) * max(1, int(accel.devices_per_unit))
    t_dev, cbound = op_times(table, accel, job.precision, p)
    host = p["host_op_s"] * (n if job.strategy is DP and n > 1 else 1)   # DP: one GIL, n devices
    cnt = table.count
    ph = table.phase
    td = t_dev * cnt
    mb = ph != OPTIMIZER                 # forward and backward run once per micro-batch
    compute_mb = float(np.sum(td[mb & cbound]))
    memory_mb = float(np.sum(td[mb & ~cbound]))
    # phase time: between op by op max(device, host) and max(device sum, host sum); docstring
    dev = [float(np.sum(td[ph == k])) for k in range(len(PHASES))]
    hst = [host * float(np.sum(cnt[ph == k])) for k in range(len(PHASES))]
    ts = np.maximum(t_dev, host) * cnt
    serial = [float(np.sum(ts[ph == k])) for k in range(len(PHASES))]
    rho = p.get("host_overlap", 0.0)
    t_fwd, t_bwd, opt = ((1 - rho) * s_ + rho * max(d, h) for s_, d, h in zip(serial, dev, hst))
    host_mb = (t_fwd - dev[FORWARD]) + (t_bwd - dev[BACKWARD])
    if job.precision.loss_scaling:
        # GradScaler.unscale_: one foreach pass reads and writes every gradient
        # (_amp_foreach_non_finite_check_and_unscale_), bandwidth-bound
        opt += 2 * meta["gradient_bytes"] / (accel.memory_bandwidth_bytes_per_s * p["bw_eff"])
    if job.strategy.shards_optimizer and n > 1:
        opt /= n                                            # each rank updates its shard
    k = max(1, int(job.grad_accum))
    device_s = k * (compute_mb + memory_mb + host_mb)
    comm, extra, notes = exposed_comm(job, accel, meta, n, t_fwd, t_bwd)
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
                    n, notes, forward_s=t_fwd)


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
