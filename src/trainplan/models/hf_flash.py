"""transformers' `flash_attention_2`, as a trace on fake tensors runs it.

`--attention flash` on an `hf:` model is `attn_implementation="flash_attention_2"` (what a TRL or
axolotl config's flash setting and fms-hf-tuning's `use_flash_attn` ask for): transformers calls
the flash-attn package (transformers/integrations/flash_attention.py `flash_attention_forward`),
which this machine does not have and whose kernels need a GPU. What that path runs on a GPU,
call by call, differs from transformers' SDPA path in three ways:

- no mask. `flash_attention_mask` (transformers/masking_utils.py) returns None for a batch
  without padding, and the kernel applies the causal and sliding-window pattern itself
  (`window_size`). The SDPA path builds a boolean mask wherever the model has a sliding window
  (Mistral, Gemma 2 and 3), and a mask takes PyTorch's flash kernel off the table: the
  memory-efficient kernel runs instead, reading an s x s bias (trace/emulation.py `_sdpa`).
- q, k and v in 16 bits. `get_target_dtype` casts them when they arrive in fp32 (PEFT's fp32
  norms under QLoRA): to the autocast dtype, else the model's (its first Linear's weights, or a
  quantised model's config dtype). Called as the installed release has it; the trace emulates
  CUDA autocast rather than entering it, so there it answers with the model's dtype, and under AMP
  the SDPA call below is itself one autocast casts to 16 bits (it is on CUDA autocast's
  lower-precision list, and the emulation casts it so).
- the output laid out (batch, seq, heads, head_dim), as the package writes it.

Traced as one `scaled_dot_product_attention` call without a mask (causal where the module is and
more than one query is asked), which the emulation runs as FlashAttention-2 on a GPU that has it.
A sliding window shorter than the sequence skips the key blocks outside it; the trace counts full
causal attention there (an upper bound). The trace's batches have no padding, so the varlen
(unpadded) path the package takes for a padded batch is not needed.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

# no "flash" in it: transformers would look for the flash-attn package or a hub kernel by that
# name (utils/generic.py `is_flash_attention_requested`, modeling_utils)
NAME = "trainplan_fa2"


def flash_attention_2(module, query, key, value, attention_mask, dropout: float = 0.0,
                      scaling: float | None = None, sliding_window: int | None = None,
                      softcap: float | None = None, is_causal: bool | None = None, **kwargs):
    """An attention function of transformers' AttentionInterface: q, k, v (batch, heads, seq,
    head_dim) in, (batch, seq, heads, head_dim) out (module docstring)."""
    from transformers.integrations.flash_attention import get_target_dtype
    target = get_target_dtype(query, module)       # the release's own rule (module docstring)
    # the kernel takes fp16 and bf16 only; a quantised model built without transformers'
    # quantizer (no config._is_quantized) would name its packed weights' dtype here
    if target in (torch.float16, torch.bfloat16) and target != query.dtype:
        query, key, value = (t.to(target) for t in (query, key, value))
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    out = F.scaled_dot_product_attention(
        query, key, value, dropout_p=dropout, is_causal=bool(causal) and query.shape[2] > 1,
        scale=scaling, enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2).contiguous(), None


def no_mask(*args, **kwargs) -> None:
    """The mask transformers hands the flash path for a batch without padding: none."""
    return None


@functools.cache
def register() -> str:
    """Register `flash_attention_2` with transformers' attention and mask interfaces (once) and
    return the name a model is built with."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    AttentionInterface.register(NAME, flash_attention_2)
    AttentionMaskInterface.register(NAME, no_mask)
    return NAME
