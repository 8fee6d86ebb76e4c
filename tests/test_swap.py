"""trace/derive/swap.py: a step with one optimizer read off the same step traced with another
equals the step traced with it, field for field (the timeline, sampled per op when traced and per
allocation when read off, and the trace's wall time aside); and the trace cache reads such steps
off instead of tracing them (cache.py `_swapped`)."""
from dataclasses import fields

import pytest
import torch

from trainplan.jobfile import job_from_dict
from trainplan.optimizer import parse
from trainplan.spec import validate
from trainplan.trace.derive.swap import swapped
from trainplan.trace.semantics import KernelSemantics
from trainplan.trace.tracer import trace_optimizer, trace_step

BF16 = KernelSemantics(attention="efficient", autocast_dtype=torch.bfloat16)
FLASH = KernelSemantics(attention="flash", autocast_dtype=torch.bfloat16)
FP16 = KernelSemantics(attention="efficient", autocast_dtype=torch.float16)
FP32 = KernelSemantics(attention="efficient")
LOOP = KernelSemantics(attention="efficient", optimizer_foreach=False)
BF16_LOOP = KernelSemantics(attention="efficient", autocast_dtype=torch.bfloat16,
                            optimizer_foreach=False)
UNCOMPARED = {"trace_seconds", "log", "derived"}
LOG_COMPARED = ("memory", "events", "blocks", "marks", "gradients")

LLAMA = "hf:meta-llama/Llama-3.2-1B"
CASES = {   # name: (job, semantics, micro-batch, blocks kept, traced with, read off for[,
            #        the semantics read off for, where not the traced step's])
    # the fix ladder's rung: LoRA on a cut stack (the events' block tags too), flash
    "llama-lora-8bit": (dict(model=LLAMA, seq_len=64, precision="bf16-amp", lora=dict(rank=8)),
                        FLASH, 1, 3, "adamw", "adamw-8bit"),
    # every parameter trained, checkpointed, the other way round: 8-bit states for the big
    # ones and fp32 for the norms in the step traced, torch's multi-tensor AdamW read off
    "llama-full-off-8bit": (dict(model=LLAMA, seq_len=64, precision="bf16-amp",
                                 grad_checkpointing="full"), BF16, 1, 2, "adamw-8bit", "adamw"),
    "llama-qlora-paged": (dict(model=LLAMA, seq_len=64, precision="bf16-amp", lora=dict(rank=8),
                               quantize="nf4-dq"), BF16, 1, 3, "adamw", "paged-adamw"),
    # tied embeddings: one parameter, one gradient, from two uses
    "gpt2-8bit": (dict(model="hf:openai-community/gpt2", seq_len=64, precision="bf16-amp"),
                  BF16, 2, None, "adamw", "adamw-8bit"),
    # an encoder in fp32, Adafactor's factored states and per-parameter temporaries
    "bert-adafactor": (dict(model="hf:google-bert/bert-base-uncased", seq_len=32,
                            precision="fp32"), FP32, 1, None, "adamw", "adafactor"),
    # a convnet, SGD to AdamW, and the per-parameter loop of a device without foreach kernels
    "resnet-sgd-adamw": (dict(model="timm:resnet18", image_size=32, precision="fp16-amp"),
                         FP16, 2, None, "sgd", "adamw"),
    "resnet-loop-lion": (dict(model="timm:resnet18", image_size=64, precision="fp32"),
                         LOOP, 2, None, "adamw", "lion"),
    # the same optimizer, torch.optim's per-parameter loop (MPS) read off its multi-tensor step
    "llama-adamw-loop": (dict(model=LLAMA, seq_len=64, precision="bf16-amp",
                              grad_checkpointing="selective"), BF16, 2, 2, "adamw", "adamw",
                         BF16_LOOP),
}


def _job(spec: dict, batch: int, optimizer: str):
    return validate(job_from_dict(dict(spec, batch_size=batch, optimizer=optimizer)))


def _differ(read, traced) -> list[str]:
    out = [f.name for f in fields(traced) if f.name not in UNCOMPARED
           and getattr(read, f.name) != getattr(traced, f.name)]
    return out + [f"log.{k}" for k in LOG_COMPARED
                  if getattr(read.log, k) != getattr(traced.log, k)]


@pytest.mark.parametrize("name", CASES)
def test_read_off_equals_traced(name):
    spec, sem, batch, depth, before, after, *other = CASES[name]
    base = trace_step(_job(spec, batch, before), sem, batch, depth=depth)
    job, sem = _job(spec, batch, after), (other[0] if other else sem)
    traced = trace_step(job, sem, batch, depth=depth)
    read = swapped(base, trace_optimizer(job, sem, depth=depth), sem)
    assert read is not None
    assert _differ(read, traced) == []
    assert read.ops[-1] != base.ops[-1]            # another update


def test_an_update_of_another_model_is_not_read():
    # the same optimizer's update, made for a model with LoRA of another rank: the parameters'
    # setup differs, so nothing is read off (the step is traced)
    spec, sem, batch, depth = dict(model=LLAMA, seq_len=64, precision="bf16-amp",
                                   lora=dict(rank=8)), BF16, 1, 2
    base = trace_step(_job(spec, batch, "adamw"), sem, batch, depth=depth)
    other = _job(dict(spec, lora=dict(rank=4)), batch, "adamw-8bit")
    assert swapped(base, trace_optimizer(other, sem, depth=depth)) is None


def test_the_cache_reads_the_rung_off(monkeypatch, tmp_path):
    # a plan's ladder asks for the 8-bit step after the AdamW one: read off, not traced, and
    # the same as traced; the 8-bit step at another micro-batch with checkpointing shares the
    # one update made; an MPS platform's per-parameter AdamW is read off too
    monkeypatch.setenv("TRAINPLAN_TRACE_CACHE", str(tmp_path))
    monkeypatch.setenv("TRAINPLAN_JOBS", "1")
    from trainplan.trace.derive import Traces
    spec = dict(model="hf:openai-community/gpt2", seq_len=32, precision="bf16-amp")
    traces = Traces()
    adamw, eight = _job(spec, 2, "adamw"), _job(spec, 2, "adamw-8bit")
    ckpt = eight.with_(grad_checkpointing="full")
    traces._real(adamw, BF16, 2)
    traces._real(adamw.with_(grad_checkpointing="full"), BF16, 1)
    made = traces.traced
    read, read_ckpt = traces._real(eight, BF16, 2), traces._real(ckpt, BF16, 1)
    loop = traces._real(adamw, BF16_LOOP, 2)
    assert traces.traced == made            # none traced
    assert len(traces._parts) == 2          # one 8-bit update for both, one loop
    assert _differ(read, trace_step(eight, BF16, 2)) == []
    assert _differ(read_ckpt, trace_step(ckpt, BF16, 1)) == []
    assert _differ(loop, trace_step(adamw, BF16_LOOP, 2)) == []
