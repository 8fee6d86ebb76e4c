"""Asking for traces in rounds: many tasks (a plan's platforms, rungs, curves) each ask for the
traces they read; where one is not made yet the task stops (`Deferred`) and the trace is
recorded, and once every task has run as far as it can, all the recorded traces are made at once
on all cores (schedule.py `fill`); the tasks then run again from their beginning, reading what is
made (what they computed before is cached by the caller, so a round costs the new traces only).

Generation forwards (inference.py) take part too: a forward not made yet is recorded with the
round's traces (`defer_forward`). `made_only` reads only traces made already (a memory curve that
must not make a plan trace more).
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable


class Deferred(Exception):
    """A trace that is not made yet was asked for while `Traces.deferring` (see `in_rounds`) or
    within `Traces.made_only`."""


def every(asks: list[Callable]) -> list:
    """Each call's answer; where some ask for traces not made yet (`Deferred`), all are still
    asked, so that a round makes their traces together, and then Deferred is raised (asked one
    by one, the second of two traces a step reads -- a line's two anchors -- would wait a whole
    round for the first)."""
    out, deferred = [], False
    for ask in asks:
        try:
            out.append(ask())
        except Deferred:
            deferred = True
    if deferred:
        raise Deferred
    return out


_MAKING = contextvars.ContextVar("trainplan_making_traces", default=True)


def may_trace() -> bool:
    """False within `Traces.made_only()`: what is not traced yet is not traced then (the
    generation forwards of inference.py read this)."""
    return _MAKING.get()


_FORWARDS = contextvars.ContextVar("trainplan_pending_forwards", default=None)


def defer_forward(key, request, keep: Callable) -> None:
    """A generation forward not traced yet (inference.py). Within `Traces.in_rounds` it is made
    with the round's other traces, on all cores: recorded under `key` with `keep(trace or
    TrainplanError)`, which caches it, and the task deferred (`Deferred`). Outside, or within
    `made_only`, nothing is recorded: the caller traces it now (or not)."""
    if record(key, request, keep):
        raise Deferred


def record(key, request, keep: Callable) -> bool:
    """Record a request other than a step's trace (a generation forward, an optimizer's update:
    cache.py `_swapped`) to be made with the round's traces, as `defer_forward` does, without
    deferring the task: True where recorded (within `Traces.in_rounds`, outside `made_only`)."""
    pending = _FORWARDS.get()
    if pending is not None and may_trace():
        pending.append((key, request, keep))
        return True
    return False


def asked(ask: Callable) -> list[tuple]:
    """The generation forwards not traced yet that `ask()` asks for (`defer_forward`), recorded
    for `prefetch` or `fill` instead of traced."""
    forwards: list[tuple] = []
    token = _FORWARDS.set(forwards)
    try:
        ask()
    finally:
        _FORWARDS.reset(token)
    return forwards


class Rounds:
    """The rounds' side of the trace cache: `deferring` (the traces asked for and not made, while
    a round runs), `made_only` and `in_rounds`. The cache defers in `_real`; `fill` makes."""

    deferring: list[tuple] | None = None

    def fill(self, requests: list[tuple], at_least: int = 1, forwards: list[tuple] = ()) -> None:
        raise NotImplementedError

    @contextlib.contextmanager
    def made_only(self):
        """Within: read only the traces this cache holds already (made or read by this run's
        plan; not one another command left in the disk store, which would make a report depend
        on what else was traced); asking for any other raises `Deferred`, generation forwards
        included, so the caller leaves out what would need a new trace (plan/extras.py's memory
        curves)."""
        old, token = self.deferring, _MAKING.set(False)
        self.deferring = []
        try:
            yield
        finally:
            self.deferring = old
            _MAKING.reset(token)

    def in_rounds(self, tasks: list[Callable]) -> list:
        """Each task's result, the traces they need made in parallel rounds (module docstring).
        The results are those of running the tasks one after another."""
        results: dict[int, object] = {}
        pending = list(range(len(tasks)))
        while pending:
            self.deferring, still, forwards = [], [], []
            token = _FORWARDS.set(forwards)
            try:
                for i in pending:
                    try:
                        results[i] = tasks[i]()
                    except Deferred:
                        still.append(i)
                requests = self.deferring
            finally:
                self.deferring = None
                _FORWARDS.reset(token)
            if still and not requests and not forwards:
                raise RuntimeError("a task deferred without naming a trace")
            self.fill(requests, forwards=forwards)
            pending = still
        return [results[i] for i in range(len(tasks))]
