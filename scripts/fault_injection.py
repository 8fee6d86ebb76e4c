"""Fault injection for trainplan.guard (issue 40): kill -9 at random points in the plain loop, the
Hugging Face Trainer path and the torchrun path (2 CPU processes on gloo; `hf-torchrun`: the
Trainer on 2 processes). After every kill the
newest complete checkpoint must hold, bit for bit, the reference run's model at its step (and no
committed checkpoint may be damaged or lost), and the run resumed from it must end with the
reference run's weights.

A kill is one of two kinds, alternately: at a random moment (after a random step, then a random
delay of up to two step times; saves take most of the time, so many land in one), or at the n-th
call of what a save is made of -- torch.save (half the bytes written, then killed), os.fsync,
os.rename, os.replace, shutil.rmtree (the prune) -- in rank 0. Kills follow each other on the
same folder (each run resumes from what the last one left) until the run completes; then a new
series starts from an empty folder.

    python scripts/fault_injection.py --path torchrun --points 50
    python scripts/fault_injection.py --path hf --points 50
    python scripts/fault_injection.py --path plain --points 50 [--seed 0] [--work DIR]

Prints one line per kill and a summary row; exit 1 when any kill left a bad state.
tests/test_faults.py runs a few points per path with the same harness (`run_series`); the 50
points per path take minutes on a 2-core machine, so they run here.
"""
from __future__ import annotations

import argparse
import io
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve()
D = 256                             # model width: a checkpoint of ~3 MB (weights + AdamW)
FAULTS = ("save", "fsync", "rename", "replace", "rmtree")
PATHS = ("plain", "hf", "torchrun", "hf-torchrun")    # hf-torchrun: the Trainer on 2 processes


# --- the workers (run as `fault_injection.py worker PATH ...`) ------------------------------------
def crc_state(sd) -> int:
    c = 0
    for k in sorted(sd):
        c = zlib.crc32(sd[k].detach().cpu().contiguous().numpy().tobytes(), c)
    return c


def _model():
    import torch
    return torch.nn.Sequential(torch.nn.Linear(D, 2 * D), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                               torch.nn.Linear(2 * D, D))


def _install_fault(spec: str | None) -> None:
    """Kill this process (SIGKILL) at the n-th call of one of what a save is made of."""
    if not spec:
        return
    import torch
    name, n = spec.split(":")
    n, calls = int(n), [0]

    def die():
        os.kill(os.getpid(), signal.SIGKILL)
    if name == "save":
        real = torch.save

        def save(obj, f, *a, **k):
            calls[0] += 1
            if calls[0] != n:
                return real(obj, f, *a, **k)
            buf = io.BytesIO()
            real(obj, buf, *a, **k)
            half = buf.getvalue()[: len(buf.getvalue()) // 2]
            if hasattr(f, "write"):
                f.write(half)
                f.flush()
            else:
                with open(f, "wb") as out:
                    out.write(half)
            die()
        torch.save = save
        return
    mod, attr = {"fsync": (os, "fsync"), "rename": (os, "rename"), "replace": (os, "replace"),
                 "rmtree": (shutil, "rmtree")}[name]
    real = getattr(mod, attr)

    def wrapped(*a, **k):
        calls[0] += 1
        if calls[0] == n:
            die()
        return real(*a, **k)
    setattr(mod, attr, wrapped)


class StepClock:
    """A clock that advances `rate` seconds a step: deadlines that depend on steps, not load."""

    def __init__(self, rate: float):
        self.rate, self.steps = rate, 0

    def __call__(self) -> float:
        return self.steps * self.rate


def _note(work: Path, text: str) -> None:
    with open(work / "outcome.txt", "a") as f:
        f.write(text + "\n")


def _result(model, work: Path) -> None:
    """The final weights, whole or not at all (a kill may come while they are written)."""
    import torch
    torch.save(model.state_dict(), work / "result.tmp")
    os.replace(work / "result.tmp", work / "result.pt")


def worker_loop(a) -> None:
    import torch
    from trainplan.guard import SessionGuard
    distributed = a.path == "torchrun"
    rank = 0
    if distributed:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        rank = dist.get_rank()
    (a.work / "pids").mkdir(exist_ok=True)
    (a.work / "pids" / str(os.getpid())).touch()
    if rank == 0:
        _install_fault(os.environ.get("TP_FAULT"))
    torch.manual_seed(0)
    model = _model()
    net = torch.nn.parallel.DistributedDataParallel(model) if distributed else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.7)
    data = torch.Generator().manual_seed(1 + rank)        # each rank its own data
    rates = [float(r) for r in a.clock.split(",")] if a.clock else None
    clock = StepClock(rates[rank % len(rates)]) if rates else time.monotonic
    guard = SessionGuard(a.work / "ck", every_steps=a.every, keep_last=a.keep,
                         total_steps=a.total, session_limit_s=a.limit, margin_s=a.margin,
                         step_time_s=rates[0] if rates else None, clock=clock,
                         signal_wait_s=a.wait, sharded=a.sharded,
                         log=lambda m: print(f"[rank {rank}] {m}",
                                                                   file=sys.stderr, flush=True))
    guard.track(model=model, optimizer=opt, scheduler=sched, data=data)
    start = guard.resume()
    stopped = None
    for step in range(start, a.total):
        x = torch.randn(16, D, generator=data)
        loss = (net(x) - x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if rates:
            clock.steps += 1
        if rank == 0:
            with open(a.work / "progress.txt", "a") as f:
                f.write(f"{step + 1} {crc_state(model.state_dict())}\n")
        if a.term_at == step + 1 and rank == a.term_rank:
            os.kill(os.getpid(), signal.SIGTERM)
        if guard.step(step + 1):
            stopped = step + 1
            break
    if stopped is None and not a.no_finish:
        guard.finish()
    _note(a.work, f"rank {rank} {'stopped' if stopped else 'done'} {stopped or a.total}")
    if stopped is None:
        time.sleep(a.linger)                    # the work after the loop (evaluation, upload)
        if rank == 0:
            _result(model, a.work)
    if distributed:
        dist.destroy_process_group()


def worker_hf(a) -> None:
    if os.environ.get("TP_HIDE_TORCHVISION"):      # a wheel built for another torch
        sys.modules["torchvision"] = None
    import torch
    from torch.utils.data import Dataset
    from transformers import Trainer, TrainerCallback, TrainingArguments
    from trainplan.guard import GuardCallback, SessionGuard, latest_hf_checkpoint
    (a.work / "pids").mkdir(exist_ok=True)
    (a.work / "pids" / str(os.getpid())).touch()
    if int(os.environ.get("RANK") or 0) == 0:
        _install_fault(os.environ.get("TP_FAULT"))

    class Data(Dataset):
        def __init__(self):
            self.x = torch.randn(4096, D, generator=torch.Generator().manual_seed(1))

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            return {"x": self.x[i]}

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = _model()

        def forward(self, x):
            return {"loss": (self.net(x) - x).pow(2).mean()}

    class Progress(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kw):
            if not state.is_world_process_zero:
                return
            with open(a.work / "progress.txt", "a") as f:
                f.write(f"{state.global_step} {crc_state(model.state_dict())}\n")

    torch.manual_seed(0)
    model = Model()
    out = a.work / "ck"
    args = TrainingArguments(output_dir=str(out), max_steps=a.total, per_device_train_batch_size=16,
                             learning_rate=1e-3, lr_scheduler_type="linear", save_strategy="no",
                             logging_strategy="no", report_to=[], use_cpu=True, seed=0,
                             dataloader_num_workers=0, disable_tqdm=True)
    guard = SessionGuard(out, every_steps=a.every, keep_last=a.keep, signal_wait_s=a.wait,
                         log=lambda m: print(m, file=sys.stderr, flush=True))
    trainer = Trainer(model=model, args=args, train_dataset=Data(),
                      callbacks=[Progress(), GuardCallback(guard)])
    trainer.train(resume_from_checkpoint=latest_hf_checkpoint(out))
    rank = guard.ranks.rank
    _note(a.work, f"rank {rank} {'stopped' if guard.stopped else 'done'} {trainer.state.global_step}")
    if not guard.stopped and rank == 0:
        _result(model, a.work)


# --- the harness ------------------------------------------------------------------------------
@dataclass
class Case:
    path: str                         # one of PATHS
    work: Path
    total: int = 24
    every: int = 2
    keep: int = 2
    extra: list = field(default_factory=list)

    def command(self) -> list[str]:
        args = ["worker", self.path, "--work", str(self.work), "--total", str(self.total),
                "--every", str(self.every), "--keep", str(self.keep), *self.extra]
        if self.path.endswith("torchrun"):
            return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node", "2", str(HERE), *args]
        return [sys.executable, str(HERE), *args]


def progress(work: Path) -> list[tuple[int, int]]:
    try:
        lines = (work / "progress.txt").read_text().split("\n")
    except FileNotFoundError:
        return []
    return [(int(s), int(c)) for s, c in (ln.split() for ln in lines if len(ln.split()) == 2)]


def run(case: Case, fault: str | None = None, kill_after: int | None = None,
        delay: float = 0.0, timeout: float = 600) -> int:
    """One run of the worker; its exit status. `kill_after`: SIGKILL every process once step
    `kill_after` is reported (and `delay` more seconds); `fault`: "fsync:3" (see FAULTS)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "TP_FAULT": fault or "", "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONPATH"] = str(HERE.parents[1] / "src") + os.pathsep + env.get("PYTHONPATH", "")
    if case.path.startswith("hf") and torchvision_broken():
        env["TP_HIDE_TORCHVISION"] = "1"
    shutil.rmtree(case.work / "pids", ignore_errors=True)
    before = len(progress(case.work))
    with open(case.work / "log.txt", "a") as log:
        p = subprocess.Popen(case.command(), start_new_session=True, stdout=log, stderr=log,
                             env=env)
        t0 = time.monotonic()
        while kill_after is not None and p.poll() is None and time.monotonic() - t0 < timeout:
            seen = progress(case.work)[before:]
            if seen and seen[-1][0] >= kill_after:
                time.sleep(delay)
                kill_all(case.work, p)
                break
            time.sleep(0.005)
        try:
            return p.wait(timeout=max(1.0, timeout - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            kill_all(case.work, p)
            return p.wait()


def torchvision_broken() -> bool:
    """A torchvision wheel built for another torch fails at import (`torchvision::nms`), and
    transformers' Trainer with it; the workers do not need it."""
    global _TV
    if _TV is None:
        import importlib.util
        _TV = importlib.util.find_spec("torchvision") is not None and subprocess.run(
            [sys.executable, "-c", "import torchvision"], capture_output=True).returncode != 0
    return _TV


_TV = None


def kill_all(work: Path, p: subprocess.Popen) -> None:
    """SIGKILL the launcher's process group and every worker (torchrun starts each worker in a
    session of its own)."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for f in (work / "pids").glob("*") if (work / "pids").is_dir() else ():
        try:
            os.kill(int(f.name), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def newest_state(case: Case) -> tuple[int, int | None, str | None]:
    """(step, model CRC, problem) of the newest complete checkpoint: the one a resume uses."""
    import torch
    from trainplan.guard import committed, latest_hf_checkpoint, verify
    from trainplan.guard.disk import HF_PREFIX
    ck = case.work / "ck"
    prefix = HF_PREFIX if case.path.startswith("hf") else "ckpt-"
    for _s, p in committed(ck, prefix):
        why = verify(p)
        if why is not None:
            return -1, None, f"committed but damaged: {why}"
    if case.path.startswith("hf"):
        newest = latest_hf_checkpoint(ck, log=lambda m: None, clean=False)
        if newest is None:
            return 0, None, None
        from safetensors.torch import load_file
        sd = load_file(str(Path(newest) / "model.safetensors"))
        return int(Path(newest).name.split("-")[-1]), crc_state(sd), None
    done = committed(ck)
    if not done:
        return 0, None, None
    step, p = done[-1]
    state = p / "state.pt" if (p / "state.pt").exists() else p / "state-rank00000.pt"
    st = torch.load(state, map_location="cpu", weights_only=False)
    return step, crc_state(st["objects"]["model"]), None


def reference(case: Case) -> tuple[dict, int]:
    """The uninterrupted run: {step: model CRC} and the final weights' CRC."""
    import torch
    rc = run(case)
    if rc != 0:
        raise SystemExit(f"the reference {case.path} run failed ({rc}): {case.work / 'log.txt'}")
    crcs = dict(progress(case.work))
    final = crc_state(torch.load(case.work / "result.pt"))
    return crcs, final


def run_series(path: str, points: int, seed: int = 0, work: Path | None = None,
               say=print, ref: tuple[dict, int] | None = None) -> dict:
    """`points` kills on `path`; {"kills", "mid_save", "failures": [...], "series"}. `ref`: the
    reference run's (`reference`) result for this path, where the caller has it already (the
    tests share one per path); else it is run here."""
    import torch
    rng = random.Random(seed)
    root = Path(work or tempfile.mkdtemp(prefix=f"faults-{path}-"))
    if ref is None:
        ref_case = Case(path, root / "reference")
        ref_case.work.mkdir(parents=True, exist_ok=True)
        ref = reference(ref_case)
    ref_steps, ref_final = ref
    out = {"kills": 0, "mid_save": 0, "failures": [], "series": 0, "resumes": 0}
    case, floor = None, 0
    while out["kills"] < points:
        if case is None:
            out["series"] += 1
            case = Case(path, root / f"series-{out['series']}")
            case.work.mkdir(parents=True)
            floor = 0
        start = floor
        if out["kills"] % 2 == 0:
            k = rng.randint(start + 1, case.total - 1) if start + 1 < case.total else case.total
            how, kw = f"after step {k}", dict(kill_after=k, delay=rng.uniform(0, 0.1))
        else:
            f = rng.choice(FAULTS)
            n = rng.randint(1, 8 if f in ("save", "rmtree") else 16)
            how, kw = f"at {f} call {n}", dict(fault=f"{f}:{n}")
        rc = run(case, **kw)
        finished = (case.work / "result.pt").exists()
        if finished:          # ran to the end (the kill, if any, came after): the weights
            got = crc_state(torch.load(case.work / "result.pt"))
            ok = got == ref_final
            say(f"{path}: run completed ({how} " + ("never came" if rc == 0 else
                f"came after it, exit {rc}") + f"): final weights {'identical' if ok else 'DIFFER'}")
            if not ok:
                out["failures"].append(f"series {out['series']}: final weights differ (rc {rc})")
            case = None
            continue
        out["kills"] += 1
        if rc == 0:
            out["failures"].append(f"kill {out['kills']} ({how}): the run was not killed")
        left = sorted(p.name for p in (case.work / "ck").iterdir()) if (case.work / "ck").is_dir() else []
        mid = any(n.startswith(".tmp-") for n in left) or (
            path.startswith("hf") and any(n.startswith("checkpoint-") and not
                                 (case.work / "ck" / n / "trainplan-commit.json").exists()
                                 for n in left))
        out["mid_save"] += mid
        step, crc, problem = newest_state(case)
        if problem is None and step < floor:
            problem = f"checkpoint {floor} lost: the newest complete one is {step}"
        if problem is None and step and crc != ref_steps.get(step):
            problem = f"checkpoint {step} differs from the reference run's model at step {step}"
        say(f"{path}: kill {out['kills']:2d} {how:<22} {'mid-save' if mid else '        '} "
            f"newest complete: {step:3d}  {'OK' if problem is None else 'FAIL: ' + problem}")
        if problem:
            out["failures"].append(f"kill {out['kills']} ({how}): {problem}")
        floor = max(floor, step)
    if case is not None:                         # the last series, run to the end
        rc = run(case)
        got = crc_state(torch.load(case.work / "result.pt")) if rc == 0 else None
        leftovers = [p.name for p in (case.work / "ck").iterdir() if p.name.startswith(".tmp-")]
        ok = rc == 0 and got == ref_final and not leftovers
        say(f"{path}: last series resumed to the end: final weights "
            f"{'identical' if got == ref_final else 'DIFFER'} (exit {rc}, leftovers {leftovers})")
        if not ok:
            out["failures"].append(f"series {out['series']}: resumed run ended wrong (rc {rc}, "
                                   f"leftovers {leftovers})")
    if work is None:
        shutil.rmtree(root, ignore_errors=True)
    return out


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        p = argparse.ArgumentParser()
        p.add_argument("worker")
        p.add_argument("path", choices=PATHS)
        p.add_argument("--work", type=Path, required=True)
        p.add_argument("--total", type=int, default=24)
        p.add_argument("--every", type=int, default=2)
        p.add_argument("--keep", type=int, default=2)
        p.add_argument("--limit", type=float)           # a session limit (with --clock)
        p.add_argument("--margin", type=float, default=0.0)
        p.add_argument("--clock", help="seconds a step, per rank: 1.0,1.3")
        p.add_argument("--wait", type=float, help="signal_wait_s")
        p.add_argument("--term-at", type=int, help="SIGTERM to itself after this step")
        p.add_argument("--term-rank", type=int, default=0)
        p.add_argument("--linger", type=float, default=0.0, help="seconds of work after the loop")
        p.add_argument("--no-finish", action="store_true")
        p.add_argument("--sharded", action="store_true", help="each rank writes its own file")
        a = p.parse_args()
        (worker_hf if a.path.startswith("hf") else worker_loop)(a)
        # what a run leaves is on disk (fsync'd by the guard); the interpreter's tear-down is
        # skipped, as the CLI skips it: under load, DDP's and gloo's threads torn down at exit
        # abort a rank that finished ("terminate called without an active exception", -6)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--path", choices=PATHS, required=True)
    p.add_argument("--points", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", type=Path, help="keep the runs' folders here")
    a = p.parse_args()
    t0 = time.time()
    out = run_series(a.path, a.points, a.seed, a.work)
    print(f"\n| path | kills | of them mid-save | series | failures | time |\n|---|---:|---:|---:|---:|---:|\n"
          f"| {a.path} | {out['kills']} | {out['mid_save']} | {out['series']} | "
          f"{len(out['failures'])} | {time.time() - t0:.0f} s |")
    for f in out["failures"]:
        print("FAIL:", f)
    return 1 if out["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
