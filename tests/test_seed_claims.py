"""Seed documents' claims that are physically impossible, checked against the traced model and
the catalog's peak rates. Each test states why the claim cannot hold.

The bound used for speed: one optimizer step needs F FLOPs (forward + backward, from the trace);
`steps/s x F` cannot exceed the devices' dense peak FLOP/s (data/accelerators.csv), which no real
training reaches (MFU of 30-60% is good). A claim above 100% of peak is impossible whatever the
software does.
"""
import math
import re

import pytest

from trainplan.accelerators import get_accelerator
from trainplan.predict.target import semantics_for
from trainplan.plan.storage import checkpoint_parts
from trainplan.trace.derive import Traces
from trainplan.spec import validate
from trainplan.jobfile import load_job

from plan_examples import ROOT, example_doc

GiB = 2**30


@pytest.fixture(scope="module")
def graphmer():
    """GraphMER-SE (examples/graphmer-se.yaml) traced at micro-batches 1 and 2."""
    job = validate(load_job("examples/graphmer-se.yaml"))
    sem = semantics_for(job, get_accelerator("rtx-3050"))
    traces = Traces()
    t1, t2 = (traces.exact(job.with_(batch_size=b), sem, b) for b in (1, 2))
    # forward + backward FLOPs are linear in the batch for a fixed sequence length
    assert t2.flops_per_step == pytest.approx(2 * t1.flops_per_step, rel=1e-6)
    return job, t1, t2


def flops_per_step(t1, batch: int) -> float:
    return batch * t1.flops_per_step


def test_graphmer_10_to_25_steps_per_s_on_kaggle_t4s_exceeds_their_peak(graphmer):
    # Seeds 000/001: "Batch Size 64", "Training Speed 10-25 steps/sec" on Kaggle's T4 (and
    # "~1.8M steps" per 30 GPU hours = 16.7 steps/s; "50,000 steps ~1 hour" = 13.9 steps/s).
    _job, t1, _t2 = graphmer
    t4 = get_accelerator("t4")
    peak_two_t4 = 2 * t4.peak_flops("fp16")                     # 2 x 65 TFLOP/s fp16 tensor
    for steps_per_s, batch in ((10, 64), (1.8e6 / (30 * 3600), 64), (50_000 / 3600, 64), (10, 32)):
        need = steps_per_s * flops_per_step(t1, batch)
        assert need > peak_two_t4, (steps_per_s, batch, need / 1e12)
    # the lowest claim needs 3.5x both T4s' peak at batch 64
    assert 10 * flops_per_step(t1, 64) / peak_two_t4 > 3


def test_graphmer_5_to_8_steps_per_s_on_an_rtx_3050_exceeds_its_peak(graphmer):
    # Seed 002: RTX 3050 8GB, batch 32, fp16: "~5-8 steps/sec", "10,000 steps ~20-30 minutes".
    _job, t1, _t2 = graphmer
    gpu = get_accelerator("rtx-3050")
    need = 5 * flops_per_step(t1, 32)
    assert need > 5 * gpu.peak_flops("fp16")                    # more than 5x the card's peak
    assert 10_000 * flops_per_step(t1, 32) / gpu.peak_flops("fp16") > 3600   # > 1 h even at 100%


def test_graphmer_batch_32_in_4_gb_is_impossible(graphmer):
    # Seeds 000/002: "Batch 32: ~4 GB (fits in 8GB local)", "~90 MB per sample".
    # What backward needs alive at its start, at the lowest: fp32 weights + AdamW's two moments +
    # the activations saved for backward. Saved activations are linear in the batch.
    _job, t1, t2 = graphmer
    per_sample = t2.activation_bytes - t1.activation_bytes
    saved_32 = t1.activation_bytes + 31 * per_sample
    resident = t1.weight_bytes + t1.optimizer_state_bytes + saved_32
    assert per_sample > 4 * 90e6                                 # > 4x the seed's 90 MB a sample
    assert resident > 8 * GiB > 4e9


def test_glf_cr_checkpoint_smaller_than_its_weights_is_impossible():
    # Seed 003: "Model Parameters: ~1.2GB" and "Checkpoints: ~150MB each (trained model
    # weights)". A checkpoint holds at least the weights it restores, so both cannot be true.
    # The GLF-CR widths (G0 96, 6 blocks x 5 layers, growth 48) give ~9.5M parameters: 38 MB of
    # fp32 weights, 114 MB with Adam's moments -- the seed's 150 MB checkpoint is about right and
    # its 1.2 GB of parameters is 30x too high.
    seed_weights, seed_checkpoint = 1.2e9, 150e6
    assert seed_checkpoint < seed_weights                        # the contradiction itself
    job = validate(load_job("examples/glf-cr-2xt4.yaml"))
    t4 = get_accelerator("t4")
    tr = Traces().exact(job.with_(batch_size=1), semantics_for(job, t4), 1)
    weights, states = checkpoint_parts(tr, lora=False)
    assert weights == 4 * tr.params_total                        # fp32
    # Adam's m and v: 8 bytes a parameter, each state tensor rounded up to 512 bytes when allocated
    assert states == pytest.approx(8 * tr.params_total, rel=0.01)
    assert seed_weights / weights > 25
    assert 100e6 < weights + states < 150e6


def test_a100_10_to_20x_a_t4_exceeds_both_peak_ratios():
    # Seed 004: "A100 has ~10-20x better AI training performance" than a T4. A step is bounded by
    # compute or by memory traffic; the A100's advantage is at most the larger of its peak-FLOP/s
    # ratio (T4 held at its sustained 70 W clock) and its memory-bandwidth ratio.
    a100, t4 = get_accelerator("a100-sxm4-40gb"), get_accelerator("t4")
    flops_ratio = a100.peak_flops("fp16") / (t4.peak_flops("fp16") * t4.sustained_clock_fraction)
    bw_ratio = a100.memory_bandwidth_bytes_per_s / t4.memory_bandwidth_bytes_per_s
    assert max(flops_ratio, bw_ratio) < 10
    assert math.isclose(flops_ratio, 312 / (65 * 900 / 1590), rel_tol=1e-3)


# Seed 004 (Chart-RVR: GRPO on Qwen2.5-VL-3B, LoRA, ZeRO-3, Kaggle 2 x T4) claims ~100-150 s per
# step and ~40-50 hours for 10K samples. examples/chart-rvr-grpo.yaml plans the whole GRPO step
# (generation included); the plan is held to the catalog's physics, and docs/seeds.md says which
# claim holds.
T4_GPU = get_accelerator("t4")
COMPLETION = 768          # max_completion_length in the seed's main.py
PROMPT = 4096


def _kaggle() -> tuple[dict, dict]:
    doc = example_doc("chart-rvr-grpo")
    return doc, next(p for p in doc["platforms"] if p["platform_id"] == "kaggle-t4x2")


def floors(params: int) -> tuple[float, float]:
    """(generation, training) lower bounds in seconds per step on a T4, from the catalog alone.
    Generation: each of the 768 tokens reads the whole fp16 model (ZeRO-3 gathers it for
    generation), at most at the T4's bandwidth. Training: a LoRA step's forward and input
    gradients, 4 x params FLOPs per token of prompt + completion, at most at the fp16 peak."""
    gen = COMPLETION * 2 * params / T4_GPU.memory_bandwidth_bytes_per_s
    train = 4 * params * (PROMPT + COMPLETION) / T4_GPU.fp16_tensor_flops
    return gen, train


def test_generation_is_at_least_the_bandwidth_floor():
    doc, p = _kaggle()
    gen_floor, train_floor = floors(doc["job"]["params_total"])
    phases = p["step_phases_s"]
    assert phases["generation"] >= gen_floor
    assert phases["training"] >= train_floor
    assert sum(phases.values()) == pytest.approx(p["step_time_s"])


def test_the_seed_claims_against_the_plan_and_the_readme():
    doc, p = _kaggle()
    steps = p["steps"]
    assert steps == 10_000                      # 10,000 prompts x 2 generations / global batch 2
    gen_floor, train_floor = floors(doc["job"]["params_total"])
    # 40-50 h for the run means at most 18 s a step: below the physical floor
    floor_hours = steps * (gen_floor + train_floor) / 3600
    assert floor_hours > 50
    # the seed's own two claims disagree: 10,000 steps x 100-150 s is 278-417 h, not 40-50 h
    assert steps * 100 / 3600 > 50
    step = p["step_time_s"]
    per_step = "holds" if 100 <= step <= 150 else ("faster" if step < 100 else "slower")
    text = (ROOT / "docs" / "seeds.md").read_text()
    section = text[text.index("### Seed 004's claims"):]
    section = section[:section.index("\n## ")] if "\n## " in section else section
    m = re.search(r"predicted step on kaggle-t4x2: ([\d.]+) s", section)
    assert m and abs(float(m.group(1)) - step) <= 0.05 * step, "docs/seeds.md's step time is stale"
    assert f"100-150 s per step: {per_step}" in section
    assert "40-50 hours: does not hold" in section


def test_seed_000_year_of_work_in_the_readme_is_the_plans():
    """Seed 000's "100 training runs x 10k steps" year: examples/graphmer-se.yaml's campaign, and
    docs/seeds.md's table quotes it."""
    doc = example_doc("graphmer-se")
    c = {p["platform_id"]: p["campaign"] for p in doc["platforms"]}
    assert doc["campaign"]["runs"] == 100 and doc["campaign"]["per"] == "year"
    section = (ROOT / "docs" / "seeds.md").read_text()
    section = section[section.index("### Campaigns"):]
    kaggle, local, colab = c["kaggle-t4x2"], c["local-rtx-3050"], c["colab-pro-tpu-v5e-1"]
    assert kaggle["total_usd"] == 0 and kaggle["quota_binds"]
    assert f"{kaggle['calendar_s'] / 86400:.0f} days" in section
    assert f"${local['total_usd']:.0f}: ${local['hardware_usd']:.0f}" in section
    assert f"${local['electricity_usd']:.0f} electricity" in section
    assert f"${colab['total_usd']:.2f} (12 months)" in section
    cross = {x["platform_id"]: x["runs"] for x in local["crossovers"]}
    assert cross == {"kaggle-t4x2": None, "colab-pro-tpu-v5e-1": 1}
