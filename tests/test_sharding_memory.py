"""What FSDP and DeepSpeed ZeRO keep on each device (predict/sharding.py, data/sharding.json), in
closed form on a traced tiny decoder: the units FSDP gathers, the parameters ZeRO-3 keeps
gathered, the fp32 master copy and the contiguous gradient bucket."""
from __future__ import annotations

import pytest
import torch

import trainplan.predict.sharding as sharding
from trainplan.models import build_model

from conftest import tiny_job, trace

N = 4


def _job(strategy, precision="bf16-amp", **kw):
    return tiny_job(strategy=strategy, gpus=N, precision=precision, num_layers=4, **kw)


def _phase(job, phase):
    autocast = getattr(torch, job.precision.autocast) if job.precision.autocast else None
    tr = trace(job, autocast=autocast)
    c = {k: float(v) for k, v in tr.phase_peaks[phase][1].items()}
    sharding.per_device(c, job, tr, phase, N)
    return tr, c


def _unit_and_root_bytes(job) -> tuple[int, int]:
    """By hand: the largest decoder layer's parameter bytes, and everything outside the layers,
    stored in fp32 (AMP)."""
    model = build_model(job).module
    layers = model.layers
    unit = max(sum(p.numel() * 4 for p in layer.parameters()) for layer in layers)
    inside = {id(p) for layer in layers for p in layer.parameters()}
    root = sum(p.numel() * 4 for p in {id(p): p for p in model.parameters()}.values()
               if id(p) not in inside)
    return unit, root


def test_fsdp_gathers_the_root_and_two_units_in_the_compute_dtype():
    job = _job("fsdp")
    unit, root = _unit_and_root_bytes(job)
    for phase in ("forward", "backward"):
        tr, c = _phase(job, phase)
        assert tr.largest_block_param_bytes == unit and tr.root_param_bytes == root
        # fp32 shards, bf16 all-gathers: the root stays unsharded, two units are in flight
        assert c["weight_casts"] == pytest.approx(root / 2 + 2 * unit / 2)
    _, opt = _phase(job, "optimizer")
    assert opt["weight_casts"] == 0


def test_fsdp_accumulation_keeps_every_unsharded_gradient():
    """accelerate / HF Trainer accumulate under no_sync: full gradients, compute dtype."""
    tr1, c1 = _phase(_job("fsdp"), "backward")
    tr2, c2 = _phase(_job("fsdp", grad_accum=2), "backward")
    extra = c2["gradients"] - c1["gradients"] - (tr2.phase_peaks["backward"][1]["gradients"]
                                                 - tr1.phase_peaks["backward"][1]["gradients"]) / N
    assert extra == pytest.approx(tr2.trainable_param_bytes / 2)


def test_zero3_gathers_at_most_what_its_settings_allow(monkeypatch):
    job = _job("zero3")
    tr, c = _phase(job, "forward")
    # a model smaller than the reuse distance stays gathered whole, in 16 bits
    assert c["weight_casts"] == pytest.approx(2 * tr.params_total)
    # a small reuse distance: the block computing + the prefetch bucket (accelerate's "auto":
    # 0.9 hidden^2) + half the reuse distance
    small = {"zero3_max_reuse_distance_elements": 20_000}
    real = sharding.value
    monkeypatch.setattr(sharding, "value", lambda k: small.get(k, real(k)))
    tr, c = _phase(job, "forward")
    block = tr.largest_block_param_bytes / 4
    assert tr.hidden_size == 64
    assert c["weight_casts"] == pytest.approx(2 * (10_000 + block + 0.9 * 64 * 64))
    assert c["weight_casts"] < 2 * tr.params_total


def test_zero_buckets_follow_accelerates_auto_values_else_deepspeeds():
    """accelerate / the HF Trainer fill "auto" DeepSpeed buckets from the hidden size; a model
    without one gets DeepSpeed's own defaults (5e8 and 5e7 elements)."""
    from dataclasses import replace
    tr = trace(_job("zero3"), autocast=torch.bfloat16)
    assert sharding._buckets(tr) == (64 * 64, pytest.approx(0.9 * 64 * 64))
    assert sharding._buckets(replace(tr, hidden_size=0)) == (5e8, 5e7)


@pytest.mark.parametrize("stage", ["zero1", "zero2", "zero3"])
def test_zero_states_are_the_papers_12_bytes_over_n(stage):
    """Rajbhandari et al. 2020: K = 12 bytes of fp32 master + Adam moments per parameter, / N
    (the traced moments are 8 bytes a parameter plus the allocator's 512-byte rounding of the
    step counters)."""
    tr, c = _phase(_job(stage), "optimizer")
    states = tr.phase_peaks["optimizer"][1]["optimizer_states"]
    assert states == pytest.approx(8 * tr.params_trainable, rel=1e-2)
    assert c["optimizer_states"] == pytest.approx((states + 4 * tr.params_trainable) / N)


def test_zero_gradient_layout_by_stage():
    tr, z1 = _phase(_job("zero1"), "backward")
    bucket = sharding._buckets(tr)[0] * 2
    _, z2 = _phase(_job("zero2"), "backward")
    _, z3f = _phase(_job("zero3"), "forward")
    p = tr.params_trainable
    live = tr.phase_peaks["backward"][1]["gradients"] / tr.gradient_bytes
    assert z1["gradients"] == pytest.approx(live * 2 * p + 2 * p / N + bucket)
    assert z2["gradients"] == pytest.approx(2 * p / N + bucket)
    assert z3f["gradients"] == pytest.approx(2 * p / N + bucket)   # stage 3 keeps its bucket
    # 16-bit model, whole for stages 1-2, / N for stage 3; no autocast copies
    assert z1["weights"] == pytest.approx(tr.phase_peaks["backward"][1]["weights"] / 2)
    assert z1["weight_casts"] == 0 and z2["weight_casts"] == 0


def test_every_default_cites_its_source():
    for key, d in sharding.defaults().items():
        assert d["source"] and "value" in d and d["unit"], key
