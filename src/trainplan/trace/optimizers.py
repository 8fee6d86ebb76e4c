"""The optimizers a job can name, built as CUDA would run them, for a fake-tensor step.

PyTorch's AdamW/Adam/SGD default to the `foreach` implementation when every parameter is on CUDA
(torch.optim.optimizer._default_to_fused_or_foreach); we ask for it explicitly because the fake
device is CPU. foreach keeps whole-group temporaries (e.g. the sqrt of every exp_avg_sq), which is
part of the real step peak.

Two optimizers torch lacks are emulated with their state layout:
* Lion (Chen et al. 2023): one momentum buffer in the parameter dtype; update
  sign(b1 m + (1 - b1) g), then m = b2 m + (1 - b2) g.
* 8-bit AdamW (bitsandbytes, Dettmers et al. 2022): two uint8 states per parameter plus one fp32
  absmax per block ("block-wise quantization": 256 elements from bitsandbytes 0.45,
  bitsandbytes/optim/optimizer.py Optimizer2State.init_state `blocksize = 256`; 2048 up to
  0.44); tensors under 4096 elements keep fp32 states (bnb's min_8bit_size). The fused kernel
  updates in place: no whole-group temporaries.
* Paged AdamW (bitsandbytes `PagedAdamW` / `PagedAdamW8bit`, Dettmers et al. 2023, section 3,
  "Paged Optimizers"): the same state layout as AdamW 32-bit (two fp32 states a parameter, fused
  in-place update) or 8-bit, allocated in CUDA unified memory, outside PyTorch's caching
  allocator; the memory model (predict/memory.py) keeps them out of what must fit, since the
  driver pages them to host RAM when the device runs short.
* Adafactor (Shazeer & Stern 2018), as transformers.optimization.Adafactor runs it (HF Trainer's
  `optim="adafactor"`; torch.optim.Adafactor reads the parameter RMS with `.item()`, which a fake
  tensor cannot answer): no first moment (beta1=None); for a parameter of >= 2 dims the second
  moment is factored into a row vector (shape[:-1]) and a column vector (shape[:-2] + shape[-1:]),
  a 1-dim parameter keeps a full one; all in fp32. The per-parameter loop makes the update from
  grad^2 and the row x column outer product: two full-size fp32 temporaries of one parameter.

Gradient clipping (`clip_gradients`, a job's `max_grad_norm`) runs before the update as torch's
`clip_grad_norm_` does (torch/nn/utils/clip_grad.py): the L2 norm of every gradient
(`_foreach_norm` per device and dtype group, or `linalg.vector_norm` one gradient at a time
without foreach), their norm, the factor min(1, max_norm / (norm + 1e-6)), and every gradient
scaled by it in place (`_foreach_mul_`). It reads every gradient twice and writes it once; its
temporaries are one scalar a gradient. No host synchronisation: since torch 1.13 the factor stays
on the device (`clamp`, not a Python `if`) unless `error_if_nonfinite` asks for one.
"""
from __future__ import annotations

import math

import torch

from ..optimizer import Optimizer


class Lion(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                m = state["exp_avg"]
                update = (m * b1 + p.grad * (1 - b1)).sign_()
                p.add_(update, alpha=-group["lr"])
                m.mul_(b2).add_(p.grad, alpha=1 - b2)


class AdamW32bitFused(torch.optim.Optimizer):
    """bitsandbytes' 32-bit AdamW (Optimizer2State): fp32 states, one fused in-place kernel."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    def _init_state(self, p, state: dict) -> None:
        state["state1"] = torch.zeros_like(p, dtype=torch.float32)
        state["state2"] = torch.zeros_like(p, dtype=torch.float32)

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    self._init_state(p, state)
                # the fused kernel reads p, grad and the states and writes p and the states
                p.add_(p.grad, alpha=-group["lr"])


class AdamW8bit(AdamW32bitFused):
    """bitsandbytes' 8-bit AdamW: uint8 states with an fp32 absmax per block (module docstring)."""

    BLOCK = 256              # bitsandbytes >= 0.45 (2048 before)
    MIN_8BIT_SIZE = 4096

    def _init_state(self, p, state: dict) -> None:
        if p.numel() < self.MIN_8BIT_SIZE:
            return super()._init_state(p, state)
        blocks = math.ceil(p.numel() / self.BLOCK)
        state["state1"] = torch.zeros_like(p, dtype=torch.uint8)
        state["state2"] = torch.zeros_like(p, dtype=torch.uint8)
        state["absmax1"] = torch.zeros(blocks, device=p.device)
        state["absmax2"] = torch.zeros(blocks, device=p.device)


class Adafactor(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-4, eps=1e-30, decay_rate=-0.8, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, eps=eps, decay_rate=decay_rate,
                                      weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad.float()
                state = self.state[p]
                if not state:
                    if p.dim() >= 2:
                        state["exp_avg_sq_row"] = torch.zeros(p.shape[:-1], device=p.device)
                        state["exp_avg_sq_col"] = torch.zeros(p.shape[:-2] + p.shape[-1:],
                                                              device=p.device)
                    else:
                        state["exp_avg_sq"] = torch.zeros_like(g)
                update = g * g + group["eps"]                       # full-size temporary 1
                if p.dim() >= 2:
                    row, col = state["exp_avg_sq_row"], state["exp_avg_sq_col"]
                    row.mul_(0.9).add_(update.mean(dim=-1), alpha=0.1)
                    col.mul_(0.9).add_(update.mean(dim=-2), alpha=0.1)
                    r = (row / row.mean(dim=-1, keepdim=True)).rsqrt_().unsqueeze(-1)
                    c = col.unsqueeze(-2).rsqrt()
                    update = torch.mul(r, c)                         # full-size temporary 2
                    update.mul_(g)
                else:
                    v = state["exp_avg_sq"]
                    v.mul_(0.9).add_(update, alpha=0.1)
                    update = v.rsqrt().mul_(g)
                p.add_(update.to(p.dtype), alpha=-group["lr"])


def clip_gradients(params: list[torch.nn.Parameter], max_norm: float | None,
                   foreach: bool = True) -> None:
    """The job's gradient clipping (module docstring), nothing where `max_norm` is None."""
    if max_norm:
        torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=foreach)


EMULATED = {"Adafactor": Adafactor, "Lion": Lion, "AdamW8bit": AdamW8bit,
            "AdamW32bitFused": AdamW32bitFused}


def build_optimizer(opt: Optimizer, params: list[torch.nn.Parameter],
                    foreach: bool = True) -> torch.optim.Optimizer:
    """The job's optimizer (optimizer.py: its `builder` and `options`) over `params`. `foreach`:
    torch's multi-tensor kernels, its default on CUDA and ROCm; False: the per-parameter loop it
    runs on devices without foreach kernels (MPS). The emulations run as their libraries' do."""
    lr, kw = 1e-4, dict(opt.options)
    if opt.builder in EMULATED:
        return EMULATED[opt.builder](params, lr=lr, **kw)
    return getattr(torch.optim, opt.builder)(params, lr=lr, foreach=foreach, **kw)
