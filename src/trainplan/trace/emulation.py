"""Emulate the target GPU's kernel semantics while tracing on the CPU fake device.

Traced naively on CPU, activation memory is about 2x wrong (BERT-large, measured against
Korthikanti et al.'s 34 sbh; tests/test_trace_closed_forms.py): CPU dropout keeps
its mask in the activation dtype, CPU SDPA takes the math path, and `torch.autocast("cuda")` does
nothing on a CPU build. `TargetSemantics` is a `TorchFunctionMode` (it runs above autograd, so the
casts it inserts are recorded in the graph exactly as CUDA autocast records them) that:

* routes `F.dropout` to `aten.native_dropout` (CUDA's fused kernel keeps a 1-byte bool mask);
* routes `F.scaled_dot_product_attention` to the backend the target would pick: flash
  (sm80+, no arbitrary mask), memory-efficient (sm50+, takes a bias), or the math composition
  (`softmax(q k^T * scale + mask) v`, which materialises the s x s scores); grouped-query K/V
  reach flash as they are and every other kernel expanded (trace/flash_gqa.py);
* keeps a `mean`'s input for its backward where the target's PyTorch did (before 2.2,
  `KernelSemantics.mean_keeps_input`);
* runs `F.group_norm` on a channels-last input as CUDA does (`KernelSemantics.cuda_layouts`,
  trace/cuda_layout.py: NCHW, with the copies its kernel makes);
* runs softmax, log_softmax and cross-entropy as CUDA does (`KernelSemantics.cuda_softmax`: a
  float16 input read directly into a float32 result; cross-entropy's log-probabilities in the
  input's dtype, copied to float32 for nll_loss) and `F.rms_norm` as its fused kernel
  (`KernelSemantics.fused_rms_norm`, trace/fused_norm.py);
* applies the CUDA autocast policy for fp16/bf16: the ops of PyTorch's "Autocast Op Reference"
  lower-precision list run in the autocast dtype, the fp32 list runs in fp32 (so layer_norm and
  softmax return fp32), the promote list runs in the widest input dtype, and casts of leaf
  parameters are cached for the whole forward (the "weight cast cache" that autocast keeps until
  the autocast region exits).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from . import cuda_layout, fused_norm, windows
from .flash_gqa import gqa_flash
from .semantics import KernelSemantics

aten = torch.ops.aten


# --- PyTorch "Autocast Op Reference", CUDA ops (torch 2.x docs, amp.html#cuda-ops-that-can-autocast-to-float16)
_LOWER = {
    "linear", "matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "baddbmm", "addmm", "addbmm",
    "addmv", "addr", "mv", "chain_matmul", "multi_dot", "conv1d", "conv2d", "conv3d",
    "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "prelu", "einsum",
    "scaled_dot_product_attention",
}
_FP32 = {
    "__pow__", "__rdiv__", "__rpow__", "__rtruediv__", "acos", "asin", "cosh", "erfinv", "exp",
    "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt", "sinh", "tan", "pow",
    "softplus", "layer_norm", "group_norm", "norm", "normalize", "cosine_similarity",
    "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "hinge_embedding_loss", "kl_div",
    "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss",
    "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "softmax", "log_softmax", "softmin", "cross_entropy", "cumprod", "cumsum", "prod", "sum",
}
_PROMOTE = {"addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sample", "index_put",
            "scatter_add", "tensordot"}


# CUDA's float16-in, float32-out kernels (KernelSemantics.cuda_softmax)
_HALF_TO_FLOAT = {"softmax": torch._softmax, "log_softmax": torch._log_softmax}
# positional parameters of the spellings of a softmax call
_SOFTMAX_ARGS = {F.softmax: ("input", "dim", "_stacklevel", "dtype"),
                 F.log_softmax: ("input", "dim", "_stacklevel", "dtype"),
                 torch.softmax: ("input", "dim", "dtype"),
                 torch.log_softmax: ("input", "dim", "dtype"),
                 torch.Tensor.softmax: ("input", "dim", "dtype"),
                 torch.Tensor.log_softmax: ("input", "dim", "dtype")}
_CROSS_ENTROPY_ARGS = ("input", "target", "weight", "size_average", "ignore_index", "reduce",
                       "reduction", "label_smoothing")


def _bound(names: tuple, args, kwargs) -> dict:
    got = dict(zip(names, args))
    got.update(kwargs)
    if "self" in got:
        got.setdefault("input", got["self"])
    return got


def _flash_ok(dtype, head_dim: int, attn_mask) -> bool:
    """Flash takes the call: no mask, fp16/bf16, a head dim up to 256."""
    return attn_mask is None and dtype != torch.float32 and head_dim <= 256


def _fname(func) -> str:
    return getattr(func, "__name__", "")


def _is_float(t) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point()


class TargetSemantics(TorchFunctionMode):
    """TorchFunctionMode applying `KernelSemantics` (see module docstring).

    `on_weight_cast(tensor)` is called for every cached weight cast so the memory tracker can label
    it; `autocast_enabled` is switched off for backward and the optimizer step by the tracer.
    """

    def __init__(self, sem: KernelSemantics, on_weight_cast=None):
        super().__init__()
        self.sem = sem
        self.autocast_enabled = sem.autocast_dtype is not None
        self.autocast_dtype = getattr(torch, sem.autocast_dtype) if sem.autocast_dtype \
            else None
        self._cast_cache: dict[int, torch.Tensor] = {}
        self._on_weight_cast = on_weight_cast
        self._inside = 0
        self.flash_eligible = 0     # SDPA calls the flash kernel would take (see `_sdpa`)
        # attention calls whose kernel the semantics chose (`backend`): where none did, flash,
        # memory-efficient and math attention run the same step (derive/twins.py)
        self.sdpa_calls = 0
        # SDPA calls given a float mask or bias, and those whose bias needs a gradient (T5's
        # relative position bias on transformers' SDPA path): flash refuses any mask, cuDNN one
        # that requires grad (sdp_utils_cpp.h check_attn_mask_shape); the memory-efficient kernel
        # takes it and, in backward, writes the bias gradient in the expanded (b, heads, s, s)
        self.float_mask_calls = 0
        self.bias_grad_calls = 0
        self.windows = None         # trace/windows.py WindowBatch, where the tracer installs one

    def clear_cast_cache(self) -> None:
        """Autocast drops its weight-cast cache when the autocast region exits (end of forward)."""
        self._cast_cache.clear()

    # -- autocast -------------------------------------------------------------------------
    def _cast(self, t, dtype):
        if not _is_float(t) or t.dtype == dtype or t.dtype == torch.float64:
            return t
        if isinstance(t, torch.nn.Parameter) or (t.is_leaf and t.requires_grad):
            hit = self._cast_cache.get(id(t))
            if hit is not None:
                return hit
            out = t.to(dtype)
            self._cast_cache[id(t)] = out
            if self._on_weight_cast is not None:
                self._on_weight_cast(out)
            return out
        return t.to(dtype)

    def _cast_all(self, args, kwargs, dtype):
        def conv(x):
            if isinstance(x, torch.Tensor):
                return self._cast(x, dtype)
            if isinstance(x, (list, tuple)) and x and all(isinstance(e, torch.Tensor) for e in x):
                return type(x)(self._cast(e, dtype) for e in x)
            return x
        return tuple(conv(a) for a in args), {k: conv(v) for k, v in kwargs.items()}

    def _autocast(self, name, args, kwargs):
        dt = self.autocast_dtype
        if name in _LOWER:
            return self._cast_all(args, kwargs, dt)
        if name in _FP32:
            # "ops that autocast to float32": a dtype= argument wins, as in CUDA autocast
            if kwargs.get("dtype") is not None:
                return args, kwargs
            return self._cast_all(args, kwargs, torch.float32)
        if name in _PROMOTE:
            floats = [a for a in list(args) + list(kwargs.values()) if _is_float(a)]
            if floats:
                widest = max((a.dtype for a in floats), key=lambda d: torch.finfo(d).bits)
                return self._cast_all(args, kwargs, widest)
        return args, kwargs

    # -- dispatch -------------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._inside:
            return func(*args, **kwargs)
        name = _fname(func)
        if name in ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout") and \
                func in (F.dropout, F.dropout1d, F.dropout2d, F.dropout3d):
            return self._dropout(name, args, kwargs)
        if self.windows is not None and self.windows.active:
            if func in windows.SPLITS:     # trace/windows.py: alike windows as one call
                out = self.windows.split(self.window_backend, func, args, kwargs)
                if out is not None:
                    return out
            elif func is torch.cat:
                self.windows.joined(args[0] if args else kwargs.get("tensors", ()))
        if self.sem.cuda_softmax or self.sem.fused_rms_norm:
            out = self._cuda_kernels(func, name, args, kwargs)
            if out is not None:
                return out
        if self.autocast_enabled:
            args, kwargs = self._autocast(name, args, kwargs)
        if func is F.group_norm and self.sem.cuda_layouts:
            got = _bound(("input", "num_groups", "weight", "bias", "eps"), args, kwargs)
            if cuda_layout.takes_copy(got.get("input")):
                self._inside += 1
                try:
                    return cuda_layout.group_norm(got["input"], got["num_groups"],
                                                  got.get("weight"), got.get("bias"),
                                                  got.get("eps", 1e-5))
                finally:
                    self._inside -= 1
        if func is F.scaled_dot_product_attention:
            self._inside += 1
            try:
                return self._sdpa(*args, **kwargs)
            finally:
                self._inside -= 1
        if name == "mean" and self.sem.mean_keeps_input:
            return self._mean_keeping_input(func, args, kwargs)
        return func(*args, **kwargs)

    def _cuda_kernels(self, func, name, args, kwargs):
        """softmax, log_softmax and cross-entropy as CUDA runs them (KernelSemantics.cuda_softmax),
        rms_norm as its fused kernel (KernelSemantics.fused_rms_norm); None where the call is none
        of those cases (it then runs as before)."""
        if name in _HALF_TO_FLOAT and func in _SOFTMAX_ARGS and self.sem.cuda_softmax:
            got = _bound(_SOFTMAX_ARGS[func], args, kwargs)
            x, dim, dtype = got.get("input"), got.get("dim"), got.get("dtype")
            if dtype is None and self.autocast_enabled:
                dtype = torch.float32                 # autocast's fp32_set_opt_dtype
            if isinstance(x, torch.Tensor) and x.dtype == torch.float16 and \
                    dtype == torch.float32 and isinstance(dim, int):
                return _HALF_TO_FLOAT[name](x, dim, True)
            return None
        if func is F.rms_norm and self.sem.fused_rms_norm:
            got = _bound(("input", "normalized_shape", "weight", "eps"), args, kwargs)
            x, weight = got.get("input"), got.get("weight")
            if isinstance(x, torch.Tensor) and fused_norm.takes_fused(x, weight):
                return fused_norm.rms_norm(x, got["normalized_shape"], weight, got.get("eps"))
            return None
        if func is F.cross_entropy and self.autocast_enabled and self.sem.cuda_softmax:
            got = _bound(_CROSS_ENTROPY_ARGS, args, kwargs)
            x, target = got.get("input"), got.get("target")
            if not (_is_float(x) and x.dtype in (torch.float16, torch.bfloat16)
                    and isinstance(target, torch.Tensor) and not target.is_floating_point()
                    and not got.get("label_smoothing") and got.get("size_average") is None
                    and got.get("reduce") is None):
                return None                   # probabilities, smoothing: the input cast first
            logp = F.log_softmax(x, 0 if x.dim() == 1 else 1, dtype=x.dtype)
            weight = got.get("weight")
            return F.nll_loss(self._cast(logp, torch.float32), target,
                              None if weight is None else self._cast(weight, torch.float32),
                              ignore_index=got.get("ignore_index", -100),
                              reduction=got.get("reduction", "mean"))
        return None

    @staticmethod
    def _mean_keeping_input(func, args, kwargs):
        """`mean` as PyTorch before 2.2 ran it (KernelSemantics.mean_keeps_input): its node
        holds the input until its backward has run, as the `_saved_self` it kept did (freed with
        the node's saved variables, after it runs: the hook runs then)."""
        out = func(*args, **kwargs)
        x = args[0] if args else kwargs.get("input")
        node = getattr(out, "grad_fn", None)
        if node is not None and isinstance(x, torch.Tensor):
            kept = [x]
            node.register_hook(lambda grad_inputs, grad_outputs: kept.clear())
        return out

    def _dropout(self, name, args, kwargs):
        x = args[0] if args else kwargs["input"]
        p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
        training = args[2] if len(args) > 2 else kwargs.get("training", True)
        if not training or p == 0:
            return x
        if not self.sem.fused_dropout or name != "dropout":
            with torch._C.DisableTorchFunction():
                return getattr(F, name)(x, p, training)
        # CUDA: fused kernel, bool mask saved for backward
        return aten.native_dropout(x, p, True)[0]

    def _sdpa(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
              enable_gqa=False):
        if attn_mask is not None and attn_mask.is_floating_point():
            self.float_mask_calls += 1
            self.bias_grad_calls += bool(attn_mask.requires_grad)
        gqa = k.shape[-3] != q.shape[-3] and q.dim() == 4
        # SDPA sees grouped K/V heads, unless the model's own code copied them (`expands_kv`)
        grouped = gqa and enable_gqa and not self.sem.expands_kv
        if self.sem.attention in ("flash", "efficient") and \
                _flash_ok(q.dtype, q.shape[-1], attn_mask):
            # the only place "flash" and "efficient" semantics part: a step where no call is
            # flash_ok runs the same ops either way (derive/twins.py shares such traces)
            self.flash_eligible += 1
        backend = self.backend(q.dtype, q.shape[-1], attn_mask, grouped)
        if backend == "flash" and grouped:         # K/V heads as they are (flash_gqa.py)
            return gqa_flash(q, k, v, dropout_p, is_causal, scale)
        if gqa:           # the model's repeat_kv, or the kernel's: one copy per query head
            rep = q.shape[-3] // k.shape[-3]
            k, v = k.repeat_interleave(rep, dim=-3), v.repeat_interleave(rep, dim=-3)
        if backend == "flash":
            out = aten._scaled_dot_product_flash_attention(
                q, k, v, dropout_p, is_causal, False, scale=scale)[0]
            return out
        if backend == "efficient":
            bias = attn_mask
            if bias is not None and bias.dtype == torch.bool:
                bias = torch.zeros(bias.shape, dtype=q.dtype, device=q.device).masked_fill(
                    bias.logical_not(), float("-inf"))
            if bias is not None and bias.dtype != q.dtype:
                bias = bias.to(q.dtype)
            if bias is not None:
                bias = bias.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
            return aten._scaled_dot_product_efficient_attention(
                q, k, v, bias, True, dropout_p, is_causal, scale=scale)[0]
        return self._math_attention(q, k, v, attn_mask, dropout_p, is_causal, scale)

    def backend(self, dtype: torch.dtype, head_dim: int, attn_mask=None, gqa: bool = False
                ) -> str:
        """The SDPA backend the target runs a call on (PyTorch's dispatcher, sdp_utils.cpp):
        flash takes no arbitrary mask and only fp16/bf16 inputs, the memory-efficient kernel a
        head dim that is a multiple of 8; grouped-query attention (`gqa`: enable_gqa with
        fewer K/V heads) only flash took before torch 2.13 (KernelSemantics.efficient_gqa)."""
        self.sdpa_calls += 1
        backend = self.sem.attention
        flash_ok = _flash_ok(dtype, head_dim, attn_mask)
        if gqa and not (backend == "flash" and flash_ok) and not self.sem.efficient_gqa and \
                backend in ("flash", "efficient"):
            return "math"
        if backend == "flash" and not flash_ok:
            backend = "efficient"
        if backend == "efficient" and head_dim % 8 != 0:
            backend = "math"
        return backend

    def window_backend(self, t: torch.Tensor) -> str:
        """The backend an SDPA call on windows of `t` (q, k or v, no mask) runs, "" where
        autocast would cast them first (trace/windows.py batches only uncast windows)."""
        if self.autocast_enabled and self.autocast_dtype not in (None, t.dtype):
            return ""
        return self.backend(t.dtype, t.shape[-1])

    def _math_attention(self, q, k, v, attn_mask, dropout_p, is_causal, scale):
        """softmax(q k^T / sqrt(d) + mask) v, as eager implementations compute it."""
        scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
        scores = torch.matmul(q, k.transpose(-2, -1)) * scale
        if is_causal:
            s_q, s_k = q.shape[-2], k.shape[-2]
            mask = torch.ones(s_q, s_k, dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(mask.logical_not(), float("-inf"))
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                scores = scores.masked_fill(attn_mask.logical_not(), float("-inf"))
            else:
                scores = scores + attn_mask
        if self.autocast_enabled:
            probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        else:
            probs = torch.softmax(scores, dim=-1)
        if dropout_p > 0:
            probs = aten.native_dropout(probs, dropout_p, True)[0]
        return torch.matmul(probs, v)
