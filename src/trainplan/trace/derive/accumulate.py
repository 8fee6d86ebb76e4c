"""The step with gradient accumulation, read off the same step traced without it.

With accumulation the tracer runs two micro-batches, the second with the first's gradients live,
and counts the second's ops (trace/tracer.py `_forward_backward`). Everything it records is the
step without accumulation with one more forward and backward spliced in before the optimizer:

* the first micro-batch is the step without it, event for event (the same ops on the same
  tensors: nothing before the optimizer depends on gradients held);
* the second micro-batch repeats the first's allocations and frees on its own tensors, except
  where the first made a parameter's `.grad`: autograd's AccumulateGrad, given a gradient where
  one is held, adds the new one into it in place (an `add_` that reads both and writes one) and
  frees it, where the first micro-batch kept it (tracer.py `_gradient_made` records each);
* the optimizer step is the same, over the gradients the first micro-batch made.

So the ops it counts (the second micro-batch's and the update's) are the step's with each
gradient's `add_` after the op that made the gradient, and its memory log is the step's with the
copy spliced in before the update; each phase's peak, the step's peak and the allocation events
follow from that log as the tracer computes them (log.py `replay_log`). The timeline (the live
total after each op, for the reports' chart) is the log's live total after each event, sampled as
the tracer samples (tracer.py `downsample`). tests/test_accumulate.py checks the result, field for
field, against traces made with accumulation (GPT-2's tied embeddings, BERT in fp32, Llama cut to 3
and 4 blocks with LoRA, QLoRA, 8-bit AdamW and checkpointing, a ResNet). Where the backward frees a
tensor made before the forward, the update frees a micro-batch's tensor other than a gradient, a
gradient's tag was not logged, or the step has no marks, there is no derivation (None) and the step
is traced with accumulation; so too under channels_last, where the first micro-batch copies a
convolution's gradient into the parameter's layout (AccumulateGrad's `clone_obey_contract`) and the
second adds it without the copy.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

from ..facts import Trace
from ..log import Alloc, Event, Free, Retag, TraceLog, downsample, replay_log


def derivable(sem) -> bool:
    """Whether steps under kernel semantics `sem` are read off (`accumulated`), not traced."""
    return not sem.channels_last


def accumulated(tr: Trace) -> Trace | None:
    """`tr`, a step without accumulation, as the step with it (module docstring), or None."""
    tl = tr.log
    if len(tl.marks) != 3 or any(g.log is None for g in tl.gradients) \
            or not derivable(tr.semantics):
        return None
    spliced = _spliced(tl)
    if spliced is None:
        return None
    out, events, blocks = spliced
    peaks, peak, timeline = replay_log(out, timeline=True)
    # each add_ after the op whose gradient it takes, in order. Host views (`OpRecord.host_ops`,
    # counted on the next kernel): the first micro-batch issued, for each gradient, the views
    # before its AccumulateGrad and one detach setting `.grad` (`add.host_ops` counts both,
    # tracer.py `_gradient_made`); a later micro-batch issues the same views before its add_ and
    # no detach; after the last backward kernel the views stay where they were (every
    # micro-batch issues them there). tests/test_accumulate.py checks this against traced steps.
    views = Counter()
    for g in tl.gradients:
        if g.op < len(tr.ops) and tr.ops[g.op].phase == "backward":
            views[g.op] += g.add.host_ops
    base = [o.copied(host_ops=o.host_ops - views[i]) if views[i] else o
            for i, o in enumerate(tr.ops)]
    ops, k = [], 0
    for g in tl.gradients:
        ops += base[k:g.op]
        ops.append(g.add.copied(host_ops=max(0, g.add.host_ops - 1)))
        k = g.op
    ops += base[k:]
    moved = {ph: dict(v) for ph, v in tr.bytes_moved.items()}
    for g in tl.gradients:
        moved["backward"][g.add.family] += g.add.bytes
    return replace(tr, phase_peaks=peaks, peak_allocated_bytes=peak[0], peak_phase=peak[1],
                   peak_breakdown_bytes=peak[2], ops=ops, bytes_moved=moved,
                   log=TraceLog(out, events, blocks, timeline=downsample(timeline)),
                   flash_eligible=2 * tr.flash_eligible,   # each micro-batch's calls
                   sdpa_calls=2 * tr.sdpa_calls)


def _spliced(tl: TraceLog) -> tuple[list, list[Event], list[int] | None] | None:
    """(memory log, events, event blocks) of the step with the first micro-batch's copy
    spliced in before the update (module docstring), or None where it is not a step this
    reads."""
    (log_f, ev_f), (log_o, ev_o) = tl.marks[:2]
    log = tl.memory
    made = {g.log: g for g in tl.gradients}
    out = list(log[:log_o])
    blocks = list(tl.blocks[:ev_o]) if tl.blocks is not None else None
    events = list(tl.events[:ev_o])
    sizes: dict[int, int] = {}       # the copies' sizes (every free below is of a copy)
    copy: dict[int, int] = {}
    j = ev_f                         # the first micro-batch's event this entry repeats
    for i in range(log_f, log_o):
        entry = log[i]
        kind = type(entry)
        if kind is Alloc:
            new = copy[entry.serial] = len(events)
            out.append(Alloc(new, entry.nbytes, entry.category, entry.phase))
            events.append(Event(new, entry.nbytes))
            sizes[new] = entry.nbytes
        elif kind is Free:
            if entry.serial < ev_f:
                return None          # a tensor from before the forward: not repeated
            new = copy[entry.serial]
            out.append(Free(new))
            events.append(Event(new, -sizes[new]))
        elif kind is Retag:
            if i in made:            # the held gradient takes it: freed, not kept
                new = copy[entry.serial]
                out.append(Free(new))
                events.append(Event(new, -sizes[new]))
                if blocks is not None:
                    blocks.append(made[i].block)
            elif entry.serial >= ev_f:   # (a tensor from before the forward is tagged already)
                out.append(Retag(copy[entry.serial], entry.category))
            continue
        else:
            return None              # a peak reset mid-step: not a step this reads
        if blocks is not None:
            blocks.append(tl.blocks[j])
        j += 1
    shift = len(events) - ev_o
    gradients = {log[g.log].serial for g in tl.gradients}
    for entry in log[log_o:]:        # the optimizer step: its own tensors renumbered
        kind = type(entry)
        if kind is Alloc:
            out.append(Alloc(entry.serial + shift, entry.nbytes, entry.category, entry.phase))
        elif kind is Free:
            if ev_f <= entry.serial < ev_o and entry.serial not in gradients:
                return None          # a micro-batch's tensor kept to the update: which one?
            out.append(Free(entry.serial + shift if entry.serial >= ev_o else entry.serial))
        elif kind is Retag:
            out.append(Retag(entry.serial + shift if entry.serial >= ev_o else entry.serial,
                             entry.category))
        else:
            return None
    events += [Event(s + shift if s >= ev_o else s, n) for s, n in tl.events[ev_o:]]
    if blocks is not None:
        blocks += tl.blocks[ev_o:]
    return out, events, blocks
