"""The one place that converts internal units (bytes, seconds, FLOPs, dollars) for display.

Memory is shown in GiB (2**30 bytes) and labelled so; rates in TFLOP/s (10**12).
"""
from __future__ import annotations

GiB = 2**30
MiB = 2**20
GB = 10**9


def gib(n_bytes: float) -> float:
    return n_bytes / GiB


def fmt_bytes(n_bytes: float | None) -> str:
    """Human-readable memory, GiB for anything over 1 GiB, MiB below, KiB below that; none at
    all is "0 B" (not "0.0 KiB", which reads as a rounded-down amount)."""
    if n_bytes is None:
        return "-"
    if n_bytes == 0:
        return "0 B"
    if abs(n_bytes) >= GiB:
        return f"{n_bytes / GiB:.2f} GiB"
    if abs(n_bytes) >= MiB:
        return f"{n_bytes / MiB:.1f} MiB"
    return f"{n_bytes / 1024:.1f} KiB"


def fmt_gib(n_bytes: float) -> str:
    """Memory always in GiB with two decimals (a finding comparing a need with a capacity reads
    both in one unit): 1.5 * 2**30 -> '1.50 GiB'."""
    return f"{n_bytes / GiB:.2f} GiB"


def fmt_gib_pair(need: float, capacity: float) -> str:
    """A need against a capacity in one unit, the unit said once: '15.27 / 15.00 GiB'."""
    return f"{need / GiB:.2f} / {fmt_gib(capacity)}"


def fmt_mib(n_bytes: float) -> str:
    """Memory in whole MiB (a saving too small for GiB): 52 * 2**20 -> '52 MiB'."""
    return f"{n_bytes / MiB:.0f} MiB"


def fmt_bandwidth(bytes_per_s: float) -> str:
    """Memory bandwidth in GB/s (10**9 bytes a second, as datasheets give it): '3,350 GB/s'."""
    return f"{bytes_per_s / GB:,.0f} GB/s"


def fmt_count(n: float | None) -> str:
    """1234567 -> '1.23M'."""
    if n is None:
        return "-"
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.2f}{suffix}"
    return f"{n:.0f}"


def fmt_flops(n: float | None) -> str:
    if n is None:
        return "-"
    for div, suffix in ((1e15, "PFLOP"), (1e12, "TFLOP"), (1e9, "GFLOP"), (1e6, "MFLOP")):
        if abs(n) >= div:
            return f"{n / div:.2f} {suffix}"
    return f"{n:.0f} FLOP"


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    if s < 120:
        return f"{s:.2f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    if s < 3 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"


def fmt_usd(x: float | None) -> str:
    if x is None:
        return "-"
    return f"${x:,.2f}"


# --- additions for the plan reports (tables and chart axes) ------------------------------------

def fmt_int(n: float | None) -> str:
    """An exact count with thousands separators: 10000 -> '10,000'."""
    if n is None:
        return "-"
    return f"{int(round(n)):,}"


def fmt_rate(x: float | None) -> str:
    """A throughput (samples/s, tokens/s): three significant figures below 10 (0.0267, never
    a bare 0.0 for a slow step), one decimal below 1,000, whole numbers above."""
    if x is None:
        return "-"
    if x == 0 or abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.3g}" if abs(x) < 10 else f"{x:,.1f}"


def fmt_percent(x: float | None) -> str:
    """A fraction as a percentage with one decimal: 0.1887 -> '18.9%'."""
    if x is None:
        return "-"
    return f"{x * 100:.1f}%"


def fmt_ratio(x: float | None) -> str:
    """A plain ratio with two decimals (weeks of quota): 0.0215 -> '0.02'."""
    if x is None:
        return "-"
    return f"{x:,.2f}"


def fmt_bool(x: bool | None) -> str:
    if x is None:
        return "-"
    return "yes" if x else "no"


def time_unit(max_s: float) -> tuple[str, float]:
    """(label, seconds per unit) for an axis whose largest value is `max_s` seconds, with the
    same thresholds as `fmt_seconds`: s below 2 min, min below 2 h, h below 3 days, else days."""
    if max_s < 120:
        return "s", 1.0
    if max_s < 7200:
        return "min", 60.0
    if max_s < 3 * 86400:
        return "h", 3600.0
    return "days", 86400.0


def nice_ticks(lo: float, hi: float, target: int = 5) -> list[float]:
    """Round axis ticks covering [lo, hi]: steps of 1, 2 or 5 x 10^k (Heckbert, "Nice numbers
    for graph labels", Graphics Gems, 1990), about `target` of them, first <= lo, last >= hi."""
    import math
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(1, target)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    n = int(math.ceil((hi - first) / step - 1e-9))
    return [round(first + i * step, 12) for i in range(n + 1)]


def fmt_tick(x: float) -> str:
    """An axis tick label: no trailing zeros, thousands separators ('0', '2.5', '1,000')."""
    if abs(x - round(x)) < 1e-9:
        return f"{int(round(x)):,}"
    return f"{x:,.6f}".rstrip("0").rstrip(".")


# --- labels for keys that carry their unit (`session_overhead_s`, `checkpoint_bytes`) ----------

KEY_LABELS = {"checkpoint_every_max_s": "longest time between checkpoints",
              "value_of_time_usd_per_h": "value of waiting time",
              "old_policy": "old policy", "generation_engine": "vLLM's share (colocated)",
              "generation_peak": "generation (gathered weights, KV cache)",
              "value_model": "value model (trained)"}
UNIT_SUFFIXES = ("_usd_per_h", "_per_s", "_bytes", "_usd", "_s")


def key_label(key: str) -> str:
    """A field name as a person reads it, its unit suffix gone (the value's format carries the
    unit): 'session_overhead_s' -> 'session overhead'."""
    if key in KEY_LABELS:
        return KEY_LABELS[key]
    for suffix in UNIT_SUFFIXES:
        if key.endswith(suffix) and len(key) > len(suffix):
            key = key[: -len(suffix)]
            break
    return key.replace("_", " ")


def fmt_none(x, none: str = "-") -> str:
    """A value that may be missing, as text: None -> '-' (never the word None)."""
    return none if x is None else str(x)


def _plain_value(v) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if v is None:
        return "-"
    if isinstance(v, dict):
        return ", ".join((k.replace("_", " ") if x is True else f"no {k.replace('_', ' ')}"
                          if x is False else f"{k.replace('_', ' ')} {_plain_value(x)}")
                         for k, x in v.items()) or "-"
    if isinstance(v, (list, tuple)):
        return ", ".join(_plain_value(x) for x in v) or "-"
    if isinstance(v, int) and abs(v) >= 10000:
        return fmt_int(v)
    return str(v)


def fmt_note(text: str) -> str:
    """A note written by another module, as a person reads it: `key={...}` dict reprs and
    `key=True` settings become `key: a, b` / `key: yes` (the values themselves are kept)."""
    import ast
    import re

    def setting(m: re.Match) -> str:
        try:
            v = ast.literal_eval(m.group(2))
        except (ValueError, SyntaxError):
            return m.group(0)
        name = m.group(1).replace("_", " ")
        return f"{name} ({_plain_value(v)})" if isinstance(v, dict) else f"{name}: {_plain_value(v)}"
    text = re.sub(r"\b(\w+)=(\{[^{}]*\}|\[[^\[\]]*\]|True|False|None|-?\d+(?:\.\d+)?|'[^']*')",
                  setting, text)
    return text


def fmt_phases(phases: dict) -> str:
    """Seconds per step by phase, the ones that take time: 'generation 23.1 s + training 45 s'."""
    parts = [f"{key_label(k)} {fmt_seconds(v)}" for k, v in phases.items() if v > 0]
    return " + ".join(parts) or "-"
