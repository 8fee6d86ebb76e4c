"""The console-script entry (`trainplan.cli.main:run`) in a real process: output complete, exit
codes kept, and no worker left behind by its `os._exit` (a leftover worker would hold the pipe
open and `communicate` would time out)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from plan_examples import TINY


def trainplan(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainplan.cli.main", *argv],
                          capture_output=True, text=True, timeout=timeout, env=dict(os.environ))


def test_output_is_complete_and_exit_0():
    r = trainplan("catalog")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) > 20 and "h100" in r.stdout.lower()


def test_bad_input_exits_2_with_one_message():
    r = trainplan("inspect", "hf:bert-larg-uncased")
    assert r.returncode == 2
    assert r.stderr.startswith("trainplan: error:") and "Traceback" not in r.stderr


def test_plan_with_worker_pool_ends_cleanly(tmp_path, monkeypatch):
    job = tmp_path / "tiny.yaml"
    job.write_text(TINY)
    monkeypatch.setenv("TRAINPLAN_JOBS", "2")  # the fork pool even on a 1-core runner
    r = trainplan("plan", str(job), "--platforms", "kaggle-t4x2,colab-free-t4", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["platforms"]) == 2
