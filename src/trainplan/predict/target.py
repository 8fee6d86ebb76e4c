"""What a job means on a target accelerator: its devices and its kernel semantics.

Devices: `job.gpus` units of the accelerator, each of `devices_per_unit` devices (a TPU v5e-8 is one
unit of 8 chips). Kernel semantics (trace/semantics.py): the attention backend the target picks for
the job's request (by backend: CUDA by compute capability, ROCm by gfx target, MPS's math path),
the autocast dtype (TPUs compute AMP in bf16 whatever dtype is asked, as XLA does), channels-last,
torch.optim's implementation on the device (foreach on CUDA/ROCm, the per-parameter loop on MPS)
and the FP8 recipe with whether the GPU keeps FP8 transposes. Two targets with equal semantics
share a trace.
"""
from __future__ import annotations

from ..accelerators import Accelerator
from ..models.hf_names import EAGER_BEFORE_SDPA_PORT, model_type
from ..trace.semantics import KernelSemantics, attention_backend_for


def devices(job, accel: Accelerator) -> int:
    """Devices the job runs on: gpus x devices per unit."""
    return max(1, job.gpus) * accel.devices_per_unit


def compute_capability(accel: Accelerator) -> float | None:
    try:
        return float(accel.compute_capability)
    except (TypeError, ValueError):
        return None


def fp8_transpose(accel: Accelerator) -> bool:
    """Whether FP8 GEMMs need a transposed copy of their operands (Transformer Engine keeps one
    where the GPU runs FP8 GEMMs only in TN layout): not on sm100-sm11x and sm130+
    (`is_non_tn_fp8_gemm_supported`, transformer_engine/pytorch/utils.py, S116); on Hopper, Ada
    and sm120-sm121 yes. Only the Transformer Engine recipes read it (CUDA-only: compat.py)."""
    cc = compute_capability(accel)
    if cc is None:
        return True
    return not (10.0 <= cc < 12.0 or cc >= 13.0)


# backends traced with CUDA's softmax, cross-entropy, fused RMSNorm and layout rules
# (KernelSemantics cuda_softmax, fused_rms_norm, cuda_layouts): CUDA's and ROCm's (their tensors
# answer is_cuda; ATen picks group norm's layout by `is_cpu()`) and XLA's, which
# fuses those ops into computations that keep no more than the fused kernels do (the CPU build's
# composites keep every intermediate, as no TPU program does); a TPU's fp16 job is then traced as
# a GPU's bf16 one (trace/derive/twins.py). MPS runs the composites.
CUDA_SOFTMAX = ("cuda", "rocm", "xla")


def eager_by_default(job) -> bool:
    """A T5-family model asked to run SDPA or left to the default: transformers ran it eager
    before its SDPA port, and a fit verdict has to hold on those releases too
    (models/hf_names.py EAGER_BEFORE_SDPA_PORT). `--attention efficient` (or math) plans the
    SDPA path of a release that has it."""
    return job.attention in ("auto", "sdpa", "flash") and \
        model_type(job.model) in EAGER_BEFORE_SDPA_PORT


def semantics_for(job, accel: Accelerator) -> KernelSemantics:
    """What the accelerator's kernels do for this job (see trace/semantics.py)."""
    autocast = job.precision.autocast       # torch's dtype name, None without AMP
    cuda_kernels = accel.backend in CUDA_SOFTMAX
    if eager_by_default(job):
        return KernelSemantics(attention="eager", autocast_dtype=autocast if accel.kind != "tpu"
                               or autocast is None else "bfloat16",
                               channels_last=bool(job.channels_last),
                               cuda_softmax=cuda_kernels, fused_rms_norm=cuda_kernels,
                               cuda_layouts=cuda_kernels)
    if accel.kind == "tpu":
        autocast = "bfloat16" if autocast is not None else None
        attention = "efficient" if job.attention in ("auto", "sdpa", "flash") else job.attention
    else:
        attention = attention_backend_for(compute_capability(accel), job.attention,
                                          accel.backend, accel.compute_capability)
        if attention == "flash" and not accel.flash_attention_2:
            attention = "efficient"
    fp8 = job.precision.fp8 if accel.kind == "gpu" else None
    return KernelSemantics(attention=attention, autocast_dtype=autocast,
                           channels_last=bool(job.channels_last),
                           optimizer_foreach=accel.backend != "mps",
                           cuda_softmax=cuda_kernels, fused_rms_norm=cuda_kernels,
                           cuda_layouts=cuda_kernels, fp8=fp8,
                           fp8_transpose=bool(fp8) and fp8.startswith("te-")
                           and fp8_transpose(accel))
