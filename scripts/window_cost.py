"""Time one chart-rvr training-step trace with Qwen2.5-VL's vision windows run as the loop and as
one batched call (trace/windows.py), and say whether the two traces agree.

Run: python scripts/window_cost.py [GPU] [MICRO_BATCH]   (default: t4 1)

Each way is traced once to warm up and twice timed (the best printed), the text stack cut to 4
blocks as a plan traces it. Agreement: the same ops (name, phase, rerun, FLOPs, bytes, dtype,
kernel shape), allocations and memory peaks; host ops are printed side by side.
"""
import sys
import time
from collections import Counter

from trainplan.accelerators import get_accelerator
from trainplan.jobfile import load_job
from trainplan.predict.target import semantics_for
from trainplan.trace import windows
from trainplan.trace.tracer import trace_step


def _trace(job, sem, batch, loop: bool):
    real = windows._loops
    if loop:
        windows._loops = lambda cls: False
    try:
        trace_step(job, sem, batch, depth=4)
        best, tr = None, None
        for _ in range(2):
            t = time.perf_counter()
            tr = trace_step(job, sem, batch, depth=4)
            best = min(best or 1e9, time.perf_counter() - t)
        return best, tr
    finally:
        windows._loops = real


def main() -> int:
    gpu = sys.argv[1] if len(sys.argv) > 1 else "t4"
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    job = load_job("examples/chart-rvr-grpo.yaml")
    sem = semantics_for(job, get_accelerator(gpu))
    t_loop, loop = _trace(job, sem, batch, True)
    t_one, one = _trace(job, sem, batch, False)

    def ops(tr):
        return Counter((r.name, r.phase, r.recompute, r.flops, r.bytes, r.dtype, r.shape)
                       for r in tr.ops)

    same = (ops(one) == ops(loop) and one.phase_peaks == loop.phase_peaks
            and sorted(e.nbytes for e in one.log.events) ==
            sorted(e.nbytes for e in loop.log.events))
    print(f"{gpu}, micro-batch {batch}: loop {t_loop:.2f} s, batched {t_one:.2f} s; "
          f"{len(one.ops)} ops; the same ops, allocations and peaks: {'yes' if same else 'NO'}; "
          f"host ops {sum(r.host_ops for r in loop.ops)} (loop) and "
          f"{sum(r.host_ops for r in one.ops)}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
