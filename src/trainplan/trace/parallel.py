"""Several traces at once, one per CPU core, in forked worker processes.

A trace is single-threaded Python (fake tensors run no kernels), so traces of independent job
variants scale with cores. Workers are forked from the planning process, so they inherit its
imported torch/transformers (no second start-up) and return each `Trace` pickled (about 0.2 MB,
milliseconds). Where fork is unavailable, one core is available, or `TRAINPLAN_JOBS=1`, traces run
one after another in this process; results are identical either way.
"""
from __future__ import annotations

import atexit
import multiprocessing
import os

from ..errors import TrainplanError
from .tracer import Trace, trace_step


def workers_available() -> int:
    env = os.environ.get("TRAINPLAN_JOBS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise TrainplanError(f"TRAINPLAN_JOBS={env!r} is not a whole number.",
                                 fix="set TRAINPLAN_JOBS to the number of traces to run at once "
                                     "(1 for none in parallel)") from None
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def _run(request) -> Trace | tuple:
    job, sem, batch, depth = request
    try:
        return trace_step(job, sem, batch, depth=depth)
    except TrainplanError as e:   # keyword-only fields: sent back as a plain tuple
        return ("error", e.what, e.allowed, e.fix)


def _child_init() -> None:
    import torch
    torch.set_num_threads(1)


_POOLS: dict[int, object] = {}


def _pool(n: int):
    """One pool per process, kept for later rounds: its workers stay warm (the first trace in a
    process pays lazy imports and fills PyTorch's fake-tensor dispatch cache)."""
    if n not in _POOLS:
        _POOLS[n] = multiprocessing.get_context("fork").Pool(n, initializer=_child_init)
        atexit.register(_POOLS[n].terminate)
    return _POOLS[n]


def trace_all(requests: list[tuple]) -> list[Trace | TrainplanError]:
    """Trace each (job, KernelSemantics, batch, depth: blocks kept or None, trace/depth.py); a
    failure comes back as its TrainplanError."""
    n = min(len(requests), workers_available())
    if n >= 2 and "fork" in multiprocessing.get_all_start_methods():
        results = _pool(workers_available()).map(_run, requests, chunksize=1)
    else:
        results = [_run(r) for r in requests]
    return [TrainplanError(r[1], allowed=r[2], fix=r[3]) if isinstance(r, tuple) else r
            for r in results]
