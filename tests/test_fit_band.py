"""The verdict's band (predict/memory.py): a job within the band of the device's capacity is
tight, not a plain fit; a job that fits only because the allocator gives its cache back is
flagged; `estimate --format json` says which, with `fit_margin`; a plan does not call it READY."""
from __future__ import annotations

from dataclasses import replace

import pytest

from trainplan.accelerators import get_accelerator
from trainplan.estimate import estimate, to_json
from trainplan.plan.result import READY, READY_WITH_CHANGES, TIGHT
from trainplan.plan.verdict import assess
from trainplan.predict import Traces, evaluate
from trainplan.predict.memory import fit_band
from trainplan.spec import Job, validate

# BERT-base: large enough that the caching allocator holds more than the step needs
JOB = validate(Job(model="hf:google-bert/bert-base-uncased", batch_size=4, seq_len=128,
                   precision="fp16-amp", gpu="rtx-3090"))


@pytest.fixture(scope="module")
def traces():
    return Traces()


@pytest.fixture(scope="module")
def held(traces):
    m = evaluate(JOB, get_accelerator("rtx-3090"), traces=traces).memory
    assert m.required_bytes < m.held_bytes       # the allocator caches something here
    return m


def _on(capacity: int):
    return replace(get_accelerator("rtx-3090"), usable_memory_bytes=int(capacity))


def test_band_is_sourced_and_small():
    assert 0 < fit_band() <= 0.1


def test_ninety_nine_percent_of_capacity_is_tight(traces, held):
    ev = evaluate(JOB, _on(held.held_bytes / 0.99), traces=traces)
    assert ev.fits and ev.tight and ev.memory.fit_state == "tight"
    assert ev.memory.fit_margin == pytest.approx(0.01, abs=1e-4)
    assert any(f.kind == "memory" and "tight" in f.message for f in ev.findings)
    d = to_json(estimate(JOB, _on(held.held_bytes / 0.99), traces=traces, with_max_batch=False))
    assert d["fits"] is True and d["fit"] == "tight" and d["fit_margin"] < fit_band()


def test_fits_only_by_releasing_the_cache_is_flagged(traces, held):
    """Capacity between what the step needs (allocated + pinned) and what it would hold."""
    cap = (held.required_bytes + held.held_bytes) // 2
    ev = evaluate(JOB, _on(cap), traces=traces)
    assert ev.fits and ev.tight and ev.memory.fit_margin < 0
    assert any("give cached memory back" in f.message for f in ev.findings)


def test_room_beyond_the_band_fits(traces, held):
    ev = evaluate(JOB, _on(held.held_bytes / (1 - 2 * fit_band())), traces=traces)
    assert ev.fits and not ev.tight and ev.memory.fit_state == "fits"
    assert not any(f.kind == "memory" for f in ev.findings)


def test_does_not_fit_is_not_tight(traces, held):
    ev = evaluate(JOB, _on(held.required_bytes * 0.9), traces=traces)
    assert not ev.fits and not ev.tight and ev.memory.fit_state == "does not fit"


def test_largest_micro_batch_with_margin_is_at_most_the_largest(traces):
    est = estimate(JOB, get_accelerator("rtx-3050-laptop-4gb"), traces=traces)
    assert est.max_batch_size_with_margin <= est.max_batch_size
    at = evaluate(JOB.with_(batch_size=est.max_batch_size_with_margin),
                  get_accelerator("rtx-3050-laptop-4gb"), traces=traces)
    assert not at.tight and at.fits


class _Cfg:
    """What verdict.assess reads of a planned configuration."""

    def __init__(self, ev):
        self.evaluation, self.memory, self.findings, self.job = ev, ev.memory, ev.findings, ev.job
        self.micro_batch, self.grad_accum, self.interpolated = ev.job.batch_size, 1, False
        self.host_ok = None


class _Platform:
    is_current, devices, cpu_cores, ram_bytes = True, 1, None, None


@pytest.mark.parametrize("margin,verdict", [(0.01, TIGHT), (2 * fit_band(), READY)])
def test_plan_verdict_uses_the_band(traces, held, margin, verdict):
    ev = evaluate(JOB, _on(held.held_bytes / (1 - margin)), traces=traces)
    got, items, fail = assess(_Platform(), JOB, _Cfg(ev), [], None, None, None, 1, None, None,
                              JOB.batch_size, headroom=["activation checkpointing (full)"])
    assert got == verdict and not fail
    assert got != READY_WITH_CHANGES
    if verdict == TIGHT:
        assert any("for headroom" in i.text for i in items)
