"""`--attention flash` on an `hf:` model is transformers' flash_attention_2 (models/hf_flash.py):
the flash-attn kernel with no mask, where transformers' SDPA path masks a sliding window and so
runs PyTorch's memory-efficient kernel on an s x s bias."""
import types

import pytest
import torch
import torch.nn.functional as F

from trainplan.models import hf_flash
from trainplan.spec import Job, validate
from trainplan.trace import emulation
from trainplan.trace.semantics import KernelSemantics
from trainplan.trace.tracer import trace_step

from conftest import shallow

FLASH = KernelSemantics(attention="flash", autocast_dtype=torch.bfloat16)
# Mistral's blocks with a window shorter than the sequence below
WINDOWED = shallow("mistralai/Mistral-7B-v0.1", 2, sliding_window=64)


def _calls(monkeypatch, job):
    """(the trace, each SDPA call's (mask shape, is_causal, enable_gqa)) under flash semantics."""
    calls = []
    real = emulation.TargetSemantics._sdpa

    def sdpa(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
             enable_gqa=False):
        calls.append((None if attn_mask is None else tuple(attn_mask.shape), is_causal,
                      enable_gqa))
        return real(self, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    monkeypatch.setattr(emulation.TargetSemantics, "_sdpa", sdpa)
    return trace_step(job, FLASH, 1), calls


def _job(attention: str):
    return validate(Job(model=WINDOWED, batch_size=1, seq_len=128, precision="bf16-amp",
                        attention=attention))


def test_the_sdpa_path_masks_a_sliding_window_and_runs_the_efficient_kernel(monkeypatch):
    tr, calls = _calls(monkeypatch, _job("sdpa"))
    assert len(calls) == 2 and all(mask is not None for mask, _c, _g in calls)
    names = {r.name for r in tr.ops}
    assert "_scaled_dot_product_efficient_attention" in names
    assert not any("flash_attention" in n for n in names)


def test_flash_attention_2_runs_the_flash_kernel_causal_with_no_mask(monkeypatch):
    tr, calls = _calls(monkeypatch, _job("flash"))
    # Mistral's 8 K/V heads go to the kernel as they are (grouped-query)
    assert calls == [(None, True, True)] * 2
    names = {r.name for r in tr.ops}
    assert {"_scaled_dot_product_flash_attention",
            "_scaled_dot_product_flash_attention_backward"} <= names
    assert not any("efficient_attention" in n for n in names)
    assert tr.flash_eligible == 2


class _Attention(torch.nn.Module):
    is_causal = True

    def __init__(self, dtype):
        super().__init__()
        self.config = types.SimpleNamespace()         # an unquantised model's config
        self.q_proj = torch.nn.Linear(8, 8, dtype=dtype)


@pytest.mark.parametrize("weights,seen", [(torch.bfloat16, torch.bfloat16),
                                          (torch.float32, torch.float32)])
def test_fp32_q_k_v_go_to_the_kernel_in_the_models_16_bit_dtype(monkeypatch, weights, seen):
    """transformers' get_target_dtype outside autocast: fp32 q/k/v (PEFT's fp32 norms) are cast
    to the model's 16-bit dtype; an fp32 model's stay fp32 (autocast, where on, casts the call)."""
    got = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        got.append((q.dtype, k.dtype, v.dtype, kw["is_causal"]))
        return real(q, k, v, **kw)
    monkeypatch.setattr(hf_flash.F, "scaled_dot_product_attention", spy)
    q = torch.randn(2, 4, 5, 8)          # (batch, heads, seq, head_dim)
    kv = torch.randn(2, 2, 5, 8)         # two K/V heads: grouped-query
    out, weights_out = hf_flash.flash_attention_2(_Attention(weights), q, kv, kv, None)
    assert got == [(seen, seen, seen, True)] and weights_out is None
    assert out.shape == (2, 5, 4, 8) and out.is_contiguous()     # (batch, seq, heads, head_dim)


def test_one_query_attends_to_every_cached_key():
    """Decoding (one query against a cache): not causal, as transformers' SDPA path has it."""
    q, kv = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 6, 8)
    out, _ = hf_flash.flash_attention_2(_Attention(torch.float32), q, kv, kv, None)
    ref = F.scaled_dot_product_attention(q, kv, kv).transpose(1, 2)
    assert torch.allclose(out, ref)


def test_an_architecture_transformers_refuses_flash_for_keeps_sdpa_and_says_so():
    """T5's relative position bias: transformers has no flash_attention_2 path for it
    (`_supports_flash_attn` False), so the SDPA path, its bias and all, is what runs."""
    from trainplan.models.hf import build_hf
    job = validate(Job(model="hf:google-t5/t5-small", batch_size=1, seq_len=64,
                       precision="bf16-amp", attention="flash"))
    bundle = build_hf(job, "flash")
    assert bundle.module.config._attn_implementation == "sdpa"
    assert any("no flash_attention_2 path" in n for n in bundle.notes)
    llama = build_hf(validate(Job(model=shallow("meta-llama/Llama-3.2-1B", 1), batch_size=1,
                                  seq_len=64, precision="bf16-amp", attention="flash")), "flash")
    assert llama.module.config._attn_implementation == hf_flash.NAME
