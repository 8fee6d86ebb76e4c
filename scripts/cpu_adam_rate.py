"""How many parameters a second one CPU core updates with Adam: the rate data/offload.json's
`cpu_adam_params_per_s_per_core` comes from (predict/offload.py: ZeRO-Offload's update).

Run: python scripts/cpu_adam_rate.py [--params N] [--repeat K]. Times `torch.optim.AdamW` on fp32
CPU tensors, fused (torch's vectorised CPU kernel, what DeepSpeed's CPUAdam is in kind: one
SIMD pass over parameter, gradient and both moments), foreach (torch's multi-tensor loop) and
loop (`foreach=False`: the single-tensor loop, what torch.optim.AdamW runs by default on CPU
tensors, as under FSDP's CPU offload), on 1 thread and on every core, and prints params/s in
all and per core. DeepSpeed says its CPUAdam is
5-7x torch.optim.Adam (deepspeed/ops/adam/cpu_adam.py docstring); the fused/foreach ratio here
is the same check on this CPU. Each update reads parameter, gradient and two moments and writes
three of them back (28 bytes per parameter), so the rate is bounded by the memory bandwidth a
core gets, not its clock: a rate, not a speed ratio.
"""
import argparse
import datetime
import os
import time

import torch

from trainplan.measure.device import cpu_model


def rate(n: int, impl: str, threads: int, repeat: int) -> float:
    torch.set_num_threads(threads)
    p = torch.nn.Parameter(torch.zeros(n))
    p.grad = torch.randn(n)
    opt = torch.optim.AdamW([p], lr=1e-3, **({"foreach": False} if impl == "loop" else
                                             {impl: True}))
    opt.step()                                   # the moments allocated, outside the timing
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        opt.step()
        best = min(best, time.perf_counter() - t0)
    return n / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=int, default=50_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"{datetime.date.today()}  {cpu_model()}, {cores} cores, torch {torch.__version__}")
    for impl in ("fused", "foreach", "loop"):
        for threads in sorted({1, cores}):
            r = rate(args.params, impl, threads, args.repeat)
            print(f"  AdamW {impl:7s} {threads} thread(s): {r / 1e6:7.0f} M params/s, "
                  f"{r / threads / 1e6:5.0f} M per core")


if __name__ == "__main__":
    main()
