"""What a target cannot run, in one table: each rule gives the finding a user reads and, where
there is one, the rewrite to the nearest job the target does run.

`estimate` asks `check` (a fatal rule is an error with exit 2: the job cannot run there at all);
`plan` asks `adapt` first (every rewrite applied, each listed as a change), then `check` on what
it will run; the fix ladder asks `violation` of every rung it proposes, and skips a rung the
target cannot run with the rule's reason (8-bit AdamW or QLoRA on a TPU, ZeRO on one device).

Facts: bf16 needs sm80+ (CUDA bf16 arithmetic; NVIDIA A100 whitepaper); FlashAttention-2 needs sm80+
(Dao-AILab/flash-attention README); bitsandbytes and DeepSpeed offload need CUDA (or ROCm), and
the offloaded update runs DeepSpeed's CPU Adam: accelerate (so the HF Trainer) puts it in place of
the script's optimizer, a bitsandbytes one included (accelerate/utils/deepspeed.py
`map_pytorch_optim_to_deepspeed`), and DeepSpeed alone refuses another by default
(`zero_force_ds_cpu_optimizer`, deepspeed/runtime/engine.py `_configure_basic_optimizer`);
bitsandbytes' kernels do not run on the CPU; DataParallel is `torch.nn.DataParallel`,
CUDA-only; TPUs compute autocast in bf16 (torch_xla AMP docs); expandable segments need CUDA's
driver API (CUDACachingAllocator.cpp compiles them out on ROCm; MPS and XLA have allocators of
their own).
By backend (data/SOURCES.md S111-S113, S116): FP8 training needs FP8 tensor cores (Ada, Hopper,
Blackwell; AMD CDNA3+) and a CUDA or ROCm build -- Transformer Engine's recipes are NVIDIA's
(torchao's float8 "supports both NVIDIA and AMD hardware", its training docs), MXFP8 needs
Blackwell's block-scaled tensor cores, and FP8 converts nn.Linear, not bitsandbytes' quantised
layers. ROCm runs bitsandbytes (LLM.int8, QLoRA 4-bit, 8-bit optimizers on gfx90a/942/950 and
RDNA 2-4), DeepSpeed and NCCL's counterpart RCCL; SDPA's AOTriton kernels are experimental on the
RDNA parts. Apple's MPS has one device, no DeepSpeed and no flash-attn build, and bitsandbytes'
8-bit optimizers are planned there, not supported (its README; QLoRA 4-bit and LLM.int8 are).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from ..accelerators import Accelerator
from ..errors import TrainplanError
from ..precision import BF16_AMP, FP16_AMP, FP8_AO_TENSORWISE, FP8_TE_CURRENT
from ..strategy import DDP, DP, SINGLE, ZERO2, ZERO3
from ..trace.semantics import ROCM_EXPERIMENTAL_SDPA
from ..units import fmt_bytes, fmt_gib
from .findings import Finding
from .target import devices


@dataclass(frozen=True)
class Rule:
    id: str
    severity: str                                       # error | warning | info
    applies: Callable[[object, Accelerator], bool]
    message: Callable[[object, Accelerator], str]
    fix: Callable[[object, Accelerator], str | None]
    rewrite: Callable[[object, Accelerator], object] | None = None   # nearest runnable job
    fatal: bool = False     # `estimate` refuses the job (the target cannot run it at all)
    kind: str = "compatibility"

    def finding(self, job, accel: Accelerator) -> Finding:
        return Finding(self.severity, self.message(job, accel), self.fix(job, accel), self.kind)


def _gpu(accel) -> bool:
    return accel.kind == "gpu"


def _bnb(job) -> bool:
    return job.quantize.bnb or job.optimizer.bnb


def _offloaded(job) -> str:
    return "optimizer state and parameters" if job.offload.params else "optimizer state"


def _offload_strategy(job):
    """The launcher an offload runs under (rule `offload-needs-zero`): ZeRO-3 for the
    parameters (DeepSpeed's offload_param is stage 3's), else ZeRO-2, as the fix ladder's
    offload rungs choose (plan/fixes.py `_offload`)."""
    return ZERO3 if job.offload.params else ZERO2


def offload_run(job, level: str) -> str:
    """The offload the job's launcher runs when `level` is asked: FSDP's CPU offload
    (CPUOffload(offload_params=True), accelerate's fsdp_offload_params) moves the parameters
    with the optimizer state, it has none of the state alone (rule `fsdp-offloads-parameters`,
    plan/fixes.py `_offload`); DeepSpeed runs either."""
    return "optimizer+params" if job.strategy.fsdp and level == "optimizer" else level


def offloaded_optimizer(job):
    """The optimizer that steps under ZeRO-Offload: AdamW (DeepSpeed's CPU Adam) in place of a
    bitsandbytes one, whose kernels do not run on the CPU (rule `offload-runs-cpu-adam`); the
    job's own otherwise."""
    from ..optimizer import ADAMW
    return ADAMW if job.optimizer.bnb else job.optimizer


def _bnb_what(job) -> str:
    return f"QLoRA {job.quantize}" if job.quantize.bnb else f"the {job.optimizer} optimizer"


def _sm(accel) -> str:
    return "sm" + str(accel.compute_capability).replace(".", "")


def _fp8(job) -> str | None:
    return job.precision.fp8


RULES: tuple[Rule, ...] = (
    Rule("fp8-needs-fp8-tensor-cores", "error",
         lambda j, a: bool(_fp8(j)) and (a.kind != "gpu" or a.backend == "mps" or not a.has_fp8),
         lambda j, a: f"{a.id} cannot run {j.precision}: {j.precision.fp8_library}'s FP8 "
                      "training needs FP8 tensor cores (NVIDIA Ada, Hopper or Blackwell; AMD "
                      f"CDNA3+) under CUDA or ROCm, and {a.id} "
                      + ("has none." if a.kind == "gpu" and a.backend != "mps" else
                         f"runs {a.backend.upper()}."),
         lambda j, a: "use --precision " + ("bf16-amp" if a.supports_bf16 else "fp16-amp")
                      + " (the same job without the FP8 GEMMs)",
         lambda j, a: j.with_(precision=BF16_AMP if a.supports_bf16 else FP16_AMP), fatal=True),
    Rule("fp8-transformer-engine-needs-cuda", "error",
         lambda j, a: bool(_fp8(j)) and j.precision.fp8.startswith("te-") and a.backend == "rocm",
         lambda j, a: f"{j.precision} is NVIDIA's Transformer Engine; on {a.id} (ROCm) plan "
                      "torchao's float8, which supports AMD GPUs.",
         lambda j, a: "use --precision fp8-torchao-tensorwise (or fp8-torchao-rowwise)",
         lambda j, a: j.with_(precision=FP8_AO_TENSORWISE), fatal=True),
    Rule("mxfp8-needs-blackwell", "error",
         lambda j, a: _fp8(j) == "te-mxfp8" and a.has_fp8 and "mxfp8" not in a.tensor_cores,
         lambda j, a: f"MXFP8 needs Blackwell's block-scaled tensor cores; {a.id} has plain FP8.",
         lambda j, a: "use --precision fp8-te-current (or fp8-te-delayed)",
         lambda j, a: j.with_(precision=FP8_TE_CURRENT), fatal=True),
    Rule("fp8-with-quantized-base", "error",
         lambda j, a: bool(_fp8(j)) and j.quantize.on,
         lambda j, a: f"FP8 training converts nn.Linear layers; {j.quantize}'s quantised base "
                      "layers are not converted, so the two do not combine.",
         lambda j, a: "plan QLoRA in --precision bf16-amp, or FP8 without --quantize",
         lambda j, a: j.with_(precision=BF16_AMP), fatal=True),
    Rule("bitsandbytes-cuda-only", "error",
         lambda j, a: a.kind == "tpu" and _bnb(j),
         lambda j, a: f"{a.id} cannot run bitsandbytes ({_bnb_what(j)}): its kernels are CUDA-only.",
         lambda j, a: "on a TPU use LoRA in bf16 (--quantize none) and --optimizer adamw or adafactor",
         lambda j, a: j.with_(quantize="none",
                              optimizer="adamw" if j.optimizer.bnb else j.optimizer),
         fatal=True),
    Rule("bitsandbytes-optimizers-mps", "error",
         lambda j, a: a.backend == "mps" and j.optimizer.bnb,
         lambda j, a: f"bitsandbytes' 8-bit and paged optimizers ({j.optimizer}) are not "
                      "supported on Apple's Metal backend (planned; QLoRA 4-bit and LLM.int8 are).",
         lambda j, a: "use --optimizer adamw (or adafactor to save optimizer memory)",
         lambda j, a: j.with_(optimizer="adamw"), fatal=True),
    Rule("mps-one-device", "error",
         lambda j, a: a.backend == "mps" and j.gpus > 1,
         lambda j, a: f"PyTorch's MPS backend exposes one GPU per machine; {j.gpus} x {a.id} "
                      "would be several Macs, which this plan does not model.",
         lambda j, a: "plan one Mac: --gpus 1",
         lambda j, a: j.with_(gpus=1, strategy=SINGLE), fatal=True),
    Rule("offload-cuda-only", "error",
         lambda j, a: (a.kind == "tpu" or a.backend == "mps") and j.offload != "none",
         lambda j, a: f"CPU offload is a DeepSpeed (CUDA) feature; {a.id} cannot run it.",
         lambda j, a: "drop --offload",
         lambda j, a: j.with_(offload="none"), fatal=True),
    Rule("offload-needs-zero", "error",
         lambda j, a: j.offload != "none" and (not j.strategy.sharded or (
             j.offload.params and not j.strategy.shards_weights)),
         lambda j, a: f"CPU offload of the {_offloaded(j)} runs under DeepSpeed "
                      f"{'ZeRO-3' if j.offload.params else 'ZeRO (stages 1-3)'} or FSDP; "
                      f"{j.strategy.label} has none: planned as "
                      f"{_offload_strategy(j).label}.",
         lambda j, a: f"--strategy {_offload_strategy(j)} (one GPU is enough for "
                      "ZeRO-Offload)",
         lambda j, a: j.with_(strategy=_offload_strategy(j))),
    Rule("fsdp-offloads-parameters", "error",
         lambda j, a: j.strategy.fsdp and j.offload == "optimizer",
         lambda j, a: "FSDP's CPU offload (CPUOffload(offload_params=True), accelerate's "
                      "fsdp_offload_params) moves the parameters and gradients to the host with "
                      "the optimizer state; FSDP has no offload of the optimizer state alone: "
                      "planned as --offload optimizer+params.",
         lambda j, a: "--offload optimizer+params (what FSDP runs), or --strategy zero2 to "
                      "offload the optimizer state alone",
         lambda j, a: j.with_(offload=offload_run(j, "optimizer"))),
    Rule("offload-runs-cpu-adam", "error",
         lambda j, a: j.offload.states and j.optimizer.bnb,
         lambda j, a: f"ZeRO-Offload steps on the CPU with DeepSpeed's CPU Adam: accelerate "
                      f"and the HF Trainer put it in place of {j.optimizer} (bitsandbytes' "
                      "kernels do not run on the CPU), DeepSpeed alone refuses it; the "
                      "states are AdamW's, in fp32 in host RAM.",
         lambda j, a: "plan --optimizer adamw with --offload (what runs)",
         lambda j, a: j.with_(optimizer=offloaded_optimizer(j))),
    Rule("offload-replaces-the-optimizer", "warning",
         lambda j, a: j.offload.states and j.optimizer.name in ("sgd", "sgd-momentum",
                                                                 "adafactor"),
         lambda j, a: f"Under ZeRO-Offload accelerate and the HF Trainer put DeepSpeed's CPU "
                      f"Adam in place of {j.optimizer} (DeepSpeed has CPU kernels for "
                      "Adam/AdamW, Adagrad and Lion only): another algorithm, with Adam's "
                      f"states, where this plan counts {j.optimizer}'s.",
         lambda j, a: 'to keep it, set "zero_force_ds_cpu_optimizer": false in the DeepSpeed '
                      "config (it then steps on the CPU in PyTorch), or plan --optimizer adamw"),
    Rule("dataparallel-cuda-only", "error",
         lambda j, a: a.kind == "tpu" and j.strategy is DP,
         lambda j, a: "DataParallel (--strategy dp) is CUDA-only.",
         lambda j, a: "TPUs replicate over their cores: use --strategy ddp",
         lambda j, a: j.with_(strategy=DDP), fatal=True),
    Rule("flash-attn-not-on-mps", "error",
         lambda j, a: a.backend == "mps" and j.attention == "flash",
         lambda j, a: f"flash-attn has no Metal build: --attention flash cannot run on {a.id}; "
                      "SDPA runs its math path there when training (the s x s scores are kept).",
         lambda j, a: "use --attention sdpa; for long sequences, gradient checkpointing or a "
                      "shorter --seq-len",
         lambda j, a: j.with_(attention="sdpa")),
    Rule("rocm-sdpa-experimental", "warning",
         lambda j, a: a.backend == "rocm" and a.compute_capability in ROCM_EXPERIMENTAL_SDPA
         and j.attention in ("auto", "sdpa"),
         lambda j, a: f"SDPA's flash kernels are experimental on {a.compute_capability}: PyTorch "
                      "runs the math path (the s x s scores are kept) unless they are enabled.",
         lambda j, a: "export TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1, or --attention flash "
                      "(flash-attn's composable_kernel backend supports RDNA 3)"),
    Rule("sharding-one-device", "error",
         lambda j, a: j.strategy.sharded and devices(j, a) <= 1 and j.offload == "none",
         lambda j, a: f"--strategy {j.strategy} on one device shards nothing.",
         lambda j, a: "add --gpus N (N > 1), or --offload optimizer to move optimizer state to "
                      "the host",
         lambda j, a: j.with_(strategy=SINGLE), fatal=True),
    Rule("bf16-needs-sm80", "error",
         lambda j, a: _gpu(a) and j.precision.is_bf16 and not a.supports_bf16,
         lambda j, a: f"{a.id} has no bf16 (needs sm80+; compute capability "
                      f"{a.compute_capability}); bf16 would be emulated or fail.",
         lambda j, a: f"use --precision {j.precision.with_compute('fp16')} (with loss scaling)",
         lambda j, a: j.with_(precision=j.precision.with_compute("fp16"))),
    Rule("flash-needs-sm80", "warning",
         lambda j, a: a.backend == "cuda" and j.attention == "flash" and not a.flash_attention_2,
         lambda j, a: f"FlashAttention-2 needs sm80+ and {a.id} is {_sm(a)}; PyTorch falls back "
                      "to the memory-efficient kernel.",
         lambda j, a: "use --attention sdpa (same memory, no flash-attn install)",
         lambda j, a: j.with_(attention="sdpa")),
    Rule("fp32-on-fp16-tensor-cores", "info",
         lambda j, a: _gpu(a) and j.precision.full and "fp16" in a.tensor_cores
         and "tf32" not in a.tensor_cores,
         lambda j, a: f"{a.id}'s tensor cores do fp16 only; fp32 runs at "
                      f"{a.peak_flops('fp32') / 1e12:.1f} TFLOP/s.",
         lambda j, a: "use --precision fp16-amp for tensor-core speed", kind="advice"),
    Rule("fp16-without-tensor-cores", "info",
         lambda j, a: _gpu(a) and a.tensor_cores in ("", "none") and j.precision.is_fp16,
         lambda j, a: f"{a.id} has no tensor cores: fp16 saves memory but gains little speed.",
         lambda j, a: None, kind="advice"),
    Rule("dataparallel-imbalance", "warning",
         lambda j, a: j.strategy is DP and j.gpus > 1,
         lambda j, a: _dataparallel(),
         lambda j, a: "use DDP (torchrun --nproc-per-node N): --strategy ddp", kind="advice"),
    Rule("tpu-computes-bf16", "info",
         lambda j, a: a.kind == "tpu" and j.precision is FP16_AMP,
         lambda j, a: "TPUs compute in bf16; fp16 AMP is traced as bf16.",
         lambda j, a: None, kind="advice"),
    Rule("unified-memory", "info",
         lambda j, a: a.backend == "mps",
         lambda j, a: "unified memory: by default the GPU may wire "
                      f"{fmt_bytes(a.usable_memory_bytes)} of the "
                      f"{fmt_bytes(a.memory_per_device_bytes)}, the capacity planned here; "
                      "macOS and the Python process (host RAM) use the rest.",
         lambda j, a: "to let it use more: sudo sysctl iogpu.wired_limit_mb=<MiB> (leave room "
                      "for macOS and Python)", kind="advice"),
    Rule("expandable-segments-cuda-only", "info",
         lambda j, a: j.expandable_segments and a.backend != "cuda",
         lambda j, a: f"expandable segments are a setting of CUDA's caching allocator; "
                      f"{a.backend} runs without them (planned with its own allocator).",
         lambda j, a: None, kind="advice"),
    Rule("pure-half-no-master-weights", "info",
         lambda j, a: j.precision.pure_half,
         lambda j, a: f"{j.precision.label}: small updates can round away.",
         lambda j, a: f"use --precision {j.precision}-amp unless memory forbids", kind="advice"),
)


def _dataparallel(gpu0_extra_bytes: int = 0) -> str:
    """The DataParallel finding's words, with what GPU 0 holds beyond the others where the
    memory model has it (memory.py `gpu0_extra_bytes`)."""
    more = f"{fmt_gib(gpu0_extra_bytes)} more memory there" if gpu0_extra_bytes else \
        "more memory there"
    return (f"DataParallel gathers outputs and keeps the optimizer on GPU 0 ({more}) and runs one "
            "Python thread per GPU.")


def with_gpu0(findings: list[Finding], gpu0_extra_bytes: int) -> list[Finding]:
    """`findings` with the DataParallel finding saying how much more GPU 0 holds: one finding
    for DataParallel, not a second one from the memory model."""
    if not gpu0_extra_bytes:
        return findings
    plain = _dataparallel()
    return [replace(f, message=_dataparallel(gpu0_extra_bytes)) if f.message == plain else f
            for f in findings]


def check(job, accel: Accelerator, strict: bool = True) -> list[Finding]:
    """Findings for `job` as written on `accel`. `strict`: a fatal rule raises TrainplanError
    (the job cannot run there at all: `estimate` answers it as bad input)."""
    out = []
    for rule in RULES:
        if not rule.applies(job, accel):
            continue
        f = rule.finding(job, accel)
        if strict and rule.fatal:
            raise TrainplanError(f.message, fix=f.fix)
        out.append(f)
    return out


def adapt(job, accel: Accelerator) -> tuple[object, list[str]]:
    """Every rewrite that applies, in table order: (the job the target runs, what changed)."""
    changes = []
    for rule in RULES:
        if rule.rewrite is None or not rule.applies(job, accel):
            continue
        new = rule.rewrite(job, accel)
        changes.append(f"{_describe(job, new)} ({rule.message(job, accel)})")
        job = new
    return job, changes


def violation(job, accel: Accelerator) -> Finding | None:
    """The first rule with a rewrite or a fatal error that `job` breaks on `accel` (None: it runs).
    The fix ladder skips a rung whose job breaks one, with this reason."""
    for rule in RULES:
        if (rule.fatal or rule.rewrite is not None) and rule.severity == "error" \
                and rule.applies(job, accel):
            return rule.finding(job, accel)
    return None


_FIELDS = ("precision", "attention", "quantize", "optimizer", "offload", "strategy")


def _describe(old, new) -> str:
    """'precision fp16-amp instead of bf16-amp' for the fields a rewrite changed."""
    parts = [f"{f} {getattr(new, f)} instead of {getattr(old, f)}" for f in _FIELDS
             if getattr(new, f) != getattr(old, f)]
    return ", ".join(parts)
