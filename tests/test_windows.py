"""Qwen2.5-VL's vision tower attends window by window in a Python loop; where the windows are
alike the tracer runs them as one call and records the loop's calls (trace/windows.py). Checked
against the same step traced with the loop: every op the same (name, phase, rerun or not, FLOPs,
bytes, dtype, kernel shape), the same bytes moved, the same allocations and memory peaks, host
ops within 2%. The bundled chart-rvr plan is the same field for field (tests/test_golden.py).
The model is chart-rvr's with a vision tower of 8 blocks, full attention in blocks 3 and 7 and
windows in the others, as Qwen2.5-VL-3B's 32 repeat them (full in 7, 15, 23, 31): the same
blocks, a quarter of them (tests/conftest.py `shallow`), and the text stack cut to 4 blocks.
"""
from __future__ import annotations

from collections import Counter

import pytest

from trainplan.accelerators import get_accelerator
from trainplan.jobfile import load_job
from trainplan.predict.target import semantics_for
from trainplan.trace import windows
from trainplan.trace.tracer import trace_step

from conftest import shallow

EXAMPLE = "examples/chart-rvr-grpo.yaml"
MODEL = shallow("Qwen/Qwen2.5-VL-3B-Instruct", None, vision=(8, [3, 7]))


def _ops(tr) -> Counter:
    return Counter((r.name, r.phase, r.recompute, r.flops, r.bytes, r.dtype, r.shape)
                   for r in tr.ops)


def _traced(job, gpu: str, batch: int, loop: bool, monkeypatch):
    """The step of `job` on `gpu`'s kernels, its windows batched or (loop) run one by one;
    with how many window loops ran batched."""
    calls = []
    real = windows.WindowBatch.split

    def split(self, *a, **kw):
        out = real(self, *a, **kw)
        calls.append(out is not None)
        return out

    with monkeypatch.context() as m:
        m.setattr(windows.WindowBatch, "split", split)
        if loop:
            m.setattr(windows, "_loops", lambda cls: False)
        tr = trace_step(job, semantics_for(job, get_accelerator(gpu)), batch, depth=4)
    return tr, sum(calls)


# 224 px: 16 x 16 patches, 4 windows of 16 in the 28 windowed blocks; 200 px: 14 x 14 patches,
# windows of 16, 8, 8 and 4 patches (not alike: left to the loop)
@pytest.mark.parametrize("gpu, batch, image, batched", [
    ("t4", 1, 224, True),                    # memory-efficient kernel, 4 windows
    ("a100-sxm4-40gb", 2, 224, True),        # flash; the full-attention blocks: 2 images alike
    ("t4", 1, 200, False),                   # windows of unequal length: the loop
])
def test_alike_windows_trace_as_the_loop(gpu, batch, image, batched, monkeypatch):
    job = load_job(EXAMPLE).with_(model=MODEL, image_size=image, seq_len=512)
    one, calls = _traced(job, gpu, batch, False, monkeypatch)
    assert (calls > 0) == batched
    if not batched:
        return
    loop, none = _traced(job, gpu, batch, True, monkeypatch)
    assert none == 0
    assert _ops(one) == _ops(loop)
    assert sum(r.bytes for r in one.ops) == sum(r.bytes for r in loop.ops)
    assert one.flops == loop.flops
    assert one.peak_allocated_bytes == loop.peak_allocated_bytes
    assert one.phase_peaks == loop.phase_peaks
    assert one.activation_bytes == loop.activation_bytes
    # every allocation the loop makes, of the same size (a batched output stands for the
    # loop's n); only the order of some frees differs (trace/windows.py)
    assert len(one.log.events) == len(loop.log.events)
    assert sorted(e.nbytes for e in one.log.events) == sorted(e.nbytes for e in loop.log.events)
    host, host_loop = (sum(r.host_ops for r in t.ops) for t in (one, loop))
    assert abs(host - host_loop) <= 0.02 * host_loop
