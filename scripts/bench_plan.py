"""Time `trainplan plan` for GraphMER-SE over the whole platform catalog (target: < 10 s).

Run: python scripts/bench_plan.py [--repeat N]. Each run is a fresh process, as a user runs it
(`trainplan plan examples/graphmer-se.yaml --platforms all`, text output to /dev/null); then the
same plan in-process, split into tracing and the rest (planning over the platforms, ranking).
Numbers depend on the machine and on what else runs on it; the load average is printed with them.
"""
import argparse
import os
import resource
import subprocess
import sys
import time

CMD = ["trainplan", "plan", "examples/graphmer-se.yaml", "--platforms", "all"]


def split_in_process() -> str:
    from trainplan.plan import Planner, make_plan, select_platforms
    from trainplan.predict.traces import Traces
    from trainplan.spec import load_job, validate

    traced = {"s": 0.0}
    orig = Traces.exact

    def timed(self, job, sem, batch):
        t0 = time.perf_counter()
        try:
            return orig(self, job, sem, batch)
        finally:
            traced["s"] += time.perf_counter() - t0

    orig_prefetch = Traces.prefetch

    def timed_prefetch(self, requests):   # traces run in forked workers (trace/parallel.py)
        t0 = time.perf_counter()
        try:
            return orig_prefetch(self, requests)
        finally:
            traced["s"] += time.perf_counter() - t0

    Traces.exact = timed
    Traces.prefetch = timed_prefetch
    try:
        job = validate(load_job("examples/graphmer-se.yaml"))
        platforms = select_platforms([])
        planner = Planner(job)
        t0 = time.perf_counter()
        plan = make_plan(job, platforms, planner=planner)
        total = time.perf_counter() - t0
    finally:
        Traces.exact = orig
        Traces.prefetch = orig_prefetch
    return (f"in-process: {len(plan.platforms)} platforms, {planner.traces.traced} traces, "
            f"{total:.2f} s = {traced['s']:.2f} s tracing + {total - traced['s']:.2f} s planning; "
            f"winner {plan.winner}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    from trainplan.trace.parallel import workers_available
    print(f"{' '.join(CMD)}  (load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs, "
          f"{workers_available()} tracing at once)")
    for i in range(args.repeat):
        t0 = time.perf_counter()
        r = subprocess.run(CMD, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wall = time.perf_counter() - t0
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        status = "ok" if r.returncode == 0 else f"exit {r.returncode}: {r.stderr.strip()[-300:]}"
        print(f"run {i + 1}: {wall:.2f} s wall, max RSS {rss / 1024:.0f} MiB ({status}); target 10 s")
    print(split_in_process())
    return 0


if __name__ == "__main__":
    sys.exit(main())
