"""A deep model traced cut to 4 blocks (trace/derive/stitch.py: one block more read off its last one,
or a second trace cut to 3) gives the step of the full trace, and an fp16 job read off its bf16
twin's trace (twins.half_twin) gives that of its own trace."""
from __future__ import annotations

import pytest

from trainplan.accelerators import get_accelerator
from trainplan.predict import evaluate
from trainplan.trace.derive import Traces
from trainplan.trace.derive import traces as traces_mod
from trainplan.spec import Job, Lora
from trainplan.trace.stack import cut, repeated_stack

from conftest import shallow

# The models' own blocks and heads, BLOCKS of each (conftest.py `shallow`): the cut keeps 4,
# the step reads the other BLOCKS - 4 off them as it reads 12 or 76 (stitch.py takes the block
# count from the model), and the full traces compared with are a third to a half of the 16- and
# 24-block models' cost
BLOCKS = 8
LLAMA = Job(model=shallow("meta-llama/Llama-3.2-1B", BLOCKS), seq_len=128, precision="bf16-amp")
GPT2 = Job(model=shallow("openai-community/gpt2-medium", BLOCKS), seq_len=128,
           precision="fp16-amp")
ROBERTA, OPT, DEBERTA = (shallow(m, BLOCKS) for m in ("FacebookAI/roberta-large",
                                                      "facebook/opt-350m",
                                                      "microsoft/deberta-v3-large"))
TORCHAO_QLORA = LLAMA.with_(lora=Lora(), quantize="torchao-nf4", precision="bf16")
# Gemma-2's layers alternate sliding-window and full attention (its config's `layer_types`): cut
# in blocks of two layers (trace/stack.py `layer_period`), 16 layers are 8 such blocks
GEMMA2 = Job(model=shallow("google/gemma-2-2b", 2 * BLOCKS), seq_len=128, precision="bf16-amp")
# BERT's layers free each block's last gradient once the block below has begun its backward
# (repeat.py `_gradients_freed_late`)
BERT = Job(model=shallow("google-bert/bert-large-uncased", BLOCKS), seq_len=128, precision="fp32")
CASES = {
    "llama": (LLAMA, "a100-80gb", 4),
    "llama-full-ckpt": (LLAMA.with_(grad_checkpointing="full"), "a100-80gb", 4),
    "llama-accum": (LLAMA.with_(grad_accum=4), "a100-80gb", 3),
    "llama-qlora": (LLAMA.with_(lora=Lora(), quantize="nf4", grad_checkpointing="full"), "t4", 4),
    "llama-8bit": (LLAMA.with_(optimizer="adamw-8bit", grad_checkpointing="selective"), "l4", 7),
    "gpt2-fp16": (GPT2, "t4", 8),
    # the optimizer's per-parameter loop (MPS: no foreach kernels), a temporary of each block's
    # last parameter freed in the next block's update (repeat.py `_merge_lagging_frees`)
    "llama-mps": (LLAMA.with_(grad_checkpointing="selective"), "m3-max-128gb", 2),
    # memory-efficient attention at 1024 tokens: the backward peaks at another place with 5
    # blocks than with 4 (stitch.py `_peaks_replayed`)
    "llama-efficient-s1024": (LLAMA.with_(seq_len=1024), "v100-sxm2-32gb", 1),
    # torchtune's QLoRA (torchao NF4 base, no checkpointing): each block's output freed once
    # the next block has run, between the two (repeat.py `_outputs_freed_late`)
    "llama-qlora-torchao": (TORCHAO_QLORA, "h100-sxm", 2),
    "bert": (BERT, "v100-16gb", 4),
    "bert-lora-full-ckpt": (BERT.with_(lora=Lora(), grad_checkpointing="full"), "t4", 4),
    "gemma2": (GEMMA2, "a100-80gb", 2),
    "gemma2-lora-full-ckpt": (GEMMA2.with_(lora=Lora(), grad_checkpointing="full"), "l4", 2),
    # every 2nd layer checkpointed (torchtitan's selective layer mode): cut in blocks of two
    # layers like Gemma-2's, 16 layers are 8 such blocks
    "llama-every-2": (Job(model=shallow("meta-llama/Llama-3.2-1B", 2 * BLOCKS), seq_len=128,
                          precision="bf16-amp", grad_checkpointing="every-2"), "a100-80gb", 2),
}


@pytest.fixture(autouse=True)
def _cut_from_blocks(monkeypatch):
    """These checks cut BLOCKS-block models (whose full traces are cheap to compare with), as
    the planner does (trace/stack.py MIN_BLOCKS), whatever MIN_BLOCKS becomes."""
    import trainplan.trace.stack as trace_depth
    monkeypatch.setattr(trace_depth, "MIN_BLOCKS", BLOCKS)
    monkeypatch.setattr(traces_mod, "MIN_BLOCKS", BLOCKS)
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
    # each phase's peak by category: the whole stack's memory log replayed (stitch.py
    # `_peaks_replayed`), the full trace's
    assert cut_ev.trace.phase_peaks == full.trace.phase_peaks
    assert cut_ev.memory.peak_allocated_bytes == full.memory.peak_allocated_bytes
    # the allocator's waste: the replay of the whole stack's allocations is the full trace's
    # (`test_whole_stack_replay_is_the_full_traces`; a stack whose allocations do not repeat
    # block by block is traced whole: the test after it)
    assert cut_ev.trace.derived.repeats
    # the module table (`inspect`): every row's parameters and activations
    assert [(m.name, m.params, m.trainable_params, m.activation_bytes)
            for m in cut_ev.trace.modules] == \
        [(m.name, m.params, m.trainable_params, m.activation_bytes) for m in full.trace.modules]
    # and every row's FLOPs: each block's backward is its own (tracer.py `_Tracker`), so the
    # copies of the last traced block are the full trace's blocks
    _same_flops(cut_ev.trace, full.trace)
    _same_table(cut_ev.trace)
    assert cut_ev.memory.required_bytes == pytest.approx(full.memory.required_bytes, rel=0.001)
    # the largest trainable tensor (ZeRO's and offload's buffers), read off the cut trace's
    # module table (predict/sharding.py), is the full trace's
    from trainplan.predict.sharding import largest_trainable_tensor_bytes
    assert largest_trainable_tensor_bytes(cut_ev.trace) == \
        largest_trainable_tensor_bytes(full.trace)


REPLAYS = {
    "llama": LLAMA,
    "llama-qlora-full-ckpt": LLAMA.with_(lora=Lora(), quantize="nf4", grad_checkpointing="full"),
    "llama-selective-accum-8bit": LLAMA.with_(grad_checkpointing="selective", grad_accum=2,
                                              optimizer="adamw-8bit"),
    "gpt2-fp16": GPT2,
    "llama-lora-mps": LLAMA.with_(lora=Lora()),
    "llama-qlora-torchao": TORCHAO_QLORA,
    # BERT (plain: test_cut_trace_gives_the_full_step) with LoRA, which also frees outputs
    # late, on MPS, which also lags in its optimizer loop: the three regroupings together
    "bert-lora-mps": BERT.with_(lora=Lora()),
    # the other stacks the regroupings made repeat (docs/speed.md)
    "roberta": Job(model=ROBERTA, seq_len=128, precision="fp32"),
    "opt-lora-mps": Job(model=OPT, seq_len=128, precision="fp32", lora=Lora()),
    "roberta-torchao": Job(model=ROBERTA, seq_len=128, precision="bf16", lora=Lora(),
                           quantize="torchao-nf4"),
    # DeBERTa's head drops a tuple of every block's output, blocks P .. 0 and then the last
    # (repeat.py DOWN_THEN_LAST), and block 0's backward frees each block's share of the shared
    # relative embeddings' gradient (`_freed_by_all`, in an earlier block's run)
    "deberta-lora": Job(model=DEBERTA, seq_len=128, precision="fp32", lora=Lora()),
    "gemma2-selective": GEMMA2.with_(grad_checkpointing="selective"),
}
ON = {"llama-lora-mps": "m3-max-128gb", "bert-lora-mps": "m3-max-128gb",   # else a100-80gb
      "opt-lora-mps": "m3-max-128gb"}


@pytest.mark.parametrize("name", list(REPLAYS))
def test_whole_stack_replay_is_the_full_traces(name):
    """The 4-block trace's allocations, tagged by block (trace/blocks.py) and repeated over the
    whole stack (depth.whole_events), replay through the caching allocator exactly as the full
    trace's: every allocation size in the same order, the same peaks allocated, reserved and
    pinned."""
    from trainplan.trace.derive.allocator import replay
    from trainplan.trace.derive.repeat import whole_events
    from trainplan.trace.stack import HIGH
    from trainplan.predict.target import semantics_for
    from trainplan.trace.derive import trace_job
    from trainplan.trace.tracer import trace_step
    job = trace_job(REPLAYS[name])
    sem = semantics_for(job, get_accelerator(ON.get(name, "a100-80gb")))
    hi, full = trace_step(job, sem, 2, depth=HIGH), trace_step(job, sem, 2)
    events = whole_events(hi, hi.stack.blocks)
    assert events is not None
    # each phase's peak by category: the whole stack's log replayed, and the same read off the
    # cut log (peaks.py), are the full trace's
    from trainplan.trace.derive.peaks import whole_peaks
    from trainplan.trace.derive.repeat import whole_log
    from trainplan.trace.log import replay_log
    assert replay_log(whole_log(hi, hi.stack.blocks))[0] == full.phase_peaks
    assert whole_peaks(hi.log, hi.stack.blocks) == full.phase_peaks
    assert sorted(n for _s, n in events) == sorted(n for _s, n in full.log.events)
    allocs = [n for _s, n in events if n > 0]
    assert allocs == [n for _s, n in full.log.events if n > 0]
    assert replay(events) == replay(full.log.events)
    assert replay(events) != replay(hi.log.events)


EXTENDS = {
    "llama": LLAMA,
    "llama-full-ckpt": LLAMA.with_(grad_checkpointing="full"),
    "llama-qlora-full-ckpt": LLAMA.with_(lora=Lora(), quantize="nf4", grad_checkpointing="full"),
    "llama-selective-8bit-accum": LLAMA.with_(grad_checkpointing="selective",
                                              optimizer="adamw-8bit", grad_accum=2),
    "gpt2-fp16": GPT2,
    "llama-mps": LLAMA.with_(grad_checkpointing="full"),
    "llama-lora-mps": LLAMA.with_(lora=Lora()),
    "llama-qlora-torchao": TORCHAO_QLORA,
    "bert-full-ckpt": BERT.with_(grad_checkpointing="full"),
    "bert-lora": BERT.with_(lora=Lora()),
    # the head keeps nothing of the last block's output (a frozen linear under LoRA) where the
    # next block's checkpoint keeps an inner block's (tracer.py `_last_block`)
    "bert-lora-full-ckpt": BERT.with_(lora=Lora(), grad_checkpointing="full"),
    "llama-qlora-torchao-full-ckpt": TORCHAO_QLORA.with_(grad_checkpointing="full"),
    "roberta-lora-full-ckpt": Job(model=ROBERTA, seq_len=128, precision="fp32", lora=Lora(),
                                  grad_checkpointing="full"),
    "deberta-lora-full-ckpt": Job(model=DEBERTA, seq_len=128, precision="fp32", lora=Lora(),
                                  grad_checkpointing="full"),
    "gemma2-lora": GEMMA2.with_(lora=Lora()),
}
ON["llama-mps"] = "m3-max-128gb"


def _work(tr):
    from collections import Counter
    return Counter((r.name, r.phase, r.dtype, r.recompute, r.family, round(r.flops),
                    round(r.bytes)) for r in tr.ops)


@pytest.mark.parametrize("name", list(EXTENDS))
def test_one_block_more_is_read_off_the_last_one(name):
    """depth.extend: the 4-block trace with one more block, read off what its last block does
    (tagged by the tracer), is the trace of the model cut to 5 blocks: the same ops, totals,
    phase peaks by category and module table. With accumulation the 4-block step is itself
    read off the step without it (accumulate.py), as the planner reads it."""
    from trainplan.trace.derive.accumulate import accumulated
    from trainplan.trace.derive.stitch import extend
    from trainplan.trace.stack import HIGH
    from trainplan.predict.target import semantics_for
    from trainplan.trace.derive import trace_job
    from trainplan.trace.tracer import trace_step
    job = trace_job(EXTENDS[name])
    sem = semantics_for(job, get_accelerator("t4" if "fp16" in name else
                                             ON.get(name, "a100-80gb")))
    if job.grad_accum > 1:
        hi = accumulated(trace_step(job.with_(grad_accum=1), sem, 2, depth=HIGH))
    else:
        hi = trace_step(job, sem, 2, depth=HIGH)
    more, real = extend(hi), trace_step(job, sem, 2, depth=HIGH + 1)
    assert more is not None and more.stack == real.stack
    assert _work(more) == _work(real)
    for field in ("params_total", "params_trainable", "weight_bytes", "trainable_param_bytes",
                  "gradient_bytes", "optimizer_state_bytes", "activation_bytes",
                  "weight_cast_bytes", "phase_peaks", "peak_allocated_bytes", "peak_phase",
                  "checkpointed_blocks", "lora_modules"):
        assert getattr(more, field) == getattr(real, field), field
    assert more.recompute_flops == pytest.approx(real.recompute_flops, rel=1e-9)
    for phase, families in real.flops.items():
        for family, x in families.items():
            assert more.flops[phase][family] == pytest.approx(x, rel=1e-9)
            assert more.bytes_moved[phase][family] == pytest.approx(
                real.bytes_moved[phase][family], rel=1e-9)
    # the module table: every row's parameters, activations and FLOPs
    assert [(m.name, m.params, m.trainable_params, m.activation_bytes) for m in more.modules] == \
        [(m.name, m.params, m.trainable_params, m.activation_bytes) for m in real.modules]
    _same_flops(more, real)


def _same_table(tr) -> None:
    """The stitched trace's op table, made off its parts (stitch.py `ops_parts`: the list is not
    made), is the one its op list gives, array for array, in the order the step runs."""
    from dataclasses import replace

    import numpy as np

    from trainplan.predict.optable import summarize
    assert tr.derived.ops_parts is not None
    listed = replace(tr, ops=list(tr.ops))        # its own derived: no parts, no table
    assert listed.derived.ops_parts is None
    mine, theirs = summarize(tr), summarize(listed)
    for col in mine.COLS + ("seq", "seq_host", "seq_modules"):
        assert np.array_equal(getattr(mine, col), getattr(theirs, col)), col
    assert len(mine.seq) == sum(r.flops > 0 or r.bytes > 0 for r in tr.ops)


def _same_flops(mine, theirs) -> None:
    """Every row of two module tables has the same forward and backward FLOPs."""
    assert [m.name for m in mine.modules] == [m.name for m in theirs.modules]
    for a, b in zip(mine.modules, theirs.modules):
        assert (a.flops_forward, a.flops_backward) == \
            pytest.approx((b.flops_forward, b.flops_backward), rel=1e-9), a.name


def test_what_a_plan_reuses_gives_what_it_would_make_afresh():
    """repeat.whole_log is walked once per log structure (the traces of one step at other
    micro-batches, real or read off the anchors' line, share it) and `stitch` takes the ops one
    more block adds from `extend`, which made them, instead of comparing the two op lists: both
    give what the walk and the comparison give."""
    from trainplan.predict.target import semantics_for
    from trainplan.trace.derive import repeat, stitch as depth, trace_job
    from trainplan.trace.derive.interpolate import trace_between
    from trainplan.trace.stack import HIGH
    from trainplan.trace.tracer import trace_step
    job = trace_job(LLAMA.with_(grad_checkpointing="selective"))
    sem = semantics_for(job, get_accelerator("a100-80gb"))
    lo, hi = (trace_step(job, sem, b, depth=HIGH) for b in (2, 32))
    repeat._LOGS.clear()
    for tr in (lo, hi, trace_between(lo, hi, 7), trace_between(lo, hi, 40, extrapolate=True)):
        for blocks in (HIGH + 1, tr.stack.blocks):
            assert repeat.whole_log(tr, blocks) == repeat._whole_log(tr.log, blocks)[0]
        more = depth.extend(tr)
        fresh = depth.extend(tr)
        fresh.derived.one_more = None           # as if read off another trace: compared
        a, b = depth.stitch(tr, more, tagged=tr), depth.stitch(tr, fresh, tagged=tr)
        assert [depth._sig(r) for r in a.ops] == [depth._sig(r) for r in b.ops]
        assert a.phase_peaks == b.phase_peaks and a.flops == b.flops
    assert len(repeat._LOGS) == 2               # one walk per depth, for all four


def test_a_cut_model_is_traced_at_one_depth(monkeypatch):
    """The planner traces a cut model with HIGH blocks only; where one block more cannot be
    read off it (stitch.extend gives None) it also traces LOW blocks, and the two ways give the
    same step."""
    import trainplan.trace.derive.stitch as depth
    import trainplan.trace.stack as stack
    accel = get_accelerator("a100-80gb")
    job = LLAMA.with_(batch_size=4, grad_checkpointing="full")
    one = Traces()
    ev = evaluate(job, accel, traces=one, strict=False)
    assert {key[2] for key in one._exact} == {stack.HIGH}
    assert ev.trace.notes[-1].startswith(f"traced with {stack.HIGH} of its")
    monkeypatch.setattr(depth, "extend", lambda tr: None)
    two = Traces()
    old = evaluate(job, accel, traces=two, strict=False)
    assert {key[2] for key in two._exact} == {stack.LOW, stack.HIGH}
    # the same ops, FLOPs, bytes and kernel shapes; the host views counted before two of a block's
    # kernels (`OpRecord.host_ops`) come from the last block traced in one way and a middle one
    # in the other, which the host queue sees as 0.1% of the step
    assert old.time.step_time_s == pytest.approx(ev.time.step_time_s, rel=2e-3)
    assert old.trace.flops == ev.trace.flops
    assert old.memory.required_bytes == pytest.approx(ev.memory.required_bytes, rel=0.001)
    assert old.trace.phase_peaks == ev.trace.phase_peaks


def test_a_stack_whose_allocations_do_not_repeat_is_traced_whole_below_40_blocks(monkeypatch):
    """Where a cut trace's events do not repeat block by block (no bundled model's since BERT's
    do, repeat.py `_gradients_freed_late`: made so here), a stack of fewer than 40 blocks is
    traced whole rather than take the 4-block replay's band (trace/stack.py EXACT_BLOCKS)."""
    from trainplan.trace.derive import repeat
    monkeypatch.setattr(repeat, "_repeat_plan", lambda log: None)
    monkeypatch.setenv("TRAINPLAN_TRACE_CACHE", "off")     # no repeat plan stored with a trace
    ev = evaluate(BERT.with_(batch_size=4), get_accelerator("v100-16gb"), traces=Traces(),
                  strict=False)
    assert ev.trace.stack is None


def test_a_plan_whose_copies_would_leave_an_allocation_alive_is_refused():
    """A free of block T's allocation the copies do not repeat (here: an earlier block's run
    frees block T's alone, emitted once as traced) would leave each copy's alive at the step's
    end where block T's is not: the events are not read off the cut trace (repeat.py
    `_balanced`)."""
    from trainplan.trace.derive.repeat import _repeat_plan
    from trainplan.trace.log import Event, TraceLog
    # the head's allocation, one a block (serials 1-4), then block 1's run freeing block T's
    events = [Event(0, 512)] + [Event(1 + b, 1024) for b in range(4)] + [Event(4, -1024)]
    log = TraceLog(events=events, blocks=[-1, 0, 1, 2, 3, 1])
    assert _repeat_plan(log) is None
    # freeing block P's as well is every block's, each copy's freed with them
    log = TraceLog(events=events + [Event(3, -1024)], blocks=[-1, 0, 1, 2, 3, 1, 1])
    assert _repeat_plan(log) is not None


def test_fp16_job_reads_its_bf16_twin(monkeypatch):
    from trainplan.trace.derive import twins
    job = LLAMA.with_(precision="fp16-amp", batch_size=4, lora=Lora())
    t4 = get_accelerator("t4")
    twin_traces = Traces()
    twin = evaluate(job, t4, traces=twin_traces, strict=False)
    assert {r.dtype for r in twin.trace.ops if r.family == "matmul"} == {"float16"}
    monkeypatch.setattr(twins, "half_twin", lambda job, sem: None)
    own = evaluate(job, t4, traces=Traces(), strict=False)
    assert twin.time.step_time_s == pytest.approx(own.time.step_time_s, rel=1e-9)
    assert twin.memory.required_bytes == own.memory.required_bytes


def test_stack_needs_alike_blocks():
    import torch.nn as nn

    class Net(nn.Module):
        def __init__(self, widths):
            super().__init__()
            self.blocks = nn.ModuleList(nn.Linear(w, w) for w in widths)

    import trainplan.trace.stack as trace_depth
    n = trace_depth.MIN_BLOCKS
    alike = Net([16] * n)
    assert repeated_stack(alike)[0] == "blocks"
    stack = cut(alike, 3)
    assert (stack.blocks, stack.traced, len(alike.blocks)) == (n, 3, 3)
    assert cut(Net([16] * (n - 1) + [32]), 3) is None      # one block differs
    assert cut(Net([16] * (n - 1)), 3) is None             # too shallow to cut


def test_layers_that_repeat_in_a_pattern_are_cut_in_whole_periods():
    """trace/stack.py `layer_period`: a config's `layer_types` repeating a whole number of times
    over the stack makes a block of one period; one that does not, or Qwen-2's sliding windows
    below `max_window_layers`, leaves the model whole."""
    import types

    import torch.nn as nn

    from trainplan.trace.stack import layer_period

    def config(kinds, **kw):
        return types.SimpleNamespace(layer_types=kinds, **kw)

    s, f = "sliding_attention", "full_attention"
    assert layer_period(config([f] * 12), 12) == 1
    assert layer_period(config(None), 12) == 1
    assert layer_period(config([s, f] * 6), 12) == 2                    # Gemma-2
    assert layer_period(config(([s] * 5 + [f]) * 8), 48) == 6           # Gemma-3-12B
    assert layer_period(config(([s] * 5 + [f]) * 4 + [s, s]), 26) is None   # Gemma-3-1B
    assert layer_period(config([s] * 4 + [f] * 8), 12) is None          # no repeating pattern
    assert layer_period(config([s, f] * 6), 24) is None                 # another stack's
    assert layer_period(config([f] * 12, use_sliding_window=True, max_window_layers=6),
                        12) is None

    class Net(nn.Module):
        def __init__(self, kinds):
            super().__init__()
            self.config = config(kinds)
            self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in kinds)

    import trainplan.trace.stack as trace_depth
    n = trace_depth.MIN_BLOCKS
    net = Net([s, f] * n)
    stack = cut(net, 3)
    assert (stack.blocks, stack.traced, stack.period, len(net.blocks)) == (n, 3, 2, 6)
    assert stack.describe() == f"6 of its {2 * n} layers, 3 of its {n} alike blocks of 2 (blocks)"
    assert cut(Net([s, f] * n), 3, periodic=False) is None    # generation's forwards: whole
    assert cut(Net([s, f] * (n - 1)), 3) is None               # too few periods to cut


def test_peaks_read_off_an_interpolated_cut_trace_are_its_whole_logs():
    """derive/peaks.py reads an interpolated trace's log through its anchor's entries at its
    own sizes (TraceLog.resized), one block more and the whole stack in one pass: each is the
    replay of the whole stack's log written at those sizes (repeat.py `whole_log`)."""
    from trainplan.trace.derive.interpolate import trace_between
    from trainplan.trace.derive.peaks import whole_peaks
    from trainplan.trace.derive.repeat import whole_log
    from trainplan.trace.log import replay_log
    from trainplan.trace.stack import HIGH
    from trainplan.predict.target import semantics_for
    from trainplan.trace.derive import trace_job
    from trainplan.trace.tracer import trace_step
    job = trace_job(LLAMA.with_(lora=Lora()))
    sem = semantics_for(job, get_accelerator("a100-80gb"))
    lo, hi = trace_step(job, sem, 2, depth=HIGH), trace_step(job, sem, 8, depth=HIGH)
    for batch, beyond in ((5, False), (20, True)):
        tr = trace_between(lo, hi, batch, extrapolate=beyond)
        assert tr.log.resized is not None
        for blocks in (HIGH + 1, BLOCKS):
            fast = whole_peaks(tr.log, blocks, also=(HIGH + 1, BLOCKS))
            assert fast is not None and fast == replay_log(whole_log(tr, blocks))[0]


def test_a_stored_cut_trace_keeps_its_whole_stack_peaks(monkeypatch):
    """The peaks a plan reads of a cut trace (one block more, the whole stack: stitch.py) are
    read where the trace is made (replays.py `prepare`) and pickled with its log, as the trace
    store and a worker send it: a plan from stored traces reads them without reading the log
    again, and they are the whole log's replay. An interpolated log's are not kept."""
    import pickle
    from trainplan.trace import lazy
    from trainplan.trace.derive import peaks as peaks_mod
    from trainplan.trace.derive.interpolate import trace_between
    from trainplan.trace.derive.replays import prepare
    from trainplan.trace.derive.repeat import whole_log
    from trainplan.trace.log import replay_log
    from trainplan.trace.stack import HIGH
    from trainplan.predict.target import semantics_for
    from trainplan.trace.derive import trace_job
    from trainplan.trace.tracer import trace_step
    job = trace_job(LLAMA.with_(grad_checkpointing="full"))
    sem = semantics_for(job, get_accelerator("a100-80gb"))
    made = prepare(trace_step(job, sem, 2, depth=HIGH))
    other = prepare(trace_step(job, sem, 8, depth=HIGH))
    stored = pickle.loads(lazy.dumps(made))
    assert stored.log.__dict__.get("peaks_memo") == made.log.peaks_memo
    assert set(made.log.peaks_memo) == {HIGH + 1, BLOCKS}

    def unread(*a):
        raise AssertionError("the stored log was read again")
    monkeypatch.setattr(peaks_mod, "_read", unread)
    for blocks in (HIGH + 1, BLOCKS):
        assert peaks_mod.whole_peaks(stored.log, blocks) == \
            replay_log(whole_log(stored, blocks))[0]
    between = trace_between(made, other, 5)
    between.log.peaks_memo[BLOCKS] = "made here"
    assert "peaks_memo" not in pickle.loads(pickle.dumps(between.log)).__dict__


@pytest.mark.parametrize("batch", [3, 7])
def test_one_block_more_off_an_interpolated_trace_makes_none_of_its_records(batch):
    """A cut trace read off two anchors (interpolate.py; 7 extrapolated beyond them) gets what
    one block more adds from the anchors' last blocks (stitch.py `block_ops`), so a micro-batch
    search reading the whole step's memory makes none of its op records; what it reads is what
    the records give, and so are the records when they are read."""
    from dataclasses import replace

    from trainplan.predict.target import semantics_for
    from trainplan.trace.derive.interpolate import trace_between
    from trainplan.trace.derive.stitch import block_ops, extend, stitch
    from trainplan.trace.lazy import Lazy
    from trainplan.trace.stack import HIGH
    job = LLAMA.with_(grad_checkpointing="selective")
    sem = semantics_for(job, get_accelerator("a100-80gb"))
    traces = Traces()
    lo, hi = (traces._real(job, sem, b, HIGH) for b in (2, 4))
    mid = trace_between(lo, hi, batch, extrapolate=batch > 4)
    more = extend(mid)
    whole = stitch(mid, more, tagged=mid)
    assert whole.peak_allocated_bytes > mid.peak_allocated_bytes
    assert type(mid.ops) is Lazy and type(more.ops) is Lazy and type(whole.ops) is Lazy
    # the same trace without its anchors' line: extended from its records
    plain = replace(mid)
    assert plain.derived.line is None
    by_records = extend(plain)
    assert block_ops(mid) == block_ops(plain)
    assert len(block_ops(mid).keys) > 0
    for field in ("flops", "bytes_moved", "recompute_flops", "phase_peaks", "activation_bytes"):
        assert getattr(more, field) == getattr(by_records, field), field
    assert list(more.ops) == list(by_records.ops)
    assert list(whole.ops) == list(stitch(plain, by_records, tagged=plain).ops)
