"""The verdict carries its own error (predict/bands.py): the band is the 95th percentile of the
memory prediction's shortfall on validated runs of the job's regime and device class, computed
by scripts/fit_bands.py from the validation rows (never typed by hand); FITS only where what
the device holds plus the band fits, TIGHT where the band crosses the capacity, DOES NOT FIT
where the step does not fit; `estimate --format json` carries the band and the probability the
verdict rests on; a plan does not call a tight job READY."""
from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import pytest

from trainplan.accelerators import get_accelerator
from trainplan.estimate import estimate, to_json
from trainplan.plan.result import READY, READY_WITH_CHANGES, TIGHT
from trainplan.plan.verdict import assess
from trainplan.predict import Traces, bands, evaluate
from trainplan.spec import Job, Lora, validate

ROOT = Path(__file__).resolve().parents[1]
# BERT-base: large enough that the caching allocator holds more than the step needs
JOB = validate(Job(model="hf:google-bert/bert-base-uncased", batch_size=4, seq_len=128,
                   precision="fp16-amp", gpu="rtx-3090"))


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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


def test_bands_are_what_the_script_computes_from_the_validation_rows():
    fb = _script("fit_bands")
    rows = json.loads((ROOT / "validation" / "results" / "memory_rows.json").read_text())
    assert json.loads((ROOT / "src" / "trainplan" / "data" / "fit_bands.json").read_text()) == \
        fb.compute(rows)
    assert rows["as_of"] and rows["machine"] and len(rows["rows"]) >= 20
    for r in rows["rows"]:
        assert r["regime"] in bands.REGIMES and r["device_class"] in bands.DEVICE_CLASSES


def test_regimes_and_classes():
    assert bands.regime(JOB) == "plain"
    assert bands.regime(JOB.with_(lora=Lora())) == "lora"
    assert bands.regime(JOB.with_(lora=Lora(), quantize="nf4")) == "qlora"
    assert bands.regime(JOB.with_(strategy="fsdp", gpus=2)) == "sharded"
    assert bands.regime(JOB.with_(strategy="zero2", offload="optimizer")) == "offload"
    assert bands.regime(JOB, moe=True) == "moe"
    assert bands.device_class("rtx-3090") == "consumer"
    assert bands.device_class("titan-rtx") == "consumer"
    assert bands.device_class("t4") == bands.device_class("h100-sxm") == "datacenter"
    assert bands.device_class(get_accelerator("tpu-v5e-8")) == "tpu"


def test_a_class_or_regime_without_rows_takes_the_wider_band():
    """No validated runs of a cell: the larger of its regime's band and the pooled one."""
    t = bands.table()
    pooled = max(0.0, t["pooled"]["p95"])
    for reg in bands.REGIMES:
        for cls in bands.DEVICE_CLASSES:
            b = bands.band_for_ids(reg, cls)
            assert b.p95 >= 0 and b.rows == len(b.errors)
            cell = t["cells"].get(reg, {}).get(cls, {"errors": []})
            if len(cell["errors"]) < t["min_rows"] and not any(
                    t["cells"].get(r, {}).get(cls) for r in t["cells"]):
                assert b.p95 >= pooled                   # a device class nobody validated
    assert bands.band_for_ids("offload", "datacenter").p95 >= pooled or \
        len(t["regimes"].get("offload", {"errors": []})["errors"]) >= t["min_rows"]


def test_inside_the_band_is_tight(traces, held):
    cap = held.banded_bytes - 1
    ev = evaluate(JOB, _on(cap), traces=traces)
    assert ev.fits and ev.tight and ev.memory.fit_state == "tight"
    assert any(f.kind == "memory" and "tight" in f.message and "band" in f.message
               for f in ev.findings)
    d = to_json(estimate(JOB, _on(cap), traces=traces, with_max_batch=False))
    assert d["fits"] is True and d["fit"] == "tight"
    assert d["fit_band"]["p95"] == held.band.p95 and d["fit_band"]["rows"] == held.band.rows
    assert 0 <= d["fit_probability"] < 1 or held.band.p95 == 0
    assert d["per_device"]["banded_bytes"] == held.banded_bytes


def test_fits_only_by_releasing_the_cache_is_flagged(traces, held):
    """Capacity between what the step needs (allocated + pinned) and what it would hold."""
    cap = (held.required_bytes + held.held_bytes) // 2
    ev = evaluate(JOB, _on(cap), traces=traces)
    assert ev.fits and ev.tight and ev.memory.fit_margin < 0
    assert any("give cached memory back" in f.message for f in ev.findings)


def test_room_for_the_band_fits(traces, held):
    ev = evaluate(JOB, _on(held.banded_bytes), traces=traces)
    assert ev.fits and not ev.tight and ev.memory.fit_state == "fits"
    b = ev.memory.band       # at the band's edge: the runs whose shortfall is at most the p95
    assert ev.memory.fit_probability == pytest.approx(
        sum(e <= b.p95 + 1e-9 for e in b.errors) / len(b.errors), abs=1 / len(b.errors))
    assert ev.memory.fit_probability >= 0.9
    assert not any(f.kind == "memory" for f in ev.findings)


def test_does_not_fit_is_not_tight(traces, held):
    ev = evaluate(JOB, _on(held.required_bytes * 0.9), traces=traces)
    assert not ev.fits and not ev.tight and ev.memory.fit_state == "does not fit"
    assert ev.memory.fit_probability == 0.0


def test_the_probability_counts_the_runs_that_would_fit(held):
    b = held.band
    cap = held.held_bytes + int(0.5 * (held.banded_bytes - held.held_bytes))
    want = sum(held.held_bytes + e * (held.held_bytes - held.overhead_bytes) <= cap
               for e in b.errors) / len(b.errors)
    assert bands.fit_probability(held.held_bytes, held.overhead_bytes, cap, b) == want


def test_largest_micro_batch_with_the_band_is_at_most_the_largest(traces):
    est = estimate(JOB, get_accelerator("rtx-3050-laptop-4gb"), traces=traces)
    d = to_json(est)
    assert est.max_batch_size_with_margin <= est.max_batch_size
    assert d["max_batch_size_with_band"] == d["max_batch_size_with_margin"]
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


@pytest.mark.parametrize("inside,verdict", [(True, TIGHT), (False, READY)])
def test_plan_verdict_uses_the_band(traces, held, inside, verdict):
    ev = evaluate(JOB, _on(held.banded_bytes - (1 if inside else 0)), traces=traces)
    got, items, fail = assess(_Platform(), JOB, _Cfg(ev), [], None, None, None, 1, None, None,
                              JOB.batch_size, headroom=["activation checkpointing (full)"])
    assert got == verdict and not fail
    assert got != READY_WITH_CHANGES
    assert any(i.text.startswith("error band:") for i in items)
    if verdict == TIGHT:
        assert any("for headroom" in i.text for i in items)
