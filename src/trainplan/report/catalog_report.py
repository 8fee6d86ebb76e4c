"""`trainplan catalog` output."""
from __future__ import annotations

import json
from dataclasses import asdict

import re

from rich.markup import escape

from ..units import fmt_bandwidth, fmt_bytes, fmt_count, fmt_seconds, fmt_usd
from .console import Col, console, fit_table

BUILT = re.compile(r"builds to (\d+)")


def model_params(row: dict) -> str:
    """The parameter count of a bundled config: the published one, else the count the config
    builds to (recorded in the index's notes when the model card gives none), marked so."""
    if row.get("published_params"):
        return fmt_count(int(row["published_params"]))
    m = BUILT.search(row.get("notes") or "")
    if m:
        return fmt_count(int(m.group(1))) + " (built)"
    return "not published"


def accelerators_markdown(rows) -> str:
    """The accelerator catalog as a Markdown table (the README's, `catalog accelerators --format
    md`): capacity per device as planned (the driver's total; Apple: Metal's default working set),
    dense peaks, backend, as-of date and source IDs (data/SOURCES.md)."""
    head = ("| id | name | backend | devices | memory/device | bandwidth | fp16/bf16 TFLOP/s "
            "| fp8 TFLOP/s | as of | sources |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for a in rows:
        half = max(a.peak_flops("fp16"), a.peak_flops("bf16"))
        fp8 = f"{a.fp8_flops / 1e12:,.1f}" if a.fp8_flops else "-"
        lines.append(f"| {a.id} | {a.name} | {a.backend} | {a.devices_per_unit} | "
                     f"{fmt_bytes(a.usable_memory_bytes)} | "
                     f"{fmt_bandwidth(a.memory_bandwidth_bytes_per_s)} | {half / 1e12:,.1f} | "
                     f"{fp8} | {a.as_of} | {' '.join(a.sources)} |")
    return "\n".join(lines)


def print_catalog(what: str, fmt: str, platforms_file: str | None = None) -> None:
    c = console()
    if what == "accelerators":
        from ..accelerators import load_accelerators
        rows = list(load_accelerators().values())
        if fmt == "json":
            print(json.dumps([asdict(a) for a in rows], indent=2, default=str))
            return
        if fmt == "md":
            print(accelerators_markdown(rows))
            return
        cols = [Col("id", key=True), Col("name", priority=1), Col("devices", "right", priority=3),
                Col("memory/device", "right", priority=9), Col("bandwidth", "right", priority=5),
                Col("fp16/bf16 TFLOP/s", "right", priority=6), Col("bf16", priority=7),
                Col("FA2", priority=4), Col("backend", priority=5), Col("as of", priority=2),
                Col("sources", priority=3)]
        body = []
        for a in rows:
            half = max(a.peak_flops("fp16"), a.peak_flops("bf16"))
            body.append([escape(a.id), escape(a.name), str(a.devices_per_unit),
                         fmt_bytes(a.usable_memory_bytes),
                         fmt_bandwidth(a.memory_bandwidth_bytes_per_s),
                         f"{half / 1e12:,.1f}", "yes" if a.supports_bf16 else "no",
                         "yes" if a.flash_attention_2 else "no", escape(a.backend),
                         escape(str(a.as_of)), escape(" ".join(a.sources))])
        c.print(fit_table(cols, body, c.width,
                          "accelerators (memory per device as the driver reports it, GiB = "
                          "2^30 bytes)"))
        c.print("[dim]sources: IDs in data/SOURCES.md (each row's with a wider terminal or "
                "--format json); Apple rows: memory is what the GPU may use of unified memory "
                "by default[/dim]")
    elif what == "platforms":
        from ..platforms import load_platforms
        plats = list(load_platforms(platforms_file).values())
        if fmt == "json":
            print(json.dumps([asdict(p) for p in plats], indent=2, default=str))
            return
        cols = [Col("id", key=True), Col("accelerator", priority=9), Col("status", priority=8),
                Col("session", "right", priority=6), Col("weekly quota", "right", priority=5),
                Col("$/h", "right", priority=7), Col("as of", priority=1)]
        body = [[escape(p.id), escape(f"{p.accelerator_count} x {p.accelerator_id}"), escape(p.status),
                 fmt_seconds(p.session_max_s) if p.session_max_s else "-",
                 fmt_seconds(p.weekly_quota_s) if p.weekly_quota_s else "-",
                 fmt_usd(p.usd_per_hour), escape(str(p.as_of))] for p in plats]
        c.print(fit_table(cols, body, c.width, "platforms"))
    else:
        from ..models.hf_names import bundled_index
        rows = list(bundled_index().values())
        if fmt == "json":
            print(json.dumps(rows, indent=2))
            return
        cols = [Col("id", key=True), Col("kind", priority=2), Col("class", priority=1),
                Col("params", "right", priority=3)]
        body = [[escape(r["hub_id"]), escape(r["kind"]), escape(r["auto_class"]), model_params(r)]
                for r in rows]
        c.print(fit_table(cols, body, c.width, "bundled Hugging Face configs (hf:<id>)"))
        if any("(built)" in b[3] for b in body):
            c.print("[dim]params (built): the model card publishes no total; the count is that of "
                    "the model the bundled config builds (head included)[/dim]")
