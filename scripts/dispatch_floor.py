"""What one PyTorch op costs to run in Python on no real data: the floor under a trace's time.

Run: python scripts/dispatch_floor.py

A plan's traces run the model's real forward and backward on fake tensors (trace/tracer.py), so a
trace costs its ops x the cost of one op through PyTorch's Python-level dispatch. This times a
Llama-shaped decoder (hidden 2048, 4 layers, 2 x 2048 tokens, SDPA, fp32; the same model each
way) forward and backward three ways, best of three after a warm-up, and prints seconds and
microseconds per dispatched op:

* meta: tensors on the meta device, one counting TorchDispatchMode (the least any tracer that
  sees every op pays: PyTorch's meta kernels, no fake device);
* fake: the same under FakeTensorMode on a fake CPU device with the counting mode (what a
  fake-tensor tracer pays before it records anything);
* trainplan: `trace_step` of the same model as a job, cut to 4 blocks, as a plan traces it
  (FakeTensorMode with the tracer's cache key, its counters, memory log and shapes; a CUDA
  device's semantics: flash attention, AMP off).

The op counts differ (the meta device has its own SDPA kernel, a CPU device decomposes it), so
compare the cost per op. Issue 41's floor of a cold plan over every platform is this cost times
the ops its traces dispatch (scripts/trace_rounds.py gives the traces; docs/speed.md).
"""
from __future__ import annotations

import sys
import time

sys.modules.setdefault("torchvision", None)    # transformers' optional import; not needed here

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

HIDDEN, LAYERS, BATCH, SEQ = 2048, 4, 2, 2048


class Count(TorchDispatchMode):
    ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        Count.ops += 1
        return func(*args, **(kwargs or {}))


def _config():
    from transformers import LlamaConfig
    return LlamaConfig(hidden_size=HIDDEN, intermediate_size=4 * HIDDEN, num_hidden_layers=LAYERS,
                       num_attention_heads=16, num_key_value_heads=8, vocab_size=32000,
                       attn_implementation="sdpa")


def _model():
    from transformers import LlamaForCausalLM
    with torch.device("meta"):
        return LlamaForCausalLM(_config())


def meta_step() -> int:
    m = _model()
    ids = torch.zeros(BATCH, SEQ, dtype=torch.long, device="meta")
    Count.ops = 0
    with Count():
        m(input_ids=ids, labels=ids).loss.backward()
    return Count.ops


def fake_step() -> int:
    from torch._subclasses.fake_tensor import FakeTensorMode
    m = _model()
    with FakeTensorMode(allow_non_fake_inputs=True):
        m = m.to_empty(device="cpu")
        ids = torch.zeros(BATCH, SEQ, dtype=torch.long)
        Count.ops = 0
        with Count():
            m(input_ids=ids, labels=ids).loss.backward()
    return Count.ops


def trainplan_step() -> int:
    from trainplan.accelerators import get_accelerator
    from trainplan.predict.target import semantics_for
    from trainplan.spec import Job, validate
    from trainplan.trace.tracer import trace_step
    import json
    import tempfile
    cfg = _config().to_dict()
    cfg["num_hidden_layers"] = 8          # cut to 4 as a plan cuts it (trace/stack.py)
    cfg["architectures"] = ["LlamaForCausalLM"]
    path = tempfile.mkdtemp() + "/config.json"
    with open(path, "w") as f:
        json.dump(cfg, f)
    job = validate(Job(model=f"hf:{path}", seq_len=SEQ, batch_size=BATCH, precision="fp32"))
    sem = semantics_for(job, get_accelerator("a100-sxm4-80gb"))
    from trace_rounds import counting_ops      # scripts/, beside this one
    with counting_ops() as ops:
        trace_step(job, sem, BATCH, depth=4)
    return ops[0]


def _best(fn) -> tuple[float, int]:
    fn()
    best, ops = float("inf"), 0
    for _ in range(3):
        t = time.perf_counter()
        ops = fn()
        best = min(best, time.perf_counter() - t)
    return best, ops


def main() -> int:
    for name, fn in (("meta", meta_step), ("fake", fake_step), ("trainplan", trainplan_step)):
        s, ops = _best(fn)
        print(f"{name:10s} {s:7.3f} s  {ops:6d} ops  {s / max(ops, 1) * 1e6:6.1f} us an op")
    return 0


if __name__ == "__main__":
    sys.exit(main())
