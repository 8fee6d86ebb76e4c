"""trainplan.guard: an interrupted run (killed at a random step after a checkpoint) resumed in a
new process reaches bit-identical weights to an uninterrupted run on CPU -- plain loop and HF
Trainer; the deadline, signal and keep-last rules."""
from __future__ import annotations

import json
import os
import random
import sys
import textwrap

import pytest
import torch

from trainplan.guard import SessionGuard, latest_hf_checkpoint

LOOP = textwrap.dedent('''
    import os, sys, torch
    from trainplan.guard import SessionGuard
    ckdir, total, kill_at, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    data = torch.Generator().manual_seed(1)          # the data position: the sampler's state
    guard = SessionGuard(ckdir, every_steps=3, keep_last=2, signals=False, log=lambda m: None)
    guard.track(model=model, optimizer=opt, scheduler=sched, data=data)
    start = guard.resume()
    for step in range(start, total):
        x = torch.randn(4, 8, generator=data)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()   # dropout draws the global RNG
        opt.zero_grad(); loss.backward(); opt.step(); sched.step()
        if guard.step(step + 1):
            break
        if step + 1 == kill_at:
            os._exit(3)                              # killed: no clean-up, no save
    torch.save({k: v for k, v in model.state_dict().items()}, out)
''')


def _forked(code: str, args) -> int:
    """Run `code` (a script) with argv `args` in a new Python process; its exit code. A new
    interpreter, not a fork of this one: a fork of a process whose torch thread pool is running
    deadlocks in the child's first parallel op (seen in the full suite). Where torchvision is
    installed but broken (a wheel for another torch: `torchvision::nms`), the child hides it,
    as transformers' Trainer would otherwise fail to import; this process is left as it is."""
    import subprocess
    shim = "import sys; sys.modules['torchvision'] = None\n" if _torchvision_broken() else ""
    r = subprocess.run([sys.executable, "-c", shim + code, *map(str, args)],
                       capture_output=True, text=True, timeout=300)
    if r.returncode not in (0, 3):
        print(r.stderr[-3000:])
    return r.returncode


class _Done:
    def __init__(self, rc):
        self.returncode, self.stderr = rc, f"exit code {rc}"


def _run(tmp_path, *args):
    return _Done(_forked(LOOP, args))


def test_plain_loop_resume_is_bit_identical(tmp_path):
    total = 13
    kill_at = random.Random().randint(4, total - 1)        # after the first checkpoint (step 3)
    ref = _run(tmp_path, tmp_path / "a", total, 0, tmp_path / "a.pt")
    assert ref.returncode == 0, ref.stderr
    killed = _run(tmp_path, tmp_path / "b", total, kill_at, tmp_path / "b.pt")
    assert killed.returncode == 3, killed.stderr
    assert not (tmp_path / "b.pt").exists()
    resumed = _run(tmp_path, tmp_path / "b", total, 0, tmp_path / "b.pt")
    assert resumed.returncode == 0, resumed.stderr
    a, b = torch.load(tmp_path / "a.pt"), torch.load(tmp_path / "b.pt")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), (k, kill_at)
    kept = sorted(p.name for p in (tmp_path / "b").iterdir())
    assert len(kept) == 2 and kept[-1] == "ckpt-000000012", kept      # keep_last=2


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


def _torchvision_broken() -> bool:
    """A torchvision wheel built for another torch fails at import (`torchvision::nms`);
    transformers' Trainer then fails too. These runs do not need it."""
    import importlib.util
    import subprocess
    if importlib.util.find_spec("torchvision") is None:
        return False
    r = subprocess.run([sys.executable, "-c", "import torchvision"], capture_output=True,
                       timeout=120)
    return r.returncode != 0


HF = textwrap.dedent('''
    import os, sys
    import torch
    from torch.utils.data import Dataset
    from transformers import Trainer, TrainingArguments, TrainerCallback
    from trainplan.guard import GuardCallback, SessionGuard, latest_hf_checkpoint
    out, total, kill_at, res = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]

    class Data(Dataset):
        def __init__(self):
            g = torch.Generator().manual_seed(1)
            self.x = torch.randn(64, 8, generator=g)
        def __len__(self): return len(self.x)
        def __getitem__(self, i): return {"x": self.x[i]}

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                           torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
        def forward(self, x):
            return {"loss": (self.net(x) - x.sum(1, keepdim=True)).pow(2).mean()}

    class Kill(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == kill_at:
                os._exit(3)

    torch.manual_seed(0)
    model = Model()
    args = TrainingArguments(output_dir=out, max_steps=total, per_device_train_batch_size=4,
                             learning_rate=1e-2, lr_scheduler_type="linear", save_strategy="no",
                             logging_strategy="no", report_to=[], use_cpu=True, seed=0,
                             dataloader_num_workers=0, disable_tqdm=True, save_only_model=False)
    guard = SessionGuard(out, every_steps=3, keep_last=2, signals=False, log=lambda m: None)
    cbs = [GuardCallback(guard)] + ([Kill()] if kill_at else [])
    trainer = Trainer(model=model, args=args, train_dataset=Data(), callbacks=cbs)
    trainer.train(resume_from_checkpoint=latest_hf_checkpoint(out))
    torch.save(model.state_dict(), res)
''')


def test_hf_trainer_resume_is_bit_identical(tmp_path):
    pytest.importorskip("transformers")

    def run(*a):
        return _Done(_forked(HF, a))
    total = 10
    kill_at = random.Random().randint(4, total - 1)
    ref = run(tmp_path / "a", total, 0, tmp_path / "a.pt")
    assert ref.returncode == 0, ref.stderr[-3000:]
    killed = run(tmp_path / "b", total, kill_at, tmp_path / "b.pt")
    assert killed.returncode == 3, killed.stderr[-3000:]
    assert latest_hf_checkpoint(tmp_path / "b") is not None
    resumed = run(tmp_path / "b", total, 0, tmp_path / "b.pt")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = torch.load(tmp_path / "a.pt"), torch.load(tmp_path / "b.pt")
    for k in a:
        assert torch.equal(a[k], b[k]), (k, kill_at)


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
