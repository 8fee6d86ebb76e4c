"""Wall time and peak process memory of trainplan's inspect commands (run: python scripts/bench.py).

Each command runs in a fresh process, as a user would run it; numbers depend on the machine.
"""
import resource
import subprocess
import sys
import time

COMMANDS = [
    ["trainplan", "inspect", "hf:meta-llama/Llama-2-7b-hf", "--batch-size", "1", "--seq-len", "4096"],
    ["trainplan", "inspect", "hf:google-bert/bert-large-uncased", "--batch-size", "8", "--seq-len", "512"],
]


def main() -> int:
    for cmd in COMMANDS:
        t0 = time.perf_counter()
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        r = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        status = "ok" if r.returncode == 0 else f"exit {r.returncode}"
        print(f"{' '.join(cmd[1:])}: {wall:.2f} s wall, max RSS {max(rss, before) / 1024:.0f} MiB ({status})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
