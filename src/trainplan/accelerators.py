"""Accelerator catalog: typed rows of `data/accelerators.csv`.

The CSV is the single home of hardware numbers; nothing in the code hard-codes a peak.
Every row carries `sources` (IDs in `data/SOURCES.md`), an `as_of` date and `choice_notes`
that say which value was chosen where sources disagree and which numbers are derived.

Conventions (see `data/SOURCES.md`):
- Units: bytes, bytes/s, FLOP/s (ops/s for int8), watts.
- Tensor rates are dense (no 2:4 sparsity). fp16 tensor = FP16 inputs with FP32 accumulate.
- A number 0 means "the hardware does not do this"; an empty cell (None) means "no source".
- One row is one *unit* that is rented or bought (a GPU, or a TPU host such as v3-8).
  A unit holds `devices_per_unit` devices (1 for GPUs; 8 TPU cores or chips). Flops,
  bandwidth, `usable_memory_bytes` and `memory_per_device_bytes` are PER DEVICE: TPU memory
  is never pooled (pytorch/xla #1881). `memory_bytes` is the whole unit's nominal memory.
- `usable_memory_bytes` is the capacity a fit is checked against: the total the driver reports
  (nvidia-smi's "MiB" total with ECC as the clouds run it; PyTorch's `total_memory` on ROCm;
  Metal's `recommendedMaxWorkingSetSize` on Apple silicon, the share of unified memory the GPU
  may wire by default). The memory model adds what the runtime takes out of it (the CUDA
  context, NCCL's buffers: predict/memory.py). Where no driver figure was found the row keeps
  the nominal GiB count and its notes say so.
- `backend` is the PyTorch device stack the row runs under: cuda (NVIDIA), rocm (AMD; PyTorch's
  "cuda" device over HIP), mps (Apple's Metal) or xla (TPUs). Kernel semantics, the allocator
  model and the compatibility rules are chosen by it (predict/target.py, predict/compat.py).
"""
from __future__ import annotations

import csv
import functools
from dataclasses import dataclass, fields
from datetime import date
from importlib import resources
from typing import NamedTuple

from .errors import TrainplanError, unknown

DTYPES = ("fp32", "tf32", "fp16", "bf16")
BACKENDS = ("cuda", "rocm", "mps", "xla")


@dataclass(frozen=True)
class Accelerator:
    """One row of `accelerators.csv`.

    id: lower-case catalog id (e.g. "a100-sxm4-40gb"). aliases: other accepted names.
    kind: "gpu" or "tpu". backend: cuda | rocm | mps | xla (module docstring).
    compute_capability: CUDA CC ("8.0"), the AMD gfx target ("gfx942"), the Apple GPU family
        ("apple9") or "" for TPUs (S05).
    memory_bytes: nominal memory of the whole unit (sum over its devices; never pooled).
    usable_memory_bytes: the capacity of one device as its driver reports it (module
        docstring; T4: 16106127360 B = 15,360 MiB as reported on Kaggle, S23, and by nvidia-smi,
        S56); the nominal GiB count where no driver figure was found (the row's notes say so).
    memory_bandwidth_bytes_per_s: peak device-memory bandwidth per device.
    fp32_flops: FP32 (non-tensor) peak per device. tf32_flops: dense TF32 tensor peak, 0 if none.
    fp16_tensor_flops: dense FP16 tensor peak with FP32 accumulate, 0 without FP16 tensor cores.
    bf16_flops: dense BF16 peak, 0 if unsupported. fp16_nontensor_flops: FP16 on CUDA cores
        with fp16 accumulation (P100: 18.7e12, S46; catalog fact only, PyTorch does not run it). int8_ops: dense INT8 tensor peak (ops/s).
    fp8_flops: dense FP8 (e4m3/e5m2) tensor peak with FP32 accumulate, what `torch._scaled_mm`
        runs at (0: no FP8 tensor cores; GeForce parts are half rate with FP32 accumulate).
    tensor_cores: "+"-joined tensor precisions ("none", "fp16+int8", "fp16+bf16+tf32+int8",
        "mxu-bf16"; Blackwell adds the block-scaled "mxfp8", "mxfp4" and "nvfp4").
    supports_bf16 / flash_attention_2: kernel support (S06: both need sm80+).
    tdp_watts: board power per device. sustained_clock_fraction: share of boost clock held
        under training load (T4 900/1590 MHz under its 70 W cap, S38; else 1.0).
    interconnect / interconnect_bytes_per_s: link used for collectives between devices of one
        machine and its spec bandwidth per direction per device (S02); efficiency is the time
        model's job. host_link: link to the host CPU.
    devices_per_unit: devices one training process sees (GPU 1; tpu-v2-8/v3-8 8 cores; v5e-8 8 chips).
    as_of: ISO date of the facts. sources: IDs in SOURCES.md. choice_notes: choices and derivations.
    """

    id: str
    aliases: tuple[str, ...]
    name: str
    vendor: str
    kind: str
    backend: str
    compute_capability: str
    memory_bytes: int
    usable_memory_bytes: int
    memory_bandwidth_bytes_per_s: float
    fp32_flops: float | None
    tf32_flops: float | None
    fp16_tensor_flops: float | None
    bf16_flops: float | None
    fp16_nontensor_flops: float | None
    int8_ops: float | None
    fp8_flops: float | None
    tensor_cores: str
    supports_bf16: bool
    flash_attention_2: bool
    tdp_watts: float | None
    sustained_clock_fraction: float
    interconnect: str
    interconnect_bytes_per_s: float | None
    devices_per_unit: int
    memory_per_device_bytes: int
    host_link: str
    as_of: str
    sources: tuple[str, ...]
    choice_notes: str

    def rate(self, dtype: str) -> tuple[float, bool]:
        """(dense FLOP/s per device of a GEMM or convolution computing in `dtype`, whether it runs
        on tensor cores: a TPU's MXU counts): the one per-dtype peak. The time model times every
        kernel at it (predict/timing.py), MFU divides by it, the catalog lists it (`peak_flops`).
        Not derated by `sustained_clock_fraction`; the time model applies that.

        - "fp32": the FP32 rate (no TF32 implied); a TPU's MXU.
        - "tf32": the TF32 tensor rate; without TF32 tensor cores (pre-Ampere, TPU) the FP32 rate.
        - "fp16": the FP16 tensor rate; without FP16 tensor cores the FP32 rate: PyTorch's half
          GEMM (cublasGemmEx with CUBLAS_COMPUTE_32F, aten/src/ATen/cuda/CUDABlas.cpp) and cuDNN's
          half convolutions (fp32 math type, "pseudo-half") accumulate in fp32, so they run on
          the FP32 FMA units: a P100's 18.7e12 half2 rate (fp16 accumulate) is not reached. A TPU
          has no fp16: XLA computes it in bf16, at the bf16 rate.
        - "bf16": the BF16 rate; on devices without BF16 (T4, V100, P100, TITAN RTX) the FP32
          rate, what emulation is timed at (the compatibility rules report it: predict/compat.py).
        - "fp8": the dense FP8 rate `torch._scaled_mm` runs at; without FP8 tensor cores the
          FP32 rate.
        """
        fp32 = float(self.fp32_flops or 0.0)
        tc, tpu = self.tensor_cores, self.kind == "tpu"
        if dtype == "tf32" and "tf32" in tc and self.tf32_flops:
            return float(self.tf32_flops), True
        if dtype == "fp16" and "fp16" in tc and self.fp16_tensor_flops:
            return float(self.fp16_tensor_flops), True
        if dtype == "fp16" and tpu:
            return float(self.bf16_flops or fp32), True
        if dtype == "bf16" and self.supports_bf16 and self.bf16_flops:
            return float(self.bf16_flops), "bf16" in tc or tpu
        if dtype == "fp8" and self.fp8_flops:
            return float(self.fp8_flops), True
        return fp32, tpu and dtype in ("fp32", "tf32")

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s per device that matmuls in `dtype` (fp32, tf32, fp16, bf16) really
        run at: `rate`'s."""
        dtype = dtype.lower()
        if dtype not in DTYPES:
            raise TrainplanError(f"Unknown dtype {dtype!r} for peak FLOP/s.", allowed=", ".join(DTYPES))
        if self.fp32_flops is None:
            raise TrainplanError(
                f"No sourced fp32 rate for accelerator {self.id!r}.",
                fix=f"add the figure with its source to data/accelerators.csv (row {self.id!r})",
            )
        return self.rate(dtype)[0]

    @property
    def has_fp8(self) -> bool:
        """FP8 tensor cores (Ada, Hopper, Blackwell, CDNA3+): what FP8 training needs."""
        return bool(self.fp8_flops)

    @property
    def unit_memory_bytes(self) -> int:
        """Total memory of the unit (devices x per-device); for display, never for fit checks."""
        return self.memory_per_device_bytes * self.devices_per_unit


class CatalogRow(NamedTuple):
    """One line of `trainplan catalog`: raw values, formatted by the report layer."""

    id: str
    name: str
    kind: str
    devices_per_unit: int
    usable_memory_bytes: int
    memory_bandwidth_bytes_per_s: float
    bf16_flops: float
    fp16_flops: float
    aliases: tuple[str, ...]
    as_of: str


def _opt_float(v: str) -> float | None:
    return None if v.strip() == "" else float(v)


def _bool(v: str) -> bool:
    if v not in ("yes", "no"):
        raise ValueError(f"expected yes/no, got {v!r}")
    return v == "yes"


_CONVERT = {
    "aliases": lambda v: tuple(a.strip().lower() for a in v.split("|") if a.strip()),
    "sources": lambda v: tuple(s.strip() for s in v.split(";") if s.strip()),
    "memory_bytes": int, "usable_memory_bytes": int, "memory_per_device_bytes": int,
    "devices_per_unit": int, "memory_bandwidth_bytes_per_s": float,
    "sustained_clock_fraction": float, "supports_bf16": _bool, "flash_attention_2": _bool,
    **{k: _opt_float for k in ("fp32_flops", "tf32_flops", "fp16_tensor_flops", "bf16_flops",
                               "fp16_nontensor_flops", "int8_ops", "fp8_flops", "tdp_watts",
                               "interconnect_bytes_per_s")},
}


def _parse_row(row: dict[str, str], line: int) -> Accelerator:
    where = f"data/accelerators.csv line {line}"
    try:
        values = {f.name: _CONVERT.get(f.name, str)(row[f.name]) for f in fields(Accelerator)}
        acc = Accelerator(**values)
        date.fromisoformat(acc.as_of)
    except (KeyError, ValueError) as err:
        raise TrainplanError(f"Bad accelerator row at {where}: {err}") from err
    problems = []
    if acc.kind not in ("gpu", "tpu"):
        problems.append(f"kind {acc.kind!r} is not gpu|tpu")
    if acc.backend not in BACKENDS or (acc.kind == "tpu") != (acc.backend == "xla"):
        problems.append(f"backend {acc.backend!r} is not one of {'|'.join(BACKENDS)} "
                        "(xla for TPUs, and only for them)")
    if not acc.sources:
        problems.append("no sources")
    if acc.memory_bytes != acc.memory_per_device_bytes * acc.devices_per_unit:
        problems.append("memory_bytes != memory_per_device_bytes x devices_per_unit")
    if not 0 < acc.usable_memory_bytes <= acc.memory_per_device_bytes:
        problems.append("usable_memory_bytes must be in (0, memory_per_device_bytes]")
    if problems:
        raise TrainplanError(f"Bad accelerator row {acc.id!r} at {where}: " + "; ".join(problems))
    return acc


@functools.cache
def load_accelerators() -> dict[str, Accelerator]:
    """All catalog rows by id, read once from the packaged CSV."""
    text = resources.files("trainplan").joinpath("data").joinpath("accelerators.csv").read_text(encoding="utf-8")
    out: dict[str, Accelerator] = {}
    for line, row in enumerate(csv.DictReader(text.splitlines()), start=2):
        acc = _parse_row(row, line)
        if acc.id in out:
            raise TrainplanError(f"Duplicate accelerator id {acc.id!r} in data/accelerators.csv line {line}.")
        out[acc.id] = acc
    return out


def _normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


@functools.cache
def _lookup_table() -> dict[str, str]:
    table: dict[str, str] = {}
    for acc in load_accelerators().values():
        for key in (acc.id, *acc.aliases):
            if table.get(key, acc.id) != acc.id:
                raise TrainplanError(f"Accelerator name {key!r} is used by both {table[key]!r} and {acc.id!r}.")
            table[key] = acc.id
    return table


def get_accelerator(name: str) -> Accelerator:
    """Look up by id or alias, case-insensitive ("A100", "tesla-t4", "RTX 3090")."""
    key = _normalise(name)
    table = _lookup_table()
    if key not in table:
        raise unknown("accelerator", name, load_accelerators(), hint="run `trainplan catalog` to list them")
    return load_accelerators()[table[key]]


def catalog_rows() -> list[CatalogRow]:
    """Rows for listing: GPUs then TPUs, each by usable memory per device."""
    accs = sorted(load_accelerators().values(), key=lambda a: (a.kind, a.usable_memory_bytes, a.id))
    return [
        CatalogRow(a.id, a.name, a.kind, a.devices_per_unit, a.usable_memory_bytes,
                   a.memory_bandwidth_bytes_per_s, a.peak_flops("bf16"), a.peak_flops("fp16"),
                   a.aliases, a.as_of)
        for a in accs
    ]


@dataclass(frozen=True)
class KernelFacts:
    """One row of `data/gpu_kernels.csv`: what a GPU's kernels are tiled over (predict/kernels.py).

    sm_count: streaming multiprocessors enabled on the product (AMD: compute units; Apple: GPU
    cores). boost_clock_mhz: its specified boost clock. l2_cache_bytes: L2 cache. None where no
    source gives it (an empty cell). as_of, sources (IDs in SOURCES.md), notes."""

    id: str
    sm_count: int | None
    boost_clock_mhz: float | None
    l2_cache_bytes: int | None
    as_of: str
    sources: str
    notes: str


@functools.cache
def _kernel_facts() -> dict[str, KernelFacts]:
    text = resources.files("trainplan").joinpath("data").joinpath("gpu_kernels.csv").read_text(
        encoding="utf-8")
    out: dict[str, KernelFacts] = {}
    for line, row in enumerate(csv.DictReader(text.splitlines()), start=2):
        try:
            facts = KernelFacts(row["id"], _opt_int(row["sm_count"]),
                                _opt_float(row["boost_clock_mhz"]),
                                _opt_int(row["l2_cache_bytes"]), row["as_of"], row["sources"],
                                row["notes"])
        except (KeyError, ValueError) as e:
            raise TrainplanError(f"data/gpu_kernels.csv line {line}: {e}.") from e
        out[facts.id] = facts
    return out


def _opt_int(v: str) -> int | None:
    return int(v) if v.strip() else None


def kernel_facts(accel: Accelerator) -> KernelFacts | None:
    """The GPU's SMs, clock and L2 (data/gpu_kernels.csv), None where the catalog has no row."""
    return _kernel_facts().get(accel.id)
