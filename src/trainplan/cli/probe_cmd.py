"""`trainplan probe-data`: samples/s one DataLoader worker delivers on your own loader, and (with a
model and --gpu or --platform) whether that accelerator would wait for data."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import TrainplanError
from ..strategy import DDP, SINGLE
from ..units import fmt_seconds
from .common import add_job_flags, job_from_args


def probe_command_parser(sub) -> None:
    p = sub.add_parser(
        "probe-data", help="measure samples/s per DataLoader worker on a real loader",
        description="Iterate your DataLoader (or Dataset) in one process and report the samples/s "
                    "one worker delivers: the job's samples_per_s_per_worker. With a model "
                    "(--model or a job file) and --gpu or --platform, also say whether the "
                    "accelerator would wait for data.")
    p.add_argument("job_file_pos", nargs="?", metavar="JOB", help="YAML job file (optional)")
    p.add_argument("--loader", required=True,
                   help="py:<module or file.py>:<factory>; the factory takes no arguments and "
                        "returns a DataLoader, a Dataset or an iterable of batches")
    add_job_flags(p)
    p.add_argument("--num-workers", type=int, help="DataLoader workers of the training job")
    p.add_argument("--platform", help="platform id (trainplan catalog platforms): its accelerator "
                                      "and CPU cores")
    p.add_argument("--seconds", type=float, default=10.0, help="measuring budget (default 10)")
    p.add_argument("--max-batches", type=int, default=200, help="at most this many batches")
    p.add_argument("--warmup", type=int, default=2, help="batches not timed (default 2)")
    p.add_argument("--workers", type=int, help="also time the loader with this many worker "
                                               "processes (scaling check)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=probe_command)


def probe_command(args: argparse.Namespace) -> int:
    from ..dataprobe import load_loader, probe
    for name in ("seconds", "max_batches", "workers", "num_workers"):
        v = getattr(args, name)
        if v is not None and v < (0 if name == "num_workers" else 1e-9):
            raise TrainplanError(f"--{name.replace('_', '-')} must be positive, got {v}.")
    job_file = args.job_file_pos or args.job_file
    base = Path(job_file).resolve().parent if job_file else Path.cwd()
    obj = load_loader(args.loader, base)
    res = probe(obj, args.loader, batch_size=args.batch_size, warmup=args.warmup,
                max_batches=args.max_batches, max_s=args.seconds, workers=args.workers)
    out = {"probe": res.to_json(), "estimate": None}
    if job_file or args.model:
        out["estimate"] = _estimate_with(args, job_file, res.samples_per_s_per_worker)
    if args.format == "json":
        print(json.dumps(out, indent=2))
        return 0
    print(f"{res.loader}: {res.samples} samples in {res.batches} batches, "
          f"{fmt_seconds(res.seconds)} (after {args.warmup} warm-up batches, "
          f"{fmt_seconds(res.warmup_s)})")
    print(f"samples_per_s_per_worker: {res.samples_per_s_per_worker:.4g}")
    if res.workers:
        print(f"with {res.workers} workers: {res.samples_per_s_with_workers:.4g} samples/s "
              f"(scaling efficiency {res.scaling_efficiency:.0%})")
    for n in res.notes:
        print(f"note: {n}")
    est = out["estimate"]
    if est:
        verdict = (f"waits {fmt_seconds(est['data_wait_s'])} per step for data"
                   if est["data_wait_s"] > 0 else "does not wait for data")
        print(f"{est['accelerator']} x{est['devices']}, {est['workers_per_loader']} worker(s) per "
              f"loader: step {fmt_seconds(est['step_time_s'])}, {verdict}; input pipeline "
              f"{est['loader_samples_per_s']:.4g} samples/s per loader")
        for n in est["notes"]:
            print(f"note: {n}")
    else:
        print(f"add to your job: samples_per_s_per_worker: {res.samples_per_s_per_worker:.4g}")
    return 0


def _estimate_with(args, job_file, rate: float) -> dict:
    """Step time of the job with the measured rate: does the accelerator wait for data?"""
    from ..accelerators import get_accelerator
    from ..predict import Traces, semantics_for
    from ..predict.timing import estimate_step_time, input_pipeline
    job = job_from_args(args, job_file)
    cores = None
    gpu = job.gpu
    if args.platform:
        from ..platforms import get_platform
        plat = get_platform(args.platform)
        cores, gpu = plat.cpu_cores, plat.accelerator_id
        if job.gpus == 1 and plat.accelerator_count > 1 and not args.gpus:
            job = job.with_(gpus=plat.accelerator_count,
                            strategy=DDP if job.strategy is SINGLE else job.strategy)
    if not gpu:
        raise TrainplanError("probe-data with a model needs an accelerator.",
                             fix="add --gpu ID or --platform ID (trainplan catalog)")
    kw = {"samples_per_s_per_worker": rate, "gpu": gpu}
    if args.num_workers is not None:
        kw["num_workers"] = args.num_workers
    job = job.with_(**kw)
    accel = get_accelerator(gpu)
    tr = Traces().exact(job, semantics_for(job, accel), job.batch_size)
    st = estimate_step_time(tr, accel, job, cpu_cores=cores)
    pipe = input_pipeline(job, st.n_devices, accel, cores)
    return {"accelerator": accel.id, "devices": st.n_devices, "step_time_s": st.step_time_s,
            "data_wait_s": st.breakdown_s["data_wait"], "bound": st.bound,
            "workers_per_loader": pipe.workers, "loader_samples_per_s": pipe.samples_per_s,
            "notes": list(pipe.notes)}
