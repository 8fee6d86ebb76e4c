"""`trainplan plan` on the command line: JSON contract, options, and bad input (exit 2)."""
import json

import pytest

from plan_examples import TINY, run_cli
from trainplan.cli.main import main



@pytest.fixture
def job(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(TINY)
    return str(path)


run = run_cli


def test_json_plan_has_the_contract_keys(capsys, job):
    code, out, err = run(capsys, "plan", job, "--platforms", "kaggle-t4x2,local-rtx-3090",
                         "--format", "json")
    assert code == 0, err
    d = json.loads(out)
    assert d["schema_version"] == "1.5" and d["steps"] == 100 and d["target_batch"] == 4
    assert d["winner"] in ("kaggle-t4x2", "local-rtx-3090")
    p = d["platforms"][0]
    for key in ("platform_id", "verdict", "micro_batch_size", "grad_accum", "device_used_bytes",
                "capacity_bytes", "step_time_s", "train_s", "sessions", "storage", "cost",
                "changes", "fixes", "checklist", "rank", "reason"):
        assert key in p, key
    assert {"sessions", "finish_s", "accelerator_s", "quota_weeks"} <= set(p["sessions"])
    assert {"checkpoint_bytes", "checkpoints_fit_disk"} <= set(p["storage"])
    assert {"total_usd", "usd_per_hour"} <= set(p["cost"])
    assert [x["rank"] for x in d["platforms"]] == [1, 2]
    kaggle = next(x for x in d["platforms"] if x["platform_id"] == "kaggle-t4x2")
    assert kaggle["devices"] == 2 and kaggle["strategy"] == "ddp"        # single job -> DDP on 2 GPUs
    assert any("DDP" in c for c in kaggle["changes"])


def test_text_plan_leads_with_the_recommendation(capsys, job):
    code, out, _ = run(capsys, "plan", job, "--platforms", "local-rtx-3090", "--optimize", "cost")
    assert code == 0
    head = "\n".join(out.splitlines()[:4])
    assert "local-rtx-3090" in head and "READY" in head


def test_steps_flags_override_the_job(capsys, job):
    code, out, _ = run(capsys, "plan", job, "--platforms", "local-rtx-3090", "--epochs", "2",
                       "--dataset-size", "1000", "--target-batch", "8", "--format", "json")
    d = json.loads(out)
    assert code == 0 and d["steps"] == 250 and d["target_batch"] == 8   # 2 x 1000 / 8
    assert d["steps_source"].startswith("epochs")


def test_budget_and_deadline_exclude_and_say_why(capsys, job):
    code, out, _ = run(capsys, "plan", job, "--platforms", "aws-p5.48xlarge,local-rtx-3090",
                       "--optimize", "time", "--budget", "0.01", "--format", "json")
    d = json.loads(out)
    p5 = next(x for x in d["platforms"] if x["platform_id"] == "aws-p5.48xlarge")
    assert d["winner"] == "local-rtx-3090" and p5["within_budget"] is False
    assert "over budget" in p5["reason"]


@pytest.mark.parametrize("argv, words", [
    (["--platforms", "kaggle-t4"], ["Unknown platform", "kaggle-t4x2"]),
    # a suggestion no longer offered says so (Kaggle retired its P100 on 2026-09-15)
    (["--platforms", "kaggle-p10"], ["'kaggle-p100' (retired 2026-09-15)", "'kaggle-t4x2',"]),
    (["--platforms", "local-rtx-3090", "--epochs", "2"], ["--dataset-size"]),
    (["--platforms", "local-rtx-3090", "--budget", "-1"], ["--budget"]),
    (["--platforms", "local-rtx-3090", "--steps", "0"], ["--steps"]),
])
def test_bad_options_exit_2(capsys, job, argv, words):
    try:
        code, _out, err = run(capsys, "plan", job, *argv)
    except SystemExit as e:          # a malformed value is argparse's error (cli/common.py steps_arg)
        code, err = e.code, capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    for w in words:
        assert w in err, err


def test_a_job_without_length_says_how_to_give_one(capsys, tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(TINY.replace("steps: 100\n", ""))
    code, _out, err = run(capsys, "plan", str(path), "--platforms", "local-rtx-3090")
    assert code == 2 and "--steps" in err and "--epochs" in err


PLATFORMS = """\
- id: lab-a6000x2
  name: Lab workstation
  accelerator_id: rtx-a6000
  accelerator_count: 2
  usd_per_hour: 0
"""


@pytest.mark.parametrize("text, line, words", [
    (PLATFORMS.replace("rtx-a6000", "rtx-a600"), 3, ["Unknown accelerator", "rtx-a6000"]),
    (PLATFORMS.replace("usd_per_hour: 0", "usd_per_hour: -2"), 5, [">= 0"]),
    (PLATFORMS.replace("  accelerator_count: 2\n", ""), 1, ["missing required field", "accelerator_count"]),
])
def test_bad_platforms_file_names_file_and_line_exit_2(capsys, job, tmp_path, text, line, words):
    pf = tmp_path / "mine.yaml"
    pf.write_text(text)
    code, _out, err = run(capsys, "plan", job, "--platforms-file", str(pf), "--platforms", "lab-a6000x2")
    assert code == 2 and "Traceback" not in err
    assert f"{pf}:{line}:" in err, err
    for w in words:
        assert w in err, err


def test_user_platform_is_planned(capsys, job, tmp_path):
    pf = tmp_path / "mine.yaml"
    pf.write_text(PLATFORMS)
    code, out, err = run(capsys, "plan", job, "--platforms-file", str(pf), "--platforms",
                         "lab-a6000x2", "--format", "json")
    assert code == 0, err
    p = json.loads(out)["platforms"][0]
    assert p["platform_id"] == "lab-a6000x2" and p["devices"] == 2 and p["cost"]["total_usd"] == 0


def test_catalog_lists_platforms_with_retired_dates(capsys):
    code, out, _ = run(capsys, "catalog", "platforms", "--format", "json")
    rows = {r["id"]: r for r in json.loads(out)}
    assert code == 0 and rows["kaggle-p100"]["status"] == "retired"
    assert rows["kaggle-p100"]["retired_on"] == "2026-09-15"


def test_a_trace_a_worker_fails_to_make_ends_the_plan_with_its_error(capsys, job, monkeypatch):
    """A step trace that fails in a worker (parallel.py sends its TrainplanError back) is asked
    of the cache again outside the round, which traces it once more and raises its error: the
    plan exits 2 with it. (Deferring on it again asked it for ever: a plan that never ended.)"""
    import signal

    from trainplan.errors import TrainplanError
    from trainplan.trace.derive import cache as cache_mod
    from trainplan.trace.derive import schedule as schedule_mod

    def failing(requests, followups=None, policy=None, started=None, finish=None):
        out = [TrainplanError("the model could not be traced on fake tensors: injected")
               for _ in requests]
        return (out, [None] * len(requests)) if followups and any(followups) else out

    monkeypatch.setattr(schedule_mod, "trace_all", failing)
    monkeypatch.setattr(cache_mod, "trace_all", failing)

    def stuck(*_):
        raise AssertionError("the plan did not end within 60 s")
    old = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(60)
    try:
        code, _out, err = run_cli(capsys, "plan", str(job), "--platforms", "kaggle-t4x2")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert code == 2 and "injected" in err and "Traceback" not in err
