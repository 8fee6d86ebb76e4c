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
follow from that log as the tracer computes them (counters.py `replay_log`). The timeline (the live
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

from ..trace.counters import ALLOC, FREE, RETAG, replay_log
from ..trace.tracer import Trace, downsample


def derivable(sem) -> bool:
    """Whether steps under kernel semantics `sem` are read off (`accumulated`), not traced."""
    return not sem.channels_last


def accumulated(tr: Trace) -> Trace | None:
    """`tr`, a step without accumulation, as the step with it (module docstring), or None."""
    if len(tr.marks) != 2 or any(g[1] is None for g in tr.gradients_made) \
            or not derivable(tr.semantics):
        return None
    (log_f, ev_f), (log_o, ev_o) = tr.marks
    log = tr.memory_log
    made = {g[1]: g for g in tr.gradients_made}
    out = list(log[:log_o])
    blocks = list(tr.event_blocks[:ev_o]) if tr.event_blocks is not None else None
    events = list(tr.alloc_events[:ev_o])
    sizes: dict[int, int] = {}       # the copies' sizes (every free below is of a copy)
    copy: dict[int, int] = {}
    j = ev_f                         # the first micro-batch's event this entry repeats
    for i in range(log_f, log_o):
        entry = log[i]
        kind = entry[0]
        if kind == ALLOC:
            _, serial, nbytes, cat, phase = entry
            new = copy[serial] = len(events)
            out.append((ALLOC, new, nbytes, cat, phase))
            events.append((new, nbytes))
            sizes[new] = nbytes
        elif kind == FREE:
            if entry[1] < ev_f:
                return None          # a tensor from before the forward: not repeated
            new = copy[entry[1]]
            out.append((FREE, new))
            events.append((new, -sizes[new]))
        elif kind == RETAG:
            if i in made:            # the held gradient takes it: freed, not kept
                new = copy[entry[1]]
                out.append((FREE, new))
                events.append((new, -sizes[new]))
                if blocks is not None:
                    blocks.append(made[i][2])
            elif entry[1] >= ev_f:   # (a tensor from before the forward is tagged already)
                out.append((RETAG, copy[entry[1]], entry[2]))
            continue
        else:
            return None              # a peak reset mid-step: not a step this reads
        if blocks is not None:
            blocks.append(tr.event_blocks[j])
        j += 1
    shift = len(events) - ev_o
    gradients = {log[g[1]][1] for g in tr.gradients_made}
    for entry in log[log_o:]:        # the optimizer step: its own tensors renumbered
        kind = entry[0]
        if kind == ALLOC:
            _, serial, nbytes, cat, phase = entry
            out.append((ALLOC, serial + shift, nbytes, cat, phase))
        elif kind == FREE:
            if ev_f <= entry[1] < ev_o and entry[1] not in gradients:
                return None          # a micro-batch's tensor kept to the update: which one?
            out.append((FREE, entry[1] + shift if entry[1] >= ev_o else entry[1]))
        elif kind == RETAG:
            out.append((RETAG, entry[1] + shift if entry[1] >= ev_o else entry[1], entry[2]))
        else:
            return None
    events += [(s + shift if s >= ev_o else s, n) for s, n in tr.alloc_events[ev_o:]]
    if blocks is not None:
        blocks += tr.event_blocks[ev_o:]
    peaks, peak, timeline = replay_log(out, timeline=True)
    # each add_ after the op whose gradient it takes, in order. Host views (`OpRecord.host_ops`,
    # counted on the next kernel): the first micro-batch issued, for each gradient, the views
    # before its AccumulateGrad and one detach setting `.grad` (`add.host_ops` counts both,
    # trace/tracer.py `_gradient_made`); a later micro-batch issues the same views before its
    # add_ and no detach; after the last backward kernel the views stay where they were (every
    # micro-batch issues them there). tests/test_accumulate.py checks this against traced steps.
    views = Counter()
    for at, *_, add in tr.gradients_made:
        if at < len(tr.ops) and tr.ops[at].phase == "backward":
            views[at] += add.host_ops
    base = [replace(o, host_ops=o.host_ops - views[i]) if views[i] else o
            for i, o in enumerate(tr.ops)]
    ops, k = [], 0
    for at, _log, _block, add in tr.gradients_made:
        ops += base[k:at]
        ops.append(replace(add, host_ops=max(0, add.host_ops - 1)))
        k = at
    ops += base[k:]
    moved = {ph: dict(v) for ph, v in tr.bytes_moved.items()}
    for *_, add in tr.gradients_made:
        moved["backward"][add.family] += add.bytes
    return replace(tr, phase_peaks=peaks, peak_allocated_bytes=peak[0], peak_phase=peak[1],
                   peak_breakdown_bytes=peak[2], ops=ops, bytes_moved=moved,
                   memory_log=out, alloc_events=events, event_blocks=blocks,
                   timeline=downsample(timeline), marks=[], gradients_made=[],
                   flash_eligible=2 * tr.flash_eligible)   # each micro-batch's calls

