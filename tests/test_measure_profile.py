"""`trainplan measure --profile`: one more step under PyTorch's profiler, its device time by the
time model's kernel classes beside the prediction's (measure/profile.py, measure/compare.py).

On CPU the profiler's device is the CPU (an op's own CPU time), which is what these tests run:
the classes partition the profiled time, the optimizer's ops are the optimizer's whatever their
names, and the prediction's classes add up to its kernels.
"""
from __future__ import annotations

import math

import pytest
import torch

from trainplan.cli.main import main
from trainplan.measure.compare import kernel_comparison
from trainplan.measure.profile import profiled_step, OPTIMIZER_RANGE, phase
from trainplan.measure.records import read_records
from trainplan.predict.timing import KERNEL_CLASS_NAMES, op_name_class

from test_measure import TINY_YAML


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINPLAN_HOME", str(tmp_path / "home"))


@pytest.mark.parametrize("name,cls", [
    ("aten::mm", "matmul"), ("aten::addmm", "matmul"), ("aten::bmm", "matmul"),
    ("aten::baddbmm", "matmul"), ("aten::cudnn_convolution", "conv"),
    ("aten::convolution_backward", "conv"), ("aten::_flash_attention_forward", "attention"),
    ("aten::_scaled_dot_product_efficient_attention_backward", "attention"),
    ("aten::_scaled_dot_product_attention_math", "elementwise"),
    ("aten::native_layer_norm_backward", "norm"), ("aten::_log_softmax", "norm"),
    ("aten::native_batch_norm", "norm"), ("aten::add_", "elementwise"),
    ("aten::copy_", "elementwise"), ("aten::_foreach_addcdiv_", "elementwise")])
def test_op_name_class(name, cls):
    assert KERNEL_CLASS_NAMES[op_name_class(name)] == cls


def test_profiled_step_partitions_its_time_and_knows_the_optimizer():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.Linear(64, 8))
    opt = torch.optim.AdamW(m.parameters(), foreach=True)
    x = torch.randn(16, 64)

    def step():
        m(x).square().mean().backward()
        with phase(OPTIMIZER_RANGE):
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)   # no Optimizer.* range of its own
            opt.step()
            opt.zero_grad(set_to_none=True)

    import contextlib
    assert isinstance(phase(OPTIMIZER_RANGE), contextlib.nullcontext)   # timed steps: no range
    prof = profiled_step(step, torch.device("cpu"))
    assert isinstance(phase(OPTIMIZER_RANGE), contextlib.nullcontext)
    by = prof["by_class_s"]
    assert set(by) == set(KERNEL_CLASS_NAMES) - {"depthwise"}
    assert math.isclose(sum(by.values()), prof["device_s"], rel_tol=1e-9)
    assert by["matmul"] > 0 and by["norm"] > 0 and by["optimizer"] > 0
    assert by["conv"] == 0 and by["attention"] == 0
    # the update's per-tensor fallbacks (lerp_, sqrt, ...) on CPU are the optimizer's, and no
    # op of the model is
    named = {o["op"]: o["class"] for o in prof["top_ops"]}
    assert all(c == "optimizer" for op, c in named.items() if op in ("aten::lerp_", "aten::sqrt"))
    assert named.get("aten::addmm", "matmul") == "matmul"


def test_measure_profile_records_and_reports_by_class(tmp_path, capsys):
    job = tmp_path / "tiny.yaml"
    job.write_text(TINY_YAML)
    out = tmp_path / "records.jsonl"
    assert main(["measure", str(job), "--steps", "2", "--warmup", "1", "--accelerator", "t4",
                 "--out", str(out), "--profile"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "by kernel class" in text and "device idle" in text and "busiest ops:" in text
    (rec,) = read_records(out)
    prof, pred = rec["measured"]["profile"], rec["predicted"]
    assert prof["device_s"] > 0 and prof["by_class_s"]["matmul"] > 0
    assert set(pred["device_by_class_s"]) == set(KERNEL_CLASS_NAMES)
    rows = {r.quantity.strip(): r for r in kernel_comparison(rec)}
    # the prediction's classes are its kernels; the rest of its step is the device waiting
    assert math.isclose(rows["kernels, all"].predicted, sum(pred["device_by_class_s"].values()))
    assert math.isclose(rows["kernels, all"].predicted + rows["device idle (host, syncs)"].predicted,
                        pred["device_step_time_s"], rel_tol=1e-9)
    assert rows["matmul"].measured == prof["by_class_s"]["matmul"]
    # scripts/measure_matrix.py --summary: a row a profiled record, a column a class
    lines = _matrix_script().kernel_lines([rec])
    assert lines[1].startswith("## Device time by kernel class")
    head, body = next(x for x in lines if x.startswith("| job")), lines[-1]
    assert head.startswith("| job | matmul |") and "device idle (host, syncs)" in head
    assert body.count("|") == head.count("|") and " / " in body


def _matrix_script():
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "scripts" / "measure_matrix.py"
    spec = importlib.util.spec_from_file_location("measure_matrix", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_measure_without_profile_has_no_kernel_rows(tmp_path):
    job = tmp_path / "tiny.yaml"
    job.write_text(TINY_YAML)
    out = tmp_path / "records.jsonl"
    assert main(["measure", str(job), "--steps", "1", "--warmup", "0", "--out", str(out),
                 "--format", "json"]) == 0
    (rec,) = read_records(out)
    assert "profile" not in rec["measured"] and kernel_comparison(rec) == []


def test_profile_refused_for_generate(capsys):
    rc = main(["measure", "--model", "hf:openai-community/gpt2", "--task", "generate",
               "--profile", "--steps", "1"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "--profile profiles a training step" in err and "drop --profile" in err
