"""The published decode-throughput rows (validation/data/published_generation.csv, issue 19) and
the results file scripts/validate_generation.py wrote from them. Reads files only: nothing is
traced here (the script itself traces and predicts every row)."""
import csv
import importlib.util
import re
from datetime import date
from pathlib import Path

import pytest

from trainplan.accelerators import load_accelerators
from trainplan.models.hf_names import bundled_index

ROOT = Path(__file__).resolve().parents[1]
CSV = ROOT / "validation" / "data" / "published_generation.csv"
RESULTS = ROOT / "validation" / "results" / "generation_validation.md"
HELD_BACK = ("DeepLearningExamples", "llm-foundry", "litgpt", "torchtune", "huggingface/blog",
             "unsloth", "lambdal", "deeplearning-benchmark")


@pytest.fixture(scope="module")
def script():
    """scripts/validate_generation.py, loaded once for the module's tests (the session's trace
    store is set by then, so the script's default store is not taken)."""
    spec = importlib.util.spec_from_file_location("validate_generation",
                                                  ROOT / "scripts" / "validate_generation.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rows():
    with open(CSV, newline="") as f:
        return list(csv.DictReader(f))


def test_csv_rows_are_complete_and_sourced(script):
    rs = rows()
    assert 10 <= len(rs) <= 80
    assert len({r["id"] for r in rs}) == len(rs)
    for r in rs:
        assert r["source"].startswith("https://") and r["section"], r["id"]
        assert not any(h.lower() in r["source"].lower() for h in HELD_BACK), r["id"]
        assert date.fromisoformat(r["date"]) <= date(2026, 11, 26), r["id"]
        assert r["engine"] in script.ENGINE_MODEL, r["id"]
        assert r["precision"] in ("bf16", "fp16"), r["id"]
        assert r["metric"] in ("output_tokens_per_s", "ms_per_output_token",
                               "total_tokens_per_s"), r["id"]
        assert float(r["value"]) > 0
        assert min(int(r["batch"]), int(r["prompt_len"]), int(r["completion_len"])) >= 1


def test_gpu_and_model_ids_resolve_in_the_catalogs():
    accels, models = load_accelerators(), bundled_index()
    for r in rows():
        assert r["gpu"] in accels, r["gpu"]
        assert r["model"].startswith("hf:") and r["model"][3:].lower() in models, r["model"]


def test_results_file_lists_exactly_the_csv_rows():
    text = RESULTS.read_text()
    assert re.search(r"on \d{4}-\d{2}-\d{2} on a \S+ machine with \d+ CPU cores", text)
    listed = re.findall(r"^\| ([a-z0-9.\-]+) \| (?:hf|vllm|sglang) \|", text, re.M)
    assert sorted(listed) == sorted(r["id"] for r in rows())
    for engine in ("all", "engine: hf", "engine: vllm", "engine: sglang"):
        assert re.search(rf"^\| {engine} \| \d+ \| [\d.]+% \| [\d.]+% \|", text, re.M), engine


def test_total_tokens_metric_is_the_same_wall_time(script):
    """The Qwen3 page's speed counts prompt and generated tokens over one wall time: 6144 + 2048
    tokens at 8192 tok/s is one second, so 2048 generated tokens a second."""
    row = {"metric": "total_tokens_per_s", "value": "8192", "batch": "1", "prompt_len": "6144",
           "completion_len": "2048"}
    assert script.measured_tokens_per_s(row) == 2048.0
    row.update(metric="output_tokens_per_s")
    assert script.measured_tokens_per_s(row) == 8192.0


def test_every_engine_is_predicted_with_a_modelled_one(script):
    from trainplan.predict.generation import ENGINES
    engine_model = script.ENGINE_MODEL
    assert set(engine_model.values()) <= set(ENGINES)
    assert {r["engine"] for r in rows()} <= set(engine_model)
