"""Trace inference forwards with a KV cache on fake tensors: the ops of one prefill or decode step.

Generation is a chain of forwards (Pope et al. 2022, "Efficiently Scaling Transformer Inference",
arXiv:2211.05102, section 2): the prefill runs the prompt's P tokens at once and fills the KV
cache; each decode step runs 1 new token per sequence against the t tokens cached so far. One
step's ops depend on (batch, new tokens, context) only, so `trace_forward` traces exactly one
forward under the training tracer's machinery (trace/tracer.py: model built on meta, parameters
re-created as fake CPU tensors, `StepCounter` for FLOPs / bytes / live memory, `TargetSemantics`
for the target's attention kernel and autocast). Ops are recorded with phase "forward", so
predict/timing.py times them as it times a training forward.

The cache is transformers' `DynamicCache` (5.x: `DynamicCache(config=...)`, one layer object per
decoder layer, filled by `cache.update(key, value, layer_idx)`, which concatenates the step's new
K/V to what it holds -- modeling_*.py call it from every attention layer). `context` cached tokens
are pre-filled as fake (batch, kv_heads, context, head_dim) tensors in the compute dtype. Our
reference transformer (models/reference.py) has no cache: its attention modules get a forward
that concatenates cached K/V in the same way (same shapes and ops as a cached HF layer).

Dtypes: weights as the job stores them (`prepare_model`: bf16/fp16 for a pure-half job, fp32
master weights under AMP). Under AMP the forward runs under the target's autocast, whose weight
casts are re-done every forward: accelerate wraps `model.forward` in `torch.autocast` per call
(`Accelerator.prepare_model`), so the cast cache dies at each call's exit -- the situation of
`model.generate` inside TRL on a mixed-precision accelerate model. The cache holds K/V in the
compute (half) dtype then.
"""
from __future__ import annotations

import time

import torch

from ..errors import TrainplanError
from ..models import build_model
from . import blocks as block_tags, hf_values
from .counters import StepCounter, event_blocks
from .facts import InferenceTrace
from .fake_cache import fake_mode
from .log import TraceLog
from .prepare import _materialise, compute_dtype, count_parameters, prepare_model, stored_bytes
from .emulation import TargetSemantics
from .semantics import KernelSemantics
from .stack import cut
from .tracer import _Tracker, _untraceable, held_collections


def kv_dims(config) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) of a transformers config or a reference TransformerDims.

    VLM and multimodal configs: the text config (`get_text_config`). GQA/MQA: `num_key_value_heads`
    (else `multi_query` = 1 head, else the query heads); `head_dim` where the config sets it
    (Gemma: 256 with hidden 2048 and 8 heads), else hidden / heads."""
    get = getattr(config, "get_text_config", None)
    c = get() if get else config
    if hasattr(c, "to_dict") and not hasattr(c, "num_hidden_layers"):
        c = type("C", (), c.to_dict())
    layers = _first(c, "num_hidden_layers", "num_layers", "n_layer", "n_layers")
    heads = _first(c, "num_attention_heads", "num_heads", "n_head", "n_heads")
    kv = _first(c, "num_key_value_heads", "num_kv_heads", default=None)
    if kv is None:
        kv = 1 if getattr(c, "multi_query", False) else heads
    hd = _first(c, "head_dim", default=None)
    if hd is None:
        hd = _first(c, "hidden_size", "n_embd", "d_model") // heads
    return int(layers), int(kv), int(hd)


def _first(c, *names, default=0):
    for n in names:
        v = getattr(c, n, None)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    if default == 0:
        raise TrainplanError(f"The model config has none of {', '.join(names)}.",
                             fix="give a decoder-only language model config")
    return default


def trace_forward(job, sem: KernelSemantics, batch: int, new_tokens: int,
                  context: int = 0, depth: int | None = None) -> InferenceTrace:
    """Trace one no-grad forward of `new_tokens` tokens for each of `batch` sequences whose KV
    cache already holds `context` tokens (prefill: context=0, new_tokens=prompt length; decode
    step at context t: new_tokens=1, context=t).

    `depth`: trace only the first `depth` layers of the model's stack of alike layers
    (trace/stack.py; all where it has none); the trace's `stack` says so, and it keeps what
    predict/generation.py reads the whole stack's forward off: each op's and event's layer
    (trace/blocks.py), the memory log, and the last layer's parameters and weight bytes."""
    t0 = time.perf_counter()
    images = bool(job.image_size)
    if images:       # a VLM generates through its language model; the prompt's image tokens
        job = job.with_(image_size=None, images_per_sample=None)    # are prefilled as tokens
    bundle = build_model(job, attention=sem.attention)
    stack = cut(bundle.module, depth, periodic=False) if depth else None   # tags read layers
    if images:
        bundle.notes.append("generation: the prompt's image tokens are prefilled through the "
                            "language model; the vision tower's pass on them is not timed here "
                            "(the training step traces it)")
    if bundle.kind != "decoder":
        raise TrainplanError(f"{bundle.name} is {bundle.described}; generation needs "
                             "a decoder-only language model.", fix="pick a causal LM")
    prepare_model(job, bundle)  # dtype, LoRA adapters (TRL generates with them unmerged)
    model = bundle.module.eval()
    reference = job.transformer is not None
    dims = kv_dims(job.transformer if reference else model.config)
    kv_dtype = compute_dtype(job.precision)
    counter = StepCounter()
    counter.cuda_layouts = sem.cuda_layouts
    tracker = _Tracker(model)
    counter.mt = tracker
    layers = model.get_submodule(stack.path) if stack is not None else None
    if layers is not None:         # which layer each event and op belongs to (trace/blocks.py)
        block_tags.tag(counter, layers)
        counter.no_grad_stack = True
    ts = TargetSemantics(sem, on_weight_cast=lambda t: counter.track(t, "weight_casts"))
    vocab = job.transformer.vocab_size if reference else model.config.get_text_config().vocab_size
    # as trace_step (a full gc.collect() here, with the collector on during the forward, was a
    # seventh of a chart-rvr decode step's trace: py-spy, 2 cores, 2026-12-02)
    with held_collections():
        try:
            with fake_mode(), counter, torch.no_grad(), \
                    hf_values.as_on_gpu():
                counter.count_ops, counter.phase = False, "setup"
                _materialise(model, counter,
                             block_tags.module_blocks(layers) if layers is not None else None)
                cache = _make_cache(model, reference, dims if stack is None else
                                    (stack.traced,) + dims[1:], batch, context, kv_dtype, counter)
                ids = torch.randint(0, vocab, (batch, new_tokens))
                kwargs = {"input_ids": ids}
                if not reference:
                    kwargs.update({_cache_kwarg(model): cache}, use_cache=True, logits_to_keep=1,
                                  position_ids=torch.arange(context, context + new_tokens)
                                  .expand(batch, -1))
                counter.count_ops, counter.phase = True, "forward"
                counter.default_category = "activations"
                with tracker, ts:
                    ts.autocast_enabled = sem.autocast_dtype is not None
                    out = _run(model, reference, cache, context, kwargs)
                    ts.autocast_enabled = False
                    ts.clear_cast_cache()
                del out
                counter.closed = True
                kv_bytes = _cache_bytes(cache)
        except TrainplanError:
            raise
        except Exception as e:
            raise _untraceable(bundle.name, e, job) from None
    total, _ = count_parameters(model)
    weight_bytes = stored_bytes(model)
    notes = list(bundle.notes)
    if counter.unknown_flop_ops:
        notes.append("FLOPs not counted for: " + ", ".join(sorted(counter.unknown_flop_ops)))
    tr = InferenceTrace(bundle.name, batch, new_tokens, context, sem, list(counter.records),
                        total, weight_bytes, kv_bytes, counter.peak, *dims,
                        torch.empty((), dtype=kv_dtype).element_size(),
                        time.perf_counter() - t0, notes)
    if stack is not None:
        tr.stack = stack
        tr.log = TraceLog(counter.memory_log, counter.events, event_blocks(counter))
        tr.last_block = {"params_total": count_parameters(layers[-1])[0],
                         "weight_bytes": stored_bytes(layers[-1])}
    return tr


def _make_cache(model, reference: bool, dims, batch: int, context: int, dtype, counter):
    """A cache holding `context` fake tokens per sequence in every layer."""
    layers, kv_heads, head_dim = dims
    if reference:
        cache = [None] * layers
    else:
        from transformers import DynamicCache
        cache = DynamicCache(config=model.config)
    if context <= 0:
        return cache
    for i in range(layers):
        if counter.tag_blocks:     # layer i's cache is layer i's (trace/blocks.py)
            counter.block = i
        k = torch.empty(batch, kv_heads, context, head_dim, dtype=dtype)
        v = torch.empty(batch, kv_heads, context, head_dim, dtype=dtype)
        if reference:
            cache[i] = (k, v)
        else:
            cache.update(k, v, i)
        del k, v       # what the cache copied is freed with its layer, not the next one's
    counter.block = -1
    return cache


def _cache_kwarg(model) -> str:
    """transformers >= 5.2x names the cache argument `cache` (`past_key_values` deprecated)."""
    import inspect
    return "cache" if "cache" in inspect.signature(model.forward).parameters else \
        "past_key_values"


def _cache_bytes(cache) -> int:
    """Bytes of the distinct K/V storages the cache holds."""
    if isinstance(cache, list):
        ts = [t for kv in cache if kv for t in kv]
    else:
        ts = [t for layer in cache.layers for t in (getattr(layer, "keys", None),
                                                    getattr(layer, "values", None))
              if isinstance(t, torch.Tensor)]
    seen = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in ts}
    return int(sum(seen.values()))


def _run(model, reference: bool, cache, context: int, kwargs):
    if not reference:
        return model(**kwargs)
    from ..models.reference import Attention
    attns = [m for m in model.modules() if isinstance(m, Attention)]
    saved = [a.forward for a in attns]
    try:
        for i, a in enumerate(attns):
            a.forward = _cached_attention(a, cache, i, context)
        return model(kwargs["input_ids"])[:, -1:]
    finally:
        for a, f in zip(attns, saved):
            a.forward = f


def _cached_attention(self, cache: list, i: int, context: int):
    """models/reference.Attention.forward with a KV cache: new K/V concatenated to the cached
    ones (as transformers' DynamicLayer.update does), queries attend to all. Position-dependent
    tensors (RoPE tables, learned positions) keep their shapes, so FLOPs and bytes are exact."""
    import torch.nn.functional as F

    def forward(x, rope=None, bias=None):
        b, s, _ = x.shape
        q, k, v = self.qkv(x, rope)
        if cache[i] is not None:
            k = torch.cat((cache[i][0], k), dim=-2)
            v = torch.cat((cache[i][1], v), dim=-2)
        cache[i] = (k, v)
        if bias is not None:
            raise TrainplanError("ALiBi reference transformers are not supported for generation.")
        y = F.scaled_dot_product_attention(q, k, v, is_causal=context == 0 and s > 1,
                                           enable_gqa=k.shape[1] != q.shape[1])
        return self.o_proj(y.transpose(1, 2).reshape(b, s, -1))
    return forward
