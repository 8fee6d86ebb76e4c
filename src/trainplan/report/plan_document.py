"""The document every plan report renders: `Plan.to_json()` plus the extras plan/extras.py
computed (memory against micro-batch, the catalog rows), under their own top-level keys, so the
plan's keys keep their meaning (`schema_version` is the plan's). Markdown, HTML and `--format
json` all render this one dict, and the HTML tags every number it shows with its path in it
(`data-json-path`). Nothing here computes a prediction.
"""
from __future__ import annotations

from dataclasses import asdict

from ..plan.extras import ReportExtras


def document(plan, extras: ReportExtras | None = None) -> dict:
    """The plan's JSON plus `memory_vs_micro_batch` and `catalog` (lists, possibly empty)."""
    extras = extras or ReportExtras()
    out = plan.to_json()
    out["memory_vs_micro_batch"] = [_plain(asdict(c)) for c in extras.memory_curves]
    out["catalog"] = [_plain(asdict(r)) for r in extras.catalog]
    return out


def _plain(x):
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def resolve(doc: dict, path: str):
    """The value at `path` in the document: 'platforms[0].sessions.finish_s'. Raises KeyError."""
    cur = doc
    for part in path.replace("]", "").split("."):
        name, *idx = part.split("[")
        if name:
            cur = cur[name]
        for i in idx:
            cur = cur[int(i)]
    return cur
