"""Time one training-step trace of a model whole and cut to 4 blocks (trace/stack.py MIN_BLOCKS).

Run: python scripts/cut_cost.py [JOB_OR_HF_ID ...]   (default: GraphMER-SE, GPT-2, Llama-3.2-1B)

Each job is traced at micro-batch 2, fp16 AMP on a T4's kernel semantics, once to warm up, then
three times whole and three times cut; the best of the three is printed (the traces are
single-threaded Python, so the machine's load shows in them).
"""
import sys
import time

from trainplan.accelerators import get_accelerator
from trainplan.predict.target import semantics_for
from trainplan.spec import Job, validate
from trainplan.jobfile import load_job
from trainplan.trace.tracer import trace_step

DEFAULT = ["examples/graphmer-se.yaml", "openai-community/gpt2", "meta-llama/Llama-3.2-1B"]


def _job(arg: str):
    if arg.endswith((".yaml", ".yml")):
        return load_job(arg)
    return validate(Job(model="hf:" + arg, seq_len=512, precision="fp16-amp"))


def _best(job, sem, depth) -> float:
    times = []
    for _ in range(3):
        t = time.perf_counter()
        trace_step(job, sem, 2, depth=depth)
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> int:
    for arg in sys.argv[1:] or DEFAULT:
        job = _job(arg)
        sem = semantics_for(job, get_accelerator("t4"))
        trace_step(job, sem, 2)
        trace_step(job, sem, 2, depth=4)
        print(f"{arg}: whole {_best(job, sem, None):.2f} s, cut to 4 blocks "
              f"{_best(job, sem, 4):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
