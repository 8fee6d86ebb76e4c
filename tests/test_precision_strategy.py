"""Precision and strategy are types parsed once (precision.py, strategy.py): every spelling means
one thing, the seeds' `mixed_precision: fp16` is mixed precision, and docs/design.md lists them all."""
from pathlib import Path

import pytest

from trainplan import precision as P
from trainplan import strategy as S
from trainplan.errors import TrainplanError
from trainplan.spec import Job
from trainplan.jobfile import job_from_dict

README = Path(__file__).resolve().parents[1] / "docs" / "design.md"     # the README points there


def test_one_word_two_meanings_are_told_apart():
    seed = job_from_dict({"model": "hf:openai-community/gpt2", "run": {"mixed_precision": "fp16"}})
    flat = job_from_dict({"model": "hf:openai-community/gpt2", "precision": "fp16"})
    assert seed.precision is P.FP16_AMP and seed.precision.amp and not seed.precision.pure_half
    assert flat.precision is P.FP16 and flat.precision.pure_half and not flat.precision.amp
    assert "mixed precision" in seed.precision.label and "pure fp16" in flat.precision.label


def test_every_spelling_parses_to_its_precision_and_round_trips():
    for p in P.ALL:
        for s in p.spellings:
            assert P.parse(s) is p and P.parse(s.upper()) is p
        assert Job(precision=p.name).precision is p and str(p) == p.name


def test_what_each_precision_stores_and_computes():
    assert (P.BF16_AMP.stored, P.BF16_AMP.compute, P.BF16_AMP.autocast) == ("float32", "bf16", "bfloat16")
    assert (P.FP16.stored, P.FP16.autocast, P.FP16.loss_scaling) == ("float16", None, True)
    assert P.TF32.full and P.FP32.full and not P.BF16.full
    assert P.BF16_AMP.with_compute("fp16") is P.FP16_AMP and P.BF16.with_compute("fp16") is P.FP16


def test_bad_precision_and_strategy_are_clear_errors_with_close_matches():
    with pytest.raises(TrainplanError, match="bf16-amp"):
        P.parse("bf16-ampp")
    with pytest.raises(TrainplanError, match="zero3"):
        S.parse("zero-4")
    # accelerate's `mixed_precision: fp8` is what it auto-detects first: torchao (issue 42)
    assert P.parse("fp8", mixed=True) is P.FP8_AO_TENSORWISE


def test_strategy_owns_what_each_device_holds():
    assert S.ZERO1.shards_optimizer and not S.ZERO1.shards_gradients
    assert S.ZERO2.shards_gradients and not S.ZERO2.shards_weights
    assert S.ZERO3.shards_weights and S.FSDP.shards_weights and S.FSDP.order == S.ZERO3.order
    assert S.DDP.replicated and S.DP.replicated and not S.ZERO1.replicated
    assert S.parse("deepspeed_zero3") is S.ZERO3 and Job(strategy="fsdp").strategy is S.FSDP


def test_readme_lists_every_accepted_spelling():
    text = README.read_text()
    for name, spellings, meaning in P.spellings_table():
        assert f"| {name} | {spellings} | {meaning} |" in text, name


def test_a_job_changed_with_with_is_the_one_replace_builds():
    """Job.with_ (thousands a plan) builds what dataclasses.replace does: the parsed fields
    parsed from any spelling, the rest as given, equal and of equal hash; an unknown field is
    refused as replace refuses it."""
    from dataclasses import replace
    job = Job(model="hf:meta-llama/Llama-3.2-1B", seq_len=128, precision="bf16-amp")
    for kw in ({"precision": "fp16-mixed"}, {"optimizer": "adamw-8bit", "batch_size": 4},
               {"strategy": "zero3", "offload": "optimizer"}, {"quantize": "nf4"},
               {"grad_checkpointing": "full", "gpus": 2}):
        mine, theirs = job.with_(**kw), replace(job, **kw)
        assert mine == theirs and hash(mine) == hash(theirs) and repr(mine) == repr(theirs)
        assert mine.precision is theirs.precision and mine.strategy is theirs.strategy
    assert job.with_(precision="fp16-mixed").precision.name == "fp16-amp"
    assert job.precision.name == "bf16-amp"                 # the original unchanged
    with pytest.raises(TypeError, match="bogus"):
        job.with_(bogus=1)
