"""Traces derived from traces: what the prediction layer reads instead of tracing every job,
micro-batch and block.

    traces.py       the trace cache (`Traces`): exact and at any micro-batch, whole or stitched
    cache.py        real traces: in memory, on disk (trace/store.py), off a twin, off the step
                    without accumulation or with another update; schedule.py makes many at
                    once, rounds.py in rounds
    anchoring.py    which job a trace is of, which micro-batches are traced
    twins.py        steps one trace serves for two targets (`canonical`)
    stitch.py       a deep model's step from a trace cut to a few blocks
    repeat.py       a cut trace's allocations repeated over the whole stack
    peaks.py        each phase's peak over the whole stack, off the cut trace's log
    accumulate.py   the step with gradient accumulation, off the step without it
    swap.py         the step with another optimizer's update, off the step with one
    interpolate.py  a micro-batch between (or beyond) two traced ones
    allocator.py    PyTorch's caching allocator, replayed; replays.py its fragmentation
    inference.py    generation's inference forwards

Every derivation makes a new trace with a log of its own (trace/log.py); no trace or log is
changed once made. The prediction layer imports only what this module exports
(tests/test_layers.py). No module here is named as a function it exports (`anchors`,
`forwards`, `replay`), so `import trainplan.trace.derive.<module>` always gives the module.
"""
from .allocator import CUDA, MPS, Rules, replay, replay_within, rules_for
from .anchoring import ANCHORS, anchors, anchors_for, loops_over_images, trace_job
from .inference import forward_job, forwards
from .replays import Fragmentation, fragmentation, replayed
from .rounds import Deferred, asked, every, may_trace
from .traces import Traces
from .twins import attention_twin, canonical, same_step

__all__ = ["ANCHORS", "CUDA", "MPS", "Deferred", "Fragmentation", "Rules", "Traces", "anchors",
           "anchors_for", "asked", "attention_twin", "canonical", "every", "forward_job",
           "forwards", "fragmentation", "loops_over_images", "may_trace", "replay",
           "replay_within", "replayed", "rules_for", "same_step", "trace_job"]
