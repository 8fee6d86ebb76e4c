"""`trainplan measure`: run N real training steps of the job on this machine and compare them
with the prediction (CUDA when present, otherwise CPU; synthetic inputs of the job's shapes)."""
from __future__ import annotations

import argparse
import json
import shlex

from .common import add_job_flags, job_from_args


def measure_command_parser(sub) -> None:
    p = sub.add_parser(
        "measure", help="run real training steps here; predicted against measured",
        description="Run --warmup + --steps real optimizer steps of the job on the local device "
                    "and print trainplan's prediction beside the measurement. The record (job, "
                    "device, versions, command, measured, predicted) is appended to --out.")
    p.add_argument("job_file_pos", nargs="?", metavar="JOB", help="YAML job file (optional)")
    add_job_flags(p)
    p.add_argument("--steps", type=int, default=10, help="timed optimizer steps (default 10)")
    p.add_argument("--warmup", type=int, default=3,
                   help="optimizer steps run first and not timed (default 3)")
    p.add_argument("--out", help="JSON-lines file to append the record to "
                                 "(default $TRAINPLAN_HOME/measurements.jsonl)")
    p.add_argument("--accelerator", help="catalog id of this device (default: detected from the "
                                         "CUDA device name)")
    p.add_argument("--device", default="auto", help="auto (cuda if present), cuda, cuda:N or cpu")
    p.add_argument("--profile", action="store_true",
                   help="also run one untimed step under PyTorch's profiler: device time by "
                        "kernel class (matmul, conv, attention, ...) and idle time, predicted "
                        "against measured")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=measure_command)


def measure_command(args: argparse.Namespace) -> int:
    from ..report.console import console
    argv = getattr(args, "argv", None)
    command = shlex.join(["trainplan", *argv]) if argv is not None else None
    progress = None if args.format == "json" else (
        lambda msg: console().print(f"[dim]{msg}[/dim]"))
    from ..measure.records import check_records_file
    check_records_file(args.out)      # before the run, not once its record is made
    if args.task == "generate" and args.profile:
        from ..errors import TrainplanError
        raise TrainplanError("--profile profiles a training step; --task generate times a "
                             "generate call.",
                             fix="drop --profile, or profile the training step (no --task "
                                 "generate)")
    if args.task == "generate":
        from ..measure.generate import run_generation
        prompt, completion = args.prompt_len, args.completion_len
        args.task = args.prompt_len = args.completion_len = None
        job = job_from_args(args, args.job_file_pos)
        rec, path = run_generation(job, prompt or job.seq_len or 512, completion or 256,
                                   steps=args.steps, warmup=args.warmup, device=args.device,
                                   accelerator=args.accelerator, out=args.out, command=command,
                                   progress=progress)
    else:
        from ..measure.runner import run_measurement
        job = job_from_args(args, args.job_file_pos)
        rec, path = run_measurement(job, steps=args.steps, warmup=args.warmup,
                                    device=args.device, accelerator=args.accelerator,
                                    out=args.out, command=command, progress=progress,
                                    profile=args.profile)
    if args.format == "json":
        print(json.dumps(rec, indent=2))
    else:
        from ..report.measure_report import measure_text
        measure_text(rec, path)
    return 0
