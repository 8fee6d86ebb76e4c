"""The document every plan report renders: `Plan.to_json()` plus the extras plan/extras.py
computed (memory against micro-batch, the catalog rows), under their own top-level keys, so the
plan's keys keep their meaning (`schema_version` is the plan's). Markdown, HTML and `--format
json` all render this one dict, and the HTML tags every number it shows with its path in it
(`data-json-path`). Nothing here computes a prediction.
"""
from __future__ import annotations

from ..plan.extras import ReportExtras
from ..plan.result import plain


def document(plan, extras: ReportExtras | None = None) -> dict:
    """The plan's JSON plus `memory_vs_micro_batch` and `catalog` (lists, possibly empty)."""
    extras = extras or ReportExtras()
    out = plan.to_json()
    out["memory_vs_micro_batch"] = plain(extras.memory_curves)
    out["catalog"] = plain(extras.catalog)
    return out


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
