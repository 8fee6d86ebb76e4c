"""trace/derive/accumulate.py: the step with gradient accumulation read off the step without it
equals the step traced with accumulation, field for field (the timeline, sampled per op when
traced and per allocation when read off, and the trace's wall time aside)."""
from dataclasses import fields

import pytest
import torch

from trainplan.trace.derive.accumulate import accumulated, derivable
from trainplan.spec import validate
from trainplan.jobfile import job_from_dict
from trainplan.trace.semantics import KernelSemantics
from trainplan.trace.tracer import trace_step

BF16 = KernelSemantics(attention="efficient", autocast_dtype=torch.bfloat16)
FLASH = KernelSemantics(attention="flash", autocast_dtype=torch.bfloat16)
FP16 = KernelSemantics(attention="efficient", autocast_dtype=torch.float16)
FP32 = KernelSemantics(attention="efficient")
UNCOMPARED = {"trace_seconds", "log", "derived"}
# of the log (trace/log.py): the timeline is sampled differently; marks and gradients are what a
# step without accumulation keeps to be read off, and the read-off step no longer needs
LOG_COMPARED = ("memory", "events", "blocks")

CASES = {   # name: (job, semantics, micro-batch, blocks kept)
    # tied input and output embeddings: one gradient from two uses
    "gpt2-bf16": (dict(model="hf:openai-community/gpt2", seq_len=64, precision="bf16-amp"),
                  BF16, 2, None),
    "bert-fp32": (dict(model="hf:google-bert/bert-base-uncased", seq_len=64, precision="fp32"),
                  FP32, 2, None),
    # cut to 4 blocks (the events' block tags too), LoRA, full checkpointing, flash
    "llama-lora-ckpt": (dict(model="hf:meta-llama/Llama-3.2-1B", seq_len=128,
                             precision="bf16-amp", grad_checkpointing="full",
                             lora=dict(rank=8)), FLASH, 2, 4),
    "llama-qlora-8bit": (dict(model="hf:meta-llama/Llama-3.2-1B", seq_len=128,
                              precision="bf16-amp", grad_checkpointing="selective",
                              lora=dict(rank=8), quantize="nf4-dq", optimizer="adamw-8bit"),
                         BF16, 1, 3),
    "resnet-fp16": (dict(model="timm:resnet18", image_size=64, precision="fp16-amp"), FP16, 2,
                    None),
}


@pytest.mark.parametrize("name", CASES)
def test_read_off_equals_traced(name):
    spec, sem, batch, depth = CASES[name]
    job = validate(job_from_dict(dict(spec, batch_size=batch)))
    without = trace_step(job.with_(grad_accum=1), sem, batch, depth=depth)
    traced = trace_step(job.with_(grad_accum=2), sem, batch, depth=depth)
    read = accumulated(without)
    assert read is not None
    differ = [f.name for f in fields(traced) if f.name not in UNCOMPARED
              and getattr(read, f.name) != getattr(traced, f.name)]
    differ += [f"log.{k}" for k in LOG_COMPARED if getattr(read.log, k) != getattr(traced.log, k)]
    assert differ == []
    # the second micro-batch's backward runs with every gradient held
    assert read.phase_peaks["backward"][0] > without.phase_peaks["backward"][0]


def test_channels_last_is_traced_not_read_off():
    # the first micro-batch copies a convolution's gradient into the parameter's layout
    # (AccumulateGrad's clone_obey_contract), the second adds it without the copy
    sem = KernelSemantics(attention="efficient", autocast_dtype=torch.float16, channels_last=True)
    assert not derivable(sem)
    job = validate(job_from_dict(dict(model="timm:resnet18", image_size=64, precision="fp16-amp",
                                      batch_size=2)))
    assert accumulated(trace_step(job, sem, 2)) is None
