"""`trainplan export JOB --platform ID --to KIND --out DIR`: the plan for one platform, as launch
files: torchrun, accelerate, deepspeed, slurm, skypilot, kaggle, colab, or all (export/); or as
a fine-tuning framework's config: axolotl, llama-factory, trl, torchtune.

--out is checked before anything is planned; files already there are never changed without
--force (export.write); the job file goes into a kit byte for byte."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import TrainplanError
from .common import add_job_flags, job_from_args, run_length, show_reading, steps_arg


def export_command_parser(sub) -> None:
    from ..export import FRAMEWORKS, KINDS
    p = sub.add_parser("export", help="write launch files for a plan: torchrun, accelerate, "
                                      "deepspeed, slurm, skypilot, kaggle/colab kits, or an "
                                      "axolotl / LLaMA-Factory / TRL / torchtune config",
                       description=__doc__.splitlines()[0])
    p.add_argument("job_file_pos", nargs="?", metavar="JOB", help="YAML job file")
    p.add_argument("--platform", help="platform id (trainplan catalog platforms); or --gpu ID "
                                      "--gpus N for N of an accelerator (16: 2 nodes of 8)")
    p.add_argument("--platforms-file", help="YAML file of your own platforms")
    p.add_argument("--to", required=True, choices=KINDS + FRAMEWORKS + ("all",),
                   help="what to write")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="folder to write into (made if missing; files already there are not "
                        "replaced without --force)")
    p.add_argument("--force", action="store_true",
                   help="replace files in --out that the export writes anew")
    p.add_argument("--script", default="train.py", help="training script the launchers run "
                                                        "(default train.py)")
    p.add_argument("--dataset", metavar="DIR", help="kaggle: package this folder as a Kaggle "
                                                    "dataset (zip + dataset-metadata.json)")
    p.add_argument("--spot", action="store_true", default=None,
                   help="skypilot: also write the spot managed-job variant (default: when the "
                        "plan has more than one session)")
    p.add_argument("--install", default="trainplan",
                   help="kits: what the notebook's install cell pip-installs (default trainplan)")
    p.add_argument("--steps", type=steps_arg, help="optimizer steps to run")
    add_job_flags(p)
    p.set_defaults(func=export_command)


def job_bytes(path: str | None, job) -> bytes:
    """The kit's job.yaml: the job file as it is, or, from flags alone, the job written out."""
    if path:
        try:
            return Path(path).read_bytes()
        except OSError as e:
            raise TrainplanError(f"Cannot read job file {path}: {e.strerror or e}.") from None
    import yaml
    from ..measure.records import job_to_dict
    return ("# The job `trainplan export` planned, from its command-line flags.\n"
            + yaml.safe_dump(job_to_dict(job), sort_keys=False)).encode()


def export_command(args: argparse.Namespace) -> int:
    from ..export import check_out
    from ..platforms import platforms_with, select_platforms
    from ..spec import check_steps
    check_out(args.out)                       # a bad --out fails before the planning
    path = args.job_file_pos or args.job_file
    job = job_from_args(args, path)
    import sys
    show_reading(args, sys.stderr)
    if args.steps is not None:
        check_steps(args.steps)
        job = job.with_(steps=args.steps, epochs=None, dataset_size=None)
    asked_steps = job.steps            # a framework config gets max_steps only when asked for
    job = run_length(args, job)
    if args.platform and (args.gpu or args.gpus):
        raise TrainplanError("--platform and --gpu/--gpus both choose the platform.",
                             fix="give one: --platform ID, or --gpu ID --gpus N")
    if args.platform:
        platforms = select_platforms([args.platform], args.platforms_file)
    elif args.gpu:
        platforms = platforms_with(args.gpu, args.gpus, args.platforms_file)[:1]
    else:
        raise TrainplanError("No platform to export for.",
                             fix="add --platform ID (trainplan catalog platforms) or --gpu ID --gpus N")
    from ..export import launch_from_plan, render, write     # the planner: after the input is read
    from ..plan import make_plan
    plan = make_plan(job, platforms)
    pp = plan.platforms[0]
    ln = launch_from_plan(plan, pp, job, job_file=path, script=args.script)
    framework = None
    from ..export import FRAMEWORKS
    if args.to in FRAMEWORKS:
        from ..export.frameworks import Export, final_job, refuse_own_file
        framework = Export(ln, final_job(job, platforms[0], pp), args.config_reading,
                           asked_steps)
    files = render(ln, args.to, job_text=job_bytes(path, job), dataset=args.dataset,
                   spot=args.spot, install=args.install, framework=framework)
    if framework is not None:
        refuse_own_file(files, args.out, [path, args.deepspeed, args.accelerate])
    written = write(files, args.out, force=args.force)
    for p in written:
        print(p)
    return 0
