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
    """Human-readable memory, GiB for anything over 1 GiB, MiB below."""
    if n_bytes is None:
        return "-"
    if abs(n_bytes) >= GiB:
        return f"{n_bytes / GiB:.2f} GiB"
    if abs(n_bytes) >= MiB:
        return f"{n_bytes / MiB:.1f} MiB"
    return f"{n_bytes / 1024:.1f} KiB"


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
