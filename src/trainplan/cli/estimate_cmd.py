"""`trainplan estimate`: memory per device, fit, largest micro-batch, step time, findings."""
from __future__ import annotations

import argparse
import json

from ..accelerators import get_accelerator
from ..errors import TrainplanError
from ..estimate import estimate, to_json
from ..measure.calibrate import user_calibration
from .common import add_job_flags, job_from_args


def estimate_command_parser(sub) -> None:
    p = sub.add_parser("estimate", help="memory, fit, max batch and step time on one accelerator",
                       description="Estimate a job on one accelerator (--gpu). Memory is per device.")
    p.add_argument("job_file_pos", nargs="?", metavar="JOB", help="YAML job file (optional)")
    add_job_flags(p)
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=estimate_command)


def estimate_command(args: argparse.Namespace) -> int:
    job = job_from_args(args, args.job_file_pos)
    if not job.gpu:
        raise TrainplanError("estimate needs an accelerator.",
                             fix="add --gpu ID (list them with `trainplan catalog`)")
    accel = get_accelerator(job.gpu)
    est = estimate(job, accel, user_calibration())
    if args.format == "json":
        print(json.dumps(to_json(est), indent=2))
    else:
        from ..report.estimate_report import estimate_text
        estimate_text(est)
    return 0
