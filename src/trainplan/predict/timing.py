"""Step-time model: one optimizer step of a traced job on one accelerator, in seconds.

Each kernel of the trace (forward, backward, recomputed forward, optimizer) gets a device time
from its shape and bytes (op_times), and the step runs them through the host/device queue
(predict/host.py: the host issues kernels, the device runs them behind it):

    t_kernel = max(t_compute, t_memory) + kernel_s
    t_memory = bytes x passes / (bandwidth x bw_eff)   (/ cast_bw: a dynamic-casting loop)
    t_compute: a GEMM or convolution tiled over the SMs (predict/kernels.py: wave and tile
               quantisation, split-K, a wave's fixed prologue/epilogue, smaller tiles'
               efficiency) at the device's measured matmul ceiling (on CUDA cores: its
               measured FP32 one); fused attention by its work items in waves at the kernel's
               ceiling for the head dimension; anything else at the CUDA-core rate
    step     = queue(k micro-batches, then the optimizer) + exposed communication + data wait

`peak` is the catalog's dense rate for the dtype the kernel computes in; without tensor cores for
that dtype the CUDA-core FP32 rate (T4 fp32 = 8.1e12; P100 fp16 = its fp32 9.3e12, since PyTorch's
half GEMMs and cuDNN's half convolutions accumulate in fp32 -- Accelerator.peak_flops; bf16 where
unsupported runs at the fp32 rate -- the memory layer reports it as unsupported). Depthwise
convolutions have no tensor-core kernels: fp32 CUDA-core rate, their own efficiency; so too the
grouped convolutions that cuDNN 8.0-8.3 ran on direct kernels in channels-last (`gdirect_emax`,
KernelSemantics.cudnn_grouped_direct: the old releases of a published table). The clock
is `sustained_clock_fraction` (T4 0.566 under its 70 W cap, S38). fp32 jobs on Ampere+ run
convolutions in TF32 (cuDNN's `allow_tf32` defaults to True), matmuls in fp32 (PyTorch >= 1.12;
NGC containers set TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1, which is `--precision tf32`).
The matmul ceiling is the device's measured best-shape matmul (matmul_ceiling), else the median
measured one; tensor-core convolutions reach `conv_rel` of it (cuDNN's implicit GEMM against
cuBLAS), less with few channels per group; fused attention by GPU generation
(attention_emax). `bw_eff` is the measured STREAM fraction of the spec bandwidth (0.86-0.92 on
V100, A100, H100, RTX 4090; not fitted). NCHW tensor-core convolutions pay cuDNN's NHWC
transposes (`passes` > 1). fp16 AMP adds GradScaler's unscale pass over the gradients and its
synchronisation before the optimizer step. The fitted parameters come from
`scripts/calibrate_time.py` (data/efficiency.json, with its provenance); errors on sources the fit
never saw (leave-one-source-out and leave-one-GPU-out) in validation/results/time_validation.md.

One optimizer step = the queue over grad_accum micro-batches and the optimizer + exposed
communication (comm.py) + data wait; under CPU offload the update is the host's and the
host-link copies not hidden under compute count as communication (offload.py). The input
pipeline (`input_pipeline`) delivers workers x samples_per_s_per_worker and overlaps the step
when it has workers.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from ..accelerators import kernel_facts
from ..errors import TrainplanError
from ..precision import Precision
from ..strategy import DP
from ..trace.semantics import CUDNN_GROUPED_DIRECT_ABOVE
from ..trace.shapes import GEMM_INTS, NHWC
from . import kernels
from .comm import DEVICES_PER_NODE, exposed_comm
from .host import step_queue
from .offload import offload_time
from .optable import BACKWARD, FORWARD, MEMO_ENTRIES, OPTIMIZER, PHASES, OpTable, summarize
from .time_params import TimeParams, bundled

# XLA compiles the step graph on the host on the first steps of a session. Sourced range
# (performance_notes.md section 3, S37): 100-110 s (Llama 3.1 8B, vLLM on v5e-8/v4-8), 8 min
# (136K-node graph), up to 25-30 min for large graphs; recompiles on every new shape.
XLA_COMPILE_S = 180.0


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
    # what `device_by_class_s` sums, kept unsummed (each op's class, device seconds, whether it
    # runs every micro-batch; micro-batches; the optimizer's device seconds): only `trainplan
    # measure --profile` and the validation read it, and a plan times thousands of steps
    by_class_parts: tuple | None = field(default=None, repr=False, compare=False)

    @property
    def device_by_class_s(self) -> dict:
        """The step's kernel time by class (KERNEL_CLASS_NAMES): every micro-batch's forward
        and backward kernels, and the optimizer's as `breakdown_s` counts them (what `trainplan
        measure --profile` compares with the kernels a profiled step ran)."""
        if self.by_class_parts is None:
            return {}
        classes, seconds, per_micro_batch, k, optimizer = self.by_class_parts
        by = np.bincount(classes[per_micro_batch], weights=seconds[per_micro_batch],
                         minlength=len(KERNEL_CLASS_NAMES)) * k
        by[K_OPTIM] = optimizer
        return dict(zip(KERNEL_CLASS_NAMES, map(float, by)))


def _rates(accel, precision: Precision) -> tuple[np.ndarray, np.ndarray]:
    """Peak FLOP/s (derated by the sustained clock) and tensor-core flag per (dtype code, conv)
    -> arrays indexed [dtype, conv] (codes: optable.DTYPES; 4 = FP8), each the catalog's
    per-dtype rate (Accelerator.rate)."""
    peak = np.zeros((5, 2))
    tensor = np.zeros((5, 2), dtype=bool)
    for conv in (0, 1):
        # fp32 convolutions run in TF32 where cuDNN may (allow_tf32), matmuls only under tf32
        use_tf32 = precision.compute == "tf32" or (conv and precision.compute == "fp32")
        for code, dtype in enumerate(("tf32" if use_tf32 else "fp32", "fp16", "bf16")):
            peak[code, conv], tensor[code, conv] = accel.rate(dtype)
        peak[3, conv] = accel.fp32_flops or 0.0      # integer and other dtypes: CUDA cores
        # FP8 GEMMs (aten._scaled_mm, trace/fp8.py): the catalog's dense FP8 peak
        peak[4, conv], tensor[4, conv] = accel.rate("fp8")
    return peak * accel.sustained_clock_fraction, tensor


# Kernel classes: what limits an op once it is memory-bound or tiny (see op_times)
K_MATMUL, K_CONV, K_ATTN, K_NORM, K_OTHER, K_OPTIM, K_DWCONV = range(7)
KERNEL_CLASS_NAMES = ("matmul", "conv", "attention", "norm", "elementwise", "optimizer",
                      "depthwise")
_NORM_OPS = ("batch_norm", "layer_norm", "group_norm", "rms_norm", "softmax", "_log_softmax")


@functools.lru_cache(maxsize=1)
def _gemm_op_names() -> frozenset:
    from ..trace.ops import MATMUL_OPS       # imports torch: only where a profile is read
    return frozenset(str(p).split(".")[-1] for p in MATMUL_OPS) | {"linear", "matmul"}


def op_name_class(name: str) -> int:
    """The kernel class of an aten op known only by its name (`aten::mm`, a profiler's event):
    a GEMM (trace/ops.py MATMUL_OPS, or cuDNN's `cudnn_convolution*` that `convolution` runs,
    which is a convolution), fused attention (any SDPA backend's kernel op), a norm, else an
    elementwise or other memory-bound op. A name cannot tell a depthwise convolution (it is
    `conv`) nor an optimizer's op from the model's (the caller knows which step phase ran it)."""
    op = name.split("::", 1)[-1]
    if "conv" in op:
        return K_CONV
    if op in _gemm_op_names():
        return K_MATMUL
    if "attention" in op and op != "_scaled_dot_product_attention_math":
        return K_ATTN
    return K_NORM if any(k in op for k in _NORM_OPS) else K_OTHER


def kernel_classes(table: OpTable) -> np.ndarray:
    """Per unique op, its kernel class (memoised on the table)."""
    cached = table.memo.kernel_classes
    if cached is not None and len(cached) == len(table.flops):
        return cached
    names = {n: (K_NORM if any(k in n for k in _NORM_OPS) else K_OTHER) for n in set(table.name)}
    k = np.array([names[n] for n in table.name], dtype=np.int64)
    k = np.where(table.family == 0, np.where(table.conv, np.where(table.group_channels == 1,
                                                                  K_DWCONV, K_CONV), K_MATMUL), k)
    k = np.where(table.family == 1, K_ATTN, k)
    k = np.where(table.phase == OPTIMIZER, K_OPTIM, k)
    table.memo.kernel_classes = k
    return k


def matmul_ceiling(accel, p: TimeParams) -> float:
    """Best achievable fraction of the dense tensor peak for a matmul on this accelerator.

    Measured, not fitted, where a source has the device (efficiency.json `matmul_ceiling`, sources
    in docs/kernel_ceilings_research.md): S01's maximum achievable matmul FLOP/s (best shape;
    A100 SXM 86.9%, A100 PCIe 81.1%, H100 SXM 80.3%, H200 "the same"), else the best square
    torch.mm of zzc0721/torch-performance-test-data @9d82827 (a lower bound: RTX 3090 1.07 and
    RTX 4090 1.02 of their fp32-accumulate spec, their boost clocks running above the spec
    clock; V100 0.76, L40S 0.74, RTX A6000 0.79, H100 PCIe 0.66, L4 0.58). Other devices:
    `tc_emax`, the median measured ceiling. Tensor-core convolutions reach `conv_rel` of it
    (cuDNN's implicit GEMM against cuBLAS, fitted).
    """
    return p.ceiling(accel.id)


def conv_generation(accel, p: TimeParams) -> float:
    """cuDNN's tensor-core convolutions on Hopper against their share of the peak on earlier
    GPUs (`conv_hopper`, fitted on our H100 runs; checked on the H200's): Hopper's peak needs
    its warpgroup MMA instructions, which cuBLAS's GEMMs use (the measured matmul ceiling) and
    kernels written for Ampere's mma.sync do not -- FlashAttention-2 reaches 0.53 of its
    Ampere fraction there (attention_emax). 1 elsewhere."""
    return float(p.conv_hopper) if str(accel.compute_capability) == "9.0" else 1.0


def attention_emax(accel, p: TimeParams) -> float:
    """Fused attention's ceiling (fraction of the dense peak): `attn_emax` (fitted) times the
    generation's measured ratio (efficiency.json `attn_generation`): FlashAttention-2, PyTorch's
    flash SDPA kernel, reaches 50-73% of the A100's peak (Dao 2023, arXiv:2307.08691) but "only
    35% utilization on H100" (Shah et al. 2024, FlashAttention-3, arXiv:2407.08608): it does not
    use Hopper's wgmma and TMA, so sm90 runs it at 0.35 / 0.615 of Ampere's fraction."""
    return float(p.attn_emax * p.attn_generation.get(str(accel.compute_capability), 1.0))


@dataclass
class _Static:
    """What op_times reads off an op table on one accelerator and precision that no parameter
    changes: rates, kernel classes, the GEMM grid (kernels.gemm_grid), each attention kernel's
    wave quantisation, head dimension and keys, each multi-tensor op's launches, the ops run
    through CUDA's dynamic-casting loop. Memoised on the table (a fit times it thousands of
    times)."""

    classes: np.ndarray
    peak: np.ndarray             # FLOP/s of each op's dtype and unit (tensor or CUDA cores)
    tensor: np.ndarray           # runs on tensor cores
    conv_groups: np.ndarray      # channels per group (>= 1) of tensor-core convolutions, else 0
    direct: np.ndarray           # grouped convolutions on cuDNN's direct kernels (_grouped_direct)
    sms: int
    gemm_owner: np.ndarray
    gemm_grid: kernels.GemmGrid | None
    gemm_dims: np.ndarray
    square: np.ndarray           # GEMM-like ops without a traced shape: taken square
    attn: np.ndarray             # indices of fused attention kernels
    attn_waves: np.ndarray
    attn_head_dim: np.ndarray
    attn_keys: np.ndarray        # keys one work item walks (causal: the mean over its rows)
    launches: np.ndarray
    cast: np.ndarray             # ops streamed at `cast_bw` (trace/casting.py; CUDA only)


def _static(table: OpTable, accel, precision: Precision) -> _Static:
    memo = table.memo.static
    key = (accel.id, precision.name)
    if key in memo:
        return memo[key]
    facts = kernel_facts(accel)
    sms = (facts.sm_count or 0) if facts else 0
    k = kernel_classes(table)
    peak, tensor = _rates(accel, precision)
    conv = table.conv.astype(int)
    dw = k == K_DWCONV
    direct = _grouped_direct(table, k)
    # depthwise convolutions have no tensor-core kernels: CUDA cores at the fp32 rate, at their
    # own (low) efficiency -- direct convolution, per-channel reductions in the weight gradient;
    # so too cuDNN 8.0-8.3's direct grouped kernels (`gdirect_emax`, no tiles:
    # KernelSemantics.cudnn_grouped_direct)
    cuda_conv = dw | direct
    pk = np.where(cuda_conv, (accel.fp32_flops or 0.0) * accel.sustained_clock_fraction,
                  peak[table.dtype, conv])
    attn_mask = k == K_ATTN
    # fp32 fused attention (the memory-efficient kernel; flash has no fp32) ignores allow_tf32:
    # on sm80+ it multiplies with CUTLASS's 3xTF32 (OpMultiplyAddFastF32, mem_eff_attention
    # gemm_kernel_utils.h `DefaultGemmType<float>`), three TF32 MMAs per product, else SIMT FP32
    fp32_attn = attn_mask & (table.dtype == 0) & (accel.kind == "gpu")
    if fp32_attn.any():
        rate = max((accel.tf32_flops or 0.0) / 3.0, accel.fp32_flops or 0.0)
        pk = np.where(fp32_attn, rate * accel.sustained_clock_fraction, pk)
    tc = (tensor[table.dtype, conv] & ~cuda_conv) | (fp32_attn & bool(accel.tf32_flops))
    groups = np.where(tc & (k == K_CONV), np.maximum(table.group_channels, 1), 0)
    gemm = np.flatnonzero(((k == K_MATMUL) | (k == K_CONV)) & (table.flops > 0) & ~direct)
    shaped = np.array([i for i in gemm if table.shape[i]], dtype=np.int64)
    owner, dims = kernels.gemm_rows(table.shape, shaped)
    attn = np.flatnonzero(attn_mask)
    launches = np.ones(len(table.flops))
    for i in np.flatnonzero(k == K_OPTIM):
        launches[i] = kernels.foreach_launches(table.shape[i], table.bytes[i] / 4.0)
    # the casting loop is CUDA's (CUDALoops.cuh): XLA fuses elementwise ops, ROCm and MPS run
    # their own loops, which the measured rate does not describe
    cast = table.cast & (accel.backend == "cuda")
    memo[key] = _Static(
        k, pk, tc, groups.astype(float), direct, sms, owner,
        kernels.gemm_grid(dims, sms) if sms and len(dims) else None, dims,
        np.array([i for i in gemm if not table.shape[i]], dtype=np.int64), attn,
        np.array([kernels.attention_quantisation(table.shape[i], sms, "backward" in
                                                 table.name[i]) for i in attn]),
        np.array([table.shape[i][5] if len(table.shape[i]) > 5 else 128 for i in attn],
                 dtype=float),
        np.array([kernels.attention_keys(table.shape[i]) for i in attn], dtype=float),
        launches, cast)
    return memo[key]


def _grouped_direct(table: OpTable, k: np.ndarray) -> np.ndarray:
    """Per unique op, whether it is a grouped convolution that cuDNN 8.0-8.3 ran on its direct
    kernels: the trace's semantics say so (KernelSemantics.cudnn_grouped_direct, set for tables
    measured on those releases), the activations are channels-last, there is more than one
    group and more than CUDNN_GROUPED_DIRECT_ABOVE channels a group (a depthwise one is
    K_DWCONV)."""
    if not table.meta.get("cudnn_grouped_direct"):
        return np.zeros(len(table.flops), dtype=bool)
    nhwc_grouped = np.array([len(s) >= GEMM_INTS and s[0] > 1 and s[4] == NHWC
                             for s in table.shape], dtype=bool)
    return (k == K_CONV) & nhwc_grouped & (table.group_channels > CUDNN_GROUPED_DIRECT_ABOVE)


def op_times(table: OpTable, accel, precision: Precision, p: TimeParams
             ) -> tuple[np.ndarray, np.ndarray]:
    """Per unique op: (device time s, is_compute_bound). Vectorised over the op table.

        t_compute = GEMMs tiled over the SMs (kernels.gemm_seconds) at peak x ceiling; fused
                    attention's FLOPs at its ceiling for the head dimension and the keys a work
                    item walks, in whole waves of work items (kernels.attention_quantisation);
                    other FLOPs at the CUDA-core rate: a matmul (and any other arithmetic)
                    at the device's measured FP32 matmul ceiling (fp32_ceiling), a
                    convolution at cuDNN's (`cuda_emax`, fitted: Winograd's 3x3 kernels do
                    fewer multiplications than the direct FLOPs counted, so it is no matmul's)
        t_memory  = bytes x passes / (bandwidth x bw_eff), x 1 / cast_bw for an elementwise op
                    CUDA runs through its dynamic-casting loop (trace/casting.py: scalar loads
                    where the others are vectorized; `cast_bw` measured by PyTorch's developers;
                    on NVIDIA GPUs only, as XLA, ROCm and MPS run other kernels)
        t_device  = max(t_compute, t_memory) + kernel_s x kernels launched

    `kernel_s` is the fixed device time of a kernel (launch latency, ramp-up, tail), why small
    elementwise kernels reach a fraction of the bandwidth that large ones do; a multi-tensor op
    launches several (kernels.foreach_launches). `passes` > 1 only for tensor-core convolutions of
    an NCHW model: cuDNN's tensor-core kernels are NHWC, so it transposes the activations in and
    out (`nchw_passes` extra passes over the op's bytes). A tensor-core convolution is an
    implicit GEMM reducing over its input channels per group (x the kernel window): few channels
    (ResNeXt's 4 a group, RegNet's, a 3-channel stem) fill a fraction of a tile's depth, so it
    reaches gc / (gc + gconv_half) of `conv_rel` x the matmul ceiling. An op whose shape was not
    traced (an op table made before shapes were), or a device without SM counts
    (data/gpu_kernels.csv: TPUs), is timed without quantisation: its FLOPs at the ceiling plus
    one wave's fixed time.
    """
    st = _static(table, accel, precision)
    k = st.classes
    gc = st.conv_groups
    conv_eff = np.where(gc > 0, p.conv_rel * gc / (gc + p.gconv_half)
                        * conv_generation(accel, p), 1.0)
    # the first that holds: tensor cores, then the CUDA-core kernels by class
    e_max = np.select([st.tensor, k == K_DWCONV, st.direct, k == K_CONV],
                      [matmul_ceiling(accel, p) * conv_eff, p.dwconv_emax,
                       p.grouped_direct_emax, p.cuda_emax],
                      default=p.fp32_matmul_ceiling(accel.id))
    rate = st.peak * e_max
    bw = accel.memory_bandwidth_bytes_per_s * p.bw_eff
    f = table.flops
    with np.errstate(divide="ignore", invalid="ignore"):
        t_c = np.where(f > 0, f / rate, 0.0)
    if len(st.gemm_owner):
        if st.gemm_grid is not None:
            secs = kernels.gemm_seconds(st.gemm_grid, rate[st.gemm_owner], st.sms,
                                        p.tile_s, p.tile_h_half, bw)
        else:
            d = st.gemm_dims
            secs = 2.0 * d.prod(axis=1) / rate[st.gemm_owner] + p.tile_s
        t_c[st.gemm_owner] = 0.0
        np.add.at(t_c, st.gemm_owner, secs)
    if len(st.square):
        t_c[st.square] = f[st.square] / rate[st.square] + p.tile_s
    if len(st.attn):
        # FlashAttention-2's throughput by head dimension (against 128) and by the keys a work
        # item walks (its fixed part: loading the query block, writing the output), both read
        # off its published curves (efficiency.json `attn_head_dim_half`, `attn_seq_half`)
        d_half, s_half = p.attn_head_dim_half, p.attn_seq_half
        eff = (st.attn_head_dim / (st.attn_head_dim + d_half)) / (128 / (128 + d_half)) \
            * st.attn_keys / (st.attn_keys + s_half)
        t_c[st.attn] = f[st.attn] / (st.peak[st.attn] * attention_emax(accel, p) * eff) * \
            st.attn_waves
    t_m = table.bytes / np.where(k == K_NORM, accel.memory_bandwidth_bytes_per_s
                                 * p.norm_bandwidth, np.where(st.cast, bw * p.cast_bw, bw))
    if not table.meta.get("channels_last", True):
        t_m = t_m * np.where(gc > 0, 1.0 + p.nchw_passes, 1.0)
    return np.maximum(t_c, t_m) + p.kernel_s * st.launches, t_c >= t_m


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


def estimate_step_time(trace, accel, job, calibration: TimeParams | None = None,
                       cpu_cores: int | None = None, host_speed: float = 1.0) -> StepTime:
    """Seconds per optimizer step of `job` on `accel` (per device trace, `job.gpus` units).

    Each kernel's device time (op_times) runs through the host/device queue (predict/host.py):
    grad_accum micro-batches back to back, then the optimizer step (after GradScaler's
    synchronisation under fp16 AMP). `host_speed`: the host CPU's speed relative to the one the
    host parameters were measured on (platforms' host CPUs: data/host_cpus.csv).
    `cpu_cores` (the platform's) caps DataLoader workers.
    """
    p = calibration or bundled()
    table = summarize(trace)
    meta = table.meta
    n = max(1, int(job.gpus)) * max(1, int(accel.devices_per_unit))
    dp = n if job.strategy is DP and n > 1 else 1      # DP: one GIL issues for n devices
    k = max(1, int(job.grad_accum))
    t_dev, cbound, q = _timed(table, accel, job.precision, p, k, host_speed, dp)
    cnt, ph = table.count, table.phase
    td = t_dev * cnt
    mb = ph != OPTIMIZER                 # forward and backward run once per micro-batch
    compute_mb = float(np.sum(td[mb & cbound]))
    memory_mb = float(np.sum(td[mb & ~cbound]))
    t_fwd = q.forward.seconds
    t_bwd = max(0.0, q.micro_batch.seconds - t_fwd)
    offloaded = offload_time(job, accel, meta, n, t_fwd, t_bwd, cpu_cores)
    # with the optimizer state offloaded the device runs no update kernels: the host does
    opt = 0.0 if offloaded.replaces_device_update else q.optimizer.device_s
    if job.precision.loss_scaling:
        # GradScaler.unscale_: one foreach pass reads and writes every gradient
        # (_amp_foreach_non_finite_check_and_unscale_), bandwidth-bound
        opt += 2 * meta["gradient_bytes"] / (accel.memory_bandwidth_bytes_per_s * p.bw_eff)
    opt /= job.strategy.optimizer_shards(n)                 # each rank updates its shard
    host_update = offloaded.update_s                        # the host's, in its place
    host_exposed = q.exposed_host_s
    comm, extra, notes = exposed_comm(job, accel, meta, n, t_fwd, t_bwd, p.overlap_slowdown)
    comm += offloaded.link_s
    notes = notes + offloaded.notes
    if host_speed != 1.0:
        notes.append(f"the host CPU issues kernels at {host_speed:.2f}x the reference host's "
                     "single-thread speed (data/host_cpus.csv)")
    step = k * (compute_mb + memory_mb) + opt + host_update + host_exposed + comm + extra
    data_wait = 0.0
    pipe = input_pipeline(job, n, accel, cpu_cores)
    if pipe is not None:
        # workers prefetch while the device computes; without workers loading is serial
        data_wait = pipe.load_s if pipe.workers == 0 else max(0.0, pipe.load_s - step)
        step += data_wait
        notes.extend(pipe.notes)
    breakdown = {"compute": k * compute_mb, "memory_bound": k * memory_mb, "communication": comm,
                 "optimizer": opt + host_update, "data_wait": data_wait, "overhead": host_exposed + extra}
    samples = meta["batch_size"] * k * n / step
    tps = meta["tokens_per_sample"]
    peak = _mfu_peak(accel, job.precision, table)
    mfu = meta["model_flops"] * k / step / peak if peak else None
    kinds = {"compute": breakdown["compute"], "memory": breakdown["memory_bound"]
             + breakdown["overhead"] + opt, "communication": comm, "data": data_wait,
             "offload": host_update}
    return StepTime(step, breakdown, samples, samples * tps if tps else None, mfu,
                    max(kinds, key=kinds.get), XLA_COMPILE_S if accel.kind == "tpu" else None,
                    n, notes, forward_s=t_fwd,
                    by_class_parts=(kernel_classes(table), td, mb, k, opt))


def _timed(table: OpTable, accel, precision: Precision, p: TimeParams, k: int,
           host_speed: float, dp: int) -> tuple:
    """(op_times, its step_queue) of `table`, kept on it (TableMemo.timed): a plan over every
    platform times each table on many platforms with the same accelerator (Llama-3.1-70B's:
    1,077 step times, 455 distinct device timings, 2026-12-03). An entry is one of the same
    accelerator (equal), the same parameters (the same object) and the same queue settings;
    the device times alone are kept too, for the accelerator, precision and parameters (the
    queue settings, a platform's host CPU and devices, change only the queue); the arrays are
    read-only, as every reader treats them."""
    memo = table.memo.timed
    devices = (accel.id, precision.name, id(p))     # what the device times depend on
    key = devices + (k, host_speed, dp)
    hit = _memo_get(memo, key, accel, p, precision)
    if hit is not None:
        return hit
    times = _memo_get(memo, devices, accel, p, precision)
    if times is None:       # the device times, shared by every queue setting (platforms' hosts)
        times = op_times(table, accel, precision, p)
        times[0].flags.writeable = times[1].flags.writeable = False
        _memo_put(memo, devices, accel, p, precision, times)
    t_dev, cbound = times
    out = (t_dev, cbound, step_queue(table, t_dev, p, k, host_speed, dp,
                                     bool(precision.loss_scaling)))
    _memo_put(memo, key, accel, p, precision, out)
    return out


def _memo_get(memo: dict, key: tuple, accel, p: TimeParams, precision: Precision):
    """The entry kept under `key`, where it was made for an equal accelerator and precision and
    the same parameters (`_timed`); else None."""
    hit = memo.get(key)
    if hit is not None and hit[1] is p and hit[0] == accel and hit[2] == precision:
        return hit[3]
    return None


def _memo_put(memo: dict, key: tuple, accel, p: TimeParams, precision: Precision, value) -> None:
    if len(memo) >= MEMO_ENTRIES:
        memo.pop(next(iter(memo)))        # the oldest
    memo[key] = (accel, p, precision, value)


def _mfu_peak(accel, precision: Precision, table: OpTable) -> float | None:
    """Nominal dense peak of the job's compute dtype (not clock-derated: MFU convention, S01).

    If some kernels run at a higher rate than the job's dtype suggests (fp32 jobs whose
    convolutions run in TF32), the highest rate used is the denominator, so MFU <= 1 always.
    Memoised on the table.
    """
    memo = table.memo.mfu_peak
    key = (accel.id, precision.name)
    if key not in memo:
        memo[key] = _peak_used(accel, precision, table)
    return memo[key]


def _peak_used(accel, precision: Precision, table: OpTable) -> float | None:
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
