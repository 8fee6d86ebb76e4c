"""The step-time model's parameters: one frozen value, loaded once from data/efficiency.json.

Fitted by scripts/calibrate_time.py (each a physical quantity with a range it may take there):

    host_scale   how much slower the fit's GPU machines issue an op than the CPU the dispatch
                 costs were measured on (predict/host.py)
    tile_s       a GEMM wave's fixed prologue/epilogue, seconds (predict/kernels.py)
    tile_h_half  the tile height at which a narrow tile reaches half its efficiency (kernels.py)
    cuda_emax    cuDNN's CUDA-core convolutions' fraction of the FP32 peak, counted in direct
                 convolution FLOPs (fp32 without TF32: V100, T4; Winograd does fewer)
    dwconv_emax  depthwise convolutions' fraction of the FP32 peak (no tensor-core kernels)
    gdirect_emax cuDNN 8.0-8.3's direct grouped-convolution kernels' fraction of the FP32 peak
                 (channels-last, > 32 channels a group: KernelSemantics.cudnn_grouped_direct)
    attn_emax    fused attention's fraction of the dense peak on Ampere (timing.attention_emax)
    conv_rel     tensor-core convolutions against the matmul ceiling (cuDNN's implicit GEMM)
    gconv_half   channels per group at which a grouped convolution reaches half of conv_rel
    norm_bw_eff  normalisation and softmax kernels' fraction of the bandwidth
    kernel_s     a kernel's fixed device time (launch latency, ramp-up, tail)
    nchw_passes  extra passes over the bytes that NCHW tensor-core convolutions pay (transposes)
    conv_hopper  cuDNN's convolutions on Hopper against their share of the peak elsewhere

Measured, not fitted (their sources in efficiency.json `provenance`): `bw_eff` (STREAM's fraction
of the spec bandwidth), `tc_emax` (the median measured matmul ceiling, for a device without its
own), `matmul_ceiling` (per accelerator id), `fp32_ceiling` and `fp32_emax` (the best measured
FP32 CUDA-core matmul, fraction of the FP32 peak, per accelerator id; the median measured one
for a device without its own), `attn_generation` (fused attention's fraction by
compute capability against Ampere's), `attn_head_dim_half` and `attn_seq_half`
(FlashAttention-2's published curves), `cuda_launch_s` and `host_dispatch` (PyTorch's dispatch
cost per path, scripts/host_dispatch.py; a checkpointed block's rerun op,
scripts/host_paths.py), `overlap_slowdown` (compute overlapping a collective runs this much slower:
predict/comm.py, arXiv:2507.03114), `cast_bw` (TensorIterator's dynamic-casting loop against the
vectorized one, trace/casting.py: PyTorch's own timings of the copies two PRs moved between them).

A missing optional value takes the neutral default below (what the model computes without it:
no convolution penalty, no per-kernel time); the calibration script builds a `TimeParams` from
its vector of fitted values and the measured constants (`TimeParams.of`).
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field, fields
from importlib import resources

FITTED = ("host_scale", "tile_s", "tile_h_half", "cuda_emax", "dwconv_emax", "attn_emax",
          "conv_rel", "gconv_half", "norm_bw_eff", "kernel_s", "nchw_passes", "conv_hopper",
          "gdirect_emax")


@dataclass(frozen=True)
class HostDispatch:
    """PyTorch's dispatch cost per op by path, seconds (predict/host.py)."""

    forward_op_s: float
    backward_op_s: float
    inference_op_s: float
    view_s: float
    # torch.utils.checkpoint's own work (its hooks on every saved tensor, the rerun's bookkeeping
    # and checks) per op a checkpointed block reruns in the backward: Python on the host CPU, no
    # kernel launch in it, so not scaled by `host_scale` (predict/host.py); the rerun op itself is
    # a forward op's dispatch. None (the bundled fit: measured, not yet adopted, docs/validation.md
    # "A checkpointed block's rerun on the host"): a rerun op costs a backward op's
    checkpoint_s: float | None = None
    # the model's own Python per module entered (a module's forward: its attribute reads, shape
    # arithmetic, config checks), measured through real models' code (scripts/host_paths.py
    # --modules): Python on the host CPU, no kernel launch in it, so, as `checkpoint_s`, not
    # scaled by `host_scale` (predict/host.py). None: a module costs nothing beyond its ops
    module_s: float | None = None
    # a view dispatched in the backward: an autograd node's op as any other, the cost
    # host_dispatch.py measures per backward op (views counted among them). None: a view's
    backward_view_s: float | None = None


@dataclass(frozen=True, eq=False)
class TimeParams:
    """The time model's parameters (module docstring). Equal only to itself: two fits are two
    values even where their numbers agree."""

    host_scale: float
    tile_s: float
    tile_h_half: float
    cuda_emax: float
    dwconv_emax: float
    attn_emax: float
    bw_eff: float
    tc_emax: float
    host_dispatch: HostDispatch
    conv_rel: float = 1.0
    gconv_half: float = 0.0
    norm_bw_eff: float | None = None        # None: bw_eff
    kernel_s: float = 0.0
    nchw_passes: float = 0.0
    conv_hopper: float = 1.0
    gdirect_emax: float | None = None       # None: cuda_emax
    cast_bw: float = 1.0                    # 1: a casting loop streams as a vectorized one
    attn_head_dim_half: float = 0.0
    attn_seq_half: float = 0.0
    cuda_launch_s: float = 0.0
    overlap_slowdown: float = 0.0           # 0: a hidden collective costs nothing (comm.py)
    fp32_emax: float | None = None          # None: cuda_emax
    matmul_ceiling: dict[str, float] = field(default_factory=dict)   # accelerator id -> fraction
    fp32_ceiling: dict[str, float] = field(default_factory=dict)     # accelerator id -> fraction
    attn_generation: dict[str, float] = field(default_factory=dict)  # compute capability -> ratio

    @property
    def norm_bandwidth(self) -> float:
        """Normalisation kernels' fraction of the bandwidth (`norm_bw_eff`, else `bw_eff`)."""
        return self.bw_eff if self.norm_bw_eff is None else self.norm_bw_eff

    @property
    def grouped_direct_emax(self) -> float:
        """cuDNN's direct grouped-convolution kernels' fraction of the FP32 peak
        (`gdirect_emax`, else `cuda_emax`)."""
        return self.cuda_emax if self.gdirect_emax is None else self.gdirect_emax

    def ceiling(self, accel_id: str) -> float:
        """The measured best-shape matmul fraction of the peak on this accelerator, else the
        median measured one (`tc_emax`)."""
        return float(self.matmul_ceiling.get(accel_id, self.tc_emax))

    def fp32_matmul_ceiling(self, accel_id: str) -> float:
        """The measured best FP32 matmul on CUDA cores (no TF32), fraction of the FP32 peak, on
        this accelerator; else the median measured one (`fp32_emax`; `cuda_emax` where a fit
        predates the measured table)."""
        fallback = self.cuda_emax if self.fp32_emax is None else self.fp32_emax
        return float(self.fp32_ceiling.get(accel_id, fallback))

    def fitted(self) -> dict[str, float]:
        """The fitted values by name (FITTED), as efficiency.json `params` writes them."""
        return {k: getattr(self, k) for k in FITTED}

    @classmethod
    def of(cls, values: dict) -> "TimeParams":
        """From efficiency.json's layout: `params` (fitted and measured scalars), with
        `matmul_ceiling`, `fp32_ceiling`, `attn_generation` and `host_dispatch` beside them;
        names the type does not have are an error, not ignored."""
        known = {f.name for f in fields(cls)}
        extra = set(values) - known
        if extra:
            raise ValueError(f"unknown time-model parameters: {', '.join(sorted(extra))}")
        kw = dict(values)
        hd = kw["host_dispatch"]
        kw["host_dispatch"] = hd if isinstance(hd, HostDispatch) else HostDispatch(**hd)
        kw["matmul_ceiling"] = dict(kw.get("matmul_ceiling") or {})
        kw["fp32_ceiling"] = dict(kw.get("fp32_ceiling") or {})
        kw["attn_generation"] = dict(kw.get("attn_generation") or {})
        return cls(**kw)


@functools.cache
def efficiency_file() -> dict:
    """data/efficiency.json as written by scripts/calibrate_time.py (with its provenance)."""
    return json.loads(resources.files("trainplan.data").joinpath("efficiency.json").read_text())


@functools.cache
def bundled() -> TimeParams:
    """The bundled fit (data/efficiency.json), loaded once."""
    return of_file(efficiency_file())


def of_file(data: dict) -> TimeParams:
    """The parameters an efficiency.json (as read by json) holds."""
    return TimeParams.of(dict(data["params"], matmul_ceiling=data.get("matmul_ceiling", {}),
                              fp32_ceiling=data.get("fp32_ceiling", {}),
                              attn_generation=data.get("attn_generation", {}),
                              host_dispatch=data["host_dispatch"]))


def bundled_accuracy() -> dict | None:
    """The bundled fit's error on sources it never saw (efficiency.json `accuracy`, written by
    scripts/validate_time.py): leave-one-source-out median and p90 absolute error."""
    return efficiency_file().get("accuracy")
