"""transformers' value checks on fake tensors answered as the GPU answers them (trace/hf_values.py).

With gradient checkpointing the KV cache is off, and transformers checks the position ids for
packed sequences; on a GPU it reads them, finds one sequence per row and runs SDPA causal, with
no mask (flash applies); on fake tensors it kept a (batch, 1, s, s) mask and no call could take
flash."""
import contextlib

import pytest
import torch

from trainplan.spec import Job, validate
from trainplan.trace import emulation, hf_values
from trainplan.trace.semantics import KernelSemantics
from trainplan.trace.tracer import trace_step

from conftest import shallow

FLASH = KernelSemantics(attention="flash", autocast_dtype=torch.bfloat16)


def _sdpa_calls(monkeypatch, job):
    """(the trace, each SDPA call's (mask, is_causal)) of `job`'s step under flash semantics."""
    calls = []
    real = emulation.TargetSemantics._sdpa

    def sdpa(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kw):
        calls.append((None if attn_mask is None else tuple(attn_mask.shape), is_causal))
        return real(self, q, k, v, attn_mask, dropout_p, is_causal, **kw)
    monkeypatch.setattr(emulation.TargetSemantics, "_sdpa", sdpa)
    return trace_step(job, FLASH, 2), calls


@pytest.mark.parametrize("model,ckpt", [("meta-llama/Llama-3.2-1B", "full"),
                                        ("meta-llama/Llama-3.2-1B", "selective"),
                                        ("openai-community/gpt2", "full")])
def test_a_checkpointed_decoder_runs_causal_flash_as_on_the_gpu(monkeypatch, model, ckpt):
    job = validate(Job(model=shallow(model, 2), batch_size=2, seq_len=128,
                       precision="bf16-amp", grad_checkpointing=ckpt))
    tr, calls = _sdpa_calls(monkeypatch, job)
    # each block's attention in the forward and again in backward's rerun
    assert calls == [(None, True)] * 4
    assert tr.flash_eligible == 4
    names = {r.name for r in tr.ops}
    assert "_scaled_dot_product_flash_attention_backward" in names
    assert not any("efficient_attention" in n for n in names)
    # the GPU's check itself is traced: the positions' cumsum and the `all` it reads
    assert {"cumsum", "all"} <= names


def test_without_the_gpus_answer_the_fake_step_kept_the_packed_sequence_mask(monkeypatch):
    """What the module answers: transformers on fake tensors alone passes every call a mask."""
    monkeypatch.setattr(hf_values, "as_on_gpu", contextlib.nullcontext)
    job = validate(Job(model=shallow("meta-llama/Llama-3.2-1B", 2), batch_size=2, seq_len=128,
                       precision="bf16-amp", grad_checkpointing="full"))
    tr, calls = _sdpa_calls(monkeypatch, job)
    assert calls == [((2, 1, 128, 128), False)] * 4 and tr.flash_eligible == 0
    assert "all" not in {r.name for r in tr.ops}    # the check the GPU makes was not traced


def test_the_check_is_transformers_own_again_after_a_trace():
    import transformers.masking_utils as masking
    own = masking.find_packed_sequence_indices
    with hf_values.as_on_gpu():
        assert masking.find_packed_sequence_indices is not own
    assert masking.find_packed_sequence_indices is own
