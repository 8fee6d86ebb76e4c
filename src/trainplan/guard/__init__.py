"""Session guard: checkpoint on a cadence, before a session's deadline and at the end of the run;
keep the last `keep_last` (fewer where the platform's disk and file limits hold fewer); resume
from the newest complete one.

Depends on torch and the standard library only: the Kaggle and Colab kits ship a copy of this
package as `trainplan_guard/` (`trainplan export` copies these files). Two front ends:

    guard = SessionGuard.from_plan("trainplan-plan.json", "checkpoints")   # or SessionGuard(...)
    guard.track(model=model, optimizer=opt, scheduler=sched, data=gen)    # anything with
    start = guard.resume()                     # state_dict/load_state_dict, or a torch.Generator
    for step in range(start, total):
        train_one_step(step)
        if guard.step(step + 1):               # saved if due; True: stop, the session is ending
            break
    else:
        guard.finish()                         # the last step saved; a later SIGTERM exits 143

    trainer = Trainer(..., callbacks=[GuardCallback(guard)])               # Hugging Face
    trainer.train(resume_from_checkpoint=latest_hf_checkpoint(args.output_dir))

Complete or absent (disk.py). A checkpoint is a folder `ckpt-<step>/`: `state.pt` (one
`state-rank<r>.pt` per process when `sharded`) and the commit marker `trainplan-commit.json`,
which lists every file's size and CRC-32. It is written as `.tmp-ckpt-<step>/`, each file
fsynced, the marker last, the folder fsynced, then renamed and the parent fsynced: the rename is
the commit point. A kill leaves the previous checkpoint as the newest; the next guard removes the
`.tmp-*` leftovers. `resume` checks the newest against its marker and that it loads; a damaged
one is named and the one before it used. The Hugging Face Trainer writes `checkpoint-N/` in
place, so there the marker is the commit point (hf.py): `GuardCallback` fsyncs the Trainer's
files and writes it when the Trainer reports the save; `latest_hf_checkpoint` returns only
committed checkpoints and removes half-written ones. A pruned checkpoint is renamed away first.

Room. The folder must be a writable folder with room for the next checkpoint (the newest one's
size, else the plan's `checkpoint_bytes`) when the guard starts and when it resumes, before any
step; older checkpoints are pruned early to make room, never the newest. `keep_last` are kept
(the plan's `keep_checkpoints`, 3 by default), fewer where N + 1 would not fit the disk and file
limits: the next save is written before the oldest goes (session.py `keep_count`). A disk that
fills part-way through a save: the partial folder is removed and `GuardError("disk full at PATH:
X needed, Y free")` says what to change.

Several processes (torchrun, accelerate; ranks.py). With a process group rank 0 writes and prunes
(each rank its own file when `sharded`, as FSDP's sharded state dicts need); every rank's RNG and
generator states are gathered into the checkpoint so each resumes its own; the others wait for
the commit. The save-or-stop decision is agreed every step (one all-reduce): the deadline is rank
0's clock, a signal to any rank stops all, so every rank stops at the same step. All ranks must
see the same checkpoint folder.

Deadline: a session limit (`session_limit_s`, from the plan or given) counted from the guard's
creation. The guard stops, after saving, once the time left is less than `margin_s` plus two
step times (measured between `step` calls, else the plan's) plus the last save's duration.
Signals: SIGTERM, SIGUSR1 (Slurm's warning, a preemption) and SIGHUP (unless ignored) stop the
loop at the next step, after a save. Outside the loop (before the first step, after `finish`,
or when no step comes within `signal_wait_s`) the process ends at once with the signal's
non-zero status, saying which steps are not saved. Idle timeouts: a heartbeat line at most
every half idle timeout (an assumption: output keeps a watched notebook active; it does not
help a closed browser tab).
"""
from .disk import (COMMIT, HF_PREFIX, PREFIX, STATE, GuardError, committed, latest_checkpoint,
                   verify)
from .hf import GuardCallback, latest_hf_checkpoint
from .session import DEFAULT_MARGIN_S, SessionGuard

FILES = ("__init__.py", "disk.py", "ranks.py", "session.py", "hf.py")   # what the kits copy

__all__ = ["COMMIT", "DEFAULT_MARGIN_S", "FILES", "HF_PREFIX", "PREFIX", "STATE", "GuardCallback",
           "GuardError", "SessionGuard", "committed", "latest_checkpoint", "latest_hf_checkpoint",
           "verify"]
