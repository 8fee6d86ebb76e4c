"""Our live-memory peak against PyTorch's own MemTracker on the same fake run (within 2%)."""
import pytest
import torch

from trainplan.spec import Job, validate
from trainplan.trace.semantics import KernelSemantics
from trainplan.trace.tracer import trace_step

from conftest import shallow


@pytest.mark.parametrize("precision,autocast", [("fp32", None), ("fp16-amp", torch.float16)])
def test_peak_matches_memtracker(precision, autocast):
    from torch.distributed._tools.mem_tracker import MemTracker
    # BERT-base's blocks, 4 of its 12 (conftest.py `shallow`), at a small batch: what is compared
    # (each allocation and free of the same fake step) does not depend on the model's size;
    # BERT-large b8 s512 took 80 s for the same check
    job = validate(Job(model=shallow("google-bert/bert-base-uncased", 4), batch_size=4, seq_len=128,
                       precision=precision, optimizer="adamw"))
    mt = MemTracker()
    tr = trace_step(job, KernelSemantics(attention="efficient", autocast_dtype=autocast),
                    extra_mode=mt)
    snap = mt.get_tracker_snapshot("peak")
    theirs = max(v["Total"] for v in snap.values())
    assert tr.peak_allocated_bytes == pytest.approx(theirs, rel=0.02)
