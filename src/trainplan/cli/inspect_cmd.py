"""`trainplan inspect [MODEL|JOB]`: parameters, activations and FLOPs per module, from one traced
step. Like `estimate`, it takes --model and a YAML job file (positional or --job); the positional
is a job file when it ends in .yaml / .yml, else a model (`trainplan inspect hf:gpt2`).

The step is the one `estimate` and `plan` read (trace/derive: the trace store, and a deep stack of
alike blocks traced cut and the rest read off its last block), so a model inspected before, or
planned, is not traced again. Read off the cut trace, every block past the traced ones has the
last traced block's row; the totals are the full trace's (tests/test_depth.py)."""
from __future__ import annotations

import argparse
import json

from ..accelerators import get_accelerator
from ..errors import TrainplanError
from .common import add_job_flags, job_from_args

DEFAULT_TARGET = "a100-sxm4-80gb"


def inspect_command_parser(sub) -> None:
    p = sub.add_parser("inspect", help="per-module parameters, activations and FLOPs of one step",
                       description="Trace one training step on fake tensors and show, per module, "
                                   "parameters, saved activations and FLOPs. Kernel semantics are "
                                   f"those of --gpu (default {DEFAULT_TARGET}).")
    p.add_argument("target", nargs="?", metavar="MODEL|JOB",
                   help="model (as --model), or a YAML job file (*.yaml, *.yml)")
    add_job_flags(p)
    p.add_argument("--depth", type=int, default=3, help="module depth shown (default 3)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=inspect_command)


def _positional(args: argparse.Namespace) -> str | None:
    """Put the positional where it belongs (--model or the job file); returns the job file."""
    target = getattr(args, "target", None)
    if not target:
        return None
    if target.lower().endswith((".yaml", ".yml")):
        if args.job_file and args.job_file != target:
            raise TrainplanError(f"Two job files: {target} and --job {args.job_file}.",
                                 fix="give one of them")
        return target
    if args.model and args.model != target:
        raise TrainplanError(f"Two models: {target} and --model {args.model}.", fix="give one of them")
    args.model = target
    return None


def trace_for(args):
    """(job, accelerator, the job's step traced for it, whether it was read from the trace
    store rather than traced now)."""
    job = job_from_args(args, _positional(args))
    accel = get_accelerator(job.gpu or DEFAULT_TARGET)
    from ..predict.target import semantics_for
    from ..trace.derive import Traces
    traces = Traces()
    tr = traces.exact(job, semantics_for(job, accel), job.batch_size)
    return job, accel, tr, traces.traced == 0


def inspect_command(args: argparse.Namespace) -> int:
    if args.depth < 0:            # before anything is traced
        raise TrainplanError(f"--depth must be 0 or more, got {args.depth}: how many levels of "
                             "modules the table shows below the model (0: the total alone).",
                             fix="--depth 3 (the default), or --depth 1 for the top-level "
                                 "modules")
    job, accel, tr, stored = trace_for(args)
    from ..report.inspect_report import inspect_json, inspect_text
    if args.format == "json":
        print(json.dumps(inspect_json(tr, accel, stored), indent=2))
    else:
        inspect_text(tr, accel, args.depth, stored)
    return 0
