"""Record a measurement from your own training loop: the same record `trainplan measure` writes.

    import trainplan.measure

    with trainplan.measure.record("job.yaml", warmup=3) as rec:   # or a Job, or a dict of flags
        for batch in loader:
            loss = model(**batch).loss
            loss.backward(); opt.step(); opt.zero_grad()
            rec.step(loss)                                          # once per optimizer step
    print(rec.result["measured"]["step_time_s"], rec.path)

The job must describe what the loop trains (model, micro-batch, grad_accum, precision, ...): it
is what trainplan predicts beside the measurement. Timing synchronises the device at every
`step()` (one `torch.cuda.synchronize` per optimizer step, which a loop that logs `loss.item()`
pays anyway). The record is written when the block exits normally, by rank 0 only when
torch.distributed is initialised; nothing is written if the block raises.
"""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

import torch

from ..spec import Job, validate

from ..jobfile import job_from_dict, load_job
from .device import resolve_device
from .recorder import Recorder


def resolve_job(job) -> Job:
    """A Job, a path to a YAML job, or a dict of job keys -> a validated Job."""
    if isinstance(job, Job):
        return validate(job)
    if isinstance(job, (str, Path)):
        return validate(load_job(job))
    if isinstance(job, dict):
        return validate(job_from_dict(job, source="record(job=...)"))
    from ..errors import TrainplanError
    raise TrainplanError(f"record() takes a Job, a YAML path or a dict, not {type(job).__name__}.",
                         fix="pass trainplan.jobfile.load_job('job.yaml') or the path itself")


def _rank() -> int:
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class Recording:
    """The context manager `record(...)` returns. `step(loss=None)` closes an optimizer step;
    after the block, `result` is the record and `path` the file it was appended to."""

    def __init__(self, job, *, warmup: int = 3, out=None, accelerator: str | None = None,
                 device: str | None = None, command: str | None = None,
                 source: str = "record", notes: list[str] | None = None):
        self.job = resolve_job(job)
        self.recorder = Recorder(self.job, resolve_device(device), warmup)
        self.out, self.accelerator, self.source = out, accelerator, source
        self.command = command or shlex.join([sys.executable, *sys.argv])
        self.notes = list(notes or [])
        self.result: dict | None = None
        self.path = None

    def __enter__(self) -> "Recording":
        self.recorder.start()
        return self

    def step(self, loss=None) -> float:
        return self.recorder.step(loss)

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.finish()
        return False

    def finish(self) -> dict:
        notes = self.notes + ["recorded in the user's own loop: its data loading, logging and "
                              "anything else between steps is in the step time"]
        self.result, self.path = self.recorder.finish(
            source=self.source, command=self.command, accelerator=self.accelerator,
            settings={"device": str(self.recorder.dev)}, notes=notes, out=self.out,
            write=_rank() == 0)
        return self.result


def record(job, *, warmup: int = 3, out=None, accelerator: str | None = None,
           device: str | None = None, command: str | None = None) -> Recording:
    """Measure the optimizer steps of a user's loop (see the module docstring).

    job: Job | YAML path | dict of job keys. warmup: leading steps not timed. out: JSON-lines file
    (default $TRAINPLAN_HOME/measurements.jsonl). accelerator: catalog id of this device (default:
    detected from the CUDA device name). device: where the loop runs (default cuda if present).
    """
    from .records import check_records_file
    check_records_file(out)           # before the loop, not once its record is made
    return Recording(job, warmup=warmup, out=out, accelerator=accelerator, device=device,
                     command=command)
