"""What a step time rests on: the time model's parameters and the user's own measurements.

A `Calibration` is an argument of every prediction, never read from disk here. It holds

    params    the time model's fitted efficiencies (timing.py); None: the bundled fit,
              data/efficiency.json (scripts/calibrate_time.py)
    factors   per accelerator, the user's correction from `trainplan calibrate`
              (measure/calibrate.py fits and stores them; the CLI loads them and passes them in)

A factor = median over the user's records of measured / predicted device step time. It scales
the device-side terms of a prediction for that accelerator only:

    step' = step + (factor - 1) x (step - communication - data_wait)

throughput scales by step / step' and MFU with it; communication and data wait are not measured
by a one-device run on synthetic inputs and stay as predicted. Every result carries
`source(accel_id)`, which the reports print.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

from .time_params import TimeParams, bundled, bundled_accuracy

UNMEASURED_TERMS = ("communication", "data_wait")   # a one-device synthetic run has neither
BUNDLED, EXPLICIT, MEASURED = "bundled", "explicit", "measured"


@dataclass(frozen=True)
class StepTimeFactor:
    """One accelerator's correction from the user's measurements."""

    accelerator: str
    step_time_factor: float        # median measured / predicted device step time
    measurements: int
    first: str                     # date of the oldest record used (YYYY-MM-DD)
    last: str                      # date of the newest
    file: str = ""                 # where it was stored


@dataclass(frozen=True)
class Calibration:
    params: TimeParams | None = None                  # None: the bundled fit
    factors: dict = field(default_factory=dict)       # accelerator id -> StepTimeFactor

    def source(self, accel_id: str, fp32: bool = False) -> dict:
        """What a step time on `accel_id` rests on: {kind, time_model, measured, text, and the
        measurement's factor, count and dates}, as every result carries it and reports show it.
        `fp32`: the job's matmuls compute in FP32 on CUDA cores, at the measured FP32 matmul
        rate (efficiency.json `fp32_ceiling`), which the text then names."""
        f = self.factors.get(accel_id)
        model = EXPLICIT if self.params is not None else BUNDLED
        words = ("the bundled time-model fit (data/efficiency.json)" if model == BUNDLED
                 else "explicit time-model parameters")
        acc = bundled_accuracy() if model == BUNDLED else None
        if acc:
            words += (f", off by {acc['loso_median_abs_err']:.0%} (median) and "
                      f"{acc['loso_p90_abs_err']:.0%} (p90) on published runs it was not "
                      "fitted to")
        params = self.params if self.params is not None else bundled()
        ceiling = accel_id in params.matmul_ceiling
        if not ceiling:
            words += (f"; with no measured matmul ceiling for {accel_id}, on its datasheet peaks "
                      f"at the median measured ceiling ({params.tc_emax:.0%})")
        if fp32:
            rate = params.fp32_matmul_ceiling(accel_id)
            words += (f"; fp32 matmuls at {accel_id}'s measured FP32 rate ({rate:.0%} of its "
                      "peak)" if accel_id in params.fp32_ceiling else
                      f"; fp32 matmuls, with no measured FP32 rate for {accel_id}, at the median "
                      f"measured one ({rate:.0%} of its peak)")
        if f is None:
            return {"kind": model, "time_model": model, "measured": False,
                    "matmul_ceiling_measured": ceiling,
                    "text": f"{words}; no measurements of {accel_id} (trainplan measure, then "
                            "trainplan calibrate)"}
        return {"kind": MEASURED, "time_model": model, "measured": True,
                "matmul_ceiling_measured": ceiling,
                "step_time_factor": f.step_time_factor, "measurements": f.measurements,
                "first": f.first, "last": f.last, "file": f.file,
                "text": f"{words}, calibrated on {f.measurements} of your measurements of "
                        f"{accel_id} ({f.first} to {f.last}; step time x{f.step_time_factor:.3f})"}

    def apply(self, t, accel_id: str):
        """`t` (a timing.StepTime) corrected by the factor for `accel_id` (module docstring);
        `t` itself without one."""
        f = self.factors.get(accel_id)
        if t is None or f is None:
            return t
        k = f.step_time_factor
        parts = dict(t.breakdown_s)
        device_s = t.step_time_s - sum(parts.get(n, 0.0) for n in UNMEASURED_TERMS)
        step = t.step_time_s + (k - 1.0) * device_s
        scale = t.step_time_s / step
        out = copy.copy(t)
        out.breakdown_s = {n: (v if n in UNMEASURED_TERMS else v * k) for n, v in parts.items()}
        out.step_time_s = step
        out.samples_per_s = t.samples_per_s * scale
        out.tokens_per_s = t.tokens_per_s * scale if t.tokens_per_s else t.tokens_per_s
        out.mfu = t.mfu * scale if t.mfu is not None else None
        out.calibration = {"step_time_factor": k, "measurements": f.measurements,
                           "first": f.first, "last": f.last,
                           "uncalibrated_step_time_s": t.step_time_s, "file": f.file}
        return out


BUNDLED_ONLY = Calibration()
