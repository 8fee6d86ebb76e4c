"""`trainplan estimate`: memory per device, fit, largest micro-batch, step time, findings.

Exit status: 0 with the estimate printed, fit or not; with --check, 1 when the job does not fit
the accelerator (--gpu) as written; 2 for bad input.
"""
from __future__ import annotations

import argparse
import json

from ..accelerators import get_accelerator
from ..errors import TrainplanError
from .common import add_job_flags, job_from_args, show_reading


def estimate_command_parser(sub) -> None:
    p = sub.add_parser("estimate", help="memory, fit, max batch and step time on one accelerator",
                       description="Estimate a job on one accelerator (--gpu). Memory is per device. "
                                   "Exit status: 0 (fit or not), 1 with --check when the job does "
                                   "not fit, 2 for bad input.")
    p.add_argument("job_file_pos", nargs="?", metavar="JOB",
                   help="YAML job file, or an axolotl, LLaMA-Factory, TRL, torchtune, DeepSpeed or "
                        "accelerate config (optional)")
    add_job_flags(p)
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--check", action="store_true",
                   help="exit 1 when the job does not fit on --gpu (the estimate is still printed)")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress display on stderr (estimate shows none; accepted as in plan)")
    p.set_defaults(func=estimate_command)


def estimate_command(args: argparse.Namespace) -> int:
    if args.task == "generate":
        return generate_command(args)
    job = job_from_args(args, args.job_file_pos)
    if not job.gpu:
        raise TrainplanError("estimate needs an accelerator.",
                             fix="add --gpu ID (list them with `trainplan catalog`)")
    accel = get_accelerator(job.gpu)
    import sys
    show_reading(args, sys.stdout if args.format == "text" else sys.stderr)
    from ..estimate import estimate, to_json          # PyTorch: imported once the input is read
    from ..measure.calibrate import user_calibration
    est = estimate(job, accel, user_calibration())
    if args.format == "json":
        doc = to_json(est)
        if getattr(args, "config_reading", None) is not None:   # what each config key became
            doc["config_reading"] = args.config_reading.to_json()
        print(json.dumps(doc, indent=2))
    else:
        from ..report.estimate_report import estimate_text
        estimate_text(est)
    return 1 if args.check and not est.fits else 0


def generate_command(args: argparse.Namespace) -> int:
    """`estimate --task generate`: the generation model alone (predict/generation.py)."""
    engine = args.engine or "hf"
    if engine not in ("hf", "vllm", "vllm-colocate", "vllm-server"):
        raise TrainplanError(f"--engine {engine!r} is not one trainplan models.",
                             allowed="hf, vllm")
    args.task, args.engine = None, None
    rollout = {a: getattr(args, a) for a in ("generations", "prompt_len", "completion_len", "beta")}
    for a in rollout:
        setattr(args, a, None)
    job = job_from_args(args, args.job_file_pos)
    if not job.gpu:
        raise TrainplanError("estimate needs an accelerator.",
                             fix="add --gpu ID (list them with `trainplan catalog`)")
    prompt = rollout["prompt_len"] or job.seq_len or 512
    completion = rollout["completion_len"] or 256
    accel = get_accelerator(job.gpu)
    from ..estimate import generation_to_json          # PyTorch: imported once the input is read
    from ..measure.calibrate import GENERATE, user_calibration
    from ..predict.generation import calibrated, estimate_generation
    g = estimate_generation(job, accel, prompts=job.batch_size,
                            generations_per_prompt=rollout["generations"] or 1,
                            prompt_len=prompt, completion_len=completion,
                            engine="hf" if engine == "hf" else "vllm")
    if engine == "hf":         # what `measure --task generate` measures: HF generate
        key = accel.id + GENERATE
        g = calibrated(g, user_calibration().factors.get(key), key)
    if args.format == "json":
        print(json.dumps(generation_to_json(job, accel, g), indent=2))
    else:
        from ..report.estimate_report import generation_text
        generation_text(job, accel, g)
    return 1 if args.check and g.peak_bytes > accel.usable_memory_bytes else 0
