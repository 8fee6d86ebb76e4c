"""Time `trainplan plan` on the README's and examples' plans and on a 70B job over every platform
(issue 18's target: each under 10 s on 2 cores).

Run: python scripts/bench_plan.py [--repeat N] [--only SUBSTRING] [--split]. Each plan runs as a
fresh process, as a user runs it (text output to /dev/null), twice: "cold" on an empty trace store
(trace/store.py: a new machine, or changed code), then "warm" reading what the cold run stored (the
same job planned again, with other options or platforms), each with its wall time and the machine's
load average before it, and how many traces the cold run stored (each a step traced, or one shared
with a twin: trace/derive/twins.py); `--split` then runs GraphMER-SE over all platforms in-process,
split into tracing and the rest (planning over the platforms, ranking). Numbers depend on the
machine and on what else runs on it.

What the plans say is pinned apart from how fast they say it: tests/golden/ holds each one's JSON
(the examples', and tests/golden/bench/ the others'), compared field for field by
tests/test_golden.py; the three over every platform only with `TRAINPLAN_SLOW_GOLDEN=1 python -m
pytest tests/test_golden.py` (about 2 min on 2 cores from a cold store).
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CMD = ["trainplan", "plan", "examples/graphmer-se.yaml", "--platforms", "all"]
LLM = ["--seq-len", "2048", "--precision", "bf16-amp", "--steps", "1000", "--platforms", "all"]
PLANS = [
    ["trainplan", "plan"],                                      # the quickstart: graphmer-se.yaml
    ["trainplan", "plan", "examples/glf-cr-2xt4.yaml"],
    ["trainplan", "plan", "examples/chart-rvr-grpo.yaml"],
    ["trainplan", "plan", "examples/llama3-8b-multinode.yaml", "--gpu", "h100-sxm", "--gpus", "16"],
    CMD,
    ["trainplan", "plan", "--model", "hf:meta-llama/Llama-3.2-1B", "--batch-size", "8"] + LLM,
    ["trainplan", "plan", "--model", "hf:meta-llama/Llama-3.1-70B", "--batch-size", "1"] + LLM,
]


def split_in_process() -> str:
    from trainplan.plan import Planner, make_plan, select_platforms
    from trainplan.trace.derive import Traces
    from trainplan.spec import validate
    from trainplan.jobfile import load_job

    traced = {"s": 0.0, "inside": False}
    orig, orig_fill = Traces._real, Traces.fill

    def timed(self, *a, **kw):        # _real calls itself for an fp16 job's bf16 twin: once
        if traced["inside"]:
            return orig(self, *a, **kw)
        t0, traced["inside"] = time.perf_counter(), True
        try:
            return orig(self, *a, **kw)
        finally:
            traced["s"] += time.perf_counter() - t0
            traced["inside"] = False

    def timed_fill(self, *a, **kw):   # traces run in forked workers (trace/parallel.py)
        t0 = time.perf_counter()
        try:
            return orig_fill(self, *a, **kw)
        finally:
            traced["s"] += time.perf_counter() - t0

    Traces._real = timed
    Traces.fill = timed_fill
    try:
        job = validate(load_job("examples/graphmer-se.yaml"))
        platforms = select_platforms([])
        planner = Planner(job)
        t0 = time.perf_counter()
        plan = make_plan(job, platforms, planner=planner)
        total = time.perf_counter() - t0
    finally:
        Traces._real = orig
        Traces.fill = orig_fill
    return (f"in-process: {len(plan.platforms)} platforms, {planner.traces.traced} traces, "
            f"{total:.2f} s = {traced['s']:.2f} s tracing + {total - traced['s']:.2f} s planning; "
            f"winner {plan.winner}")


def _command() -> str:
    """`trainplan` on PATH, else the one beside this interpreter (a virtual environment run
    without activating it)."""
    beside = os.path.join(os.path.dirname(sys.executable), "trainplan")
    return shutil.which("trainplan") or beside


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--only", help="run the plans whose command line contains this")
    ap.add_argument("--split", action="store_true", help="also the in-process split of GraphMER-SE")
    args = ap.parse_args()
    from trainplan.trace.parallel import workers_available
    print(f"{os.cpu_count()} CPUs, {workers_available()} tracing at once; target 10 s each")
    for cmd in PLANS:
        line = " ".join(cmd)
        if args.only and args.only not in line:
            continue
        for i in range(args.repeat):
            with tempfile.TemporaryDirectory() as store:   # cold: an empty trace store
                env = dict(os.environ, TRAINPLAN_TRACE_CACHE=store)
                for run in ("cold", "warm"):
                    load = os.getloadavg()[0]
                    t0 = time.perf_counter()
                    r = subprocess.run([_command()] + cmd[1:], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.PIPE, text=True, env=env)
                    wall = time.perf_counter() - t0
                    status = ("ok" if r.returncode == 0
                              else f"exit {r.returncode}: {r.stderr.strip()[-300:]}")
                    if run == "cold":     # what the cold run stored: its traces, and the
                        status += f", {len(list(Path(store).glob('*.trace')))} traces stored"
                    print(f"{wall:7.2f} s  {run}  load {load:.2f}  {line} ({status})", flush=True)
    if args.split:
        print(split_in_process())
    return 0


if __name__ == "__main__":
    sys.exit(main())
