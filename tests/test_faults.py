"""Issue 40, the session guard under faults: each row of the issue's table repeated, on CPU.

kill -9 at random points (random moments, and inside each step of a save) in the plain loop, the
Hugging Face Trainer, torchrun (2 processes on gloo) and the Trainer under torchrun runs a small
sample here through scripts/fault_injection.py's harness: two kills a path (one at a random
moment, one inside a part of a save), one for the Trainer under torchrun; the full sweep is the
script's, 50 points a path:

    python scripts/fault_injection.py --path plain --points 50     (and hf, torchrun, hf-torchrun)

The uninterrupted reference run of each path is made once per test session and shared by the
tests that compare against it (its weights do not depend on how checkpoints are written). A full
disk is a tmpfs of a few MB where this process may mount one (root), else a stubbed writer; the
unwritable folder is a read-only mount (root ignores permissions), else a chmod 555 folder.
"""
from __future__ import annotations

import contextlib
import errno
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from plan_examples import made_once

from trainplan.guard import COMMIT, GuardError, SessionGuard, latest_hf_checkpoint, verify
from trainplan.guard import disk as gdisk

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("fault_injection", ROOT / "scripts" / "fault_injection.py")
fi = importlib.util.module_from_spec(_spec)
sys.modules["fault_injection"] = fi          # its dataclass looks its module up
_spec.loader.exec_module(fi)


def _quiet(_msg):
    pass


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    """path -> the uninterrupted run's ({step: model CRC}, final CRC), each run once a test run:
    the first pytest-xdist worker to need it runs it and the others read it
    (tests/plan_examples.py `made_once`, as the example plans are). hf-torchrun's is the
    Trainer on 2 processes, its own; torchrun's serves --sharded too."""
    made = {}

    def run(path: str) -> str:
        case = fi.Case(path, tmp_path_factory.mktemp(f"reference-{path}"))
        return json.dumps(fi.reference(case))

    def get(path: str):
        if path not in made:
            steps, final = json.loads(made_once(f"faults-reference-{path}", lambda: run(path)))
            made[path] = {int(k): v for k, v in steps.items()}, final
        return made[path]
    return get


# --- kill -9: the sampled series (the script runs 50 points per path) ------------------------------
@pytest.mark.parametrize("path, points", [("plain", 2), ("torchrun", 2), ("hf", 2), ("hf-torchrun", 1)])
def test_kill9_leaves_a_resumable_bit_identical_state(tmp_path, path, points, reference):
    """Kills alternate: the first at a random moment, the second inside a part of a save
    (torch.save, fsync, rename, replace, rmtree); the full 50-point sweep per path is
    scripts/fault_injection.py's."""
    if path.startswith("hf"):
        pytest.importorskip("transformers")
    out = fi.run_series(path, points, seed=40, work=tmp_path, say=_quiet, ref=reference(path))
    assert out["kills"] == points and out["failures"] == [], out["failures"]


def test_hf_killed_inside_the_trainers_save(tmp_path, reference):
    """The row that failed 11 of 15: killed while the Trainer writes checkpoint-N, the
    half-written folder is never returned, is removed on resume, and the older complete one is
    used; the resumed run ends bit-identical."""
    pytest.importorskip("transformers")
    steps, final = reference("hf")
    case = fi.Case("hf", tmp_path / "run")
    case.work.mkdir()
    # torch.save calls per checkpoint: training_args.bin, optimizer, scheduler, RNG states
    assert fi.run(case, fault="save:6") == -signal.SIGKILL      # checkpoint-4: its optimizer
    ck = case.work / "ck"
    half = [p for p in ck.iterdir() if p.name.startswith("checkpoint-") and not (p / COMMIT).exists()]
    assert [p.name for p in half] == ["checkpoint-4"]
    logs = []
    assert latest_hf_checkpoint(ck, log=logs.append) == str(ck / "checkpoint-2")
    assert not (ck / "checkpoint-4").exists() and any("checkpoint-4" in m for m in logs)
    assert fi.newest_state(case)[1] == steps[2]
    assert fi.run(case) == 0
    assert fi.crc_state(torch.load(case.work / "result.pt")) == final


def test_torchrun_sharded_kill_and_resume(tmp_path, reference):
    """sharded=True (FSDP's way): each rank writes its own file into the one temporary folder,
    rank 0 commits; killed twice, the run resumes to the reference's weights."""
    steps, final = reference("torchrun")      # how checkpoints are written changes no weight
    case = fi.Case("torchrun", tmp_path / "run", extra=["--sharded"])
    case.work.mkdir()
    assert fi.run(case, kill_after=7) != 0
    assert fi.run(case, fault="rename:3") != 0
    step, crc, problem = fi.newest_state(case)
    assert problem is None and step >= 6 and crc == steps[step]
    done = sorted(p.name for p in (case.work / "ck" / f"ckpt-{step:09d}").iterdir())
    assert done == ["state-rank00000.pt", "state-rank00001.pt", COMMIT]
    assert fi.run(case) == 0
    assert fi.crc_state(torch.load(case.work / "result.pt")) == final


# --- deadlines: sessions, and several processes -------------------------------------------------
def test_deadline_sessions_resume_bit_identical(tmp_path, reference):
    """Deadline stops on a step-driven clock: 4 sessions of at most 7 steps, then the same
    weights as the uninterrupted run."""
    _steps, final = reference("plain")
    case = fi.Case("plain", tmp_path / "run", extra=["--clock", "1.0", "--limit", "8"])
    case.work.mkdir()
    for _session in range(6):
        assert fi.run(case) == 0
        if (case.work / "result.pt").exists():
            break
    stops = [ln.split() for ln in (case.work / "outcome.txt").read_text().splitlines()]
    assert [s[2:] for s in stops] == [["stopped", "7"], ["stopped", "14"], ["stopped", "21"],
                                      ["done", "24"]]
    assert fi.crc_state(torch.load(case.work / "result.pt")) == final


def test_torchrun_ranks_stop_at_the_same_step(tmp_path):
    """Rank 1's clock runs 30% fast: alone it would stop earlier; the decision is rank 0's,
    agreed every step, so both stop at the same step and neither dies in gloo."""
    case = fi.Case("torchrun", tmp_path, total=40, extra=["--clock", "1.0,1.3", "--limit", "12"])
    assert fi.run(case) == 0
    lines = sorted((case.work / "outcome.txt").read_text().splitlines())
    assert lines == ["rank 0 stopped 11", "rank 1 stopped 11"], lines
    assert (case.work / "ck" / "ckpt-000000011" / COMMIT).is_file()


def test_torchrun_sigterm_to_one_rank_stops_both(tmp_path):
    """SIGTERM to rank 1 alone (after its step 9, before the guard's check): both save step 9
    and stop there."""
    case = fi.Case("torchrun", tmp_path, total=40, extra=["--term-at", "9", "--term-rank", "1"])
    assert fi.run(case) == 0
    lines = sorted((case.work / "outcome.txt").read_text().splitlines())
    assert lines == ["rank 0 stopped 9", "rank 1 stopped 9"], lines
    assert SessionGuard(case.work / "ck", signals=False, log=_quiet).latest().name == "ckpt-000000009"


# --- signals --------------------------------------------------------------------------------------
def _start(case, *extra):
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    case.extra = list(extra)
    return subprocess.Popen(case.command(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=env)


def _wait_for(path: Path, text: str, timeout=120):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if path.exists() and text in path.read_text():
            return
        time.sleep(0.02)
    raise AssertionError(f"{text!r} never appeared in {path}")


@pytest.mark.parametrize("finish", [True, False])
def test_sigterm_after_the_loop_is_never_exit_0(tmp_path, finish):
    """The row that exited 0: SIGTERM during the work after the loop. With guard.finish() the
    last step is saved and the process ends at once with SIGTERM's status; without it, the
    guard waits for a step that never comes, says what is not saved, and ends the same way."""
    case = fi.Case("plain", tmp_path, total=23)
    p = _start(case, "--linger", "60", "--wait", "1", *(() if finish else ("--no-finish",)))
    _wait_for(tmp_path / "outcome.txt", "done")
    p.send_signal(signal.SIGTERM)
    _out, err = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGTERM, err
    assert "outside the training loop" in err
    newest = SessionGuard(tmp_path / "ck", signals=False, log=_quiet).latest().name
    assert newest == "ckpt-000000023"                  # total_steps: the last step is saved
    assert not (tmp_path / "result.pt").exists()


def test_sigterm_in_the_loop_saves_then_stops(tmp_path):
    case = fi.Case("plain", tmp_path, total=1000, every=500)
    p = _start(case)
    _wait_for(tmp_path / "progress.txt", "\n20 ")
    p.send_signal(signal.SIGTERM)
    _out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    outcome = (tmp_path / "outcome.txt").read_text().split()
    step = int(outcome[-1])
    # stopped by the signal, not run to its 1,000 steps (whose last save would pass the rest)
    assert outcome[-2] == "stopped" and 20 <= step < 1000, outcome
    assert "SIGTERM: saving at the next step" in err
    assert SessionGuard(tmp_path / "ck", signals=False, log=_quiet).latest().name == f"ckpt-{step:09d}"


# --- damaged checkpoints ----------------------------------------------------------------------
def _guard(d, **kw):
    kw.setdefault("log", _quiet)
    return SessionGuard(d, signals=False, **kw)


def _tracked(g, seed=0):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(64, 64)
    return g.track(model=lin), lin


@pytest.mark.parametrize("damage", ["truncate", "empty", "flip"])
def test_damaged_newest_falls_back_naming_the_file(tmp_path, damage):
    g, lin = _tracked(_guard(tmp_path, keep_last=3))
    g.save(1)
    want = {k: v.clone() for k, v in lin.state_dict().items()}
    with torch.no_grad():
        lin.weight.add_(1.0)
    g.save(2)
    state = tmp_path / "ckpt-000000002" / "state.pt"
    data = state.read_bytes()
    state.write_bytes({"truncate": data[: len(data) // 2], "empty": b"",
                       "flip": data[:-100] + bytes(b ^ 1 for b in data[-100:])}[damage])
    logs = []
    g2, lin2 = _tracked(_guard(tmp_path, keep_last=3, log=logs.append), seed=1)
    assert g2.resume() == 1
    assert all(torch.equal(lin2.state_dict()[k], want[k]) for k in want)
    assert any(str(state) in m and "using the checkpoint before it" in m for m in logs), logs
    g2.save(2)                                      # the damaged one is replaced
    assert verify(tmp_path / "ckpt-000000002") is None


def test_every_checkpoint_damaged_is_an_error_not_a_fresh_start(tmp_path):
    g, _lin = _tracked(_guard(tmp_path))
    g.save(1)
    (tmp_path / "ckpt-000000001" / "state.pt").write_bytes(b"")
    with pytest.raises(GuardError, match="every checkpoint .* is damaged"):
        _tracked(_guard(tmp_path))[0].resume()


def test_leftover_temp_folders_are_removed_at_start_up(tmp_path):
    g, _lin = _tracked(_guard(tmp_path))
    g.save(1)
    (tmp_path / ".tmp-ckpt-000000002").mkdir()
    (tmp_path / ".tmp-ckpt-000000002" / "state.pt").write_bytes(b"x" * 1000)
    (tmp_path / ".tmp-del-ckpt-000000000").mkdir()
    os.rename(tmp_path / "ckpt-000000001", tmp_path / ".old-ckpt-000000001")   # cut short
    logs = []
    g2 = _guard(tmp_path, log=logs.append)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-000000001"]
    assert g2.latest().name == "ckpt-000000001" and any("restored" in m for m in logs)


# --- room: unwritable folders, full disks -----------------------------------------------------------
def _mount(target: Path, options: str) -> bool:
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)],
                          capture_output=True).returncode == 0


@contextlib.contextmanager
def small_disk(folder: Path, size: int, monkeypatch, kind: str):
    """`folder` holding at most `size` bytes: a tmpfs ("tmpfs"), or the guard's writes and free
    space stubbed ("stub"): disk_usage reports what is left, a write past it fails ENOSPC."""
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "tmpfs":
        if not _mount(folder, f"size={size}"):
            pytest.skip("cannot mount a tmpfs here (not root, or no mount permission)")
        try:
            yield folder
        finally:
            subprocess.run(["umount", "-l", str(folder)], capture_output=True)
        return
    real_usage, real_write = shutil.disk_usage, gdisk.HashingWriter.write

    def usage(path):
        u = real_usage(path)
        if str(path).startswith(str(folder)):
            return u._replace(free=max(0, size - gdisk.bytes_under(folder)))
        return u

    def write(self, b):
        if gdisk.bytes_under(folder) + len(b) > size:
            self.error = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            raise self.error
        return real_write(self, b)
    monkeypatch.setattr(gdisk.shutil, "disk_usage", usage)
    monkeypatch.setattr(gdisk.HashingWriter, "write", write)
    yield folder


def _ckpt_bytes(tmp_path) -> int:
    g, _lin = _tracked(_guard(tmp_path / "probe"))
    return gdisk.bytes_under(g.save(1))


@pytest.mark.parametrize("kind", ["tmpfs", "stub"])
def test_room_for_three_keeps_three_by_pruning_first(tmp_path, monkeypatch, kind):
    """keep 3 on a disk that holds 3: the oldest goes before the next save, never after; no
    opaque error, no partial folder."""
    size = _ckpt_bytes(tmp_path)
    with small_disk(tmp_path / "disk", 3 * size + 2 * gdisk.SLACK_BYTES, monkeypatch, kind) as d:
        g, _lin = _tracked(_guard(d / "ck", keep_last=3))
        for step in range(1, 8):
            g.save(step)
            assert all(verify(p) is None for _s, p in g.checkpoints())
        names = sorted(p.name for p in (d / "ck").iterdir())
        assert names == ["ckpt-000000005", "ckpt-000000006", "ckpt-000000007"][-len(names):]
        assert len(names) >= 2


@pytest.mark.parametrize("kind", ["tmpfs", "stub"])
def test_disk_full_mid_save_removes_the_partial_and_says_so(tmp_path, monkeypatch, kind):
    size = _ckpt_bytes(tmp_path)
    with small_disk(tmp_path / "disk", size // 2, monkeypatch, kind) as d:
        g, _lin = _tracked(_guard(d / "ck"))
        with pytest.raises(GuardError, match=r"disk full at .*: .* needed, .* free") as e:
            g.save(1)
        assert "keep fewer checkpoints" in str(e.value)
        assert os.listdir(d / "ck") == []               # nothing half-written stays
        # the next session is told before any step, once it knows the size (the plan's)
        with pytest.raises(GuardError, match="disk full .*to start"):
            _guard(d / "ck", checkpoint_bytes=size)


@pytest.mark.parametrize("kind", ["tmpfs", "stub"])
def test_no_room_beside_the_newest_is_said_before_writing(tmp_path, monkeypatch, kind):
    size = _ckpt_bytes(tmp_path)
    with small_disk(tmp_path / "disk", size + size // 2, monkeypatch, kind) as d:
        g, _lin = _tracked(_guard(d / "ck"))
        g.save(1)
        with pytest.raises(GuardError, match="disk full .*for the next checkpoint"):
            g.save(2)
        assert sorted(os.listdir(d / "ck")) == ["ckpt-000000001"]      # the newest kept
        with pytest.raises(GuardError, match="disk full .*to start"):
            _guard(d / "ck")                            # the rerun is told at once


def test_checkpoint_folder_that_is_a_file(tmp_path):
    (tmp_path / "ck").write_text("not a folder")
    with pytest.raises(GuardError, match="is a file, not a folder"):
        _guard(tmp_path / "ck")


def test_unwritable_checkpoint_folder_is_an_error_before_any_step(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    mounted = _mount(d, "ro,size=1m")
    if not mounted:
        if os.geteuid() == 0:
            pytest.skip("root without mount: permissions do not stop it writing")
        d.chmod(0o555)
    try:
        with pytest.raises(GuardError, match="is not writable"):
            _guard(d / "ck" if not mounted else d)
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(d)], capture_output=True)
        d.chmod(0o755)


# --- the kit's training cell in a Jupyter kernel --------------------------------------------------
JOB = """name: tiny
model: transformer
transformer: {hidden_size: 64, num_layers: 2, num_heads: 4, intermediate_size: 128, vocab_size: 256}
batch_size: 4
seq_len: 32
steps: 50
"""
TRAIN = '''
import os, sys, time, torch
from trainplan_guard import SessionGuard
guard = SessionGuard.from_plan(os.environ["TRAINPLAN_PLAN"], os.environ["TRAINPLAN_CHECKPOINT_DIR"],
                               total_steps=None, every_steps=10**6)
model = torch.nn.Linear(8, 8)
guard.track(model=model)
for step in range(guard.resume(), 100000):
    time.sleep(0.02)
    print(f"step {step + 1}", flush=True)
    if guard.step(step + 1):
        open("stopped.txt", "w").write(f"{step + 1} {guard.signalled}")
        break
'''


def test_sigterm_to_the_kernel_reaches_the_training(tmp_path):
    """The row that lost 87-91 steps: SIGTERM to the kernel running the kit's training cell.
    The training (its own session: no SIGHUP) gets SIGTERM, checkpoints and stops; then the
    kernel ends as asked."""
    jupyter_client = pytest.importorskip("jupyter_client")
    nbformat = pytest.importorskip("nbformat")
    from trainplan.export import launch_from_plan, render, write
    from trainplan.plan import make_plan, select_platforms
    from trainplan.jobfile import load_job
    path = tmp_path / "job.yaml"
    path.write_text(JOB)
    job = load_job(str(path))
    plan = make_plan(job, select_platforms(["colab-free-t4"]))
    ln = launch_from_plan(plan, plan.platforms[0], job, job_file=str(path))
    kit = tmp_path / "kit"
    write(render(ln, "colab", job_text=path.read_bytes()), kit)
    (kit / "train.py").write_text(TRAIN)
    nb = nbformat.read(kit / "colab_kit.ipynb", as_version=4)
    cell = next(c for c in nb.cells if "train" in c.metadata.get("tags", []))
    code = cell.source.replace("/content", str(kit))
    km = jupyter_client.KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(kit), env={**os.environ, "PYTHONPATH": f"{kit}{os.pathsep}"
                                       + os.environ.get("PYTHONPATH", "")})
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        kc.execute(code)
        t0, seen = time.monotonic(), ""
        while "step 10\n" not in seen and time.monotonic() - t0 < 120:
            with contextlib.suppress(Exception):
                msg = kc.get_iopub_msg(timeout=1)
                if msg["msg_type"] == "stream":
                    seen += msg["content"]["text"]
                elif msg["msg_type"] == "error":
                    raise AssertionError("\n".join(msg["content"]["traceback"]))
        assert "step 10\n" in seen, seen[-2000:]
        os.kill(km.provisioner.process.pid, signal.SIGTERM)
        t0 = time.monotonic()
        while km.is_alive() and time.monotonic() - t0 < 60:
            time.sleep(0.1)
        assert not km.is_alive(), "the kernel did not end"
    finally:
        kc.stop_channels()
        if km.is_alive():
            km.shutdown_kernel(now=True)
    stopped, why = (kit / "stopped.txt").read_text().split()
    newest = SessionGuard(kit / "checkpoints", signals=False, log=_quiet).latest()
    assert why == "SIGTERM" and newest.name == f"ckpt-{int(stopped):09d}"
    assert int(stopped) >= 10 and verify(newest) is None
