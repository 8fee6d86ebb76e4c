"""`trainplan inspect MODEL`: parameters, activations and FLOPs per module, from one traced step."""
from __future__ import annotations

import argparse
import json

from ..accelerators import get_accelerator
from ..predict.target import semantics_for
from ..trace.semantics import KernelSemantics
from ..trace.tracer import trace_step
from .common import add_job_flags, job_from_args

DEFAULT_TARGET = "a100-sxm4-80gb"


def inspect_command_parser(sub) -> None:
    p = sub.add_parser("inspect", help="per-module parameters, activations and FLOPs of one step",
                       description="Trace one training step on fake tensors and show, per module, "
                                   "parameters, saved activations and FLOPs. Kernel semantics are "
                                   f"those of --gpu (default {DEFAULT_TARGET}).")
    p.add_argument("model", nargs="?", help="model (or give --job)")
    add_job_flags(p, model_positional=True)
    p.add_argument("--depth", type=int, default=3, help="module depth shown (default 3)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=inspect_command)


def trace_for(args):
    job = job_from_args(args)
    accel = get_accelerator(job.gpu or DEFAULT_TARGET)
    sem: KernelSemantics = semantics_for(job, accel)
    return job, accel, trace_step(job, sem)


def inspect_command(args: argparse.Namespace) -> int:
    tr = None
    job, accel, tr = trace_for(args)
    from ..report.inspect_report import inspect_json, inspect_text
    if args.format == "json":
        print(json.dumps(inspect_json(tr, accel), indent=2))
    else:
        inspect_text(tr, accel, args.depth)
    return 0
