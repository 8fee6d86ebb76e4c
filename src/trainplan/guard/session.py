"""`SessionGuard`: the plain training loop's checkpoints, deadline and signals (the package's
docstring says what is guaranteed)."""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import torch

from .disk import (COMMIT, FULL, OLD, PREFIX, SLACK_BYTES, STATE, TMP, GuardError, HashingWriter,
                   bytes_under, check_folder, clean, committed, disk_full, files_of, free_bytes,
                   fsync_dir, remove, step_of, verify, write_marker)
from .ranks import NO, SAVE, STOP_DEADLINE, STOP_SIGNAL, Ranks, attempt

DEFAULT_MARGIN_S = 300.0
MIN_SIGNAL_WAIT_S = 30.0           # the shortest wait for a step to take a stop signal


def _stderr(msg: str) -> None:
    print(f"[trainplan.guard] {msg}", file=sys.stderr, flush=True)


class SessionGuard:
    def __init__(self, directory: str | os.PathLike, *, session_limit_s: float | None = None,
                 idle_timeout_s: float | None = None, every_steps: int | None = None,
                 keep_last: int | None = 3, step_time_s: float | None = None,
                 margin_s: float = DEFAULT_MARGIN_S, disk_bytes: int | None = None,
                 file_limit: int | None = None, checkpoint_bytes: int | None = None,
                 total_steps: int | None = None, sharded: bool = False,
                 signal_wait_s: float | None = None, clock=time.monotonic, signals: bool = True,
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
        self.checkpoint_bytes = checkpoint_bytes  # the plan's; the newest checkpoint's once saved
        self.total_steps = total_steps          # the run's last step: saved when reached
        self.sharded = sharded                  # each rank writes its own file (FSDP)
        self.signal_wait_s = signal_wait_s
        self.clock = clock
        self.started = clock()
        self.log = log or _stderr
        self.ranks = Ranks()
        self.damaged: dict[Path, str] = {}      # checkpoint -> what is wrong with it
        self.signalled: str | None = None
        self.stopped = False
        self.last_saved_step: int | None = None
        self.extra: dict = {}
        self._tracked: dict[str, object] = {}
        self._last_tick: float | None = None
        self._last_wall: float | None = None    # time.monotonic() of the last step (signals)
        self._save_s = 0.0
        self._beat = self.started
        self._step: int | None = None           # the last completed step reported
        self._pending: tuple[int, float] | None = None   # a stop signal no step has taken yet
        self._busy = False                      # a save is being written
        self._finished = False
        self._loaded: dict | None = None        # the state resume's choice loaded
        self._warned = False
        if self.ranks.rank == 0 or sharded:
            check_folder(self.directory)
        if self.ranks.rank == 0:
            clean(self.directory, self.log)
            self._make_room(self._size_estimate(), "to start")
        if signals:
            self._install_signals()

    @classmethod
    def from_plan(cls, plan: str | os.PathLike | dict, directory: str | os.PathLike, **overrides):
        """From `trainplan-plan.json` (written by `trainplan export`) or its dict; keyword
        arguments override what the plan says."""
        doc = plan if isinstance(plan, dict) else json.loads(Path(plan).read_text())
        kw = dict(session_limit_s=doc.get("session_max_s"), idle_timeout_s=doc.get("idle_timeout_s"),
                  every_steps=doc.get("checkpoint_every_steps"),
                  keep_last=doc.get("keep_checkpoints") or 3, step_time_s=doc.get("step_time_s"),
                  disk_bytes=doc.get("disk_bytes"), file_limit=doc.get("output_file_limit"),
                  checkpoint_bytes=doc.get("checkpoint_bytes"), total_steps=doc.get("steps"))
        kw.update(overrides)
        return cls(directory, **kw)

    # --- room ----------------------------------------------------------------------------------
    def free_bytes(self, folder: Path | None = None) -> int:
        return free_bytes(folder or self.directory, self.disk_bytes)

    def _size_estimate(self) -> int | None:
        newest = self.latest()
        return bytes_under(newest) if newest is not None else self.checkpoint_bytes

    def _make_room(self, size: int | None, when: str, cks=None, folder: Path | None = None) -> None:
        """Room for one more checkpoint of `size` bytes, pruning the oldest early (never the
        newest); GuardError("disk full ...") when there is none."""
        if not size:
            return
        folder = folder or self.directory
        needed = int(size) + SLACK_BYTES
        cks = list(self.checkpoints() if cks is None else cks)
        free = self.free_bytes(folder)
        while free < needed and len(cks) > 1:
            _step, old = cks.pop(0)
            remove(old)
            self.log(f"removed {old.name} early: room for the next checkpoint")
            free = self.free_bytes(folder)
        if free < needed:
            raise disk_full(folder, needed, free, when)

    def keep_count(self, size_bytes: int, files: int = 1) -> int:
        """How many checkpoints to keep: `keep_last`, and N such that N + 1 fit the disk and
        file limits (the next save is written before the oldest is removed); at least 1."""
        n = [self.keep_last or 1]
        if self.disk_bytes:
            n.append(int(self.disk_bytes) // max(1, size_bytes) - 1)
        if self.file_limit:
            n.append(int(self.file_limit) // max(1, files) - 1)
        return max(1, min(n))

    # --- signals -------------------------------------------------------------------------------
    def _install_signals(self) -> None:
        for name in ("SIGTERM", "SIGUSR1", "SIGHUP"):
            sig = getattr(signal, name, None)
            if sig is None or (name == "SIGHUP" and signal.getsignal(sig) == signal.SIG_IGN):
                continue                      # nohup: the user asked to ignore it
            try:
                signal.signal(sig, self._on_signal)
            except ValueError:                # not the main thread
                pass

    def _wait_s(self) -> float:
        """How long a stop signal waits for a step to take it (then the loop is taken to have
        ended): three step times and two saves, at least MIN_SIGNAL_WAIT_S."""
        if self.signal_wait_s is not None:
            return self.signal_wait_s
        return max(MIN_SIGNAL_WAIT_S, 3 * (self.step_time_s or 0.0) + 2 * self._save_s)

    def _on_signal(self, signum, _frame) -> None:
        now, wait = time.monotonic(), self._wait_s()
        if self._pending is not None and now - self._pending[1] < wait:
            return                             # a repeat (a launcher passing it on)
        running = (not self._finished and not self.stopped and self._last_wall is not None
                   and now - self._last_wall < wait)
        if self._busy or (running and self._pending is None):
            self.signalled = self.signalled or signal.Signals(signum).name
            self._pending = (signum, now)
            self.log(f"{self.signalled}: saving at the next step, then stopping")
            t = threading.Timer(wait, self._redeliver)
            t.daemon = True
            t.start()
            return
        self._exit(signum)

    def _redeliver(self) -> None:
        """No step took the stop signal in time: the loop has ended; end the process."""
        if self._pending is not None and not self.stopped and not self._busy:
            os.kill(os.getpid(), self._pending[0])

    def _exit(self, signum: int) -> None:
        """End the process as the signal asks (its non-zero status), saying what is unsaved."""
        lost = self._step is not None and self._step != self.last_saved_step
        self.log(f"{signal.Signals(signum).name} outside the training loop"
                 + (f": steps after {self.last_saved_step or 0} are not saved (call "
                    "guard.finish() after the loop to save them)" if lost else "")
                 + f"; exiting with status {128 + signum}")
        try:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            time.sleep(5)
        finally:
            os._exit(128 + signum)

    # --- what is saved -------------------------------------------------------------------------
    def track(self, **objects) -> "SessionGuard":
        """Objects to save and restore: anything with state_dict()/load_state_dict() (model,
        optimizer, scheduler, GradScaler, a sampler), or a torch.Generator (data order)."""
        self._tracked.update({k: v for k, v in objects.items() if v is not None})
        return self

    def _local(self) -> dict:
        """This process's own state: RNG states and generators (they differ between ranks)."""
        rng = {"python": random.getstate(), "torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        if "numpy" in sys.modules:
            rng["numpy"] = sys.modules["numpy"].random.get_state()
        gens = {k: v.get_state() for k, v in self._tracked.items() if isinstance(v, torch.Generator)}
        return {"rng": rng, "generators": gens}

    def _state(self, step: int, extra: dict | None, ranks: list) -> dict:
        objects = {k: v.state_dict() for k, v in self._tracked.items()
                   if not isinstance(v, torch.Generator)}
        return {"format": 2, "step": step, "extra": extra or {}, "objects": objects,
                "ranks": ranks, "world_size": self.ranks.world}

    def _restore(self, st: dict) -> None:
        if "ranks" in st:
            ranks, r = st["ranks"], self.ranks.rank
            if r >= len(ranks):
                self.log(f"checkpoint saved by {len(ranks)} process(es): rank {r} takes rank 0's "
                         "RNG states")
            local = ranks[r] if r < len(ranks) else ranks[0]
            objects, rng = {**st["objects"], **local["generators"]}, local["rng"]
        else:                                   # written before per-rank states
            objects, rng = st["objects"], st["rng"]
        for name, obj in self._tracked.items():
            if name not in objects:
                raise KeyError(f"checkpoint has no state for {name!r}")
            if isinstance(obj, torch.Generator):
                obj.set_state(objects[name])
            else:
                obj.load_state_dict(objects[name])
        random.setstate(rng["python"])
        torch.set_rng_state(rng["torch"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        if "numpy" in rng and "numpy" in sys.modules:
            sys.modules["numpy"].random.set_state(rng["numpy"])

    # --- checkpoints on disk -------------------------------------------------------------------
    def checkpoints(self) -> list[tuple[int, Path]]:
        """Committed checkpoints, oldest first (those found damaged left out)."""
        return [(s, p) for s, p in committed(self.directory) if p not in self.damaged]

    def latest(self) -> Path | None:
        cks = self.checkpoints()
        return cks[-1][1] if cks else None

    def _shard(self, rank: int | None = None) -> str:
        if not self.sharded:
            return STATE
        return f"state-rank{self.ranks.rank if rank is None else rank:05d}.pt"

    def _write(self, path: Path, obj) -> dict:
        """torch.save into `path`, fsynced; its size and CRC-32. On failure the file is
        removed; a full disk is GuardError("disk full at ...")."""
        w = None
        try:
            with open(path, "wb") as f:
                w = HashingWriter(f)
                try:
                    torch.save(obj, w)
                except RuntimeError as e:       # torch's report of a write that failed
                    if w.error is None:
                        raise
                    raise w.error from e
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            path.unlink(missing_ok=True)
            if e.errno in FULL:
                needed = max(w.n if w else 0, self._size_estimate() or 0) + SLACK_BYTES
                raise disk_full(self.directory, needed, self.free_bytes(path.parent),
                                "for this checkpoint") from None
            raise GuardError(f"cannot write checkpoint file {path}: {e.strerror or e}.",
                             fix="check the disk and the folder's permissions") from None
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return {"bytes": w.n, "crc32": w.crc}

    def save(self, step: int, extra: dict | None = None) -> Path:
        """Write checkpoint `step` (every rank calls it), commit it, prune; its folder."""
        t0, r = self.clock(), self.ranks
        final = self.directory / f"{PREFIX}{step:09d}"
        tmp = self.directory / f"{TMP}{final.name}"
        self._busy = True
        try:
            local = self._local()
            if self.sharded:         # rank 0 makes the folder, each rank writes its own file
                r.agree_ok(attempt(lambda: self._begin(tmp)) if r.rank == 0 else None,
                           f"starting {final.name}")
                st = self._state(step, extra, [local])
                mine = attempt(lambda: {self._shard(): self._write(tmp / self._shard(), st)})
                sums = r.gather(mine)
                err = next((s for s in sums if isinstance(s, Exception)), None)
                if r.rank == 0 and err is None:
                    err = attempt(lambda: self._commit(
                        tmp, final, step, {k: v for s in sums for k, v in s.items()}))
                err = mine if isinstance(mine, Exception) else err
            else:                    # rank 0 writes, with every rank's RNG states
                ranks = r.gather(local)
                err = None
                if r.rank == 0:
                    def write():
                        self._begin(tmp)
                        sums = {STATE: self._write(tmp / STATE, self._state(step, extra, ranks))}
                        self._commit(tmp, final, step, sums)
                    err = attempt(write)
            if err is not None and r.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            r.agree_ok(err, f"saving {final.name}")
        finally:
            self._busy = False
        self.last_saved_step = step
        self._save_s = self.clock() - t0
        return final

    def _begin(self, tmp: Path) -> None:
        check_folder(self.directory)
        self._make_room(self._size_estimate(), "for the next checkpoint")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()

    def _commit(self, tmp: Path, final: Path, step: int, sums: dict) -> None:
        """The marker, then the rename (the commit point), then the parent fsynced; prune."""
        write_marker(tmp, step, sums, self.ranks.world)
        old = None
        if final.exists():                     # the same step again: set the old one aside
            old = self.directory / f"{OLD}{final.name}"
            shutil.rmtree(old, ignore_errors=True)
            os.rename(final, old)
        os.rename(tmp, final)
        fsync_dir(self.directory)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        self.damaged.pop(final, None)
        self.prune()

    def prune(self, folder: Path | None = None, prefix: str = PREFIX, protect=()) -> None:
        """Keep the newest `keep_count` committed checkpoints; damaged ones older than the
        newest go too (a damaged newer one is replaced when its step is saved again)."""
        cks = [(s, p) for s, p in committed(folder or self.directory, prefix)
               if p not in protect and p not in self.damaged]
        if not cks:
            return
        newest_step, newest = cks[-1]
        files = files_of(newest)
        keep = self.keep_count(sum(f.stat().st_size for f in files), len(files) + 1)
        for _step, path in cks[:-keep]:
            remove(path)
        for path in [p for p in self.damaged if step_of(p, prefix) < newest_step]:
            remove(path)
            self.damaged.pop(path)

    def resume(self) -> int:
        """Load the newest complete checkpoint into the tracked objects (every rank calls it);
        the step to continue from (0 when there is none). A damaged newest one is named and
        the one before it used."""
        r = self.ranks
        alone = r.group() is None
        chosen = attempt(self._choose) if (r.rank == 0 or alone) else None
        if not alone:
            chosen = r.broadcast(chosen)
        if isinstance(chosen, Exception):
            raise chosen
        if chosen is None:
            return 0
        path, step = Path(chosen[0]), int(chosen[1])
        st = self._loaded if self._loaded is not None else self._load(path)
        self._loaded = None
        self._restore(st)
        self.last_saved_step = self._step = step
        self.extra = st.get("extra", {})
        if r.rank == 0:
            self._make_room(bytes_under(path), "to resume")
        self.log(f"resumed from {path.name} (step {step})")
        return step

    def _load(self, path: Path) -> dict:
        return torch.load(path / self._shard(), map_location="cpu", weights_only=False)

    def _choose(self):
        """(folder, step) of the newest checkpoint that matches its marker and loads, or None;
        GuardError when every one is damaged."""
        for step, path in reversed(self.checkpoints()):
            why = verify(path) if (path / COMMIT).exists() else None
            if why is None:
                try:
                    self._loaded = self._load(path)
                    return str(path), step
                except Exception as e:          # unpickling errors have no common base
                    why = f"{path / self._shard()} does not load ({type(e).__name__}: {e})"
            self.damaged[path] = why
            self.log(f"{why}; using the checkpoint before it")
        if self.damaged:
            raise GuardError(f"every checkpoint in {self.directory} is damaged: "
                             + "; ".join(self.damaged.values()),
                             fix="move the folder aside to start over, or restore a copy")
        return None

    # --- the per-step check --------------------------------------------------------------------
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
        """A save is due: the cadence, or the run's last step (`total_steps`)."""
        return (bool(self.every_steps) and step % self.every_steps == 0) or (
            bool(self.total_steps) and step == self.total_steps)

    def tick(self, step: int) -> str | None:
        """Account for step `step` (completed steps so far); what to do now, the same on every
        rank: "stop" (save and stop), "save", or None."""
        now = self.clock()
        if self._last_tick is not None:
            dt = now - self._last_tick
            self.step_time_s = dt if self.step_time_s is None else 0.8 * self.step_time_s + 0.2 * dt
        self._last_tick, self._last_wall, self._step = now, time.monotonic(), step
        self._finished = False
        grouped = self.ranks.group() is not None
        if not self._warned and int(os.environ.get("WORLD_SIZE") or 1) > 1 and not grouped:
            self._warned = True
            self.log("several processes but no process group: only rank 0 saves, and the ranks "
                     "do not agree when to stop (init_process_group before training)")
        if self.idle_timeout_s and now - self._beat >= self.idle_timeout_s / 2:
            self._beat = now
            if self.ranks.rank == 0:
                self.log(f"step {step}: alive")
        code = NO
        if self.signalled:
            code = STOP_SIGNAL
        elif (self.ranks.rank == 0 or not grouped) and self.ending():
            code = STOP_DEADLINE
        elif self.due(step):
            code = SAVE
        code = self.ranks.max(code)            # decided once: rank 0's clock, any rank's signal
        if code == STOP_SIGNAL and not self.signalled:
            self.signalled = "a signal to another rank"
        return {NO: None, SAVE: "save"}.get(code, "stop")

    def step(self, step: int, extra: dict | None = None) -> bool:
        """Call after each optimizer step with the number of completed steps. Saves when due,
        at `total_steps` or when the session ends; returns True when the loop must stop."""
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

    def finish(self, step: int | None = None, extra: dict | None = None) -> Path | None:
        """After the training loop (every rank): save the last step if it is not saved yet.
        A stop signal that came meanwhile, or comes later, ends the process at once with a
        non-zero status."""
        step = self._step if step is None else step
        path = None
        if step is not None and step != self.last_saved_step:
            path = self.save(step, extra)
        self._finished = True
        self.end_if_signalled()
        return path

    def end_if_signalled(self) -> None:
        """A stop signal no step took (it came during the last save): end the process now."""
        if self._pending is not None and not self.stopped:
            self._exit(self._pending[0])

    def __enter__(self) -> "SessionGuard":
        return self

    def __exit__(self, exc_type, *exc) -> bool:
        if exc_type is None:
            self.finish()
        return False
