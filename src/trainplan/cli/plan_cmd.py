"""`trainplan plan [JOB]`: where to run a job -- fit after fixes, micro-batch and accumulation,
step time, time to finish in sessions and quota weeks, checkpoints, dollars, a verdict and
checklist per platform, and a ranking. With no JOB it plans examples/graphmer-se.yaml.

Precedence: CLI flags > YAML job file > defaults. Platforms: --platforms; else, with --gpu
and/or --gpus on the command line, the current platforms with that accelerator and that many of
it (one is built from the accelerator catalog if none has both; the job's global batch counts
those devices); else the job's `platforms:`, else every current platform of the catalog (plus
--platforms-file's).

Exit status: 0 with the plan printed, whether or not the job fits anywhere; with --check, 1 when
no platform can run it even after the fix ladder (every verdict WON'T FIT or RETIRED); 2 for bad
input. The progress display (stderr) is shown only on a terminal, and never with --quiet.
"""
from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

from ..errors import TrainplanError
from .common import add_job_flags, job_from_args, run_length, show_reading, steps_arg

DEFAULT_JOB = "examples/graphmer-se.yaml"


def plan_command_parser(sub) -> None:
    p = sub.add_parser("plan", help="plan a job over platforms: fit, fixes, time, sessions, cost, ranking",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("job_file_pos", nargs="?", metavar="JOB",
                   help=f"YAML job file, or an axolotl, LLaMA-Factory, TRL, torchtune, DeepSpeed "
                        f"or accelerate config (default: {DEFAULT_JOB})")
    p.add_argument("--platforms", help="comma-separated platform ids (trainplan catalog platforms), "
                                       "or 'all' for every current one")
    p.add_argument("--platforms-file", help="YAML file of your own platforms (added to the catalog)")
    n = p.add_mutually_exclusive_group()
    n.add_argument("--steps", type=steps_arg, help="optimizer steps to run")
    n.add_argument("--epochs", type=float, help="epochs over --dataset-size samples")
    p.add_argument("--dataset-size", type=int, help="training samples per epoch (with --epochs)")
    p.add_argument("--target-batch", type=int, help="global batch per optimizer step "
                                                     "(default: the job's batch x accumulation x devices)")
    p.add_argument("--budget", type=float, metavar="USD", help="most dollars to spend")
    p.add_argument("--deadline", type=float, metavar="HOURS", help="latest finish, in hours from now")
    p.add_argument("--optimize", choices=("time", "cost", "balanced"), default="balanced",
                   help="rank by time to finish, by dollars, or by dollars + $10/h of waiting "
                        "(default balanced)")
    # --- reports (issue 6): report/plan_output.py ---
    c = p.add_argument_group("campaign (many runs; also a `campaign:` block in the job file)")
    c.add_argument("--runs", type=int, help="plan N runs of the job: calendar time under quotas, "
                                            "cost of ownership, owned-hardware crossover")
    c.add_argument("--per", choices=("week", "month", "year"),
                   help="the runs are one week's, month's or year's work")
    c.add_argument("--electricity-price", type=float, metavar="USD_PER_KWH",
                   help="owned hardware's electricity (default: the region's household price)")
    c.add_argument("--region", help="electricity price region: us (default) or eu")
    c.add_argument("--hardware-price", type=float, metavar="USD",
                   help="owned platforms: the machine's price (default: the board's launch price)")
    c.add_argument("--lifetime-years", type=float,
                   help="owned hardware's price spread over this many years (default 3)")
    p.add_argument("--format", choices=("text", "md", "json", "html"), default="text",
                   help="stdout: text (terminal tables), md (Markdown), json (the whole plan), "
                        "html (a self-contained page)")
    p.add_argument("--report", metavar="FILE", help="also write the report to FILE: plan.md, "
                                                    "plan.html or plan.json (format from the extension)")
    p.add_argument("--force", action="store_true",
                   help="replace an existing --report file (without it one is never replaced)")
    p.add_argument("--check", action="store_true",
                   help="exit 1 when no platform can run the job, even after the fixes (every "
                        "verdict WON'T FIT or RETIRED); the plan is still printed. Exit 2 is bad input")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress display on stderr (it is shown only on a terminal anyway)")
    add_job_flags(p)
    for action in p._actions:   # the shared flags, as `plan` reads them
        if action.dest == "gpu":
            action.help = ("accelerator id (trainplan catalog): plan only on platforms with it "
                           "(with --gpus: that many of it; built if no platform has it)")
        elif action.dest == "gpus":
            action.help = ("accelerators per platform: plan only on platforms with that many "
                           "(the job's global batch counts them)")
    p.set_defaults(func=plan_command)


def _default_job() -> str:
    here = Path(DEFAULT_JOB)
    if here.exists():
        return str(here)
    repo = Path(__file__).resolve().parents[3] / DEFAULT_JOB   # editable install: <repo>/src/trainplan/cli
    if repo.exists():
        return str(repo)
    raise TrainplanError(f"No job given and {DEFAULT_JOB} is not here.",
                         fix="give a job file: trainplan plan path/to/job.yaml")


def _positive(name: str, v, integer: bool = True) -> None:
    if v is not None and (v <= 0 or (integer and int(v) != v)):
        raise TrainplanError(f"--{name} must be a positive {'integer' if integer else 'number'}, got {v}.")


def runnable(plan) -> bool:
    """Some platform runs the job (READY, READY WITH CHANGES or TIGHT), fixes applied."""
    from ..plan.result import READY, READY_WITH_CHANGES, TIGHT
    return any(p.verdict in (READY, READY_WITH_CHANGES, TIGHT) for p in plan.platforms)


def _platforms(args: argparse.Namespace, job):
    """--platforms; else --gpu/--gpus given on the command line; else the job's; else all."""
    from ..platforms import platforms_with, select_platforms
    by_accelerator = args.gpu is not None or args.gpus is not None
    if args.platforms and by_accelerator:
        raise TrainplanError("--platforms and --gpu/--gpus both choose the platforms.",
                             fix="give one: --platforms IDS, or --gpu ID [--gpus N]")
    if by_accelerator:
        return platforms_with(args.gpu, args.gpus, args.platforms_file)
    ids = [s for s in (args.platforms or "").split(",") if s.strip()] or list(job.platforms)
    if [i.strip().lower() for i in ids] == ["all"]:
        ids = []
    return select_platforms(ids, args.platforms_file)


_CAMPAIGN_FLAGS = {"runs": "runs", "per": "per", "electricity_price": "electricity_usd_per_kwh",
                   "region": "region", "hardware_price": "hardware_usd",
                   "lifetime_years": "lifetime_years"}


def campaign_spec(args: argparse.Namespace, job):
    """The job's campaign block with the campaign flags over it; None when neither asks."""
    from ..campaign import parse_campaign
    given = {key: getattr(args, flag) for flag, key in _CAMPAIGN_FLAGS.items()
             if getattr(args, flag, None) is not None}
    if job.campaign is None and not given:
        return None
    base = {} if job.campaign is None else job.campaign.to_dict()
    where = "the command line" if given else "campaign"
    return parse_campaign({**base, **given}, where)


def plan_command(args: argparse.Namespace) -> int:
    path = args.job_file_pos or (None if getattr(args, "model", None) or args.job_file
                                 or args.deepspeed or args.accelerate else _default_job())
    job = job_from_args(args, path)
    import sys
    show_reading(args, sys.stdout if args.format == "text" else sys.stderr)
    for name in ("steps", "dataset_size", "target_batch"):
        _positive(name.replace("_", "-"), getattr(args, name))
    _positive("epochs", args.epochs, integer=False)
    kw = {k: getattr(args, k) for k in ("steps", "epochs", "dataset_size", "target_batch")
          if getattr(args, k) is not None}
    if args.steps is not None:
        kw.update(epochs=None, dataset_size=None)
    elif args.epochs is not None:
        kw["steps"] = None
    job = run_length(args, job.with_(**kw))
    if job.epochs is not None and not job.steps and not job.dataset_size:
        raise TrainplanError("--epochs needs the dataset size.", fix="add --dataset-size N (samples per epoch)")
    platforms = _platforms(args, job)
    spec = campaign_spec(args, job)
    # --- reports (issue 6): progress on stderr, extras for md/json/html, then the output ---
    from ..measure.calibrate import user_calibration
    from ..plan import Planner, make_plan
    from ..plan.extras import plan_extras
    from ..report.plan_output import check_report, emit_plan, needs_curves
    from ..report.plan_rich import print_as_given, stderr_console, tracing_progress
    check_report(args.report, args.force)  # a bad extension or a kept file before the tracing
    err = stderr_console()
    display = contextlib.nullcontext(None) if args.quiet else tracing_progress(err)
    with display as progress:
        planner = Planner(job, progress=progress, calibration=user_calibration())
        # the job as written, on the terminal as soon as it is known; the rest follows
        answered = None if progress is None else lambda rows: print_as_given(rows, err)
        plan = make_plan(job, platforms, optimize=args.optimize, budget_usd=args.budget,
                         deadline_s=args.deadline * 3600 if args.deadline is not None else None,
                         planner=planner, answered=answered)
        if spec is not None:
            from ..plan.campaign import campaign_plan, variant_jobs
            variants = [(settings, plan if jv == job else make_plan(
                jv, platforms, optimize=args.optimize, budget_usd=args.budget, planner=planner))
                for settings, jv in variant_jobs(job, spec)]
            plan = campaign_plan(plan, variants, spec, platforms)
        curves = needs_curves(args.format, args.report)
        extras = plan_extras(plan, platforms, planner if curves else None)
    emit_plan(plan, extras, args.format, args.report)
    return 1 if args.check and not runnable(plan) else 0
