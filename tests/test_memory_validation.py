"""The memory validation on two published rows (scripts/validate_memory.py runs them all).

HF "Efficient Training on a Single GPU" (2022), bert-large-uncased, seq 512, V100-SXM2-16GB, NVML
used after training: gradient accumulation bs 1 x 4 (8681 MiB) and the same with gradient
checkpointing, fp16 AMP and Adafactor (4847 MiB). Target of the issue: within 10%.
"""
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def vm():
    spec = importlib.util.spec_from_file_location("validate_memory",
                                                  ROOT / "scripts" / "validate_memory.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["validate_memory"] = mod      # dataclasses resolve annotations through it
    spec.loader.exec_module(mod)
    return mod


def test_every_source_row_becomes_a_case(vm):
    hf, _ = vm.hf_cases()
    llm, skipped = vm.llm_cases()
    bert = [c for c in hf if c.source == "hf"]
    peft = [c for c in hf if c.source == "peft"]
    assert len(bert) == 10                               # nine configurations + Accelerate loop
    assert len(peft) == 9 and {c.figure for c in peft} == {"fits"}   # 3 models x 3 techniques
    assert sum(c.measured == 0.0 for c in peft) == 2     # full fine-tuning of mt0-xxl, bloomz
    assert {c.job["optimizer"] for c in bert} == {"adamw", "adafactor", "adamw-8bit"}
    assert {c.source for c in llm} == {"litgpt", "torchtune", "torchtitan"}
    assert all(s.reason for s in skipped)
    assert vm.next_larger(256) == 384 and vm.next_larger(12) == 16 and vm.next_larger(512) is None


@pytest.mark.parametrize("label, measured_mib", [
    ("gradient accumulation (bs 1, ga 4)", 8681),
    ("grad accum + grad checkpointing + fp16 + Adafactor (bs 1, ga 4)", 4847),
])
def test_bert_large_v100_within_ten_percent(vm, label, measured_mib):
    case = next(c for c in vm.hf_cases()[0] if c.label == label)
    assert case.measured == measured_mib * 2**20      # the doc prints used // 1024**2 as "MB"
    got = vm.predict(case)
    assert "error" not in got, got.get("error")
    err = (got["device_used_bytes"] - case.measured) / case.measured
    assert abs(err) <= 0.10, f"{label}: predicted {got['device_used_bytes'] / 2**20:.0f} MiB"
