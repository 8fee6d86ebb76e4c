"""Wall time and peak process memory of trainplan's inspect commands (run: python scripts/bench.py).

Each command runs in a fresh process, as a user would run it; numbers depend on the machine.
Each command starts from an empty $TRAINPLAN_HOME, so its first run also builds trainplan's caches (the
table of transformers' model modules, see trainplan.models.hf_import, and the trace store,
trace/store.py); it is reported apart as "first run", and the runs after it read what it stored
(the same model inspected again).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

COMMANDS = [
    ["trainplan", "inspect", "hf:meta-llama/Llama-2-7b-hf", "--batch-size", "1", "--seq-len", "4096"],
    ["trainplan", "inspect", "hf:google-bert/bert-large-uncased", "--batch-size", "8", "--seq-len", "512"],
]


def timed(cmd: list[str], env: dict) -> tuple[float, float, str]:
    t0 = time.perf_counter()
    pid = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(pid.pid, 0)
    wall = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_maxrss / 1024, "ok" if code == 0 else f"exit {code}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs per command after the first")
    args = ap.parse_args()
    for cmd in COMMANDS:
        with tempfile.TemporaryDirectory() as home:
            env = dict(os.environ, TRAINPLAN_HOME=home)
            first = timed(cmd, env)
            runs = [timed(cmd, env) for _ in range(args.runs)]
        walls = [r[0] for r in runs]
        status = ", ".join(sorted({r[2] for r in runs}))
        print(f"{' '.join(cmd[1:])}: {min(walls):.2f}-{max(walls):.2f} s wall over {len(runs)} "
              f"runs, max RSS {max(r[1] for r in runs):.0f} MiB ({status}); first run "
              f"(empty cache) {first[0]:.2f} s ({first[2]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
