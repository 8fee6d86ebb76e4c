"""Quantised frozen base weights (QLoRA and 8-bit fine-tuning): how each library stores a weight,
what its matmul keeps for backward, and what it does to the parameters it does not quantise.
One type, parsed once where a job is read (spec.py); models/lora.py builds the layers from it.

    name           library, layer                         bytes per weight             keeps input
    nf4            bitsandbytes Linear4bit, NF4           1/2 + 4/64 (fp32 absmax)     <= 0.43.1 only
    nf4-dq         + double quantisation                  1/2 + 1/64 + 4/(64*256)      <= 0.43.1 only
    fp4, fp4-dq    the same, FP4 code                     as nf4 / nf4-dq              <= 0.43.1 only
    int8           bitsandbytes Linear8bitLt (LLM.int8)   1 + 4/in_features (row SCB)  yes
    torchao-nf4    torchao NF4Tensor (torchtune QLoRA)    1/2 + 1/64 + 4/(64*256)      no

Storage. bitsandbytes `quantize_4bit` (bitsandbytes/functional.py) packs two 4-bit codes a byte
and keeps one fp32 absmax per block of 64 (`blocksize=64`, the default of
`BitsAndBytesConfig`/`Linear4bit`). `bnb_4bit_use_double_quant=True` (`compress_statistics`)
quantises those absmax values blockwise again, 8 bits each, with one fp32 absmax per 256 of them
(`quantize_blockwise(absmax, blocksize=256)`), plus one fp32 offset: QLoRA (Dettmers et al. 2023,
section 3) computes 32/64 = 0.5 bits per parameter of statistics without and 8/64 + 32/(64*256) =
0.127 with it. `BitsAndBytesConfig`'s default is no double quantisation; the QLoRA recipe turns
it on. torchao's NF4Tensor (`torchao/dtypes/nf4tensor.py`, `to_nf4(block_size=64,
scaler_block_size=256)`) always double-quantises the same way. LLM.int8 stores int8 weights and
one fp32 scale per output row (`Int8Params.SCB`).

The matmul. bitsandbytes' `MatMul4Bit.forward` dequantises the weight just before `F.linear`
(`F.dequantize_4bit(B, quant_state).to(A.dtype)`: a transient full-size copy of that one layer,
in the dtype the weight was quantised from, and once more in the input's dtype when they differ)
and backward dequantises again (`grad_A = grad_output @ dequantize_4bit(B).to(grad.dtype)`).
What it keeps for backward changed with the release (bitsandbytes/autograd/_functions.py):
up to 0.43.1 `ctx.tensors = (A, B)` whenever an input needs a gradient, so every quantised
layer's input stayed live until its backward although grad_A needs only the weight; 0.43.2
(bitsandbytes-foundation/bitsandbytes#1270, "fix QLoRA mem bug: delete useless buffered
activation", 2024-07-16) keeps `(None, B)`: no activation of its own, which 0.44-0.50 and main
still do. Today's release is the default (`KernelSemantics.bnb4_keeps_input`, trace/semantics.py,
is True only where a run states an older one: LitGPT's resource tables ran 0.41.1). LLM.int8's
`MatMul8bitLt` keeps `(CAt, subA, A)` in every release. One row without autograd (a batch-1
decode step) skips all this in bitsandbytes' 4-bit layer when its input width is a multiple of
the block: `matmul_4bit` runs `gemv_4bit`, which dequantises in registers and writes no weight
(`if A.numel() == A.shape[-1] and A.requires_grad == False`, 0.43.3 and 0.49.0). torchao's `linear_nf4` saves only the NF4
weight (`ctx.save_for_backward(weight)`; backward is `grad_output @ weight.to(dtype)`).

Compute dtype. `Linear4bit.set_compute_type` (bitsandbytes >= 0.42) computes in the input's dtype
when it is fp32 or bf16, and `forward` returns `out.to(inp_dtype)`: after a norm kept in fp32 the
layer dequantises its bf16/fp16 weight, copies it to fp32, and under autocast F.linear casts input
and weight back to 16 bits (three transient copies of the layer's weight); its output is fp32, and
so is the residual stream.

Parameters left unquantised (embeddings, norms, biases, the output head) are stored in the job's
precision: under AMP that is fp32, which is what peft's `prepare_model_for_kbit_training` does
(peft/utils/other.py: "cast all non INT8 parameters to fp32", every fp16/bf16 parameter that is
not `Params4bit`) and why a 7B QLoRA under bf16-amp holds ~1 GB of fp32 embeddings and head.
That upcast is optional (`Job.frozen_half`): "embeddings" is what TRL's SFTTrainer (0.13-0.21,
with bf16=True) leaves after `peft_module_casting_to_bf16` (trl@v0.13.0 trl/trainer/utils.py:872:
norms kept fp32, `lm_head`/`embed_tokens` back to bf16), "all" loads them in half precision and
never upcasts (TRL's SFTTrainer calls prepare_model_for_kbit_training up to 0.21 and not from
0.22; FSDP/ZeRO-3 QLoRA never did, trl@v0.13.0 sft_trainer.py:182-233). Under pure bf16
(LitGPT's `bf16-true`, torchtune) they stay bf16.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import unknown
from .named import Named

NF4_BLOCK = 64                 # weights per absmax (bitsandbytes blocksize, torchao block_size)
DQ_BLOCK = 256                 # absmax values per second-level fp32 scale (double quantisation)


@dataclass(frozen=True, eq=False)
class Quantization(Named):
    name: str
    label: str
    bits: int = 0              # bits per stored weight; 0: not quantised
    double_quant: bool = False
    keeps_input: bool = False  # today's release of its matmul keeps its input for backward
    library: str = ""
    spellings: tuple[str, ...] = ()

    @property
    def on(self) -> bool:
        return self.bits > 0

    @property
    def bnb(self) -> bool:
        """Needs bitsandbytes (CUDA kernels; compat.py)."""
        return self.library == "bitsandbytes"

    @property
    def bnb4(self) -> bool:
        """bitsandbytes' 4-bit layer (Linear4bit, `matmul_4bit`)."""
        return self.bnb and self.bits == 4

    def keeps_input_in(self, old_bnb4: bool = False) -> bool:
        """Does the quantised matmul keep its input for backward: today's release, or with
        `old_bnb4` a 4-bit bitsandbytes release before 0.43.2 (module docstring)."""
        return self.keeps_input or (old_bnb4 and self.bnb4)

    def fused_gemv(self, in_features: int) -> bool:
        """Does one row of input without autograd (a batch-1 decode step) take a fused GEMV that
        writes no dequantised weight: bitsandbytes' 4-bit `matmul_4bit` where the input width is
        a multiple of its block (module docstring)."""
        return self.bnb4 and in_features % NF4_BLOCK == 0

    def weight_bytes(self, out_features: int, in_features: int) -> int:
        """Bytes of one quantised (out x in) weight with its quantisation state (module docstring)."""
        n = out_features * in_features
        if self.bits == 8:
            return n + 4 * out_features
        blocks = math.ceil(n / NF4_BLOCK)
        stats = blocks + 4 * math.ceil(blocks / DQ_BLOCK) + 4 if self.double_quant else 4 * blocks
        return math.ceil(n / 2) + stats


NONE = Quantization("none", "not quantised")
NF4 = Quantization("nf4", "NF4 4-bit base weights (bitsandbytes, fp32 absmax per 64)", 4, False,
                   False, "bitsandbytes", ("bnb.nf4", "4bit", "qlora-nf4"))
NF4_DQ = Quantization("nf4-dq", "NF4 4-bit base weights, double-quantised absmax (bitsandbytes)",
                      4, True, False, "bitsandbytes", ("bnb.nf4-dq", "qlora", "nf4+dq"))
FP4 = Quantization("fp4", "FP4 4-bit base weights (bitsandbytes, fp32 absmax per 64)", 4, False,
                   False, "bitsandbytes", ("bnb.fp4",))
FP4_DQ = Quantization("fp4-dq", "FP4 4-bit base weights, double-quantised absmax (bitsandbytes)",
                      4, True, False, "bitsandbytes", ("bnb.fp4-dq",))
INT8 = Quantization("int8", "LLM.int8 8-bit base weights (bitsandbytes)", 8, False, True,
                    "bitsandbytes", ("bnb.int8", "8bit", "llm.int8"))
TORCHAO_NF4 = Quantization("torchao-nf4", "NF4 4-bit base weights (torchao NF4Tensor, as "
                           "torchtune's QLoRA)", 4, True, False, "torchao", ("torchtune-nf4",))
ALL = (NONE, NF4, NF4_DQ, FP4, FP4_DQ, INT8, TORCHAO_NF4)
NAMES = tuple(q.name for q in ALL)


def _table() -> dict[str, Quantization]:
    t = {}
    for q in ALL:
        for s in (q.name, *q.spellings):
            t[s] = q
    return t


def parse(value, where: str = "--quantize") -> Quantization:
    """A spelling -> its Quantization (None, "", "no", false -> none)."""
    if isinstance(value, Quantization):
        return value
    if value in (None, False, "", "no", "false"):
        return NONE
    text = str(value).strip().lower().replace("_", "-")
    table = _table()
    if text in table:
        return table[text]
    raise unknown("quantisation", text, table, n=1, allowed=", ".join(NAMES),
                  what=f"{where} {value!r} is not a quantisation.")


def spellings_table() -> list[tuple[str, str, str]]:
    """(canonical name, accepted spellings, meaning) for the README and `--help`."""
    return [(q.name, ", ".join((q.name,) + q.spellings), q.label) for q in ALL]
