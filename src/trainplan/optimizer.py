"""Optimizer and Offload: what updates the weights, and where its state lives. One type each,
parsed once where a job is read (spec.py); the tracer, memory, the compatibility rules, the fix
ladder and the exports ask it.

    name              built as (trace/optimizers.py)      step on CUDA   library
    adamw             torch.optim.AdamW                   foreach        torch
    adam              torch.optim.Adam                    foreach        torch
    sgd               torch.optim.SGD                     foreach        torch
    sgd-momentum      torch.optim.SGD (momentum 0.9,      foreach        torch
                      Nesterov)
    adafactor         Adafactor (transformers')           per parameter  transformers
    adamw-8bit        AdamW8bit                           fused          bitsandbytes
    lion              Lion                                per parameter  lion-pytorch / bnb
    paged-adamw       AdamW32bitFused, paged              fused          bitsandbytes
    paged-adamw-8bit  AdamW8bit, paged                    fused          bitsandbytes

`foreach`: torch.optim's multi-tensor step, its default on CUDA, which keeps whole-group
temporaries (predict/memory.py scales them for a per-parameter loop on older releases).
`bnb`: needs bitsandbytes' CUDA (or ROCm) kernels (predict/compat.py). `paged`: its states live in
CUDA unified memory, outside PyTorch's caching allocator, paged to host RAM by the driver when
the device runs short (Dettmers et al. 2023, section 3): memory.py keeps them out of what must
fit. `hf_optim` and `torchtune` are the names the exports write for it (the HF Trainer's `optim`,
torchtune's `_component_`).

    offload           each device holds                      (DeepSpeed ZeRO-Offload,
    none              everything its strategy gives it        Ren et al. 2021,
    optimizer         no optimizer state (host RAM)           arXiv:2101.06840; FSDP's
    optimizer+params  no optimizer state, and under ZeRO-3    CPUOffload)
                      or FSDP only the layers gathered
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import unknown
from .named import Named


@dataclass(frozen=True, eq=False)
class Optimizer(Named):
    name: str
    label: str
    builder: str                  # a class of torch.optim, or trace/optimizers.py's emulation
    hf_optim: str                 # the HF Trainer's `optim` value written for it
    torchtune: str                # torchtune's `_component_` written for it
    options: tuple = ()           # the builder's keyword arguments beyond the learning rate
    foreach: bool = False         # torch.optim's multi-tensor step (module docstring)
    bnb: bool = False             # bitsandbytes' kernels: CUDA and ROCm only
    paged: bool = False           # states in CUDA unified memory (module docstring)
    spellings: tuple[str, ...] = ()


ADAMW = Optimizer("adamw", "AdamW", "AdamW", "adamw_torch", "torch.optim.AdamW", foreach=True)
ADAM = Optimizer("adam", "Adam", "Adam", "adamw_torch", "torch.optim.Adam", foreach=True)
SGD = Optimizer("sgd", "SGD", "SGD", "sgd", "torch.optim.SGD", foreach=True)
SGD_MOMENTUM = Optimizer("sgd-momentum", "SGD with Nesterov momentum", "SGD", "sgd",
                         "torch.optim.SGD", (("momentum", 0.9), ("nesterov", True)), foreach=True)
ADAFACTOR = Optimizer("adafactor", "Adafactor", "Adafactor", "adafactor", "torch.optim.Adafactor")
# bitsandbytes' class names and the HF Trainer's `optim` values are other spellings
ADAMW_8BIT = Optimizer("adamw-8bit", "8-bit AdamW (bitsandbytes)", "AdamW8bit", "adamw_bnb_8bit",
                       "bitsandbytes.optim.AdamW8bit", bnb=True,
                       spellings=("adamw8bit", "adam8bit", "8bit-adamw", "adamw-bnb-8bit"))
LION = Optimizer("lion", "Lion", "Lion", "lion_32bit", "bitsandbytes.optim.Lion")
PAGED_ADAMW = Optimizer("paged-adamw", "paged AdamW (bitsandbytes)", "AdamW32bitFused",
                        "paged_adamw_32bit", "bitsandbytes.optim.PagedAdamW", bnb=True, paged=True,
                        spellings=("paged-adamw-32bit",))
PAGED_ADAMW_8BIT = Optimizer("paged-adamw-8bit", "paged 8-bit AdamW (bitsandbytes)", "AdamW8bit",
                             "paged_adamw_8bit", "bitsandbytes.optim.PagedAdamW8bit", bnb=True,
                             paged=True, spellings=("paged-adamw8bit",))
ALL: tuple[Optimizer, ...] = (ADAMW, ADAM, SGD, SGD_MOMENTUM, ADAFACTOR, ADAMW_8BIT, LION,
                              PAGED_ADAMW, PAGED_ADAMW_8BIT)
NAMES = tuple(o.name for o in ALL)


def traced_as(opt: Optimizer) -> Optimizer:
    """The optimizer whose step a trace of `opt` runs: the first of ALL with its builder and
    options. The tracer builds an optimizer from those alone (trace/optimizers.py), so a paged
    optimizer's step is its unpaged twin's (paged-adamw-8bit: adamw-8bit's), which one trace
    serves (trace/derive/anchoring.py `trace_job`); where its states live is the memory model's
    (`paged`, predict/memory.py)."""
    return next((o for o in ALL if o.builder == opt.builder and o.options == opt.options), opt)


def parse(value, where: str = "--optimizer") -> Optimizer:
    """A spelling -> its Optimizer (case and `_`/`-` ignored); TrainplanError with the names
    otherwise."""
    if isinstance(value, Optimizer):
        return value
    text = str(value).lower().replace("_", "-")
    for o in ALL:
        if text == o.name or text in o.spellings:
            return o
    raise unknown("optimizer", text, NAMES, n=1, allowed=", ".join(NAMES),
                  what=f"{where} {text!r} is not a choice.")


@dataclass(frozen=True, eq=False)
class Offload(Named):
    name: str
    label: str
    states: bool                  # the optimizer states (and ZeRO's fp32 gradients) in host RAM
    params: bool                  # the parameters too
    order: int                    # how much leaves the device: none 0, optimizer 1, +params 2


NO_OFFLOAD = Offload("none", "no CPU offload", False, False, 0)
OFFLOAD_OPTIMIZER = Offload("optimizer", "optimizer state in host RAM", True, False, 1)
OFFLOAD_PARAMS = Offload("optimizer+params", "optimizer state and parameters in host RAM", True,
                         True, 2)
OFFLOADS: tuple[Offload, ...] = (NO_OFFLOAD, OFFLOAD_OPTIMIZER, OFFLOAD_PARAMS)
OFFLOAD_NAMES = tuple(o.name for o in OFFLOADS)


def parse_offload(value, where: str = "--offload") -> Offload:
    """A spelling -> its Offload; TrainplanError with the names otherwise."""
    if isinstance(value, Offload):
        return value
    for o in OFFLOADS:
        if value == o.name:
            return o
    raise unknown("offload", str(value), OFFLOAD_NAMES, n=1, allowed=", ".join(OFFLOAD_NAMES),
                  what=f"{where} {value!r} is not a choice.")
