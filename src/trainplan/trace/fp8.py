"""FP8 training as Transformer Engine and torchao run it, for a fake-tensor step: which linears
run their GEMMs in FP8, what each recipe keeps for backward, and its scaling state.

The GEMMs become `aten._scaled_mm` on float8_e4m3fn operands with a bf16 output (FLOPs from
PyTorch's formula; the time model runs them at the catalog's FP8 peak). Every other op keeps the
precision's bf16 autocast. What is allocated follows the libraries' source, read 2026-11-27
(data/SOURCES.md S116):

torchao float8 (`torchao/float8/float8_linear.py` @36027d8, `matmul_with_hp_or_float8_args`):
    forward casts the input to the autocast dtype (`Float8Linear.forward`), saves that
    high-precision input and the weight itself (`ctx.save_for_backward(input_hp, weight_hp_t)`:
    no copy), and casts both to FP8 for the GEMM only; the weight goes from fp32 to FP8 directly,
    so autocast's cached bf16 weight copies disappear. backward casts grad_output, the weight
    and the saved input to FP8 again for the two GEMMs (grad_weight is computed whether the
    weight trains or not). "tensorwise" keeps one fp32 scale a tensor, "rowwise" one a row
    (e4m3 throughout). The casts are what torch.compile fuses (torchao's benchmarks and
    torchtitan compile): amax and cast in one kernel, no full-size |x| or x * scale temporaries.
Transformer Engine (`transformer_engine/pytorch/module/linear.py` @d0067d0):
    the input is quantized with row- and column-wise usage and only the column-wise data is kept
    for backward (`update_usage(rowwise_usage=False, columnwise_usage=True)`); the FP8 weight,
    both usages, is saved too (`wt_save = weightmat`). Float8 tensors hold the column-wise data as
    a separate transpose (`_transpose`) unless the GPU runs FP8 GEMMs in non-TN layouts, which
    sm100-sm11x and sm130+ do (`is_non_tn_fp8_gemm_supported`, `Float8Quantizer` specs): on an H100,
    an Ada card or an sm120 RTX 50 the FP8 weight costs 2 bytes a parameter, on a B200 1.
    MXFP8 (Blackwell) quantizes rows and columns separately, each with one E8M0 scale per 32
    values (`MXFP8BlockScaling`). Delayed scaling keeps, per linear, an fp32 amax history of
    `amax_history_len` (1024, TE's and accelerate's TERecipeKwargs default) x 3 forward and x 2
    backward tensors plus their scales (`DelayedScalingRecipeState`); current scaling keeps none.
    grad_weight is skipped for a frozen weight.
Which linears (accelerate @16cb6eb): TE's `convert_model` converts every nn.Linear whose
    dimensions are multiples of 16; torchao's default filter (`filter_first_and_last_linear_layers`)
    also skips the model's first and last linear layers "for stability".
"""
from __future__ import annotations

import torch
import torch.nn as nn

F8 = torch.float8_e4m3fn
MX_BLOCK = 32                     # values per E8M0 scale (MXFP8BlockScaling)
AMAX_HISTORY = 1024               # DelayedScaling.amax_history_len default
RECIPES = ("te-delayed", "te-current", "te-mxfp8", "torchao-tensorwise", "torchao-rowwise")


def _is_te(recipe: str) -> bool:
    return recipe.startswith("te-")


def eligible(model: nn.Module, recipe: str) -> list[str]:
    """Names of the nn.Linear modules the recipe converts (module docstring)."""
    linears = [(n, m) for n, m in model.named_modules() if type(m) is nn.Linear]
    skip = set() if _is_te(recipe) or not linears else {linears[0][0], linears[-1][0]}
    return [n for n, m in linears
            if n not in skip and m.in_features % 16 == 0 and m.out_features % 16 == 0]


def convert(model: nn.Module, recipe: str, transpose: bool, on_weight_cast=None) -> list[str]:
    """Swap the eligible linears' forward for the recipe's FP8 GEMM (on the meta model, before
    its tensors are made); delayed scaling's state becomes buffers of each converted module.
    `transpose`: the GPU keeps FP8 transposes (TE on GPUs without non-TN FP8 GEMMs).
    `on_weight_cast(t)` labels each FP8 weight copy (the tracer's weight_casts)."""
    names = eligible(model, recipe)
    for name in names:
        mod = model.get_submodule(name)
        if recipe == "te-delayed":
            dev = mod.weight.device
            mod.register_buffer("fp8_amax_history_fwd", torch.zeros(AMAX_HISTORY, 3, device=dev))
            mod.register_buffer("fp8_scale_fwd", torch.ones(3, device=dev))
            mod.register_buffer("fp8_amax_history_bwd", torch.zeros(AMAX_HISTORY, 2, device=dev))
            mod.register_buffer("fp8_scale_bwd", torch.ones(2, device=dev))
        mod.forward = _forward(mod, recipe, transpose, on_weight_cast)
    return names


def _forward(mod: nn.Linear, recipe: str, transpose: bool, on_weight_cast):
    def forward(x: torch.Tensor) -> torch.Tensor:
        dtype = torch.bfloat16
        if not _is_te(recipe) and x.dtype != dtype:
            x = x.to(dtype)               # Float8Linear.forward: the input in the autocast dtype
        return _Fp8Linear.apply(x, mod.weight, mod.bias, recipe, transpose, on_weight_cast)
    return forward


def _cast(t: torch.Tensor, rowwise: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(FP8 data, fp32 scale): one amax reduction and one cast kernel (module docstring).
    Rowwise: a scale a row."""
    amax = t.amax(dim=-1, keepdim=True) if rowwise else t.amax()
    return t.to(F8), amax.float()


def _mx(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 data of `t` along its last dim and its E8M0 scales (one byte per 32 values)."""
    scales = torch.empty(*t.shape[:-1], -(-t.shape[-1] // MX_BLOCK), dtype=torch.uint8,
                         device=t.device)
    return t.to(F8), scales


def _gemm(a: torch.Tensor, b: torch.Tensor, bias=None) -> torch.Tensor:
    """a (m, k) FP8 @ b (k, n) FP8 -> bf16, as cuBLASLt / CUTLASS run it (`aten._scaled_mm`; the
    scales a recipe made are allocated by `_cast`/`_mx`, the GEMM reads them)."""
    one = torch.ones((), dtype=torch.float32, device=a.device)
    return torch._scaled_mm(a, b, one, one, bias=bias, out_dtype=torch.bfloat16)


class _Fp8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, recipe, transpose, on_weight_cast):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])                            # (m, k); weight (n, k)
        b16 = bias.to(torch.bfloat16) if bias is not None else None
        ctx.recipe, ctx.transpose, ctx.shape = recipe, transpose, shape
        ctx.has_bias, ctx.weight_trains = bias is not None, weight.requires_grad
        ctx.weight_dtype = weight.dtype
        if not _is_te(recipe):                                   # torchao: keep hp input, weight
            rowwise = recipe == "torchao-rowwise"
            x8, _sx = _cast(x2, rowwise)
            w8, _sw = _cast(weight, rowwise)
            out = _gemm(x8, w8.t(), b16)
            del x8, w8, _sx, _sw
            ctx.save_for_backward(x2, weight)
            return out.reshape(*shape[:-1], out.shape[-1])
        mx = recipe == "te-mxfp8"
        if mx:                       # rows and columns quantized separately, scales per 32
            x8, _xs = _mx(x2)
            x8c, xsc = _mx(x2.t())                               # (k, m), kept
            w8, wsr = _mx(weight)
            w8c, wsc = _mx(weight.t())                           # (k, n)
            kept = (x8c, xsc, w8, wsr, w8c, wsc)
            weights = (w8, wsr, w8c, wsc)
        else:
            x8, _xs = _cast(x2)
            x8c = x8.t().contiguous() if transpose else x8       # Float8Tensor `_transpose`
            w8, _ws = _cast(weight)
            w8c = w8.t().contiguous() if transpose else w8
            weights = (w8, w8c) if transpose else (w8,)
            kept = (x8c,) + weights
        if on_weight_cast is not None:
            for t in weights:
                on_weight_cast(t)
        out = _gemm(x8, w8.t(), b16)
        del x8, _xs                                              # row-wise input data dropped
        ctx.save_for_backward(*kept)
        return out.reshape(*shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, grad):
        recipe, transpose, shape = ctx.recipe, ctx.transpose, ctx.shape
        g2 = grad.reshape(-1, grad.shape[-1])                    # (m, n)
        grad_bias = g2.sum(0) if ctx.has_bias else None
        if not _is_te(recipe):
            x_hp, weight = ctx.saved_tensors
            rowwise = recipe == "torchao-rowwise"
            g8, _sg = _cast(g2, rowwise)
            w8, _sw = _cast(weight, rowwise)                     # (n, k)
            gin = _gemm(g8, w8)                                  # grad_input (m, k)
            del w8, _sw
            g8t = g8.t().contiguous()                            # (n, m), row-major for a
            del g8
            x8, _sx = _cast(x_hp, rowwise)                       # (m, k)
            gw = _gemm(g8t, x8)                                  # grad_weight: always made
            gin = gin.reshape(*shape[:-1], gin.shape[-1])
            return gin, gw.to(weight.dtype), grad_bias, None, None, None
        saved = ctx.saved_tensors
        mx = recipe == "te-mxfp8"
        if mx:
            x8c, w8c = saved[0], saved[4]
            g8, _gs = _mx(g2)
            g8c, _gcs = _mx(g2.t())                              # (n, m)
            w_b, x_b = w8c.t(), x8c.t()
        else:
            x8c, w8 = saved[0], saved[1]
            g8, _gs = _cast(g2)
            g8c = g8.t().contiguous() if transpose else g8.t()   # (n, m)
            w_b = saved[2].t() if transpose else w8              # (n, k)
            x_b = x8c.t() if transpose else x8c                  # (m, k)
        gin = _gemm(g8, w_b).reshape(*shape[:-1], -1)            # dgrad
        gw = _gemm(g8c, x_b).to(ctx.weight_dtype) if ctx.weight_trains else None  # wgrad
        return gin, gw, grad_bias, None, None, None
