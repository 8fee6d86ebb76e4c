"""The model as a step is traced on it, and what its parameters come to.

`prepare_model` applies the job to the model built on the meta device: the precision weights are
stored in (fp32 master weights under AMP), LoRA/QLoRA adapters, frozen prefixes, frozen weights
kept in 16 bits. `_materialise` then re-creates every parameter and buffer as a fake CPU tensor
the counter tracks (fake *cuda* tensors cannot train on a CPU build: their backward dispatches to
CUDA kernels a CPU build does not have). The rest count what the parameters hold: totals
(quantised weights as the parameters they encode, as peft reports them), bytes as stored, the
largest repeated block's and the root's (what FSDP and ZeRO-3 gather), the packed part.
"""
from __future__ import annotations

import torch

from ..errors import TrainplanError
from ..models import ModelBundle
from ..models.hf_releases import use_releases_before
from ..models.lora import apply_lora
from ..models.meta import on_meta
from .counters import StepCounter
from .semantics import KernelSemantics
from .stack import Stack


def stored_dtype(precision) -> torch.dtype:
    """The dtype parameters are stored in (fp32 under AMP: the master weights)."""
    return getattr(torch, precision.stored)


def autocast_dtype(precision) -> torch.dtype | None:
    """torch.autocast's dtype, None without AMP."""
    return getattr(torch, precision.autocast) if precision.autocast else None


def compute_dtype(precision) -> torch.dtype:
    """What the matmuls compute in: the 16-bit dtype of AMP or pure half, else fp32."""
    return getattr(torch, precision.half) if precision.half else torch.float32


def _materialise(model: torch.nn.Module, counter: StepCounter,
                 blocks: dict[int, int] | None = None) -> None:
    """Replace meta parameters/buffers by fake CPU tensors (memoised so tied weights stay tied);
    `blocks` (id(module) -> block, trace/blocks.py) tags each with its block of the cut stack."""
    memo: dict[int, torch.Tensor] = {}
    for mod in model.modules():
        if blocks is not None:
            counter.block = blocks.get(id(mod), -1)
        for name, p in list(mod._parameters.items()):
            if p is None:
                continue
            if id(p) not in memo:
                # in the meta parameter's strides: a channels-last model's convolution weights
                # stay channels-last, as `model.to(memory_format=...)` left them
                t = torch.empty_strided(p.shape, p.stride(), dtype=p.dtype, device="cpu")
                counter.track(t, "weights")
                memo[id(p)] = torch.nn.Parameter(t, requires_grad=p.requires_grad)
            mod._parameters[name] = memo[id(p)]
        for name, b in list(mod._buffers.items()):
            if b is None:
                continue
            if id(b) not in memo:
                t = torch.empty(b.shape, dtype=b.dtype, device="cpu")
                counter.track(t, "weights")
                memo[id(b)] = t
            mod._buffers[name] = memo[id(b)]
        for name, v in list(vars(mod).items()):  # plain tensor attributes (e.g. rotary caches)
            if isinstance(v, torch.Tensor) and v.device.type == "meta":
                if id(v) not in memo:
                    memo[id(v)] = torch.empty(v.shape, dtype=v.dtype, device="cpu")
                setattr(mod, name, memo[id(v)])
    counter.block = -1


def prepare_model(job, bundle: ModelBundle, semantics: KernelSemantics | None = None
                  ) -> list[str]:
    """Precision, LoRA/QLoRA, frozen prefixes and 16-bit frozen weights, applied on the meta
    model (checkpointing is the tracer's: it needs the step's recompute context); the LoRA
    modules' names. `semantics`: the target's kernels (which bitsandbytes release:
    quantization.py; which transformers release: models/hf_releases.py)."""
    model = bundle.module
    # AMP keeps fp32 master weights whatever dtype the config was published in
    model.to(stored_dtype(job.precision))
    lora_names: list[str] = []
    if job.lora is not None:
        compute = compute_dtype(job.precision)
        adapter = stored_dtype(job.precision)
        with on_meta():
            lora_names = apply_lora(model, job.lora.rank, job.lora.alpha, job.lora.targets,
                                    job.lora.dropout, job.quantize, compute, adapter,
                                    old_bnb4=bool(semantics and semantics.bnb4_keeps_input))
    for prefix in job.frozen:
        hit = False
        for name, p in model.named_parameters():
            if name == prefix or name.startswith(prefix + "."):
                p.requires_grad_(False)
                hit = True
        if not hit:
            raise TrainplanError(f"frozen: {prefix!r} matches no parameter of {bundle.name}.",
                                 fix="run `trainplan inspect` to see parameter names")
    half_frozen(model, job)
    use_releases_before(model, bool(semantics and semantics.hf_loss_copies_logits))
    return lora_names


def half_frozen(model: torch.nn.Module, job) -> int:
    """Store frozen floating-point parameters in the 16-bit dtype as `job.frozen_half` says (under
    mixed precision only: elsewhere they are stored as the job computes). "embeddings": the
    input embeddings and the output head (TRL's `peft_module_casting_to_bf16`: norms stay fp32);
    "all": every frozen parameter (loaded with torch_dtype=bf16/fp16, never upcast). Returns the
    parameters cast (quantization.py has the sources)."""
    from ..models.lora import HEADS
    if job.frozen_half == "none" or not job.precision.amp:
        return 0
    half = compute_dtype(job.precision)
    cast = 0
    for name, m in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if job.frozen_half == "embeddings" and not (
                isinstance(m, torch.nn.Embedding) or (leaf in HEADS and hasattr(m, "weight"))):
            continue
        for p in m.parameters(recurse=False):
            if not p.requires_grad and p.is_floating_point() and p.dtype != half:
                p.data = p.data.to(half)
                cast += p.numel()
    return cast


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(total, trainable) parameters, tied weights once; quantised weights count as the
    parameters they encode (QLoRA reports the base model's count, as peft does)."""
    seen: set[int] = set()
    total = trainable = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        if p.requires_grad:
            trainable += p.numel()
    return total + _packed_param_count(model), trainable


def stored_bytes(module: torch.nn.Module) -> int:
    """Bytes of a module's parameters (tied ones once) and buffers as stored."""
    uniq = {id(p): p for p in module.parameters()}.values()
    return sum(p.numel() * p.element_size() for p in uniq) + \
        sum(b.numel() * b.element_size() for b in module.buffers())


def dtype_split(module: torch.nn.Module) -> tuple[int, int]:
    """(bytes of the parameters and buffers that are not floating point: packed quantised
    weights and their quantisation state, which a dtype cast leaves alone; elements of the
    floating-point ones, which DeepSpeed's 16-bit engine casts: plan/fixes.py, sharding.py)."""
    tensors = list({id(p): p for p in module.parameters()}.values()) + list(module.buffers())
    packed = sum(t.numel() * t.element_size() for t in tensors if not t.is_floating_point())
    return packed, sum(t.numel() for t in tensors if t.is_floating_point())


def _unit_bytes(model, gathered_in: torch.dtype | None = None) -> tuple[int, int]:
    """(parameter bytes of the largest repeated block, what FSDP/ZeRO-3 gathers at a time;
    parameter bytes outside every block: embeddings, final norm, output head, what an FSDP wrap
    of the blocks leaves to the root unit, predict/sharding.py). Without blocks both are the
    whole model. `gathered_in`: count floating-point parameters at most this wide, as a
    MixedPrecision all-gather casts them; packed quantised weights (uint8, or bf16 storage with
    bnb_4bit_quant_storage) are gathered as they are."""
    from .checkpointing import find_blocks

    def nbytes(p) -> int:
        size = p.element_size()
        if gathered_in is not None and p.is_floating_point():
            size = min(size, torch.finfo(gathered_in).bits // 8)
        return p.numel() * size
    blocks = find_blocks(model)
    largest = max((sum(nbytes(p) for p in b.parameters()) for _, b in blocks),
                  default=sum(nbytes(p) for p in model.parameters()))
    inside = {id(p) for _, b in blocks for p in b.parameters()}
    uniq = {id(p): p for p in model.parameters()}
    return largest, sum(nbytes(p) for i, p in uniq.items() if i not in inside)


def _hidden_size(job, model) -> int:
    """The model's hidden size (HF config, or the reference transformer's dimensions)."""
    if job.transformer is not None:
        return int(job.transformer.hidden_size)
    cfg = getattr(model, "config", None)
    get = getattr(cfg, "get_text_config", None)
    cfg = get() if get else cfg
    h = getattr(cfg, "hidden_size", None)
    return int(h) if isinstance(h, int) else 0


def _quantized_note(job, model, stack: Stack | None = None) -> str:
    """What QLoRA stores, for the whole model: the quantised weights with their state, and the
    rest in its dtype. A cut trace (stack.py) holds `stack.traced` of the `stack.blocks`
    alike blocks: what lies in them counts blocks / traced times."""
    from ..models.lora import QuantizedWeight
    from ..units import fmt_bytes, fmt_count
    inside: set[int] = set()
    scale = 1.0
    if stack is not None:
        inside = {id(m) for m in model.get_submodule(stack.path).modules()}
        inside |= {id(p) for p in model.get_submodule(stack.path).parameters()}
        scale = stack.blocks / stack.traced

    def times(obj) -> float:
        return scale if id(obj) in inside else 1.0
    qs = [m for m in model.modules() if isinstance(m, QuantizedWeight)]
    q_params = sum(m.shape[0] * m.shape[1] * times(m) for m in qs)
    q_bytes = sum((m.packed.numel() + m.quant_state.numel()) * times(m) for m in qs)
    rest = {id(p): p for n, p in model.named_parameters()
            if not n.endswith("packed") and not p.requires_grad}.values()
    r_params = sum(p.numel() * times(p) for p in rest)
    r_bytes = sum(p.numel() * p.element_size() * times(p) for p in rest)
    dtypes = sorted({str(p.dtype).replace("torch.", "") for p in rest})
    why = (" (as peft's prepare_model_for_kbit_training casts them under mixed precision)"
           if "float32" in dtypes and job.precision.amp else "")
    return (f"{job.quantize.label}: {fmt_count(int(q_params))} weights in "
            f"{fmt_bytes(int(q_bytes))} with their quantisation state; "
            f"{fmt_count(int(r_params))} frozen parameters left unquantised (embeddings, norms, "
            f"head) in {'/'.join(dtypes) or '-'}, {fmt_bytes(int(r_bytes))}{why}")


def _packed_param_count(model) -> int:
    """Quantised weights count as the parameters they encode (QLoRA reports the base model's)."""
    from ..models.lora import QuantizedWeight
    n = 0
    for m in model.modules():
        if isinstance(m, QuantizedWeight):
            n += m.shape[0] * m.shape[1] - m.packed.numel()
    return n
