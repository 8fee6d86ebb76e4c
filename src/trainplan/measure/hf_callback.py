"""`TrainplanCallback`: record a transformers `Trainer` run as a trainplan measurement.

    trainer = Trainer(model, args, train_dataset=ds,
                      callbacks=[TrainplanCallback("job.yaml", warmup=3)])
    trainer.train()      # appends one record to $TRAINPLAN_HOME/measurements.jsonl

Trainer's `on_step_end` fires once per optimizer step (after gradient accumulation), which is
the step trainplan predicts. The job's batch_size and grad_accum should be the Trainer's
per_device_train_batch_size and gradient_accumulation_steps; a mismatch is noted in the record.
Loss values are not read (that would add a device sync the Trainer does not do).
"""
from __future__ import annotations

import warnings

from ..models.vision import import_torchvision

import_torchvision(required=False)   # transformers imports torchvision when it is installed
from transformers import TrainerCallback  # noqa: E402

from .hooks import Recording  # noqa: E402


class TrainplanCallback(TrainerCallback):
    """job: Job | YAML path | dict; warmup, out, accelerator as for `trainplan.measure.record`.
    After training, `result` is the record and `path` the file it was appended to."""

    def __init__(self, job, *, warmup: int = 3, out=None, accelerator: str | None = None):
        from .records import check_records_file
        check_records_file(out)       # before training, not once its record is made
        self._kw = dict(warmup=warmup, out=out, accelerator=accelerator)
        self._job = job
        self._rec: Recording | None = None
        self.result: dict | None = None
        self.path = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        notes = []
        dev = getattr(args, "device", None)
        rec = Recording(self._job, device=str(dev) if dev is not None else None,
                        source="hf-trainer", **self._kw)
        job = rec.job
        for theirs, ours, name in ((args.per_device_train_batch_size, job.batch_size,
                                    "per_device_train_batch_size / batch_size"),
                                   (args.gradient_accumulation_steps, job.grad_accum,
                                    "gradient_accumulation_steps / grad_accum")):
            if theirs != ours:
                notes.append(f"Trainer and job differ: {name} {theirs} vs {ours}")
        clip = getattr(args, "max_grad_norm", None) or None       # the Trainer's 0: no clipping
        if clip != job.max_grad_norm:
            notes.append("Trainer and job differ: max_grad_norm "
                         f"{'none' if clip is None else f'{clip:g}'} vs "
                         f"{'none' if job.max_grad_norm is None else f'{job.max_grad_norm:g}'}")
        rec.notes.extend(notes)
        self._rec = rec.__enter__()

    def on_step_end(self, args, state, control, **kwargs):
        if self._rec is not None:
            self._rec.step()

    def on_train_end(self, args, state, control, **kwargs):
        if self._rec is None:
            return
        rec, self._rec = self._rec, None
        n = len(rec.recorder.times_s)
        if n <= rec.recorder.warmup:
            warnings.warn(f"TrainplanCallback: {n} optimizer step(s), all within warm-up "
                          f"({rec.recorder.warmup}); nothing recorded. Train longer or pass a "
                          "smaller warmup.", stacklevel=2)
            return
        rec.__exit__(None, None, None)
        self.result, self.path = rec.result, rec.path
