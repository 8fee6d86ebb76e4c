"""The local device a measurement runs on: what it is, which catalog row it is, how much memory
the process holds on it, and the library versions that ran.

Memory as PyTorch users know it (the three figures `memory.py` predicts):

    peak allocated   torch.cuda.max_memory_allocated()   bytes the caching allocator handed out
    peak reserved    torch.cuda.max_memory_reserved()    allocated + the allocator's cached segments
    device used      NVML's usedGpuMemory for this process (the per-process column of nvidia-smi:
                     reserved + CUDA context + kernel images); without pynvml, or where NVML cannot
                     see this process (containers with their own PID namespace),
                     torch.cuda.mem_get_info()'s total - free, which is device-wide and so counts
                     other processes too. The record says which source was used.

On a CPU there is no caching allocator: peak allocated/reserved are None, and the process's peak
resident set size (getrusage ru_maxrss: lifetime peak, Python and libraries included) is recorded
instead, with the resident size before the model was built.
"""
from __future__ import annotations

import os
import platform
import re
import resource
import sys
from dataclasses import asdict, dataclass
from importlib import metadata

import torch

from ..accelerators import get_accelerator, load_accelerators
from ..errors import TrainplanError
from ..trace.parallel import usable_cores

# words that name a vendor or a product line, not the model (the model token is what is left)
_VENDOR_WORDS = {"nvidia", "tesla", "geforce", "rtx", "quadro", "google", "amd", "instinct", "radeon",
                 "rx"}


@dataclass(frozen=True)
class DeviceInfo:
    type: str                       # "cuda" | "cpu"
    index: int | None
    name: str
    total_memory_bytes: int | None
    compute_capability: str | None
    driver_version: str | None
    # the CPU that issues the kernels, e.g. "AMD EPYC 7B13, 16 cores": the step's host time
    # depends on it (predict/host.py, data/host_cpus.csv); a record without it cannot say
    host_cpu: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def resolve_device(requested: str | None = None) -> torch.device:
    """`requested` ("cuda", "cuda:1", "cpu") or, by default, CUDA when present, otherwise CPU."""
    if requested in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(requested)
    except RuntimeError:
        raise TrainplanError(f"--device {requested!r} is not a device.",
                             allowed="auto, cpu, cuda, cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise TrainplanError("--device cuda asked for, but this PyTorch sees no CUDA device.",
                             fix="run on a machine with a GPU and a CUDA build of torch, or use "
                                 "--device cpu")
    if dev.type not in ("cuda", "cpu"):
        raise TrainplanError(f"--device {requested!r}: trainplan measures on cuda or cpu.",
                             allowed="auto, cpu, cuda, cuda:N")
    return dev


def describe_device(dev: torch.device) -> DeviceInfo:
    if dev.type == "cuda":
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        return DeviceInfo("cuda", idx, props.name, int(props.total_memory),
                          f"{props.major}.{props.minor}", _nvml_driver(), _host_cpu(cpu_model()))
    model = cpu_model()
    return DeviceInfo("cpu", None, f"{model} ({torch.get_num_threads()} threads used)",
                      None, None, None, _host_cpu(model))


def cpu_model() -> str:
    """'AMD EPYC 7B13' from /proc/cpuinfo where there is one, else what `platform` says."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return name


def _host_cpu(model: str) -> str:
    """'AMD EPYC 7B13, 16 cores': the host CPU's model and the cores this process may use."""
    return f"{model}, {usable_cores()} cores"


def _tokens(name: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", name.lower())


def _model_token(catalog_name: str) -> str | None:
    """'NVIDIA A100 SXM4 40GB' -> 'a100'; 'NVIDIA GeForce RTX 3090 24GB' -> '3090'."""
    for t in _tokens(catalog_name):
        if t not in _VENDOR_WORDS:
            return t
    return None


def match_accelerator(device_name: str, total_memory_bytes: int | None = None) -> str | None:
    """The catalog id of a CUDA device (ROCm's HIP devices report as CUDA ones), from the name
    the driver reports, or None.

    Driver names ("NVIDIA A100-SXM4-80GB", "Tesla T4", "NVIDIA H100 80GB HBM3", "NVIDIA A10G")
    are matched on the model token of each catalog row's name (a100, t4, h100, a10g, 3090), then
    narrowed by form factor (a "PCIe" or "Laptop" device only matches such rows, other devices
    prefer rows that are neither) and finally by the memory size closest to the device's.
    """
    tokens = set(_tokens(device_name))
    cands = [a for a in load_accelerators().values()
             if a.backend in ("cuda", "rocm") and _model_token(a.name) in tokens]
    if not cands:
        return None
    for form in ("laptop", "pcie"):
        mine = [a for a in cands if form in _tokens(a.name)]
        if form in tokens:
            cands = mine or cands
        elif len(mine) < len(cands):
            cands = [a for a in cands if a not in mine]
    if total_memory_bytes:
        cands.sort(key=lambda a: abs(a.memory_per_device_bytes - total_memory_bytes))
    return cands[0].id


def resolve_accelerator(info: DeviceInfo, flag: str | None) -> tuple[str | None, str | None]:
    """(catalog id, how it was found: "flag" | "detected") for the device that ran, or (None, None)."""
    if flag:
        return get_accelerator(flag).id, "flag"
    if info.type == "cuda":
        found = match_accelerator(info.name, info.total_memory_bytes)
        if found:
            return found, "detected"
    return None, None


def library_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version(), "torch": torch.__version__,
                                  "cuda": torch.version.cuda, "cudnn": None}
    if torch.cuda.is_available():
        v = torch.backends.cudnn.version()
        out["cudnn"] = str(v) if v else None
    for pkg in ("trainplan", "transformers", "timm", "torchvision", "accelerate", "numpy"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    out["platform"] = platform.platform()
    return out


# --- memory -------------------------------------------------------------------------------------
def _nvml():
    try:
        import pynvml
        pynvml.nvmlInit()
        return pynvml
    except Exception:  # not installed, no driver, no permission: NVML is optional
        return None


def _nvml_driver() -> str | None:
    nv = _nvml()
    if nv is None:
        return None
    try:
        v = nv.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:
        return None


def _nvml_handle(nv, idx: int):
    """NVML's handle for torch's device `idx` (by UUID, since CUDA_VISIBLE_DEVICES renumbers)."""
    uuid = getattr(torch.cuda.get_device_properties(idx), "uuid", None)
    if uuid is not None:
        try:
            return nv.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
        except Exception:
            pass
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        ids = [v.strip() for v in visible.split(",")]
        if idx < len(ids) and ids[idx].isdigit():
            return nv.nvmlDeviceGetHandleByIndex(int(ids[idx]))
        return None
    return nv.nvmlDeviceGetHandleByIndex(idx)


def rss_bytes() -> int | None:
    """Resident set size of this process now (Linux /proc; psutil elsewhere if installed)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil
        return int(psutil.Process().memory_info().rss)
    except Exception:
        return None


def peak_rss_bytes() -> int:
    """Lifetime peak RSS: ru_maxrss is in KiB on Linux, in bytes on macOS."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


class MemoryProbe:
    """Peak memory of one measured run on `dev`; `reset()` at the start, `sample()` after steps."""

    def __init__(self, dev: torch.device):
        self.dev = dev
        self.device_used_bytes: int | None = None
        self.device_used_source: str | None = None
        self.rss_before_bytes: int | None = None
        self._nv = _nvml() if dev.type == "cuda" else None
        self._handle = None
        if self._nv is not None:
            try:
                self._handle = _nvml_handle(self._nv, self._index())
            except Exception:
                self._handle = None

    def _index(self) -> int:
        return self.dev.index if self.dev.index is not None else torch.cuda.current_device()

    def reset(self) -> None:
        self.rss_before_bytes = rss_bytes()
        self.device_used_bytes = None
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)
            torch.cuda.reset_peak_memory_stats(self.dev)

    def sample(self) -> None:
        """Device used now (the caching allocator never shrinks by itself, so the last sample of a
        steady run is its peak); keeps the largest value seen."""
        if self.dev.type != "cuda":
            return
        used, source = self._process_used(), "nvml-process"
        if used is None:
            free, total = torch.cuda.mem_get_info(self.dev)
            used, source = int(total - free), "cuda-mem-get-info (device-wide)"
        if self.device_used_bytes is None or used > self.device_used_bytes:
            self.device_used_bytes, self.device_used_source = used, source

    def _process_used(self) -> int | None:
        if self._nv is None or self._handle is None:
            return None
        try:
            procs = self._nv.nvmlDeviceGetComputeRunningProcesses(self._handle)
        except Exception:
            return None
        for p in procs:
            if p.pid == os.getpid() and p.usedGpuMemory:
                return int(p.usedGpuMemory)
        return None

    def result(self) -> dict:
        cuda = self.dev.type == "cuda"
        return {
            "peak_allocated_bytes": int(torch.cuda.max_memory_allocated(self.dev)) if cuda else None,
            "peak_reserved_bytes": int(torch.cuda.max_memory_reserved(self.dev)) if cuda else None,
            "device_used_bytes": self.device_used_bytes,
            "device_used_source": self.device_used_source,
            "peak_rss_bytes": peak_rss_bytes(),
            "rss_before_bytes": self.rss_before_bytes,
        }


def synchronize(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
