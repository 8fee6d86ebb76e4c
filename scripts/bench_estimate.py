"""Time estimates of one job on every catalog accelerator, once the job is traced.

A job is traced once per distinct kernel semantics (attention backend, autocast dtype); every
accelerator with the same semantics reuses that trace (predict.Traces caches them, timing.summarize
caches the op table on the trace). This script reports, per job:

    trace      wall time of the traces the sweep needs (one per distinct semantics)
    estimate   predict.evaluate(job, accel) on every accelerator, traces warm
    time only  timing.estimate_step_time on every accelerator (the step-time model alone)

    PYTHONPATH=src python scripts/bench_estimate.py [--repeat 3]

Target (issue "Step time on any accelerator"): estimate over all accelerators < 2 s per job.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

JOBS = {
    "GraphMER-SE (examples/graphmer-se.yaml)": dict(file=ROOT / "examples" / "graphmer-se.yaml"),
    "BERT-large fp16-amp b8 s512": dict(model="hf:google-bert/bert-large-uncased", batch_size=8,
                                        seq_len=512, precision="fp16-amp", optimizer="adamw"),
    # was tests/test_timing.py's wall-time assertion (benchmarks are run here, not asserted on)
    "GPT-2 124M fp16-amp b16 s1024": dict(model="hf:openai-community/gpt2", batch_size=16,
                                          seq_len=1024, precision="fp16-amp", optimizer="adamw"),
}


def load(spec: dict):
    from trainplan.spec import Job, validate
    from trainplan.jobfile import load_job
    spec = dict(spec)
    f = spec.pop("file", None)
    return validate(load_job(f).with_(**spec) if f else Job(**spec))


def bench(label: str, job, repeat: int) -> dict:
    from trainplan.accelerators import load_accelerators
    from trainplan.errors import TrainplanError
    from trainplan.predict import Traces, evaluate, semantics_for
    from trainplan.predict.timing import estimate_step_time
    accels = list(load_accelerators().values())
    traces = Traces()
    t0 = time.perf_counter()
    sems = {}
    for a in accels:
        sem = semantics_for(job, a)
        if sem.key() not in sems:
            sems[sem.key()] = traces.exact(job, sem, job.batch_size)
    t_trace = time.perf_counter() - t0
    best_est, best_time, skipped = float("inf"), float("inf"), []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for a in accels:
            try:
                evaluate(job, a, traces=traces)
            except TrainplanError as e:       # impossible combination (e.g. bnb on a TPU)
                skipped.append(f"{a.id}: {str(e).splitlines()[0]}")
        best_est = min(best_est, time.perf_counter() - t0)
        t0 = time.perf_counter()
        for a in accels:
            estimate_step_time(sems[semantics_for(job, a).key()], a, job)
        best_time = min(best_time, time.perf_counter() - t0)
    return dict(job=label, accelerators=len(accels), traces=len(sems), trace_s=t_trace,
                estimate_s=best_est, time_only_s=best_time, skipped=sorted(set(skipped)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="best of N sweeps (default 3)")
    args = ap.parse_args()
    print(f"{'job':42s} {'accels':>6s} {'traces':>6s} {'trace s':>8s} {'estimate s':>10s} "
          f"{'time-only s':>11s}")
    for label, spec in JOBS.items():
        r = bench(label, load(spec), args.repeat)
        print(f"{r['job']:42s} {r['accelerators']:6d} {r['traces']:6d} {r['trace_s']:8.2f} "
              f"{r['estimate_s']:10.3f} {r['time_only_s']:11.4f}")
        for s in r["skipped"]:
            print(f"    skipped {s}")


if __name__ == "__main__":
    main()
