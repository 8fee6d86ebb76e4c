"""Precision: what a job stores its weights in, what its kernels compute in, and whether it keeps
fp32 master weights. One type, parsed once where a job is read (spec.py); everything else asks it.

    name       weights stored   kernels compute in              master   loss scaling
    fp32       fp32             fp32 (matmuls; cuDNN convs TF32) -        -
    tf32       fp32             TF32 tensor cores (matmuls too)  -        -
    fp16-amp   fp32             fp16 (torch.autocast)            fp32     yes (GradScaler)
    bf16-amp   fp32             bf16 (torch.autocast)            fp32     no
    fp16       fp16             fp16 (model.half())              none     yes
    bf16       bf16             bf16 (model.to(bfloat16))        none     no
    fp8-*      fp32             FP8 linear GEMMs, bf16 autocast  fp32     no
                                elsewhere (trace/fp8.py)

`fp32` follows PyTorch's defaults since 1.12: `torch.backends.cuda.matmul.allow_tf32 = False`,
`torch.backends.cudnn.allow_tf32 = True` (PyTorch docs, "TensorFloat-32 (TF32) on Ampere (and
later) devices"). `tf32` is `torch.set_float32_matmul_precision("high")` -- or "medium", which
on CUDA also selects TF32 (bf16 passes are a oneDNN CPU path) -- and what NVIDIA's NGC PyTorch
containers run fp32 jobs in: they set TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 (PyTorch PR #77114,
2022), which turns fp32 matmuls into TF32 whatever the script says. A job measured in an NGC
container at "fp32" is a `tf32` job here.

One word, two meanings. accelerate's `mixed_precision: fp16` (and the seeds' `run:
mixed_precision:`) means AMP: fp32 weights, fp16 autocast. trainplan's own `precision: fp16` means
pure fp16 (the whole model in fp16, no master copy), as `model.half()` does. So the spelling is read
in its context (`parse(text, mixed=True)` for a `mixed_precision` key) and every output prints the
`label`, which says which one was planned.

FP8 training is a precision with its recipe named: Transformer Engine's delayed scaling
(`DelayedScaling`, amax history 1024), current scaling (`Float8CurrentScaling`) and MXFP8
(`MXFP8BlockScaling`, Blackwell), torchao's float8 tensorwise (its default) and rowwise. Each keeps
fp32 master weights under bf16 autocast and runs the linears' GEMMs in FP8; what each keeps for
backward is trace/fp8.py's. `fp8` alone, like accelerate's `mixed_precision: fp8`, is torchao
tensorwise: accelerate auto-detects torchao first, then Transformer Engine, then MS-AMP
(`Accelerator.__init__`, huggingface/accelerate @16cb6eb; data/SOURCES.md S116).
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import unknown
from .named import Named


@dataclass(frozen=True, eq=False)
class Precision(Named):
    name: str                 # the canonical spelling
    stored: str               # dtype of the parameters as stored: float32 | float16 | bfloat16
    compute: str              # what matmuls/convs compute in: fp32 | tf32 | fp16 | bf16
    autocast: str | None      # torch.autocast dtype (float16 | bfloat16), None without AMP
    label: str                # what every output prints
    spellings: tuple[str, ...] = ()
    fp8: str | None = None    # the FP8 recipe (trace/fp8.py RECIPES), None without FP8

    @property
    def amp(self) -> bool:
        """Mixed precision: fp32 weights (the master copy) and 16-bit autocast kernels."""
        return self.autocast is not None

    @property
    def pure_half(self) -> bool:
        """The whole model in 16 bits, no fp32 master copy."""
        return self.stored != "float32"

    @property
    def half(self) -> str | None:
        """The 16-bit dtype the kernels compute in ("float16" | "bfloat16"), None for fp32/tf32."""
        return {"fp16": "float16", "bf16": "bfloat16"}.get(self.compute)

    @property
    def is_bf16(self) -> bool:
        return self.compute == "bf16"

    @property
    def is_fp16(self) -> bool:
        return self.compute == "fp16"

    @property
    def loss_scaling(self) -> bool:
        """fp16 gradients underflow without a loss scale (torch.cuda.amp.GradScaler)."""
        return self.is_fp16

    @property
    def full(self) -> bool:
        """fp32 or tf32: no 16-bit anywhere."""
        return self.half is None

    @property
    def compute_bytes(self) -> int:
        """Bytes of one element in the compute dtype: what gathered weights, communicated
        gradients and activations sent between devices take (2 for fp16/bf16, 4 otherwise)."""
        return 4 if self.full else 2

    @property
    def fp8_library(self) -> str | None:
        """"Transformer Engine" or "torchao" for an FP8 precision, None otherwise."""
        if not self.fp8:
            return None
        return "Transformer Engine" if self.fp8.startswith("te-") else "torchao"

    def with_compute(self, compute: str) -> "Precision":
        """The same kind of precision (AMP or pure) in another 16-bit dtype: bf16 -> fp16.
        An FP8 precision goes to the 16-bit AMP of that dtype."""
        return next(p for p in ALL if p.amp == self.amp and p.compute == compute
                    and p.pure_half == self.pure_half and not p.fp8)


FP32 = Precision("fp32", "float32", "fp32", None,
                 "fp32 (TF32 matmuls off, as PyTorch defaults; cuDNN convolutions in TF32)",
                 ("fp32", "float32", "no", "none", "full"))
TF32 = Precision("tf32", "float32", "tf32", None,
                 "fp32 weights, TF32 tensor-core matmuls (float32_matmul_precision high)",
                 ("tf32", "fp32-tf32", "float32-high", "float32-medium"))
FP16_AMP = Precision("fp16-amp", "float32", "fp16", "float16",
                     "fp16 mixed precision (AMP autocast, fp32 master weights, loss scaling)",
                     ("fp16-amp", "amp", "fp16-mixed", "16-mixed", "mixed-fp16"))
BF16_AMP = Precision("bf16-amp", "float32", "bf16", "bfloat16",
                     "bf16 mixed precision (AMP autocast, fp32 master weights)",
                     ("bf16-amp", "bf16-mixed", "mixed-bf16"))
FP16 = Precision("fp16", "float16", "fp16", None,
                 "pure fp16 (weights, gradients and optimizer in fp16; no master copy)",
                 ("fp16", "half", "float16", "16-true"))
BF16 = Precision("bf16", "bfloat16", "bf16", None,
                 "pure bf16 (weights, gradients and optimizer in bf16; no master copy)",
                 ("bf16", "bfloat16", "bf16-true"))
_FP8 = "fp32 master weights, bf16 autocast, the linears' GEMMs in FP8"
FP8_TE_DELAYED = Precision("fp8-te-delayed", "float32", "bf16", "bfloat16",
                           f"fp8 Transformer Engine delayed scaling ({_FP8}; amax history 1024)",
                           ("fp8-te-delayed", "fp8-te", "te-fp8", "te-delayed", "fp8-delayed",
                            "transformer-engine"), fp8="te-delayed")
FP8_TE_CURRENT = Precision("fp8-te-current", "float32", "bf16", "bfloat16",
                           f"fp8 Transformer Engine current scaling ({_FP8})",
                           ("fp8-te-current", "te-current", "fp8-current"), fp8="te-current")
FP8_TE_MXFP8 = Precision("fp8-te-mxfp8", "float32", "bf16", "bfloat16",
                         f"MXFP8 Transformer Engine block scaling ({_FP8}, a scale per 32 values)",
                         ("fp8-te-mxfp8", "mxfp8", "te-mxfp8", "fp8-mxfp8"), fp8="te-mxfp8")
FP8_AO_TENSORWISE = Precision("fp8-torchao-tensorwise", "float32", "bf16", "bfloat16",
                              f"fp8 torchao float8 tensorwise ({_FP8}; one scale per tensor)",
                              ("fp8-torchao-tensorwise", "fp8", "float8", "fp8-torchao",
                               "torchao-float8", "float8-tensorwise", "torchao-tensorwise"),
                              fp8="torchao-tensorwise")
FP8_AO_ROWWISE = Precision("fp8-torchao-rowwise", "float32", "bf16", "bfloat16",
                           f"fp8 torchao float8 rowwise ({_FP8}; one scale per row)",
                           ("fp8-torchao-rowwise", "float8-rowwise", "torchao-rowwise"),
                           fp8="torchao-rowwise")
FP8_ALL = (FP8_AO_TENSORWISE, FP8_AO_ROWWISE, FP8_TE_DELAYED, FP8_TE_CURRENT, FP8_TE_MXFP8)
ALL: tuple[Precision, ...] = (FP32, TF32, FP16_AMP, BF16_AMP, FP16, BF16) + FP8_ALL
NAMES = tuple(p.name for p in ALL)

# accelerate / the seeds' `mixed_precision:` key: the value names the autocast dtype (fp8: what
# accelerate picks when torchao is installed, its first choice; module docstring)
_MIXED = {"fp16": FP16_AMP, "bf16": BF16_AMP, "no": FP32, "none": FP32, "fp32": FP32,
          "fp8": FP8_AO_TENSORWISE}


def _table() -> dict[str, Precision]:
    return {s: p for p in ALL for s in p.spellings}


def parse(value, mixed: bool = False, where: str = "--precision") -> Precision:
    """A spelling -> its Precision. `mixed`: the value comes from a `mixed_precision` key
    (accelerate's meaning: fp16 = AMP). Raises TrainplanError with the accepted spellings."""
    if isinstance(value, Precision):
        return value
    text = str(value).strip().lower().replace("_", "-")
    if mixed and text in _MIXED:
        return _MIXED[text]
    table = _table()
    if text in table:
        return table[text]
    raise unknown("precision", text, table, n=1, what=f"{where} {value!r} is not a precision.",
                  allowed=", ".join(NAMES))


def spellings_table() -> list[tuple[str, str, str]]:
    """(canonical name, accepted spellings, meaning) for the README and `--help`."""
    rows = [(p.name, ", ".join(p.spellings), p.label) for p in ALL]
    rows.append(("(mixed_precision: key)", "fp16 -> fp16-amp, bf16 -> bf16-amp, no -> fp32, "
                 "fp8 -> fp8-torchao-tensorwise",
                 "accelerate's meaning: the autocast dtype of mixed precision (fp8: the backend "
                 "it auto-detects first)"))
    return rows
