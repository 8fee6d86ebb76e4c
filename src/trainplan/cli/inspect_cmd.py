"""`trainplan inspect [MODEL|JOB]`: parameters, activations and FLOPs per module, from one traced
step. Like `estimate`, it takes --model and a YAML job file (positional or --job); the positional
is a job file when it ends in .yaml / .yml, else a model (`trainplan inspect hf:gpt2`)."""
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
    job = job_from_args(args, _positional(args))
    accel = get_accelerator(job.gpu or DEFAULT_TARGET)
    from ..predict.target import semantics_for      # PyTorch: imported once the input is read
    from ..trace.tracer import trace_step
    return job, accel, trace_step(job, semantics_for(job, accel))


def inspect_command(args: argparse.Namespace) -> int:
    tr = None
    job, accel, tr = trace_for(args)
    from ..report.inspect_report import inspect_json, inspect_text
    if args.format == "json":
        print(json.dumps(inspect_json(tr, accel), indent=2))
    else:
        inspect_text(tr, accel, args.depth)
    return 0
