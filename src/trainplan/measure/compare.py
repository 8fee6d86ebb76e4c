"""Predicted against measured, quantity by quantity, from one record (values, not text).

error = predicted / measured - 1: +10% means trainplan predicted 10% more than was measured
(time: pessimistic; memory: conservative).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..predict.timing import KERNEL_CLASS_NAMES


@dataclass(frozen=True)
class Row:
    quantity: str
    unit: str                  # "s" | "bytes" | "samples/s" | "tokens/s"
    predicted: float | None
    measured: float | None

    @property
    def error(self) -> float | None:
        if self.predicted is None or not self.measured:
            return None
        return self.predicted / self.measured - 1.0


def comparison(rec: dict) -> list[Row]:
    m, p = rec["measured"], rec.get("predicted") or {}
    if rec["source"] == "measure-generate":        # one generate call, split (generate.py)
        rows = [Row("generate call", "s", p.get("step_time_s"), m["step_time_s"]),
                Row("prefill", "s", p.get("prefill_s"), m.get("prefill_s")),
                Row("decode, per token", "s", p.get("decode_token_s"), m.get("decode_token_s")),
                Row("sequences/s", "samples/s", p.get("samples_per_s"), m["samples_per_s"])]
    else:
        rows = [Row("step time", "s", p.get("device_step_time_s"), m["step_time_s"]),
                Row("samples/s", "samples/s", p.get("samples_per_s"), m["samples_per_s"])]
    if m.get("tokens_per_s") or p.get("tokens_per_s"):
        rows.append(Row("tokens/s", "tokens/s", p.get("tokens_per_s"), m.get("tokens_per_s")))
    if p.get("calibrated_step_time_s"):
        rows.insert(1, Row("step time, calibrated", "s", p["calibrated_step_time_s"],
                           m["step_time_s"]))
    rows += [
        Row("peak allocated", "bytes", p.get("peak_allocated_bytes"), m["peak_allocated_bytes"]),
        Row("peak reserved", "bytes", p.get("peak_reserved_bytes"), m["peak_reserved_bytes"]),
        Row("device used (nvidia-smi)", "bytes", p.get("device_used_bytes"),
            m["device_used_bytes"]),
    ]
    if rec["device"].get("type") == "cpu":
        rows.append(Row("process peak RSS", "bytes", None, m.get("peak_rss_bytes")))
    return rows


def kernel_comparison(rec: dict) -> list[Row]:
    """A profiled step's device time by kernel class against the prediction's (`measure
    --profile`, measure/profile.py), then all kernels together and the time the device sat
    idle (the step beyond its kernels: the host issuing them, synchronisations). Empty where
    the record has no profile. Depthwise convolutions are convolutions here: a profiler's op
    name cannot tell them apart."""
    m, p = rec["measured"], rec.get("predicted") or {}
    prof = m.get("profile")
    if not prof:
        return []
    pred = dict(p.get("device_by_class_s") or {})
    if pred:
        pred["conv"] = pred.get("conv", 0.0) + pred.pop("depthwise", 0.0)
    meas = prof["by_class_s"]
    rows = [Row(f"  {cls}", "s", pred.get(cls) if pred else None, meas.get(cls, 0.0))
            for cls in KERNEL_CLASS_NAMES if meas.get(cls) or pred.get(cls)]
    kernels = sum(pred.values()) if pred else None
    rows.append(Row("kernels, all", "s", kernels, prof["device_s"]))
    step = p.get("device_step_time_s")
    rows.append(Row("device idle (host, syncs)", "s",
                    max(0.0, step - kernels) if step is not None and kernels is not None
                    else None, max(0.0, m["step_time_s"] - prof["device_s"])))
    return rows
