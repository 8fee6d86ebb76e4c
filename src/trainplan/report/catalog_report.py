"""`trainplan catalog` output."""
from __future__ import annotations

import json
from dataclasses import asdict

from rich.table import Table

from ..units import fmt_bytes
from .console import console


def print_catalog(what: str, fmt: str, platforms_file: str | None = None) -> None:
    c = console()
    if what == "accelerators":
        from ..accelerators import load_accelerators
        rows = list(load_accelerators().values())
        if fmt == "json":
            print(json.dumps([asdict(a) for a in rows], indent=2, default=str))
            return
        t = Table(title="accelerators (memory per device, GiB = 2^30 bytes)", show_edge=False)
        for col in ("id", "name", "devices", "memory/device", "bandwidth", "fp16/bf16 TFLOP/s",
                    "bf16", "FA2", "as of"):
            t.add_column(col)
        for a in rows:
            half = max(a.peak_flops("fp16"), a.peak_flops("bf16"))
            t.add_row(a.id, a.name, str(a.devices_per_unit), fmt_bytes(a.usable_memory_bytes),
                      f"{a.memory_bandwidth_bytes_per_s / 1e9:.0f} GB/s",
                      f"{half / 1e12:.1f}", "yes" if a.supports_bf16 else "no",
                      "yes" if a.flash_attention_2 else "no", a.as_of)
        c.print(t)
    elif what == "platforms":
        from ..platforms import load_platforms
        plats = list(load_platforms(platforms_file).values())
        if fmt == "json":
            print(json.dumps([asdict(p) for p in plats], indent=2, default=str))
            return
        t = Table(title="platforms", show_edge=False)
        for col in ("id", "accelerator", "status", "session", "weekly quota", "$/h", "as of"):
            t.add_column(col)
        for p in plats:
            t.add_row(p.id, f"{p.accelerator_count} x {p.accelerator_id}", p.status,
                      f"{p.session_max_s / 3600:.0f} h" if p.session_max_s else "-",
                      f"{p.weekly_quota_s / 3600:.0f} h" if p.weekly_quota_s else "-",
                      f"{p.usd_per_hour:.2f}" if p.usd_per_hour is not None else "-", p.as_of)
        c.print(t)
    else:
        from ..models.hf import bundled_index
        rows = list(bundled_index().values())
        if fmt == "json":
            print(json.dumps(rows, indent=2))
            return
        t = Table(title="bundled Hugging Face configs (hf:<id>)", show_edge=False)
        for col in ("id", "kind", "class", "params"):
            t.add_column(col)
        for r in rows:
            t.add_row(r["hub_id"], r["kind"], r["auto_class"], r["published_params"] or "")
        c.print(t)
