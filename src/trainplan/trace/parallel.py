"""Several traces at once, one per CPU core, in forked worker processes.

A trace is single-threaded Python (fake tensors run no kernels), so traces of independent job
variants scale with cores. Workers are forked from the planning process, so they inherit its
imported torch/transformers (no second start-up) and return each `Trace` pickled (about 0.2 MB,
milliseconds). Where fork is unavailable, one core is available, or `TRAINPLAN_JOBS=1`, traces run
one after another in this process; results are identical either way. Once a pool is started, a
single trace runs on it too (where its workers were forked with this environment): they have
imported torch and filled PyTorch's fake-tensor caches, which this process may not have (a
plan's main process imports torch only to trace).

`trace_all` can also be given follow-ups: a trace that may turn out to be the same step as
another one (derive/schedule.py: flash and memory-efficient attention where no call can take
flash). Each follow-up waits for its first trace and is made only if `policy` says so once that
result is in; a core that would otherwise sit idle makes a follow-up whose answer is not known
yet (as if there were no follow-ups), so the wall time is never longer than tracing both.
"""
from __future__ import annotations

import atexit
import multiprocessing
import os
import pickle
import queue
from collections.abc import Callable
from typing import NamedTuple

from ..errors import TrainplanError
from . import lazy
from .facts import Trace


class Forward(NamedTuple):
    """A request for one inference forward (trace/generate.py `trace_forward`) instead of a
    training step: generation's prefill and decode steps, traced beside the steps."""

    job: object
    sem: object
    batch: int
    new_tokens: int
    context: int
    depth: int | None = None      # layers of the stack traced (trace_forward)


class OptimizerStep(NamedTuple):
    """A request for a job's optimizer alone (tracer.py `trace_optimizer`): its warm-up and
    update, what derive/swap.py reads the job's step off another optimizer's step with."""

    job: object
    sem: object
    depth: int | None = None


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask, else the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def workers_available() -> int:
    env = os.environ.get("TRAINPLAN_JOBS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise TrainplanError(f"TRAINPLAN_JOBS={env!r} is not a whole number.",
                                 fix="set TRAINPLAN_JOBS to the number of traces to run at once "
                                     "(1 for none in parallel)") from None
    return usable_cores()


def _run(request, finish: Callable | None = None, pack: bool = False) -> Trace | tuple:
    """One request traced here. `pack` (a worker's): sent back as lazy.py's bytes, whose long
    lists the planning process unpickles only where it reads them (`_result`). The tracers
    (torch) are imported here, not with this module: a plan answered from stored traces never
    needs them."""
    from .generate import trace_forward
    from .tracer import trace_optimizer, trace_step
    try:
        if isinstance(request, Forward):
            out = trace_forward(*request)
        elif isinstance(request, OptimizerStep):
            out = trace_optimizer(*request)
        else:
            job, sem, batch, depth = request
            tr = trace_step(job, sem, batch, depth=depth)
            out = finish(tr) if finish is not None else tr
        return ("packed", lazy.dumps(out)) if pack else out
    except TrainplanError as e:   # keyword-only fields: sent back as a plain tuple
        return ("error", e.what, e.allowed, e.fix)


def _child_init() -> None:
    import torch
    torch.set_num_threads(1)


_POOLS: dict[int, object] = {}
_POOL_ENV: dict[int, dict] = {}    # the environment each pool's workers were forked with


def _warm(n: int) -> bool:
    """Whether a pool of n workers is started and its workers see this process's environment
    (a test's monkeypatched settings, a home set after the fork, would not reach them: a single
    trace then runs here, as it always did)."""
    return n in _POOLS and _POOL_ENV.get(n) == dict(os.environ)


def _pool(n: int):
    """One pool per process, kept for later rounds: its workers stay warm (the first trace in a
    process pays lazy imports and fills PyTorch's fake-tensor dispatch cache)."""
    if n not in _POOLS:
        _POOLS[n] = multiprocessing.get_context("fork").Pool(n, initializer=_child_init)
        _POOL_ENV[n] = dict(os.environ)
        atexit.register(_POOLS[n].terminate)
    return _POOLS[n]


def _result(r):
    if isinstance(r, tuple) and r and r[0] == "packed":
        return pickle.loads(r[1])
    if isinstance(r, tuple) and r and r[0] == "error":
        return TrainplanError(r[1], allowed=r[2], fix=r[3])
    if isinstance(r, BaseException):
        raise r
    return r


RUN, SKIP, WAIT, IDLE = "run", "skip", "wait", "idle"


def trace_all(requests: list[tuple], followups: list[tuple | None] | None = None,
              policy: Callable | None = None, started: Callable | None = None,
              finish: Callable | None = None) -> list:
    """Trace each (job, KernelSemantics, batch, depth: blocks kept or None, trace/stack.py), or
    each `Forward` or `OptimizerStep`; a failure comes back as its TrainplanError.

    With `followups` (one request or None per request) the answer is (results, follow-up
    results), a follow-up's None where it was not made. `policy(i, done, result)` decides
    follow-up i: RUN (make it now), SKIP (not needed: only once its request is `done`), WAIT
    (until the request is done) or IDLE (make it if a core is free and nothing else is); it is
    called with every request's result as it comes in, follow-up or not.
    `started(kind, i)` is told as request ("r") or follow-up ("f") i starts. `finish(trace)`, a
    module-level function (workers receive it pickled by name), is applied to each step's trace
    where it is made, before it is sent back (derive/replays.py `prepare`: its allocator replay,
    made on all cores)."""
    followups = followups or [None] * len(requests)
    policy = policy or (lambda i, done, result: RUN)
    started = started or (lambda kind, i: None)
    n = min(len(requests) + sum(f is not None for f in followups), workers_available())
    if n == 1 and _warm(workers_available()):
        n = 2                     # one trace, on a warm worker: this process may lack torch
    if n < 2 or "fork" not in multiprocessing.get_all_start_methods():
        results, more = [], [None] * len(requests)
        for i, r in enumerate(requests):
            started("r", i)
            results.append(_result(_run(r, finish)))
            policy(i, True, results[i])
        for i, f in enumerate(followups):
            if f is not None and policy(i, True, results[i]) != SKIP:
                started("f", i)
                more[i] = _result(_run(f, finish))
    else:
        results, more = _scheduled(requests, followups, policy, started, finish)
    return (results, more) if any(f is not None for f in followups) else results


def _scheduled(requests, followups, policy, started, finish):
    """trace_all on the pool: requests first, follow-ups as `policy` lets them (see there)."""
    pool, workers = _pool(workers_available()), workers_available()
    done_q: queue.SimpleQueue = queue.SimpleQueue()
    results: list = [None] * len(requests)
    more: list = [None] * len(requests)
    finished = [False] * len(requests)
    open_f = {i for i, f in enumerate(followups) if f is not None}
    queued = list(range(len(requests)))
    busy = 0

    def submit(tag, request):
        started(*tag)
        pool.apply_async(_run, (request, finish, True), callback=lambda r: done_q.put((tag, r)),
                         error_callback=lambda e: done_q.put((tag, e)))

    while queued or open_f or busy:
        for i in sorted(open_f):        # settle what can be settled, start what must run
            verdict = policy(i, finished[i], results[i])
            if verdict == SKIP and finished[i]:
                open_f.discard(i)
            elif verdict == RUN and busy < workers:
                open_f.discard(i)
                submit(("f", i), followups[i])
                busy += 1
        while queued and busy < workers:
            i = queued.pop(0)
            submit(("r", i), requests[i])
            busy += 1
        for i in sorted(open_f):        # a core would sit idle: make a follow-up not known yet
            if busy >= workers:
                break
            if policy(i, finished[i], results[i]) == IDLE:
                open_f.discard(i)
                submit(("f", i), followups[i])
                busy += 1
        if not busy:
            if open_f:                  # only follow-ups waiting on nothing: make them
                for i in sorted(open_f):
                    submit(("f", i), followups[i])
                    busy += 1
                open_f.clear()
            else:
                break
        (kind, i), r = done_q.get()
        busy -= 1
        if kind == "r":
            results[i], finished[i] = _result(r), True
            policy(i, True, results[i])      # told first: it may learn from the result
        else:
            more[i] = _result(r)
    return results, more
