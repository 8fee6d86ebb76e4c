"""FakeTensorMode's dispatch cache keyed in one pass (trace/fake_cache.py): on every dispatch of
real traces, the key it makes is torch's own, value for value and type for type, and so are the
bypasses; the traces are the same with it and without; it is installed only over the code it
reproduces."""
from __future__ import annotations

import pytest
import torch
from conftest import shallow, tiny_job
from torch._subclasses import fake_tensor as ft

from trainplan.accelerators import get_accelerator
from trainplan.predict.target import semantics_for
from trainplan.spec import Job, Lora, validate
from trainplan.trace import fake_cache
from trainplan.trace.generate import trace_forward
from trainplan.trace.semantics import KernelSemantics
from trainplan.trace.tracer import trace_step


@pytest.fixture
def both(monkeypatch):
    """Each key made both ways, on copies; the traced step keyed by torch's own. Counts the
    calls and those with a fake tensor, keeps every difference."""
    seen = {"calls": 0, "fakes": 0, "differ": []}

    def keyed(make, self, result, args, state):
        out = list(result)
        try:
            make(self, out, args, state, [])
        except ft._BypassDispatchCache as e:
            return str(e), out
        return None, out

    def checked(self, result, args, state, id_hashed_objects):
        theirs = keyed(fake_cache._ORIGINAL, self, result, args, state)
        ours = keyed(fake_cache._prep_args, self, result, args, state)
        seen["calls"] += 1
        seen["fakes"] += torch.Size in theirs[1]
        if theirs[0] != ours[0] or theirs[1] != ours[1] or \
                list(map(type, theirs[1])) != list(map(type, ours[1])):
            seen["differ"].append((theirs[0], ours[0], theirs[1][len(result):][:30],
                                   ours[1][len(result):][:30]))
        return fake_cache._ORIGINAL(self, result, args, state, id_hashed_objects)

    fake_cache.install()           # first: a trace installs it once per process
    monkeypatch.setattr(ft.FakeTensorMode, "_prep_args_for_hash", checked)
    return seen


def _vl():
    """Qwen2.5-VL with a 4-block vision tower (windows in three, full attention in the last),
    LoRA on both stacks, fp16 on a T4's kernels: batched windows (trace/windows.py), split
    sizes as lists, checkpointing's rerun. Traced with its text stack cut (`DEPTH`)."""
    job = validate(Job(model=shallow("Qwen/Qwen2.5-VL-3B-Instruct", None, vision=(4, [3])),
                       seq_len=128, image_size=112, images_per_sample=1, batch_size=1,
                       precision="fp16", grad_checkpointing="full",
                       lora=Lora(rank=8, alpha=16, targets="q_proj,v_proj,gate_proj")))
    return job, semantics_for(job, get_accelerator("t4"))


DEPTH = {"qwen-vl-lora": 2}     # text blocks kept (trace/stack.py `cut`)
CASES = {
    "decoder-amp-ckpt": lambda: (tiny_job(precision="bf16-amp", grad_checkpointing="full"),
                                 KernelSemantics(attention="efficient",
                                                 autocast_dtype="bfloat16")),
    "convnet-channels-last": lambda: (
        validate(Job(model="torchvision:resnet18", image_size=64, batch_size=2,
                     precision="fp16-amp", channels_last=True)),
        KernelSemantics(autocast_dtype="float16")),
    "qwen-vl-lora": _vl,
}


@pytest.mark.parametrize("case", CASES)
def test_every_key_is_torchs_own(both, case):
    job, sem = CASES[case]()
    trace_step(job, sem, 2, depth=DEPTH.get(case))
    assert both["differ"] == []
    assert both["calls"] > 200 and both["fakes"] > 100


def test_an_inference_forwards_keys_are_torchs_own(both):
    job = tiny_job(precision="bf16")
    trace_forward(job, semantics_for(job, get_accelerator("h100-sxm")), 3, 1, 20)
    assert both["differ"] == [] and both["calls"] > 50


def test_the_same_trace_with_either_key(monkeypatch):
    job, sem = CASES["qwen-vl-lora"]()
    fake_cache.install()
    fast = trace_step(job, sem, 1, depth=DEPTH["qwen-vl-lora"])
    monkeypatch.setattr(ft.FakeTensorMode, "_prep_args_for_hash", fake_cache._ORIGINAL)
    slow = trace_step(job, sem, 1, depth=DEPTH["qwen-vl-lora"])
    assert fast.ops == slow.ops
    assert fast.log.events == slow.log.events and fast.log.memory == slow.log.memory
    assert fast.phase_peaks == slow.phase_peaks
    assert fast.modules == slow.modules


def test_installed_only_over_the_code_it_reproduces(monkeypatch):
    monkeypatch.setattr(ft.FakeTensorMode, "_prep_args_for_hash", fake_cache._ORIGINAL)
    monkeypatch.setattr(fake_cache, "_installed", [])
    monkeypatch.setattr(fake_cache, "_SOURCE", "0" * 16)      # another torch's code
    assert fake_cache.install() is False
    assert ft.FakeTensorMode._prep_args_for_hash is fake_cache._ORIGINAL
    monkeypatch.setattr(fake_cache, "_installed", [])
    monkeypatch.setattr(fake_cache, "_SOURCE", fake_cache._digest())
    assert fake_cache.install() is True
    assert ft.FakeTensorMode._prep_args_for_hash is fake_cache._prep_args


@pytest.mark.skipif(not torch.__version__.startswith("2.13.0"),
                    reason="the digest is of torch 2.13.0's code (constraints.txt)")
def test_installed_under_the_pinned_torch():
    assert fake_cache._digest() == fake_cache._SOURCE
