"""Time what a plan's own process does with a step read off another (an accumulated step,
trace/derive/accumulate.py): the whole stack's events (derive/repeat.py `_emit`) and the caching
allocator's replay of them (derive/allocator.py), this checkout's code beside another's.

Run: python scripts/replay_cost.py [--against OTHER_SRC] [HF_ID ...]
     (default: Llama-3.2-1B and Llama-3.1-8B; OTHER_SRC: another checkout's src/, e.g. a
     `git worktree add /tmp/old <commit>`'s /tmp/old/src)

Each model's step (micro-batch 2, sequence 1024, bf16 AMP, full checkpointing, LoRA rank 16, an
A100's kernels) is traced once cut to 4 blocks and its accumulated step read off it. Its whole
stack's events are made and replayed (CUDA's rules) 25 times by each code, alternating, in this
one process (runs in separate processes differ by more than such a change on a 2-core machine);
the best time of each is printed, and the events and peaks must be the same.
"""
import argparse
import importlib.util
import sys
import time

from trainplan.accelerators import get_accelerator
from trainplan.predict.target import semantics_for
from trainplan.spec import Job, Lora, validate
from trainplan.trace.derive import allocator, repeat
from trainplan.trace.derive.accumulate import accumulated
from trainplan.trace.tracer import trace_step

DEFAULT = ["meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.1-8B"]
RUNS = 25


def _other(src: str, name: str):
    """`trainplan.trace.derive.<name>` from another checkout's `src`, beside this one's."""
    full = f"trainplan.trace.derive.{name}_other"
    spec = importlib.util.spec_from_file_location(full, f"{src}/trainplan/trace/derive/{name}.py")
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "trainplan.trace.derive"
    sys.modules[full] = module
    spec.loader.exec_module(module)
    return module


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", help="another checkout's src/ folder")
    ap.add_argument("models", nargs="*", default=DEFAULT)
    a = ap.parse_args()
    codes = {"this": (repeat, allocator)}
    if a.against:
        codes["other"] = (_other(a.against, "repeat"), _other(a.against, "allocator"))
    for hub_id in a.models:
        job = validate(Job(model="hf:" + hub_id, batch_size=2, seq_len=1024,
                           precision="bf16-amp", grad_checkpointing="full",
                           lora=Lora(rank=16)))
        sem = semantics_for(job, get_accelerator("a100-sxm4-80gb"))
        acc = accumulated(trace_step(job, sem, 2, depth=4))
        plan, blocks = repeat.plan_of(acc.log), acc.stack.blocks
        best = {k: [float("inf"), float("inf")] for k in codes}
        made = {}
        for _ in range(RUNS):
            for name, (rep, alloc) in codes.items():
                t = time.perf_counter()
                events = rep._emit(acc.log.events, plan, blocks)
                t1 = time.perf_counter()
                peaks = alloc.replay(events, alloc.CUDA)
                t2 = time.perf_counter()
                best[name] = [min(best[name][0], t1 - t), min(best[name][1], t2 - t1)]
                made[name] = ([tuple(e) for e in events], peaks)
        same = len({repr(v) for v in made.values()}) == 1
        print(f"{hub_id}: {len(made['this'][0])} events, peaks (allocated, reserved, pinned) "
              f"{made['this'][1]}" + ("" if len(codes) == 1 else
                                      f", the same with both codes: {'yes' if same else 'NO'}"))
        for name, (emit, rep_s) in best.items():
            print(f"  {name:5s} whole-stack events {emit * 1e3:6.1f} ms, replay {rep_s * 1e3:6.1f} ms"
                  f" (best of {RUNS})")
        if not same:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
