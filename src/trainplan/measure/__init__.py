"""Measure real training steps and compare them with trainplan's prediction.

    device.py       the local device, its catalog row, memory probes, library versions
    records.py      the JSON-lines record schema, reading and writing
    recorder.py     timing + memory of optimizer steps -> a record with the prediction beside it
    runner.py       `trainplan measure`: build the job's model for real and run N steps
    hooks.py        `record(job)`: the same record from a user's own training loop
    hf_callback.py  `TrainplanCallback`: the same record from a transformers Trainer
    calibrate.py    per-accelerator step-time correction fitted on records; `user_calibration()`
                    hands it to the prediction core as an argument (the CLI does)

Exports are imported on first use (`trainplan.measure.record`), so the CLI can read a calibration
without importing the runner.
"""
from __future__ import annotations

import importlib

_EXPORTS = {"record": "hooks", "Recording": "hooks", "TrainplanCallback": "hf_callback",
            "run_measurement": "runner", "fit": "calibrate", "user_calibration": "calibrate"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
