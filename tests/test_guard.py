"""trainplan.guard in one process: the deadline, signal and keep-last rules, committed and
damaged checkpoints, sharded saves. A run killed and resumed in new processes reaching the
uninterrupted run's weights bit for bit (plain loop, HF Trainer, torchrun, the Trainer under
torchrun; kill -9 at random moments and inside each part of a save) is tests/test_faults.py's."""
from __future__ import annotations

import json
import os
import random

import torch

from trainplan.guard import SessionGuard, latest_hf_checkpoint


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_deadline_saves_then_stops(tmp_path):
    clock = Clock()
    lin = torch.nn.Linear(2, 2)
    g = SessionGuard(tmp_path, session_limit_s=100, every_steps=1000, margin_s=10, step_time_s=5,
                     clock=clock, signals=False, log=lambda m: None).track(model=lin)
    stops = []
    for step in range(1, 100):
        clock.t += 5
        if g.step(step):
            stops.append(step)
            break
    # stops when less than margin + 2 step times is left: at t=85 (15 s left < 10 + 2 x 5 = 20)
    assert stops == [17] and g.latest().name == "ckpt-000000017"
    assert g.time_left_s() >= 10


def test_signal_saves_and_stops(tmp_path):
    g = SessionGuard(tmp_path, every_steps=100, signals=False, log=lambda m: None)
    g.track(model=torch.nn.Linear(2, 2))
    assert not g.step(1)
    g.signalled = "SIGTERM"
    assert g.step(2) and g.latest().name == "ckpt-000000002"


def test_keep_within_disk_and_file_limits(tmp_path):
    """N kept such that N + 1 fit: the next save is written before the oldest goes."""
    g = SessionGuard(tmp_path, keep_last=10, disk_bytes=3500, file_limit=9, signals=False)
    assert g.keep_count(1000, 1) == 2          # the disk holds 3: keep 2, the next is the third
    assert g.keep_count(10, 4) == 1            # the file limit holds 2 of 4 files: keep 1
    assert g.keep_count(10, 3) == 2            # 3 of 3 files fit: keep 2
    assert g.keep_count(5000, 1) == 1          # never fewer than 1
    assert SessionGuard(tmp_path, keep_last=3, signals=False).keep_count(10**9) == 3
    # the exported kaggle-t4x2 plan's case: 1.66 GB checkpoints in 20 GB keep 11, not 12
    assert SessionGuard(tmp_path, keep_last=12, disk_bytes=20 * 10**9,
                        signals=False).keep_count(1_660_000_000) == 11


def test_from_plan_reads_limits(tmp_path):
    doc = {"session_max_s": 43200.0, "idle_timeout_s": 1200.0, "checkpoint_every_steps": 50,
           "keep_checkpoints": 4, "step_time_s": 0.5, "disk_bytes": 20e9, "output_file_limit": None}
    (tmp_path / "p.json").write_text(json.dumps(doc))
    g = SessionGuard.from_plan(tmp_path / "p.json", tmp_path / "ck", signals=False, margin_s=60)
    assert (g.session_limit_s, g.idle_timeout_s, g.every_steps, g.keep_last, g.margin_s) == (
        43200.0, 1200.0, 50, 4, 60)


def test_finish_saves_the_last_step(tmp_path):
    lin = torch.nn.Linear(2, 2)
    with SessionGuard(tmp_path, every_steps=10, signals=False, log=lambda m: None) as g:
        g.track(model=lin)
        for step in range(1, 8):
            assert not g.step(step)
    assert [s for s, _p in g.checkpoints()] == [7]            # saved on leaving the block
    g2 = SessionGuard(tmp_path, every_steps=10, total_steps=12, signals=False, log=lambda m: None)
    g2.track(model=lin)
    assert g2.resume() == 7
    for step in range(8, 13):
        g2.step(step)
    assert g2.latest().name == "ckpt-000000012"              # total_steps: the last step saved
    assert g2.finish() is None                                # nothing left to save


def test_checkpoint_without_a_marker_still_resumes(tmp_path):
    """A checkpoint an earlier guard wrote (no marker; its rename was the commit) is used."""
    lin = torch.nn.Linear(2, 2)
    old = tmp_path / "ckpt-000000005"
    old.mkdir()
    torch.save({"step": 5, "extra": {}, "objects": {"model": lin.state_dict()},
                "rng": {"python": random.getstate(), "torch": torch.get_rng_state()}},
               old / "state.pt")
    g = SessionGuard(tmp_path, signals=False, log=lambda m: None).track(model=torch.nn.Linear(2, 2))
    assert g.resume() == 5
    assert torch.equal(g._tracked["model"].weight, lin.weight)


def test_latest_hf_checkpoint_uses_only_committed_ones(tmp_path):
    from trainplan.guard.disk import sum_file, write_marker

    def folder(step, files=("model.safetensors", "trainer_state.json"), commit=True):
        p = tmp_path / f"checkpoint-{step}"
        p.mkdir()
        for f in files:
            (p / f).write_bytes(os.urandom(64))
        if commit:
            write_marker(p, step, {f: sum_file(p / f) for f in files}, 1)
        return p
    folder(1, commit=False)                     # older, complete-looking, no marker: left alone
    folder(2)
    bad = folder(3)
    (bad / "model.safetensors").write_bytes(b"")  # committed, then damaged
    folder(4, files=("model.safetensors",), commit=False)     # half-written: removed
    logs = []
    assert latest_hf_checkpoint(tmp_path, log=logs.append) == str(tmp_path / "checkpoint-2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1", "checkpoint-2",
                                                           "checkpoint-3"]
    text = "\n".join(logs)
    assert "removed checkpoint-4" in text and "checkpoint-3/model.safetensors holds 0 B" in text
    assert "checkpoint-1 has no commit marker" in text


def test_sharded_in_one_process(tmp_path):
    lin = torch.nn.Linear(3, 3)
    g = SessionGuard(tmp_path, sharded=True, signals=False, log=lambda m: None).track(model=lin)
    path = g.save(4)
    assert sorted(p.name for p in path.iterdir()) == ["state-rank00000.pt", "trainplan-commit.json"]
    g2 = SessionGuard(tmp_path, sharded=True, signals=False, log=lambda m: None)
    assert g2.track(model=torch.nn.Linear(3, 3)).resume() == 4
