"""Run one `trainplan` command and show what it traced, round by round (where a plan's time goes).

Run: python scripts/trace_rounds.py plan examples/chart-rvr-grpo.yaml
     (any `trainplan` arguments; its output goes to stdout as usual, this report to stderr)

For every call of trace/parallel.py's `trace_all` made by trace/derive/schedule.py (one round of
traces on all cores): each training step asked for (micro-batch, attention kernel, the job's
checkpointing, LoRA (its rank), quantisation, optimizer, accumulation, sequence length,
precision and strategy), each generation forward (`Forward`: sequences, new tokens, context)
and each optimizer's update (`OptimizerStep`, what a step with it is read off with),
how many follow-ups it made, its wall time and when it started; every trace made one at a time
in this process, and the total. Set TRAINPLAN_TRACE_CACHE to an empty folder for a cold run
(nothing read from the trace store). With TRAINPLAN_JOBS=1 every trace is made in this process,
and the total also counts the ops the traces dispatched (each op through the tracer's
`StepCounter.__torch_dispatch__`, trace/counters.py): what a cold plan's tracing costs is that
count times a dispatch (scripts/dispatch_floor.py).
The README's "Speed of analysis" cites runs of this script.
"""
import contextlib
import os
import sys
import time

import trainplan.trace.derive.cache as cache
import trainplan.trace.derive.inference as generation
import trainplan.trace.derive.schedule as traces
from trainplan.trace.parallel import Forward, OptimizerStep

T0 = time.perf_counter()


def _step(job, sem, batch, depth=None) -> str:
    return (f"step b={batch}{'' if depth is None else f' cut to {depth}'} {sem.attention} "
            f"ckpt={job.grad_checkpointing} lora={job.lora.rank if job.lora else 'no'} "
            f"quant={job.quantize} opt={job.optimizer} accum={job.grad_accum} seq={job.seq_len} "
            f"{job.precision} {job.strategy} x{job.gpus} {_semantics(sem)}")


def _semantics(sem) -> str:
    """What the kernel semantics set apart from the defaults (attention is shown already)."""
    from dataclasses import fields
    from trainplan.trace.semantics import KernelSemantics
    default = KernelSemantics()
    return " ".join(f"{f.name}={getattr(sem, f.name)}" for f in fields(sem)
                    if f.name != "attention" and getattr(sem, f.name) != getattr(default, f.name))


def _forward(f: Forward) -> str:
    return f"forward b={f.batch} new={f.new_tokens} context={f.context} {f.sem.attention}"


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@contextlib.contextmanager
def counting_ops():
    """Counts the ops traces made in this process dispatch (each through the tracer's
    `StepCounter.__torch_dispatch__`, trace/counters.py) while inside: yields a one-element list
    holding the count."""
    from trainplan.trace.counters import StepCounter
    ops = [0]
    dispatch = StepCounter.__torch_dispatch__

    def counted(self, func, types, args=(), kwargs=None):
        ops[0] += 1
        return dispatch(self, func, types, args, kwargs)

    StepCounter.__torch_dispatch__ = counted
    try:
        yield ops
    finally:
        StepCounter.__torch_dispatch__ = dispatch


def main() -> int:
    def watched(real, where: str):
        """trace/parallel.py's trace_all as `where` calls it, reported: schedule.py's calls are
        rounds on all cores, cache.py's and inference.py's traces made one at a time."""
        def trace_all(requests, *a, **kw):
            t = time.perf_counter()
            out = real(requests, *a, **kw)
            more = out[1] if isinstance(out, tuple) else [None] * len(requests)
            if where == "round":
                _say(f"round at {t - T0:.0f} s: {len(requests)} traces, "
                     f"{sum(m is not None for m in more)} follow-ups, "
                     f"{time.perf_counter() - t:.1f} s")
            for r in requests:
                what = (_forward(r) if isinstance(r, Forward) else
                        f"update {r.job.optimizer} cut to {r.depth}"
                        if isinstance(r, OptimizerStep) else _step(*r))
                _say(("  " + what) if where == "round" else
                     f"one at a time: {what}, {time.perf_counter() - t:.1f} s")
            return out
        return trace_all

    # traces in this process (TRAINPLAN_JOBS=1): count their ops
    counting = counting_ops() if os.environ.get("TRAINPLAN_JOBS") == "1" else \
        contextlib.nullcontext([0])
    traces.trace_all = watched(traces.trace_all, "round")
    cache.trace_all = watched(cache.trace_all, "one")
    generation.trace_all = watched(generation.trace_all, "one")
    from trainplan.cli.main import main as trainplan
    with counting as ops:
        try:
            code = trainplan(sys.argv[1:])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    _say(f"total {time.perf_counter() - T0:.1f} s" +
         (f"; {ops[0]:,} ops dispatched by the traces" if ops[0] else ""))
    sys.stdout.flush()
    os._exit(code or 0)      # as the CLI does: no interpreter tear-down of the worker pool


if __name__ == "__main__":
    main()
