"""Predicted against measured, quantity by quantity, from one record (values, not text).

error = predicted / measured - 1: +10% means trainplan predicted 10% more than was measured
(time: pessimistic; memory: conservative).
"""
from __future__ import annotations

from dataclasses import dataclass


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
