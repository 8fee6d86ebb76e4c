"""LoRA and QLoRA applied to a meta-device model, without peft or bitsandbytes.

LoRA (Hu et al. 2021): a frozen weight W (out x in) gains B A with A (r x in), B (out x r), scaled
by alpha / r; trainable parameters per adapted linear = r (in + out), the count peft reports
(Llama-2-7B, r=16 on q and v: 32 layers x 2 x 16 x (4096 + 4096) = 8,388,608).

QLoRA (Dettmers et al. 2023): the frozen base weights are stored packed, 4 bits per weight with
their quantisation state (quantization.py has each library's layout and what its matmul keeps:
0.5625 bytes per weight for bitsandbytes NF4, 0.516 double-quantised, vs 2 for bf16). The forward
dequantises each weight just before its matmul (a transient full-size copy of that layer, and a
second in fp32 when the input is fp32) and backward dequantises again. Each dequantisation is a
kernel of its own (`dequantize`, a custom op): it reads the codes and their state and writes the
weight, so under full checkpointing a step moves about 3 x 2.5 bytes a quantised weight for it
(forward, the backward's rerun, backward), a cost that does not shrink with the batch.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import TrainplanError
from ..quantization import NF4_BLOCK, Quantization

ATTN_TOKENS = ("attn", "attention")
QKV = {"q": {"q_proj", "query", "q_lin", "query_proj", "q"},
       "k": {"k_proj", "key", "k_lin", "key_proj", "k"},
       "v": {"v_proj", "value", "v_lin", "value_proj", "v"}}
FUSED_QKV = {"c_attn", "qkv_proj", "query_key_value", "Wqkv", "qkv", "in_proj"}
OUT = {"o_proj", "out_proj", "o", "out_lin", "dense", "c_proj", "proj"}
HEADS = {"lm_head", "classifier", "head", "score", "qa_outputs"}
ROLES = ("q", "k", "v", "o", "mlp", "lm_head", "embed")


def _is_linear(m: nn.Module) -> bool:
    return isinstance(m, nn.Linear) or type(m).__name__ == "Conv1D"


def _in_attention(name: str) -> bool:
    return any(t in name.lower() for t in ATTN_TOKENS)


def matches_role(name: str, module: nn.Module, role: str) -> bool:
    """Does module `name` play `role`? Roles: q, k, v, o, mlp, lm_head, embed (see --lora-targets)."""
    leaf = name.rsplit(".", 1)[-1]
    if role == "embed":
        return isinstance(module, nn.Embedding)
    if not _is_linear(module):
        return False
    if role in QKV:
        return leaf in QKV[role] or leaf in FUSED_QKV
    if role == "o":
        return leaf in OUT and _in_attention(name.rsplit(".", 1)[0]) or \
            leaf == "dense" and ".attention.output" in name
    if role == "lm_head":
        return leaf in HEADS
    if role == "mlp":
        return not _in_attention(name) and leaf not in HEADS and ".attention." not in name
    raise ValueError(role)


def select_targets(model: nn.Module, targets: str) -> list[str]:
    """Names of modules that get adapters. `all-linear` = every linear but the output head (peft)."""
    names = []
    roles = [t.strip() for t in targets.split(",") if t.strip()]
    for name, m in model.named_modules():
        if not name:
            continue
        if targets == "all-linear":
            if _is_linear(m) and name.rsplit(".", 1)[-1] not in HEADS:
                names.append(name)
            continue
        for r in roles:
            if (r in ROLES and matches_role(name, m, r)) or \
                    (r not in ROLES and (name == r or name.endswith("." + r))
                     and (_is_linear(m) or isinstance(m, nn.Embedding))):
                names.append(name)
                break
    if not names:
        raise TrainplanError(
            f"--lora-targets {targets!r} matched no module of this model.",
            allowed="all-linear, or a comma list of roles (q, k, v, o, mlp, lm_head, embed) or "
                    "module-name suffixes",
            fix="run `trainplan inspect MODEL` to see module names")
    return names


class QuantizedWeight(nn.Module):
    """Frozen base weight stored packed, with its quantisation state, in exactly the bytes of
    `Quantization.weight_bytes` (the codes as a uint8 parameter, the state as a uint8 buffer).
    `dequantize()` returns a transient full-size weight in `dtype`."""

    def __init__(self, out_f: int, in_f: int, q: Quantization, dtype: torch.dtype):
        super().__init__()
        self.shape = (out_f, in_f)
        self.q = q
        self.dtype = dtype
        n = out_f * in_f
        codes = n if q.bits == 8 else math.ceil(n / 2)
        self.packed = nn.Parameter(torch.empty(codes, dtype=torch.uint8), requires_grad=False)
        self.register_buffer("quant_state", torch.empty(q.weight_bytes(out_f, in_f) - codes,
                                                        dtype=torch.uint8))

    def dequantize(self) -> torch.Tensor:
        return dequantize(self.packed, self.absmax(), *self.shape, self.dtype)

    def absmax(self) -> torch.Tensor:
        """The block scales the weight's kernel reads. bitsandbytes with double quantisation
        first rebuilds them (functional.py `dequantize_4bit` and `gemv_4bit`, `if
        quant_state.nested`, 0.43-0.49): `dequantize_blockwise` of the 8-bit scales to fp32, then
        `absmax += offset`, two kernels before the weight's own, which reads the fp32 scales.
        Otherwise the state as stored (torchao's NF4Tensor rebuilds its scales inside one
        dequantisation here: its several small kernels are not traced one by one)."""
        if not (self.q.bnb and self.q.double_quant):
            return self.quant_state
        blocks = math.ceil(self.shape[0] * self.shape[1] / NF4_BLOCK)
        absmax = dequantize(self.quant_state, self.quant_state[:0], 1, blocks, torch.float32)
        return absmax.add_(self.quant_state[-4:].view(torch.float32))


@torch.library.custom_op("trainplan::dequantize", mutates_args=())
def dequantize(packed: torch.Tensor, state: torch.Tensor, rows: int, cols: int,
               dtype: torch.dtype) -> torch.Tensor:
    """The dequantisation kernel: reads a weight's codes and their state, writes the full-size
    weight in `dtype` (bitsandbytes' `kDequantizeBlockwise` under `dequantize_4bit`, one thread
    block per 64-weight block). A custom op, so the tracer records it as the one kernel it is,
    moving those bytes (codes + state in, 2 bytes a weight out in bf16: 2.52 a weight for NF4
    with double quantisation), where `torch.empty` launches nothing and the time model would see
    no cost. Its values are not computed (the tracer needs bytes, not values; `trainplan
    measure` writes random ones, measure/runner.py). LLM.int8 dequantises only in backward
    (`CB * SCB / 127`); its forward is an int8 GEMM, emulated here as this kernel and a 16-bit
    one (no published int8 run checks the difference)."""
    return torch.empty((rows, cols), dtype=dtype, device=packed.device)


@dequantize.register_fake
def _(packed, state, rows, cols, dtype):
    return packed.new_empty((rows, cols), dtype=dtype)


@torch.library.custom_op("trainplan::gemv_4bit", mutates_args=())
def gemv_4bit(x: torch.Tensor, packed: torch.Tensor, state: torch.Tensor,
              out_features: int) -> torch.Tensor:
    """bitsandbytes' fused 4-bit GEMV (`kgemm_4bit_inference_naive`): one row of input times the
    packed weight, dequantising in registers; it moves the codes, their state, the row and the
    output, and no full-size weight. Bandwidth-bound, so timed by those bytes (its 2 x in x out
    FLOPs are a few per byte). On a real device (`trainplan measure`) it reads the codes (one
    reduction over them) and writes small random values, as measure/runner.py's dequantisation
    writes a weight: the same bytes, not bitsandbytes' arithmetic."""
    packed.max()
    return x.new_empty((*x.shape[:-1], out_features)).normal_(0.0, 0.02)


@gemv_4bit.register_fake
def _(x, packed, state, out_features):
    return x.new_empty((*x.shape[:-1], out_features))


class _QuantMatmul(torch.autograd.Function):
    """y = x W^T with W dequantised on the fly in forward and again in backward, as bitsandbytes'
    MatMul4Bit does (bitsandbytes/autograd/_functions.py): forward
    `F.linear(A, dequantize_4bit(B, state).to(A.dtype))`, the dequantised weight made in the dtype
    it was quantised from and copied to the input's when they differ (an fp32 input after a norm
    peft keeps in fp32: bitsandbytes >= 0.42 then computes in fp32, and under AMP F.linear casts
    input and weight back to 16 bits); backward `grad_out @ dequantize_4bit(B).to(grad.dtype)`.
    The input is kept for backward only where the release does (quantization.py: bitsandbytes
    <= 0.43.1 and LLM.int8), although grad_x needs only W. torchao's linear_nf4 keeps only the
    weight."""

    @staticmethod
    def forward(ctx, x, qweight_module_holder):
        qw = qweight_module_holder.module
        ctx.holder = qweight_module_holder
        ctx.kept_input = x if x.requires_grad and qweight_module_holder.keeps_input else None
        w = qw.dequantize()
        if w.dtype != x.dtype:
            w = w.to(x.dtype)
        return F.linear(x, w)

    @staticmethod
    def backward(ctx, g):
        w = ctx.holder.module.dequantize()
        if w.dtype != g.dtype:
            w = w.to(g.dtype)
        return g @ w, None


class _Holder:
    def __init__(self, module, keeps_input: bool = False):
        self.module = module
        self.keeps_input = keeps_input


class QuantLinear(nn.Module):
    def __init__(self, linear: nn.Linear, q: Quantization, dtype: torch.dtype,
                 keeps_input: bool = False):
        super().__init__()
        out_f, in_f = linear.out_features, linear.in_features
        self.in_features, self.out_features = in_f, out_f
        self.weight_q = QuantizedWeight(out_f, in_f, q, dtype)
        self.keeps_input = keeps_input
        self.bias = None
        if linear.bias is not None:
            self.bias = nn.Parameter(torch.empty(out_f, dtype=dtype), requires_grad=False)

    def forward(self, x):
        w = self.weight_q
        if x.numel() == x.shape[-1] and not x.requires_grad and w.q.fused_gemv(self.in_features):
            # one row without autograd (a batch-1 decode step): bitsandbytes' fused GEMV reads
            # the 4-bit codes, no dequantised weight (quantization.py)
            y = gemv_4bit(x, w.packed, w.absmax(), self.out_features)
        else:
            y = _QuantMatmul.apply(x, _Holder(w, self.keeps_input))
        y = y + self.bias if self.bias is not None else y
        # bitsandbytes' Linear4bit.forward computes in compute_dtype and returns
        # `out.to(inp_dtype)`: an fp32 input (after a norm that prepare_model_for_kbit_training
        # keeps in fp32) gives an fp32 output, and the residual stream stays fp32
        return y.to(x.dtype) if w.q.bnb else y


class LoraLinear(nn.Module):
    """base(x) + B(A(dropout(x))) * alpha / r, base frozen."""

    def __init__(self, base: nn.Module, in_f: int, out_f: int, rank: int, alpha: float,
                 dropout: float, dtype: torch.dtype):
        super().__init__()
        self.base = base
        self.lora_A = nn.Linear(in_f, rank, bias=False, dtype=dtype)
        self.lora_B = nn.Linear(rank, out_f, bias=False, dtype=dtype)
        self.dropout = dropout
        self.scaling = alpha / rank

    def forward(self, x):
        h = F.dropout(x, self.dropout, self.training) if self.dropout else x
        return self.base(x) + self.lora_B(self.lora_A(h)) * self.scaling


class LoraEmbedding(nn.Module):
    def __init__(self, base: nn.Embedding, rank: int, alpha: float, dtype: torch.dtype):
        super().__init__()
        self.base = base
        self.lora_A = nn.Parameter(torch.empty(base.num_embeddings, rank, dtype=dtype))
        self.lora_B = nn.Parameter(torch.empty(rank, base.embedding_dim, dtype=dtype))
        self.scaling = alpha / rank

    def forward(self, ids):
        return self.base(ids) + F.embedding(ids, self.lora_A) @ self.lora_B * self.scaling


def _linear_dims(m: nn.Module) -> tuple[int, int]:
    if isinstance(m, nn.Linear):
        return m.in_features, m.out_features
    w = m.weight  # transformers Conv1D stores (in, out)
    return w.shape[0], w.shape[1]


def _set(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, leaf = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, leaf, new)


def apply_lora(model: nn.Module, rank: int, alpha: float, targets: str, dropout: float,
               quantize: Quantization, compute_dtype: torch.dtype, adapter_dtype: torch.dtype,
               old_bnb4: bool = False) -> list[str]:
    """Freeze the model, quantise its linears (QLoRA) and attach adapters; returns adapted names.

    Adapters are fp32 under AMP (peft's default) and in the model dtype for pure half precision.
    `old_bnb4`: a bitsandbytes release before 0.43.2, whose 4-bit matmul keeps its input
    (quantization.py).
    """
    names = select_targets(model, targets)
    for p in model.parameters():
        p.requires_grad_(False)
    if quantize.on:
        quantize_linears(model, quantize, compute_dtype, quantize.keeps_input_in(old_bnb4))
        quantize_experts(model, quantize, compute_dtype)
    for name in names:
        m = model.get_submodule(name)
        if isinstance(m, nn.Embedding):
            _set(model, name, LoraEmbedding(m, rank, alpha, adapter_dtype))
            continue
        if isinstance(m, QuantLinear):
            in_f, out_f = m.in_features, m.out_features
        else:
            in_f, out_f = _linear_dims(m)
        _set(model, name, LoraLinear(m, in_f, out_f, rank, alpha, dropout, adapter_dtype))
    return names


def quantize_experts(model: nn.Module, q: Quantization, compute_dtype: torch.dtype) -> int:
    """Quantise MoE experts kept as 3-D parameters (transformers 5's `gate_up_proj` (E, 2I, H),
    `down_proj` (E, H, I), trace/moe.py) as QLoRA quantises every expert's Linear: each becomes a
    QuantizedWeight of E x rows, and the module reads the parameter's name as its dequantised
    weight in the compute dtype, so the grouped GEMMs run in bf16/fp16 as bitsandbytes' do
    (MatMul4Bit dequantises to `bnb_4bit_compute_dtype`). One difference stays: autograd keeps
    that dequantised weight for the input gradient, where bitsandbytes dequantises again in
    backward -- a layer's experts more in memory, until its backward (one layer at a time under
    full checkpointing). Returns the number of parameters quantised."""
    count = 0
    for _, m in list(model.named_modules()):
        cubes = {n: tuple(p.shape) for n, p in m.named_parameters(recurse=False) if p.dim() == 3}
        if not cubes:
            continue
        props = {}
        for n, shape in cubes.items():
            del m._parameters[n]
            m.add_module(f"{n}_q", QuantizedWeight(shape[0] * shape[1], shape[2], q,
                                                   compute_dtype))
            props[n] = property(lambda self, n=n, shape=shape:
                                getattr(self, f"{n}_q").dequantize().view(shape))
        m.__class__ = type(type(m).__name__, (type(m),), props)
        count += len(cubes)
    return count


def quantize_linears(model: nn.Module, q: Quantization, compute_dtype: torch.dtype,
                     keeps_input: bool = False) -> int:
    """Replace every nn.Linear except output heads by a QuantLinear (transformers' bitsandbytes
    integration skips the output head: `get_keys_to_not_convert`)."""
    count = 0
    for name, m in list(model.named_modules()):
        if isinstance(m, nn.Linear) and name.rsplit(".", 1)[-1] not in HEADS:
            _set(model, name, QuantLinear(m, q, compute_dtype, keeps_input))
            count += 1
    return count
