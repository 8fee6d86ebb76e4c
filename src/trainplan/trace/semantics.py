"""What the target device's kernels do, as far as a traced step's memory and FLOPs go: the
SDPA backend, the autocast dtype, the fused dropout, the optimizer's implementation, FP8 and the
library releases that change what is kept (`KernelSemantics`), and which backend PyTorch picks
on a given GPU (`attention_backend_for`).

Plain data, no PyTorch: a stored trace carries its `KernelSemantics`, and a plan answered from
stored traces reads them without importing torch (about 1.3 s of a warm plan on 2 cores).
trace/emulation.py applies them while tracing (`TargetSemantics`).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelSemantics:
    """What the target device's kernels do, as far as memory and FLOPs are concerned.

    attention: "flash" | "efficient" | "math" (SDPA's backend) or "eager" (the model composes
        attention from matmul/softmax/dropout itself; for SDPA callers this equals "math").
    autocast_dtype: "float16" / "bfloat16" (torch's dtype name) for AMP, None otherwise; a
        torch.dtype given here is kept by its name.
    optimizer_foreach: torch.optim's default implementation on the device: the multi-tensor
        (foreach) kernels on CUDA/ROCm, the per-parameter loop where PyTorch has no foreach
        kernels (MPS: torch/utils/_foreach_utils.py lists cuda, xpu, mtia and privateuse1 only).
    fp8: the FP8 training recipe the linears run (trace/fp8.py), None without.
    fp8_transpose: the GPU keeps FP8 transposes beside the data (Transformer Engine on GPUs
        without non-TN FP8 GEMMs: Hopper, Ada, sm120).
    bnb4_keeps_input: bitsandbytes before 0.43.2, whose 4-bit matmul kept every input for
        backward (quantization.py); False is today's release.
    efficient_gqa: PyTorch's memory-efficient kernel takes grouped-query attention
        (`enable_gqa=True` with fewer K/V heads): from pytorch/pytorch#191085 (July 2026, torch
        2.13). Before it only flash did, so a GQA call flash cannot take (fp32, a mask, a head
        dim over 256) fell to the math path, which materialises the scores (pytorch/pytorch#
        139586; sdp_utils.cpp check_batch_size_and_num_heads_dense). False: the releases in
        common use (torch <= 2.12), what the measured H100/H200 runs (torch 2.11) ran.
    mean_keeps_input: PyTorch before 2.2, whose `mean` kept its whole input for backward:
        mean's derivative (derivatives.yaml `mean.dim`: `mean_backward(grad, self.sym_sizes(),
        dim, self.sym_numel(), keepdim)`) needs only the input's sizes and element count, but
        torchgen saved `self.sym_numel()` as a number only from 2.2.0 (load_derivatives.py's
        `_sym_numel` replacement); 2.1 and earlier saved `self` to call it (MeanBackward1
        `_saved_self`, checked on torch 2.1.0; pytorch/pytorch#5741). An RMSNorm's
        `mean(x * x)` then keeps one more activation-sized tensor per norm. False: torch >= 2.2.
    hf_loss_copies_logits: transformers before 4.49, whose causal-LM loss copied the shifted
        fp32 logits (models/hf_releases.py): one more fp32 tokens x vocab tensor at the end of
        the forward. False: transformers >= 4.49, what the tracer's release runs.
    cuda_softmax: softmax, log_softmax and cross-entropy as CUDA/ROCm run them (False on CPU
        and MPS, whose autocast casts cross-entropy's input to float32 first; XLA's fusions are
        traced as CUDA's, predict/target.py CUDA_SOFTMAX). (1) Asked for
        float32 from a float16 input (CUDA autocast asks so of every softmax and log_softmax:
        autocast_mode.h AT_FORALL_FP32_SET_OPT_DTYPE), the kernel reads the float16 and writes
        float32 (SoftMax.cpp: `input_.is_cuda() && Half && dtype == Float` ->
        `_softmax(input, dim, half_to_float=true)`) and its backward writes float16: no float32
        copy of the input (bfloat16 is copied: the fast path is Half only). (2) Cross-entropy is
        on no CUDA autocast list: ATen composes it (LossNLL.cpp `cross_entropy_loss_symint`) as
        log_softmax in the input's own dtype (its explicit dtype keeps autocast off it), then
        nll_loss, on the float32 list, over a float32 copy of the log-probabilities, which
        nll_loss's backward keeps.
    fused_rms_norm: `F.rms_norm` as one CUDA kernel each way, its node keeping the input and
        1/rms (trace/fused_norm.py; PyTorch >= 2.9, pytorch/pytorch#153666, on CUDA and ROCm).
        False: the composite (CPU; MPS under autograd; PyTorch <= 2.8), whose nodes keep the
        normalised input too.
    expands_kv: the model copies grouped-query K/V heads to every query head before attention:
        transformers before 4.54 (`repeat_kv` in every SDPA call; 4.54 passes grouped K/V with
        `enable_gqa` where there is no mask, huggingface/transformers#39412, July 2025), and
        the Llama code of torchtitan, torchtune and IBM's foundation-model-stack the published
        runs used (`repeat_kv`; `expand(...).flatten`). SDPA then sees as many K/V heads as query heads,
        so any kernel takes the call. False: today's transformers, whose grouped K/V reach the
        flash kernel as they are (trace/flash_gqa.py).
    cuda_layouts: CUDA's and ROCm's layout rules (trace/cuda_layout.py): group norm makes a
        channels-last input contiguous and writes NCHW, forward and backward, and a convolution
        transposes an activation not in the layout cuDNN runs, inside the kernel. False: the CPU
        device's, which keeps channels-last through a group norm (CPU and MPS targets).
    """

    attention: str = "efficient"
    autocast_dtype: str | None = None
    fused_dropout: bool = True
    channels_last: bool = False
    optimizer_foreach: bool = True
    fp8: str | None = None
    fp8_transpose: bool = False
    bnb4_keeps_input: bool = False
    efficient_gqa: bool = False
    mean_keeps_input: bool = False
    hf_loss_copies_logits: bool = False
    cudnn_grouped_direct: bool = False
    expands_kv: bool = False
    cuda_softmax: bool = True
    fused_rms_norm: bool = True
    cuda_layouts: bool = True

    def __post_init__(self):
        if self.autocast_dtype is not None and not isinstance(self.autocast_dtype, str):
            object.__setattr__(self, "autocast_dtype", dtype_name(self.autocast_dtype))

    def key(self) -> tuple:
        base = (self.attention, self.autocast_dtype, self.fused_dropout, self.channels_last,
                self.bnb4_keeps_input, self.efficient_gqa)
        extra = (("loop",) if not self.optimizer_foreach else ()) + \
            ((f"fp8:{self.fp8}:{int(self.fp8_transpose)}",) if self.fp8 else ()) + \
            (("mean-keeps-input",) if self.mean_keeps_input else ()) + \
            (("hf-loss-copies-logits",) if self.hf_loss_copies_logits else ()) + \
            (("cudnn-grouped-direct",) if self.cudnn_grouped_direct else ()) + \
            (("expands-kv",) if self.expands_kv else ()) + \
            (() if self.cuda_softmax else ("cpu-softmax",)) + \
            (() if self.fused_rms_norm else ("rms-composite",)) + \
            (() if self.cuda_layouts else ("cpu-layouts",))
        return base + extra


# What a PyTorch release before 2.9 runs where the defaults assume today's: `F.rms_norm` composed,
# not fused (KernelSemantics.fused_rms_norm). Every published run the validations read predates
# 2.9 (the newest, PEFT's L40S rows, ran 2.7.1; validation/PROVENANCE.md).
BEFORE_TORCH_2_9 = {"fused_rms_norm": False}


# cuDNN 8.0-8.3's channels-last grouped convolutions above this many channels a group ran its
# direct kernels (KernelSemantics.cudnn_grouped_direct): RegNetZ-d32's 32 ran NHWC faster than
# NCHW in timm's RTX 3090 tables, RegNetX-032's 48 2.6x slower
CUDNN_GROUPED_DIRECT_ABOVE = 32


# AMD archs whose AOTriton SDPA kernels PyTorch treats as experimental: flash and memory-efficient
# attention stay off unless TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1 (aten/src/ATen/native/
# transformers/cuda/sdp_utils.cpp, `check_flash_attention_hardware_support`: gfx1100 by name,
# later `aotriton::isArchExperimentallySupported`; data/SOURCES.md S111). RDNA 3/4 consumer parts.
ROCM_EXPERIMENTAL_SDPA = frozenset({"gfx1100", "gfx1101", "gfx1102", "gfx1150", "gfx1151",
                                    "gfx1200", "gfx1201"})


def attention_backend_for(compute_capability: float | None, requested: str = "auto",
                          backend: str = "cuda", arch: str = "") -> str:
    """The SDPA backend PyTorch picks on a GPU of this compute capability and backend.

    FlashAttention-2 needs sm80+ (Dao-AILab/flash-attention README); PyTorch's memory-efficient
    kernel (xformers/cutlass) runs from sm50 and is what a T4 (sm75) or V100 (sm70) gets; flash
    covers sm80-sm121, Blackwell included (sdp_utils.cpp, S111). TPUs (None) run XLA's fused
    attention, closest in memory to "efficient". ROCm: AOTriton's flash kernel on CDNA (gfx90a,
    gfx942, gfx950), the math path on archs it gates as experimental (`ROCM_EXPERIMENTAL_SDPA`).
    MPS: the math path when training -- `scaled_dot_product_attention` takes the MPS kernel only
    when no input requires grad (aten/src/ATen/native/transformers/attention.cpp, S111), and the
    flash-attn package has no Metal build.
    """
    if requested == "sdpa":
        requested = "auto"
    if backend == "mps":
        return "math" if requested in ("auto", "flash", "efficient") else requested
    if requested != "auto":
        return requested
    if backend == "rocm":
        return "math" if arch in ROCM_EXPERIMENTAL_SDPA else "flash"
    if compute_capability is None:
        return "efficient"
    if compute_capability >= 8.0:
        return "flash"
    if compute_capability >= 5.0:
        return "efficient"
    return "math"




def dtype_name(dtype) -> str:
    """torch.bfloat16 -> "bfloat16" (a name passes through), without importing torch."""
    return str(dtype).replace("torch.", "")
