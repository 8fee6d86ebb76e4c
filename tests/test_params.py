"""Parameter counts: ours equal the libraries' own, for every bundled config and 20+ timm models."""
import csv
from pathlib import Path

import pytest
import torch

from trainplan.models import build_model
from trainplan.models.hf_names import bundled_ids
from trainplan.spec import Job
from trainplan.trace.tracer import count_parameters

TIMM_CSV = Path(__file__).parent / "data" / "timm_param_counts.csv"


@pytest.mark.parametrize("hub_id", bundled_ids())
def test_bundled_hf_params_equal_transformers(hub_id):
    """count_parameters (what every trace reports) == transformers' own num_parameters()."""
    bundle = build_model(Job(model=f"hf:{hub_id}", seq_len=16))
    total, trainable = count_parameters(bundle.module)
    assert total == bundle.module.num_parameters()
    assert trainable == total


def _timm_rows():
    with TIMM_CSV.open() as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


@pytest.mark.parametrize("row", _timm_rows(), ids=lambda r: r["model"])
def test_timm_params_equal_published(row):
    """timm's published benchmark CSV (param_count in millions, 2 decimals; RTX 3090 results)."""
    bundle = build_model(Job(model=f"timm:{row['model']}", image_size=int(row["img_size"])))
    total, _ = count_parameters(bundle.module)
    assert total / 1e6 == pytest.approx(float(row["param_count_millions"]), abs=0.006)


def test_torchvision_resnet50_params():
    bundle = build_model(Job(model="torchvision:resnet50"))
    assert count_parameters(bundle.module)[0] == 25_557_032   # torchvision docs


def test_trace_reports_the_same_count():
    from conftest import trace
    job = Job(model="hf:openai-community/gpt2", batch_size=1, seq_len=64)
    assert trace(job).params_total == 124_439_808   # GPT2LMHeadModel, tied lm_head
