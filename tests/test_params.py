"""Parameter counts: ours equal the libraries' own, for every bundled config and 20+ timm models."""
import csv
from pathlib import Path

import pytest
import torch

from trainplan.models import build_model
from trainplan.models.hf_names import bundled_ids
from trainplan.spec import Job
from trainplan.errors import TrainplanError
from trainplan.trace.tracer import count_parameters

TIMM_CSV = Path(__file__).parent / "data" / "timm_param_counts.csv"


@pytest.mark.parametrize("hub_id", bundled_ids())
def test_bundled_hf_params_equal_transformers(hub_id):
    """count_parameters (what every trace reports) == transformers' own num_parameters()."""
    try:
        bundle = build_model(Job(model=f"hf:{hub_id}", seq_len=16))
    except TrainplanError as e:        # an image model reads no sequence (models/__init__.py)
        assert "reads images" in e.what
        bundle = build_model(Job(model=f"hf:{hub_id}"))
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


def _layout(module):
    """Each parameter's and buffer's name, shape, dtype and trainability, and which names share
    one tensor (tied weights)."""
    tensors = {}
    for n, p in module.named_parameters(remove_duplicate=False):
        tensors.setdefault(id(p), []).append(n)
    return ([(n, tuple(p.shape), p.dtype, p.requires_grad, p.device.type)
             for n, p in module.named_parameters(remove_duplicate=False)],
            [(n, tuple(b.shape), b.dtype) for n, b in module.named_buffers()],
            sorted(tensors.values()))


@pytest.mark.parametrize("model", [
    "hf:openai-community/gpt2", "hf:meta-llama/Llama-3.2-1B", "hf:google-t5/t5-small",
    "hf:google-bert/bert-base-uncased", "timm:vit_small_patch16_224", "torchvision:resnet18"])
def test_a_model_built_without_initialisers_is_the_model_built_with_them(model, monkeypatch):
    """models/meta.py `on_meta` skips torch's initialisers on the meta device: the model is the
    one built with them (parameters, buffers, dtypes, tied weights), and torch.nn.init's
    functions are torch's own again after it, also where the build raises."""
    import contextlib
    import sys

    from trainplan.models import custom, hf, reference_source, vision
    from trainplan.models.meta import on_meta
    job = Job(model=model, seq_len=None if model.startswith(("timm:", "torchvision:")) else 16,
              lora=None)
    skipped = build_model(job).module
    with monkeypatch.context() as m:
        for module in (hf, vision, reference_source, custom):
            m.setattr(module, "on_meta", lambda: torch.device("meta"))
        initialised = build_model(job).module
    assert _layout(skipped) == _layout(initialised)
    real = dict(vars(torch.nn.init))
    inits = {id(f) for n, f in real.items() if n.endswith("_") and callable(f)}
    others = {(m, k): v for m in sys.modules if m.startswith("torch.nn.modules.")
              for k, v in vars(sys.modules[m]).items() if id(v) not in inits}
    with contextlib.suppress(RuntimeError), on_meta():
        assert torch.nn.init.kaiming_uniform_ is not real["kaiming_uniform_"]
        assert all(vars(sys.modules[m])[k] is v for (m, k), v in others.items())  # None too
        w = torch.empty(4, 4)
        assert torch.nn.init.normal_(w) is w and w.is_meta
        real_w = torch.empty(4, 4, device="cpu")   # what `measure` builds: initialised
        assert torch.nn.init.ones_(real_w) is real_w and bool((real_w == 1).all())
        raise RuntimeError("a build that fails")
    assert dict(vars(torch.nn.init)) == real
    from torch.nn.modules import activation
    assert activation.xavier_uniform_ is real["xavier_uniform_"]
