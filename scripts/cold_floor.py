"""How long a cold plan takes before any fix-ladder rung: the plan with every trace but its base
step's already in the trace store (trace/store.py).

Run: python scripts/cold_floor.py [trainplan plan arguments]
     (default: the 70B job over every platform that scripts/bench_plan.py runs)

It plans once on an empty store (cold), removes from that store the traces of the job's own
step (what the plan traces first: read off the stored traces as those with no checkpointed
block, no LoRA module and the job's sequence length; a rung that changed only the optimizer
would pass too, which the default job's ladder does not have: its 8-bit rung comes after full
checkpointing), then plans again twice: the time of the second run is what a plan costs
when every rung it climbs is free and only its first round is traced (python, torch and
trainplan start-up, the first trace in each worker with its imports, planning the platforms,
output); the third, everything stored, is the warm time. Each run is a fresh process, output to
/dev/null; this machine's load average is printed beside each time.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

from trainplan.trace import store

DEFAULT = ["--model", "hf:meta-llama/Llama-3.1-70B", "--batch-size", "1", "--seq-len", "2048",
           "--precision", "bf16-amp", "--steps", "1000", "--platforms", "all"]


def _plan(args: list[str], folder: str) -> float:
    env = dict(os.environ, **{store.ENV: folder})
    t0 = time.perf_counter()
    subprocess.run([shutil.which("trainplan") or "trainplan", "plan", *args, "--quiet"], env=env,
                   stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def _base_step(tr, seq_len: int | None) -> bool:
    """The job's own step: no rung of the fix ladder applied to it (a training step: a
    generation forward holds no optimizer state)."""
    return (not tr.checkpointed_blocks and not tr.lora_modules and tr.seq_len == seq_len
            and tr.optimizer_state_bytes > 0)


def main() -> int:
    args = sys.argv[1:] or DEFAULT
    seq = int(args[args.index("--seq-len") + 1]) if "--seq-len" in args else None
    folder = tempfile.mkdtemp(prefix="trainplan-floor-")
    try:
        print(f"{_plan(args, folder):7.2f} s  cold  load {os.getloadavg()[0]:.2f}", flush=True)
        os.environ[store.ENV] = folder
        removed = 0
        for path in list(os.scandir(folder)):
            tr = store.load(path.name.removesuffix(".trace"))
            if tr is not None and _base_step(tr, seq):
                os.remove(path.path)
                removed += 1
        load = os.getloadavg()[0]
        print(f"{_plan(args, folder):7.2f} s  only the base step traced ({removed} traces)  "
              f"load {load:.2f}", flush=True)
        load = os.getloadavg()[0]
        print(f"{_plan(args, folder):7.2f} s  warm  load {load:.2f}", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
