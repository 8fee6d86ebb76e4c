"""The prediction core: a traced job on a target -> memory, step time, findings, largest
micro-batch. Imports nothing from plan/, report/, measure/ or cli/ (tests/test_layers.py).

    target.py       what a job means on an accelerator: devices, kernel semantics
    compat.py       what a target cannot run: findings and rewrites, one table
    memory.py       per-device memory by strategy (the traces it reads: trace/derive/)
    timing.py       step time; calibration.py what it rests on
    evaluate.py     evaluate(job, accel, calibration, traces) and largest_micro_batch
"""
from .calibration import BUNDLED_ONLY, Calibration, StepTimeFactor
from .evaluate import MAX_MICRO_BATCH, Evaluation, evaluate, largest_micro_batch
from .findings import Finding
from .target import devices, semantics_for
from ..trace.derive import Traces, trace_job

__all__ = ["BUNDLED_ONLY", "Calibration", "StepTimeFactor", "MAX_MICRO_BATCH", "Evaluation",
           "evaluate", "largest_micro_batch", "Finding", "devices", "semantics_for", "Traces",
           "trace_job"]
