"""Session guard: checkpoint on a cadence and before a session's deadline, keep the last N within
the platform's disk and file limits, and resume from the newest on the next session.

Depends on torch and the standard library only (the Kaggle and Colab kits ship a copy of this
file). Two front ends:

    guard = SessionGuard.from_plan("trainplan-plan.json", "checkpoints")   # or SessionGuard(...)
    guard.track(model=model, optimizer=opt, scheduler=sched, data=gen)    # anything with
    start = guard.resume()                     # state_dict/load_state_dict, or a torch.Generator
    for step in range(start, total):
        train_one_step(step)
        if guard.step(step + 1):               # saved if due; True: stop, the session is ending
            break

    trainer = Trainer(..., callbacks=[GuardCallback(guard)])               # Hugging Face
    trainer.train(resume_from_checkpoint=latest_hf_checkpoint(args.output_dir))

A checkpoint is one `state.pt` in `ckpt-<step>/`, written into a temporary folder and renamed:
a kill mid-save leaves the previous checkpoint as the newest. It holds the tracked objects' states,
the step, and the RNG states (Python, torch CPU and CUDA, NumPy if loaded), so a resumed run
continues bit for bit where the saved one was.

Deadline: a session limit (`session_limit_s`, from the plan or given) counted from the guard's
creation. The guard stops, after saving, once the time left is less than `margin_s` plus two
step times (measured between `step` calls, else the plan's) plus the last save's duration.
SIGTERM and SIGUSR1 (Slurm's warning signal, a preemption) have the same effect at the next step.
Idle timeouts: the guard prints a heartbeat line at most every half idle timeout (an assumption:
output keeps a watched notebook active; it does not help a closed browser tab).
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sys
import time
from pathlib import Path

import torch

PREFIX = "ckpt-"
STATE = "state.pt"
DEFAULT_MARGIN_S = 300.0


class SessionGuard:
    def __init__(self, directory: str | os.PathLike, *, session_limit_s: float | None = None,
                 idle_timeout_s: float | None = None, every_steps: int | None = None,
                 keep_last: int | None = 3, step_time_s: float | None = None,
                 margin_s: float = DEFAULT_MARGIN_S, disk_bytes: int | None = None,
                 file_limit: int | None = None, clock=time.monotonic, signals: bool = True,
                 log=None):
        self.directory = Path(directory)
        self.session_limit_s = session_limit_s
        self.idle_timeout_s = idle_timeout_s
        self.every_steps = every_steps
        self.keep_last = keep_last
        self.step_time_s = step_time_s          # the plan's; replaced by measurements
        self.margin_s = margin_s
        self.disk_bytes = disk_bytes
        self.file_limit = file_limit
        self.clock = clock
        self.started = clock()
        self.log = log or (lambda msg: print(f"[trainplan.guard] {msg}", file=sys.stderr, flush=True))
        self._tracked: dict[str, object] = {}
        self._last_tick: float | None = None
        self._save_s = 0.0
        self._beat = self.started
        self.signalled: str | None = None
        self.stopped = False
        self.last_saved_step: int | None = None
        if signals:
            self._install_signals()

    # --- construction from a plan --------------------------------------------------------
    @classmethod
    def from_plan(cls, plan: str | os.PathLike | dict, directory: str | os.PathLike, **overrides):
        """From `trainplan-plan.json` (written by `trainplan export`) or its dict; keyword
        arguments override what the plan says."""
        doc = plan if isinstance(plan, dict) else json.loads(Path(plan).read_text())
        kw = dict(session_limit_s=doc.get("session_max_s"), idle_timeout_s=doc.get("idle_timeout_s"),
                  every_steps=doc.get("checkpoint_every_steps"),
                  keep_last=doc.get("keep_checkpoints") or 3, step_time_s=doc.get("step_time_s"),
                  disk_bytes=doc.get("disk_bytes"), file_limit=doc.get("output_file_limit"))
        kw.update(overrides)
        return cls(directory, **kw)

    def _install_signals(self) -> None:
        def handler(signum, _frame):
            self.signalled = signal.Signals(signum).name
        for sig in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGUSR1", None)):
            if sig is None:
                continue
            try:
                signal.signal(sig, handler)
            except ValueError:      # not the main thread
                pass

    # --- what is saved -----------------------------------------------------------------------
    def track(self, **objects) -> "SessionGuard":
        """Objects to save and restore: anything with state_dict()/load_state_dict() (model,
        optimizer, scheduler, GradScaler, a sampler), or a torch.Generator (data order)."""
        self._tracked.update({k: v for k, v in objects.items() if v is not None})
        return self

    def _state(self, step: int, extra: dict | None) -> dict:
        st: dict = {"step": step, "extra": extra or {}, "objects": {},
                    "rng": {"python": random.getstate(), "torch": torch.get_rng_state()}}
        if torch.cuda.is_available():
            st["rng"]["cuda"] = torch.cuda.get_rng_state_all()
        if "numpy" in sys.modules:
            st["rng"]["numpy"] = sys.modules["numpy"].random.get_state()
        for name, obj in self._tracked.items():
            st["objects"][name] = obj.get_state() if isinstance(obj, torch.Generator) else obj.state_dict()
        return st

    def _restore(self, st: dict) -> None:
        for name, obj in self._tracked.items():
            if name not in st["objects"]:
                raise KeyError(f"checkpoint has no state for {name!r}")
            if isinstance(obj, torch.Generator):
                obj.set_state(st["objects"][name])
            else:
                obj.load_state_dict(st["objects"][name])
        rng = st["rng"]
        random.setstate(rng["python"])
        torch.set_rng_state(rng["torch"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        if "numpy" in rng and "numpy" in sys.modules:
            sys.modules["numpy"].random.set_state(rng["numpy"])

    # --- checkpoints on disk -------------------------------------------------------------------
    def checkpoints(self) -> list[tuple[int, Path]]:
        """Complete checkpoints, oldest first."""
        if not self.directory.is_dir():
            return []
        out = []
        for p in self.directory.iterdir():
            if p.name.startswith(PREFIX) and (p / STATE).is_file():
                try:
                    out.append((int(p.name[len(PREFIX):]), p))
                except ValueError:
                    continue
        return sorted(out)

    def latest(self) -> Path | None:
        cks = self.checkpoints()
        return cks[-1][1] if cks else None

    def save(self, step: int, extra: dict | None = None) -> Path:
        t0 = self.clock()
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.directory / f"{PREFIX}{step:09d}"
        tmp = self.directory / f".tmp-{PREFIX}{step:09d}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        torch.save(self._state(step, extra), tmp / STATE)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        self.last_saved_step = step
        self._save_s = self.clock() - t0
        self._prune(final)
        return final

    def keep_count(self, size_bytes: int, files: int = 1) -> int:
        """How many checkpoints to keep: `keep_last`, within the disk and file limits."""
        n = [self.keep_last or 1]
        if self.disk_bytes:
            n.append(max(1, self.disk_bytes // max(1, size_bytes)))
        if self.file_limit:
            n.append(max(1, self.file_limit // max(1, files)))
        return max(1, min(n))

    def _prune(self, newest: Path) -> None:
        size = sum(f.stat().st_size for f in newest.rglob("*") if f.is_file())
        files = sum(1 for f in newest.rglob("*") if f.is_file())
        keep = self.keep_count(size, files)
        for _step, path in self.checkpoints()[:-keep]:
            shutil.rmtree(path, ignore_errors=True)

    def resume(self) -> int:
        """Load the newest checkpoint into the tracked objects; the step to continue from (0
        when there is none)."""
        path = self.latest()
        if path is None:
            return 0
        st = torch.load(path / STATE, map_location="cpu", weights_only=False)
        self._restore(st)
        self.last_saved_step = st["step"]
        self.extra = st.get("extra", {})
        self.log(f"resumed from {path.name} (step {st['step']})")
        return int(st["step"])

    # --- the per-step check ------------------------------------------------------------------
    def time_left_s(self) -> float | None:
        if not self.session_limit_s:
            return None
        return self.session_limit_s - (self.clock() - self.started)

    def ending(self) -> bool:
        """The session is about to end (deadline within the margin, or a stop signal)."""
        if self.signalled:
            return True
        left = self.time_left_s()
        if left is None:
            return False
        return left < self.margin_s + 2 * (self.step_time_s or 0.0) + self._save_s

    def due(self, step: int) -> bool:
        return bool(self.every_steps) and step % self.every_steps == 0

    def tick(self, step: int) -> str | None:
        """Account for step `step` (completed steps so far); what to do now: "stop" (save and
        stop), "save", or None."""
        now = self.clock()
        if self._last_tick is not None:
            dt = now - self._last_tick
            self.step_time_s = dt if self.step_time_s is None else 0.8 * self.step_time_s + 0.2 * dt
        self._last_tick = now
        if self.idle_timeout_s and now - self._beat >= self.idle_timeout_s / 2:
            self._beat = now
            self.log(f"step {step}: alive")
        if self.ending():
            return "stop"
        return "save" if self.due(step) else None

    def step(self, step: int, extra: dict | None = None) -> bool:
        """Call after each optimizer step with the number of completed steps. Saves when due or
        when the session ends; returns True when the loop must stop."""
        what = self.tick(step)
        if what is None:
            return False
        if self.last_saved_step != step:
            self.save(step, extra)
        if what == "stop":
            self.stopped = True
            self.log(f"stopping at step {step} ({self.signalled or 'session limit'}); "
                     "rerun to resume")
            return True
        return False

    __call__ = step

    def __enter__(self) -> "SessionGuard":
        return self

    def __exit__(self, *exc) -> bool:
        return False


# --- Hugging Face Trainer ---------------------------------------------------------------------
def latest_hf_checkpoint(output_dir: str | os.PathLike) -> str | None:
    """The newest `checkpoint-N` folder the Trainer wrote, for `resume_from_checkpoint`."""
    d = Path(output_dir)
    if not d.is_dir():
        return None
    found = []
    for p in d.iterdir():
        if p.is_dir() and p.name.startswith("checkpoint-"):
            try:
                found.append((int(p.name.split("-")[-1]), p))
            except ValueError:
                pass
    return str(sorted(found)[-1][1]) if found else None


def GuardCallback(guard: SessionGuard):
    """A `transformers.TrainerCallback` driven by `guard`: asks the Trainer to save every
    `guard.every_steps` and before the deadline (then to stop), and sets `save_total_limit` to
    what the disk and file limits hold. The Trainer's own checkpoints carry the model,
    optimizer, scheduler, RNG states and data position; resume with `latest_hf_checkpoint`."""
    from transformers import TrainerCallback

    class _GuardCallback(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            if guard.keep_last:
                args.save_total_limit = guard.keep_last
            return control

        def on_step_end(self, args, state, control, **kw):
            what = guard.tick(state.global_step)
            if what is not None:
                control.should_save = True
                guard.last_saved_step = state.global_step
            if what == "stop":
                control.should_training_stop = True
                guard.stopped = True
            return control

    return _GuardCallback()
