"""Bundled Hugging Face ``config.json`` files: they parse, build on the meta device
with the installed transformers, and their parameter counts match published values.

Nothing here touches the network: configs are read from the package directory and
instantiated through ``CONFIG_MAPPING`` / ``<AutoClass>.from_config``.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

# transformers imports torchvision when installed; trainplan's shim makes a CPU-torch install
# whose torchvision C++ ops cannot load importable (see trainplan.models.vision).
from trainplan.models.vision import import_torchvision  # noqa: E402

import_torchvision(required=False)

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import CONFIG_MAPPING  # noqa: E402

CONFIG_DIR = Path(__file__).parents[1] / "src/trainplan/models/hf_configs"
INDEX = CONFIG_DIR / "index.csv"
KINDS = {"encoder", "decoder", "encoder-decoder", "vision", "vision-language"}
COLUMNS = ["hub_id", "family", "kind", "auto_class", "published_params", "params_source", "notes"]


def _rows() -> list[dict[str, str]]:
    with INDEX.open(newline="") as fh:
        return list(csv.DictReader(fh))


ROWS = _rows()
IDS = [r["hub_id"] for r in ROWS]


def _json_path(hub_id: str) -> Path:
    return CONFIG_DIR / (hub_id.replace("/", "--") + ".json")


def _load_config(hub_id: str):
    cfg = json.loads(_json_path(hub_id).read_text())
    return CONFIG_MAPPING[cfg["model_type"]](**cfg)


def test_index_columns_and_values():
    with INDEX.open(newline="") as fh:
        header = next(csv.reader(fh))
    assert header == COLUMNS
    assert len(IDS) == len(set(IDS)), "duplicate hub ids in index.csv"
    for r in ROWS:
        assert r["kind"] in KINDS, r
        assert hasattr(transformers, r["auto_class"]), r
        if r["published_params"]:
            assert int(r["published_params"]) > 0
            assert r["params_source"], f"{r['hub_id']}: published_params without params_source"


def test_at_least_40_models_bundled():
    assert len(ROWS) >= 40
    with_counts = [r for r in ROWS if r["published_params"]]
    assert len(with_counts) >= 20


def test_index_and_json_files_agree():
    on_disk = {p.name for p in CONFIG_DIR.glob("*.json")}
    indexed = {_json_path(h).name for h in IDS}
    assert on_disk == indexed


@pytest.mark.parametrize("hub_id", IDS)
def test_config_parses(hub_id):
    cfg = json.loads(_json_path(hub_id).read_text())
    assert cfg["model_type"] in CONFIG_MAPPING
    config = _load_config(hub_id)
    assert config.model_type == cfg["model_type"]


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_builds_on_meta_with_published_param_count(row):
    config = _load_config(row["hub_id"])
    auto_cls = getattr(transformers, row["auto_class"])
    with torch.device("meta"):
        model = auto_cls.from_config(config)
    n_params = sum(p.numel() for p in set(model.parameters()))  # tied weights once
    assert n_params > 0
    if row["published_params"]:
        assert n_params == int(row["published_params"]), (
            f"{row['hub_id']}: built {n_params}, published {row['published_params']}"
        )


@pytest.mark.parametrize("hub_id,arch,expected", [
    ("mosaicml/mpt-7b", "MPTForCausalLM", "MptForCausalLM"),             # remote-code spelling
    ("google-t5/t5-small", "T5WithLMHeadModel", "T5ForConditionalGeneration"),   # legacy name
    ("openai-community/gpt2", "GPT2LMHeadModel", "GPT2LMHeadModel"),
])
def test_architecture_without_a_transformers_class_maps_through_model_type(hub_id, arch,
                                                                          expected):
    """A config.json whose `architectures` names a class transformers does not have is built
    with the class of its model_type for the task the name's head suffix says."""
    from trainplan.models.hf import resolve_architecture
    cfg = json.loads(_json_path(hub_id).read_text())
    cls, note = resolve_architecture(arch, cfg["model_type"])
    assert cls.__name__ == expected
    assert (note is None) == (arch.lower() == expected.lower())
    if note:
        assert arch in note and expected in note


def test_local_config_with_legacy_architecture_estimates(tmp_path):
    from trainplan.accelerators import get_accelerator
    from trainplan.estimate import estimate
    from trainplan.spec import Job, validate
    cfg = json.loads(_json_path("google-t5/t5-small").read_text())
    cfg["architectures"] = ["T5WithLMHeadModel"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    job = validate(Job(model=f"hf:{tmp_path / 'config.json'}", batch_size=2, seq_len=64))
    est = estimate(job, get_accelerator("t4"), with_max_batch=False)
    assert est.time.step_time_s > 0
    assert any("T5WithLMHeadModel" in n for n in est.trace.notes)
