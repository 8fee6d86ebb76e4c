"""The Hugging Face Trainer under the guard: `GuardCallback` and `latest_hf_checkpoint`.

The Trainer writes `checkpoint-N/` in place (model, optimizer, scheduler, scaler, one RNG file
per process, trainer_state.json last) and calls `on_save` once it is written. There the guard
fsyncs every file, writes the commit marker (the commit point) and prunes; the Trainer's own
rotation (`save_total_limit`) is switched off, as it deletes older checkpoints before the new
one is committed. A checkpoint without a marker is not used: newer than the newest committed
one (or lacking trainer_state.json) it is half-written and removed; older, it is left alone.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from .disk import (COMMIT, HF_PREFIX, PROBE, TMP, GuardError, bytes_under, check_folder,
                   committed, files_of, fsync_dir, remove, step_of, sum_file, verify, write_marker)
from .ranks import Ranks, attempt
from .session import SessionGuard, _stderr


def latest_hf_checkpoint(output_dir: str | os.PathLike, log=None, clean: bool = True) -> str | None:
    """The newest committed `checkpoint-N` that matches its marker, for the Trainer's
    `resume_from_checkpoint` (None: start afresh). Rank 0 removes half-written ones, naming
    them; a damaged one is named and the one before it returned."""
    log = log or _stderr
    d = Path(output_dir)
    if not d.is_dir():
        return None
    done = committed(d, HF_PREFIX)
    newest = done[-1][0] if done else -1
    if clean and Ranks().rank == 0:
        for p in sorted(d.iterdir()):
            if p.name.startswith(TMP) and not p.name.startswith(PROBE):
                shutil.rmtree(p, ignore_errors=True)
            elif p.name.startswith(HF_PREFIX) and p.is_dir() and not (p / COMMIT).is_file():
                if step_of(p, HF_PREFIX) > newest or not (p / "trainer_state.json").is_file():
                    remove(p)
                    log(f"removed {p.name}: half-written (no commit marker)")
                else:
                    log(f"{p.name} has no commit marker (written without the guard?): not used")
    for _step, path in reversed(done):
        why = verify(path)
        if why is None:
            return str(path)
        log(f"{why}; using the checkpoint before it")
    return None


def _newest_size(guard: SessionGuard, out: Path) -> int | None:
    """The newest committed checkpoint's size, else the plan's `checkpoint_bytes`."""
    done = committed(out, HF_PREFIX)
    return bytes_under(done[-1][1]) if done else guard.checkpoint_bytes


def _on_rank0(guard: SessionGuard, fn, what: str) -> None:
    """`fn()` on rank 0, its success agreed by every rank (ranks.py)."""
    guard.ranks.agree_ok(attempt(fn) if guard.ranks.rank == 0 else None, what)


def GuardCallback(guard: SessionGuard):
    """A `transformers.TrainerCallback` driven by `guard`: asks the Trainer to save every
    `guard.every_steps`, at the last step and before the deadline (then to stop); commits every
    save the Trainer makes and prunes to the guard's `keep_last`, fewer where the disk and file
    limits hold fewer (the Trainer's `save_total_limit` is switched off: module docstring). The
    Trainer's checkpoints carry the model, optimizer, scheduler, RNG states and data position;
    resume with `latest_hf_checkpoint`. The class is made here because transformers is imported
    only when a Trainer is guarded (the kits' guard runs without it)."""
    from transformers import TrainerCallback

    class _GuardCallback(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            out = Path(args.output_dir)
            if args.save_total_limit:
                guard.log(f"save_total_limit {args.save_total_limit}: the guard prunes instead, "
                          "after each commit")
            args.save_total_limit = None
            if guard.total_steps is None and state.max_steps and state.max_steps > 0:
                guard.total_steps = state.max_steps

            def ready():
                check_folder(out)
                latest_hf_checkpoint(out, log=guard.log)         # half-written ones removed
                guard._make_room(_newest_size(guard, out), "to start",
                                 committed(out, HF_PREFIX), out)
            _on_rank0(guard, ready, "checking the checkpoint folder")
            return control

        def on_step_end(self, args, state, control, **kw):
            step, out = state.global_step, Path(args.output_dir)
            what = guard.tick(step)
            if (what or control.should_save) and step != guard.last_saved_step:
                def prepare():
                    stale = out / f"{HF_PREFIX}{step}"
                    if stale.exists():                # uncommitted or damaged: written anew
                        remove(stale)
                    guard._make_room(_newest_size(guard, out), "for the next checkpoint",
                                     committed(out, HF_PREFIX), out)
                _on_rank0(guard, prepare, "making room for the checkpoint")
                control.should_save = True
                guard._busy, self.t0 = True, guard.clock()
            if what == "stop":
                control.should_training_stop = True
                guard.stopped = True
                guard.log(f"stopping at step {step} ({guard.signalled or 'session limit'}); "
                          "rerun to resume")
            return control

        def on_save(self, args, state, control, **kw):
            step, out = state.global_step, Path(args.output_dir)
            folder = out / f"{HF_PREFIX}{step}"

            def commit():
                files = files_of(folder)
                if not files:
                    raise GuardError(f"the Trainer reported saving {folder}, which holds no files")
                sums = {f.relative_to(folder).as_posix(): sum_file(f, fsync=True) for f in files}
                for sub in sorted({f.parent for f in files}, reverse=True):
                    fsync_dir(sub)
                write_marker(folder, step, sums, guard.ranks.world)
                fsync_dir(out)
                best = state.best_model_checkpoint
                guard.prune(out, HF_PREFIX, protect={Path(best)} if best else ())
            try:
                guard.ranks.max(0)                    # every rank's files are written
                _on_rank0(guard, commit, f"committing {folder.name}")
            finally:
                guard._busy = False
            guard.last_saved_step = step
            guard._save_s = guard.clock() - getattr(self, "t0", guard.clock())
            return control

        def on_train_end(self, args, state, control, **kw):
            guard._finished = True
            guard.end_if_signalled()
            return control

    return _GuardCallback()
