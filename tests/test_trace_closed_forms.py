"""The tracer against closed forms: Korthikanti et al.'s activation bytes, 6NT FLOPs."""
import math

import pytest
import torch

from conftest import SBH, tiny_job, trace
from trainplan.spec import Job, validate
from trainplan.trace.semantics import KernelSemantics
from trainplan.trace.tracer import trace_step


def _layer_bytes(tr, i=5):
    return next(m for m in tr.modules if m.name == f"bert.encoder.layer.{i}").activation_bytes


def test_korthikanti_eager_74_sbh(bert_large_traces):
    """Korthikanti et al. 2022 (arXiv 2205.05198) eq. 1, 16-bit, dropout, materialised attention:
    s*b*h*(34 + 5*a*s/h) = sbh*(34 + 5*16*512/1024) = 74 sbh per layer."""
    per_layer = _layer_bytes(bert_large_traces["eager"]) / SBH
    assert per_layer == pytest.approx(74, rel=0.03)


def test_korthikanti_flash_34_sbh(bert_large_traces):
    """With flash / memory-efficient attention the 5as/h term goes: 34 sbh per layer."""
    per_layer = _layer_bytes(bert_large_traces["flash"]) / SBH
    assert per_layer == pytest.approx(34, rel=0.03)


def _linear_weight_elems(job) -> int:
    """Sum of in*out over every linear the forward runs (a tied decoder counts once per use)."""
    from trainplan.models import build_model
    m = build_model(job).module
    return sum(mod.in_features * mod.out_features for mod in m.modules()
               if isinstance(mod, torch.nn.Linear))


def test_bert_large_flops_6nt_plus_attention(bert_large_traces):
    """Closed form (eager attention): 6 * N_linear * T for the linears (forward 2NT, backward 4NT)
    plus the attention matmuls QK^T and PV: forward 2 * 2*b*s^2*h per layer, x3 with backward.
    PyTorch's counter counts matmuls only; elementwise ops are not in the closed form either."""
    job = validate(Job(model="hf:google-bert/bert-large-uncased", batch_size=8, seq_len=512))
    b, s, h, L = 8, 512, 1024, 24
    T = b * s
    closed = 6 * _linear_weight_elems(job) * T + 3 * (2 * 2 * b * s * s * h) * L
    assert bert_large_traces["eager"].flops_per_step == pytest.approx(closed, rel=0.02)


def test_llama2_7b_flops_6nt_plus_causal_flash_attention():
    """Llama-2-7B, b1 s2048, flash attention: 6 * N_linear * T plus attention counted as the
    causal kernel computes it: forward 4*b*s^2*h*L x n(n+1)/(2n^2) blocks (n = s/128), backward
    2.5x forward (PyTorch's sdpa_backward_flop_count: recompute QK^T plus four matmuls)."""
    job = validate(Job(model="hf:meta-llama/Llama-2-7b-hf", batch_size=1, seq_len=2048,
                       precision="bf16-amp"))
    tr = trace_step(job, KernelSemantics(attention="flash", autocast_dtype=torch.bfloat16))
    b, s, h, L = 1, 2048, 4096, 32
    n = s // 128
    causal = n * (n + 1) / 2 / n**2
    attn = 4 * b * s * s * h * L * causal * (1 + 2.5)
    closed = 6 * _linear_weight_elems(job) * b * s + attn
    assert tr.flops_per_step == pytest.approx(closed, rel=0.02)
    # and the 6NT rule of thumb with N = all parameters is within 10% for this model
    assert tr.flops_per_step == pytest.approx(6 * tr.params_total * b * s, rel=0.10)


def test_checkpointing_recompute_is_counted():
    base = trace(tiny_job())
    full = trace(tiny_job(grad_checkpointing="full"))
    assert full.recompute_flops > 0
    assert full.flops_per_step == pytest.approx(base.flops_per_step + full.recompute_flops, rel=1e-6)
    assert full.model_flops == pytest.approx(base.model_flops, rel=1e-6)


def test_autocast_emulation_follows_cuda_policy():
    """Under CUDA autocast layer_norm/softmax run in fp32 and linears in fp16; weights are cast
    once per forward and cached (the weight-cast cache)."""
    job = tiny_job(precision="fp16-amp", kind="encoder")
    tr = trace(job, attention="eager", autocast=torch.float16)
    dtypes = {(r.name, r.dtype) for r in tr.ops if r.phase == "forward"}
    assert ("native_layer_norm", "float32") in dtypes
    assert any(n == "addmm" and d == "float16" for n, d in dtypes)
    assert tr.weight_cast_bytes > 0


def test_dropout_mask_is_one_byte():
    """CUDA's fused dropout keeps a bool mask: the traced native_dropout outputs (x, mask)."""
    job = tiny_job(kind="encoder", precision="fp16")
    tr = trace(job)
    assert any(r.name == "native_dropout" for r in tr.ops)


def test_a_trace_collects_only_what_the_last_one_left_and_all_every_so_often(monkeypatch):
    """tracer._collect_and_freeze: what a trace freezes stays frozen, so the next trace's
    collection scans only the objects made since; every FULL_COLLECTION_EVERY traces all are
    unfrozen and collected, so garbage frozen while it was live is reclaimed. (The collector
    itself is stubbed: this checks the policy.)"""
    from trainplan.trace import tracer
    calls, frozen = [], [0]

    class Gc:
        @staticmethod
        def collect():
            calls.append("full" if not frozen[0] else "young")

        @staticmethod
        def freeze():
            frozen[0] += 1

        @staticmethod
        def unfreeze():
            frozen[0] = 0
            calls.append("unfreeze")

        @staticmethod
        def get_freeze_count():
            return frozen[0]
    monkeypatch.setattr(tracer, "gc", Gc)
    monkeypatch.setattr(tracer, "_traced", 0)
    n = tracer.FULL_COLLECTION_EVERY
    for _ in range(2 * n + 1):
        tracer._collect_and_freeze()
        assert frozen[0]
    # the first trace of a process has nothing to free; then young collections, and a full
    # one after every n traces
    assert calls == (["young"] * (n - 1) + ["unfreeze", "full"]) * 2


def _rotate(q, k, cos, sin, unsqueeze_dim=1):
    """Llama's apply_rotary_pos_emb as transformers writes it, a plain function."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)

    def half(x):
        return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)
    return q * cos + half(q) * sin, k * cos + half(k) * sin


class Func(torch.nn.Module):
    """A function made a module that no model holds, as `kernels` (a dependency of transformers
    5.25) makes apply_rotary_pos_emb one (kernels/_internals/layer/layer.py)."""

    def forward(self, *args, **kwargs):
        return _rotate(*args, **kwargs)


def test_a_module_the_model_does_not_hold_is_its_callers_work(monkeypatch):
    """tracer.py `_Tracker`: a module outside the model, called inside its forward, is not
    entered: each attention's rotated queries and keys, and their FLOPs, stay the attention's,
    as with the plain function (with it entered, they were a `Func` row's, outside the model's
    rows: the model's total and each block's attention told apart from the rest)."""
    from conftest import shallow
    from trainplan.models.hf_import import prepare
    prepare()       # as the tracer imports transformers (torchvision hidden)
    import transformers.models.llama.modeling_llama as llama
    # pure bf16: the attention keeps the rotated queries themselves (under autocast it keeps
    # their bf16 casts, made in the attention either way)
    job = validate(Job(model=shallow("meta-llama/Llama-3.2-1B", 2), seq_len=64, batch_size=1,
                       precision="bf16"))
    sem = KernelSemantics(attention="efficient")
    monkeypatch.setattr(llama, "apply_rotary_pos_emb", _rotate)
    plain = trace_step(job, sem)
    monkeypatch.setattr(llama, "apply_rotary_pos_emb", Func())
    wrapped = trace_step(job, sem)

    def rows(tr):
        return [(m.name, m.activation_bytes, m.flops_forward, m.flops_backward)
                for m in tr.modules]
    assert rows(wrapped) == rows(plain)
    # the rotated queries (bf16, one token's hidden size each) are the attention's own
    attn = {m.name: m for m in plain.modules}["model.layers.0.self_attn"]
    children = sum(m.activation_bytes for m in plain.modules
                   if m.name.startswith("model.layers.0.self_attn."))
    assert attn.activation_bytes - children >= 64 * 2048 * 2
