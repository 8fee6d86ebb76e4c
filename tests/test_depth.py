"""A deep model traced cut to 3 and 4 blocks (predict/depth.py) gives the step of the full trace,
and an fp16 job read off its bf16 twin's trace (traces.half_twin) gives that of its own trace."""
from __future__ import annotations

import pytest

from trainplan.accelerators import get_accelerator
from trainplan.predict import evaluate
from trainplan.predict import traces as traces_mod
from trainplan.predict.traces import Traces
from trainplan.spec import Job, Lora
from trainplan.trace.depth import cut, repeated_stack

LLAMA = Job(model="hf:meta-llama/Llama-3.2-1B", seq_len=128, precision="bf16-amp")
CASES = {
    "llama": (LLAMA, "a100-80gb", 4),
    "llama-full-ckpt": (LLAMA.with_(grad_checkpointing="full"), "a100-80gb", 4),
    "llama-accum": (LLAMA.with_(grad_accum=4), "a100-80gb", 3),
    "llama-qlora": (LLAMA.with_(lora=Lora(), quantize="nf4", grad_checkpointing="full"), "t4", 4),
    "llama-8bit": (LLAMA.with_(optimizer="adamw-8bit", grad_checkpointing="selective"), "l4", 7),
    "gpt2-fp16": (Job(model="hf:openai-community/gpt2-medium", seq_len=128, precision="fp16-amp"),
                  "t4", 8),
}


@pytest.fixture(autouse=True)
def _cut_from_16(monkeypatch):
    """These checks cut 16- to 24-block models (whose full traces are cheap to compare with), as
    the planner does (trace/depth.py MIN_BLOCKS), whatever MIN_BLOCKS becomes."""
    import trainplan.trace.depth as trace_depth
    monkeypatch.setattr(trace_depth, "MIN_BLOCKS", 16)
    monkeypatch.setattr(traces_mod, "MIN_BLOCKS", 16)
    monkeypatch.setenv("TRAINPLAN_JOBS", "1")      # worker pools forked earlier cut from 40


def _pair(job, gpu, batch, **kw):
    accel = get_accelerator(gpu)
    job = job.with_(batch_size=batch)
    return (evaluate(job, accel, traces=Traces(**kw), strict=False),
            evaluate(job, accel, traces=Traces(cut=False), strict=False))


@pytest.mark.parametrize("name", list(CASES))
def test_cut_trace_gives_the_full_step(name):
    job, gpu, batch = CASES[name]
    cut_ev, full = _pair(job, gpu, batch)
    assert cut_ev.trace.stack is not None and cut_ev.trace.stack.traced == 4
    assert "alike blocks" in cut_ev.trace.notes[-1]
    # the step time and every byte count are the full trace's, to rounding
    assert cut_ev.time.step_time_s == pytest.approx(full.time.step_time_s, rel=1e-9)
    for field in ("params_total", "weight_bytes", "gradient_bytes", "optimizer_state_bytes",
                  "activation_bytes"):
        assert abs(getattr(cut_ev.trace, field) - getattr(full.trace, field)) <= 4096, field
    # each phase's peak is on its line, unless another point of the phase overtakes it deeper
    # in the model (depth.py): within 1%
    assert cut_ev.memory.peak_allocated_bytes == pytest.approx(full.memory.peak_allocated_bytes,
                                                               rel=0.01)
    # the allocator's waste: the replay of the whole stack's allocations is the full trace's
    # (`test_whole_stack_replay_is_the_full_traces`; BERT, whose allocations do not repeat block
    # by block, is traced whole: the test after it)
    assert cut_ev.trace.derived["whole_replay"]
    assert cut_ev.memory.required_bytes == pytest.approx(full.memory.required_bytes, rel=0.001)


REPLAYS = {
    "llama": LLAMA,
    "llama-qlora-full-ckpt": LLAMA.with_(lora=Lora(), quantize="nf4", grad_checkpointing="full"),
    "llama-selective-accum-8bit": LLAMA.with_(grad_checkpointing="selective", grad_accum=2,
                                              optimizer="adamw-8bit"),
    "gpt2-fp16": Job(model="hf:openai-community/gpt2-medium", seq_len=128, precision="fp16-amp"),
}


@pytest.mark.parametrize("name", list(REPLAYS))
def test_whole_stack_replay_is_the_full_traces(name):
    """The 4-block trace's allocations, tagged by block (trace/blocks.py) and repeated over the
    whole stack (depth.whole_events), replay through the caching allocator exactly as the full
    trace's: every allocation size in the same order, the same peaks allocated, reserved and
    pinned."""
    from trainplan.predict.allocator import replay
    from trainplan.predict.depth import HIGH, whole_events
    from trainplan.predict.target import semantics_for
    from trainplan.predict.traces import trace_job
    from trainplan.trace.tracer import trace_step
    job = trace_job(REPLAYS[name])
    sem = semantics_for(job, get_accelerator("a100-80gb"))
    hi, full = trace_step(job, sem, 2, depth=HIGH), trace_step(job, sem, 2)
    events = whole_events(hi, hi.stack.blocks)
    assert events is not None
    assert sorted(n for _s, n in events) == sorted(n for _s, n in full.alloc_events)
    allocs = [n for _s, n in events if n > 0]
    assert allocs == [n for _s, n in full.alloc_events if n > 0]
    assert replay(events) == replay(full.alloc_events)
    assert replay(events) != replay(hi.alloc_events)


def test_a_stack_whose_allocations_do_not_repeat_is_traced_whole_below_40_blocks():
    """BERT allocates between its layers (no block's hook runs), so its cut trace's events do
    not repeat block by block: a 24-block BERT is traced whole rather than take the 4-block
    replay's band (trace/depth.py EXACT_BLOCKS)."""
    job = Job(model="hf:google-bert/bert-large-uncased", seq_len=128, precision="fp32",
              batch_size=4)
    ev = evaluate(job, get_accelerator("v100-16gb"), traces=Traces(), strict=False)
    assert ev.trace.stack is None


def test_fp16_job_reads_its_bf16_twin(monkeypatch):
    job = LLAMA.with_(precision="fp16-amp", batch_size=4, lora=Lora())
    t4 = get_accelerator("t4")
    twin_traces = Traces()
    twin = evaluate(job, t4, traces=twin_traces, strict=False)
    assert {r.dtype for r in twin.trace.ops if r.family == "matmul"} == {"float16"}
    monkeypatch.setattr(traces_mod, "half_twin", lambda job, sem: None)
    own = evaluate(job, t4, traces=Traces(), strict=False)
    assert twin.time.step_time_s == pytest.approx(own.time.step_time_s, rel=1e-9)
    assert twin.memory.required_bytes == own.memory.required_bytes


def test_stack_needs_alike_blocks():
    import torch.nn as nn

    class Net(nn.Module):
        def __init__(self, widths):
            super().__init__()
            self.blocks = nn.ModuleList(nn.Linear(w, w) for w in widths)

    import trainplan.trace.depth as trace_depth
    n = trace_depth.MIN_BLOCKS
    alike = Net([16] * n)
    assert repeated_stack(alike)[0] == "blocks"
    stack = cut(alike, 3)
    assert (stack.blocks, stack.traced, len(alike.blocks)) == (n, 3, 3)
    assert cut(Net([16] * (n - 1) + [32]), 3) is None      # one block differs
    assert cut(Net([16] * (n - 1)), 3) is None             # too shallow to cut
