"""Inference forwards (trace/generate.py): the prefill and decode steps generation is timed on
(predict/generation.py), made once per process and kept in the disk store, a deep stack traced
cut and read whole off its last layer (stitch.py `whole_forward`).
"""
from __future__ import annotations

from ...models import stack_hint
from .. import store
from ..facts import InferenceTrace
from ..parallel import Forward, trace_all
from ..stack import HIGH, MIN_BLOCKS
from .anchoring import trace_job
from .rounds import Deferred, defer_forward, may_trace
from .stitch import whole_forward

_MEMO: dict[tuple, InferenceTrace] = {}


def forward_job(job):
    """The job as a no-grad forward sees it: what only training reads (optimizer, checkpointing,
    accumulation, frozen modules, the training micro-batch, the job's name and notes) reset, so
    the ladder's rungs that change only those (8-bit AdamW, checkpointing, accumulation) share
    one generation trace."""
    return trace_job(job).with_(optimizer="adamw", grad_checkpointing="none",
                                checkpoint_impl="auto", grad_accum=1, frozen=(), name=None,
                                notes=(), algorithm="sft")


def _traced(job, sem, batch: int, new_tokens: int, context: int) -> InferenceTrace:
    """trace_forward, once per process and kept in the disk store (trace/store.py): a plan asks
    for the same rollout on every rung of every platform's ladder. While a plan runs its tasks
    in rounds (rounds.py `in_rounds`) a forward not made yet is made with the round's other
    traces, on all cores (`defer_forward`)."""
    tj = forward_job(job)
    memo = (repr(tj), repr(sem), batch, new_tokens, context)
    if memo not in _MEMO:
        name = store.key(tj, sem, batch, f"forward {new_tokens} at {context}")
        tr = store.load(name)
        if tr is None:
            depth = HIGH if (stack_hint(tj) or 0) >= MIN_BLOCKS else None

            def keep(made):
                if isinstance(made, InferenceTrace):     # a deep stack traced cut: read the
                    made = whole_forward(made)           # whole one off it (stitch.py), or
                    if made is None:                     # trace it whole
                        made = trace_all([Forward(tj, sem, batch, new_tokens, context)])[0]
                    store.save(name, made)
                _MEMO[memo] = made

            defer_forward(memo, Forward(tj, sem, batch, new_tokens, context, depth), keep)
            if not may_trace():       # within Traces.made_only(): not traced now
                raise Deferred
            keep(trace_all([Forward(tj, sem, batch, new_tokens, context, depth)])[0])
        else:
            _MEMO[memo] = tr
    if isinstance(_MEMO[memo], BaseException):    # a forward that could not be traced
        raise _MEMO[memo]
    return _MEMO[memo]


def forwards(job, sem, requests: list[tuple]) -> list[InferenceTrace]:
    """The inference forwards (trace/generate.py) of `job` under `sem`, one for each (batch,
    new_tokens, context), the whole stack's where it was traced cut; where some are deferred,
    all of them are asked for first, so that one round makes them together."""
    out, deferred = [], None
    for f in requests:
        try:
            out.append(_traced(job, sem, *f))
        except Deferred as e:
            deferred = e
    if deferred is not None:
        raise deferred
    return out
