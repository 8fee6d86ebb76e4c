"""The tables of a plan report, as data: which value goes in which column and how it is shown.

Markdown, HTML and the terminal render the same tables from the same document
(`plan_document.document`), so they cannot disagree. A column names its value by a path into the
document, relative to the row (`sessions.finish_s` of `platforms[3]`; `catalog:ram_bytes` reads the
row's catalog entry) and a format kind; every format goes through `units.py`. The HTML writes the
full path next to each number (`data-json-path`), which is how its test checks the page against
the JSON.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..units import (fmt_bool, fmt_bytes, fmt_count, fmt_int, fmt_percent, fmt_rate, fmt_ratio,
                     fmt_seconds, fmt_usd, key_label)
from .plan_document import resolve

FORMATS: dict[str, Callable] = {
    "bytes": fmt_bytes, "s": fmt_seconds, "usd": fmt_usd, "int": fmt_int, "count": fmt_count,
    "rate": fmt_rate, "percent": fmt_percent, "ratio": fmt_ratio, "bool": fmt_bool,
    "text": lambda v: "-" if v is None or v == "" else str(v),
}


@dataclass(frozen=True)
class Column:
    header: str
    path: str | None              # None: `text` computes the cell from the row
    fmt: str = "text"
    text: Callable | None = None  # (doc, row path) -> str, for cells made of several values
    align: str = "right"


@dataclass(frozen=True)
class Cell:
    text: str
    path: str | None              # full document path of the value shown, if it is one value
    fmt: str
    align: str


def fmt_value(fmt: str, value) -> str:
    return FORMATS[fmt](value)


def fmt_by_key(key: str, value) -> str:
    """Format a value by its key's unit suffix (assumptions): _bytes, _s, _usd, _usd_per_h."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return fmt_value("text", value)
    if key.endswith("_usd_per_h"):
        return fmt_usd(value) + "/h"
    for suffix, fmt in (("_bytes", "bytes"), ("_s", "s"), ("_usd", "usd")):
        if key.endswith(suffix):
            return fmt_value(fmt, value)
    return fmt_value("int" if float(value).is_integer() else "ratio", value)


def catalog_index(doc: dict) -> dict[str, int]:
    return {r["platform_id"]: i for i, r in enumerate(doc.get("catalog", []))}


def cell(doc: dict, row: str, col: Column, catalog: dict[str, int] | None = None) -> Cell:
    """The cell of `col` in the row at document path `row` (e.g. 'platforms[2]')."""
    if col.path is None:
        return Cell(col.text(doc, row), None, "text", col.align)
    if col.path.startswith("catalog:"):
        catalog = catalog if catalog is not None else catalog_index(doc)
        i = catalog.get(resolve(doc, row + ".platform_id"))
        if i is None:
            return Cell("-", None, col.fmt, col.align)
        full = f"catalog[{i}].{col.path[len('catalog:'):]}"
    else:
        full = f"{row}.{col.path}" if row else col.path
    try:
        value = resolve(doc, full)
    except (KeyError, IndexError, TypeError):    # e.g. sessions is None on a platform that won't fit
        return Cell("-", None, col.fmt, col.align)
    shown = fmt_value(col.fmt, value)
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    return Cell(shown, full if numeric else None, col.fmt, col.align)


def rows(doc: dict, bases: list[str], cols: tuple[Column, ...]) -> list[list[Cell]]:
    idx = catalog_index(doc)
    return [[cell(doc, b, c, idx) for c in cols] for b in bases]


def platform_rows(doc: dict, include_retired: bool = True) -> list[str]:
    return [f"platforms[{i}]" for i, p in enumerate(doc["platforms"])
            if include_retired or p["verdict"] != "RETIRED"]


def _devices(doc, row) -> str:
    p = resolve(doc, row)
    return f"{p['accelerator_id']} x {p['accelerator_count']}" + (
        f" ({p['devices']} devices)" if p["devices"] != p["accelerator_count"] else "")


def _split(doc, row) -> str:
    p = resolve(doc, row)
    if p["micro_batch_size"] is None:
        return "-"
    return f"{p['micro_batch_size']} x {p['grad_accum']} x {p['devices']} = {fmt_int(p['global_batch_size'])}"


def _headroom(doc, row) -> str:
    p = resolve(doc, row)
    if p["device_used_bytes"] is None:
        return "-"
    d = p["capacity_bytes"] - p["device_used_bytes"]
    return fmt_bytes(d) if d >= 0 else "short " + fmt_bytes(-d)


T = "text"
L = "left"

VERDICTS = (
    Column("#", "rank", "int"),
    Column("platform", "platform_id", T, align=L),
    Column("verdict", "verdict", T, align=L),
    Column("accelerator", None, text=_devices, align=L),
    Column("memory / device", "device_used_bytes", "bytes"),
    Column("capacity", "capacity_bytes", "bytes"),
    Column("micro-batch x accum x devices", None, text=_split),
    Column("time to finish", "sessions.finish_s", "s"),
    Column("cost", "cost.total_usd", "usd"),
)

HARDWARE = (
    Column("platform", "platform_id", T, align=L),
    Column("offering", "name", T, align=L),
    Column("accelerator", None, text=_devices, align=L),
    Column("memory / device", "capacity_bytes", "bytes"),
    Column("host RAM", "catalog:ram_bytes", "bytes"),
    Column("CPU cores", "catalog:cpu_cores", "int"),
    Column("session limit", "catalog:session_max_s", "s"),
    Column("weekly quota", "catalog:weekly_quota_s", "s"),
    Column("runs in background", "catalog:background_execution", "bool"),
    Column("output disk", "catalog:disk_bytes", "bytes"),
    Column("price / hour", "catalog:usd_per_hour", "usd"),
    Column("status", "status", T, align=L),
)

MEMORY_TAIL = (
    Column("device used", "device_used_bytes", "bytes"),
    Column("capacity", "capacity_bytes", "bytes"),
    Column("headroom", None, text=_headroom),
    Column("peak in", "peak_phase", T, align=L),
    Column("host RAM needed", "host_ram_bytes", "bytes"),
    Column("host RAM", "platform_ram_bytes", "bytes"),
)


def memory_columns(doc: dict) -> tuple[Column, ...]:
    """platform, one column per breakdown term (union over platforms, in first-seen order), then
    the totals: the terms sum to `device_used_bytes`."""
    terms: list[str] = []
    for p in doc["platforms"]:
        for k in p["memory_breakdown_bytes"] or {}:
            if k not in terms:
                terms.append(k)
    return (Column("platform", "platform_id", T, align=L),
            *(Column(k.replace("_", " "), f"memory_breakdown_bytes.{k}", "bytes") for k in terms),
            *MEMORY_TAIL)


def phase_columns(doc: dict) -> tuple[Column, ...] | None:
    """platform, one column per step phase some platform spends time in, the step time; None
    for supervised training (all of its step is `training`)."""
    phases: list[str] = []
    for p in doc["platforms"]:
        for k, v in (p.get("step_phases_s") or {}).items():
            if v and k not in phases:
                phases.append(k)
    if phases in ([], ["training"]):
        return None
    return (Column("platform", "platform_id", T, align=L),
            *(Column(key_label(k), f"step_phases_s.{k}", "s") for k in phases),
            Column("step time", "step_time_s", "s"))


PERFORMANCE = (
    Column("platform", "platform_id", T, align=L),
    Column("step time", "step_time_s", "s"),
    Column("micro-batch x accum x devices", None, text=_split),
    Column("samples/s", "samples_per_s", "rate"),
    Column("tokens/s", "tokens_per_s", "rate"),
    Column("MFU", "mfu", "percent"),
    Column("bound", "bound", T, align=L),
    Column("steps", "steps", "int"),
    Column("training time", "train_s", "s"),
)

SESSIONS = (
    Column("platform", "platform_id", T, align=L),
    Column("sessions", "sessions.sessions", "int"),
    Column("session limit", "sessions.session_max_s", "s"),
    Column("overhead / session", "sessions.overhead_s_per_session", "s"),
    Column("checkpoint every (steps)", "sessions.checkpoint_every_steps", "int"),
    Column("accelerator time", "sessions.accelerator_s", "s"),
    Column("weekly quota", "sessions.weekly_quota_s", "s"),
    Column("weeks of quota", "sessions.quota_weeks", "ratio"),
    Column("time to finish", "sessions.finish_s", "s"),
)

STORAGE = (
    Column("platform", "platform_id", T, align=L),
    Column("checkpoint", "storage.checkpoint_bytes", "bytes"),
    Column("files each", "storage.files_per_checkpoint", "int"),
    Column("output disk", "storage.disk_bytes", "bytes"),
    Column("checkpoints on disk", "storage.checkpoints_fit_disk", "int"),
    Column("checkpoints in file limit", "storage.checkpoints_fit_files", "int"),
)

COST = (
    Column("platform", "platform_id", T, align=L),
    Column("price / hour", "cost.usd_per_hour", "usd"),
    Column("accelerator hours", "cost.accelerator_hours", "ratio"),
    Column("compute", "cost.compute_usd", "usd"),
    Column("subscription", "cost.subscription_usd", "usd"),
    Column("compute units", "cost.compute_units", "rate"),
    Column("total", "cost.total_usd", "usd"),
    Column("within budget", "within_budget", "bool"),
    Column("meets deadline", "meets_deadline", "bool"),
)

def crossover_text(doc: dict, row: str) -> str:
    """An owned platform's crossovers: 'cheaper than X from run N' (else 'never ...')."""
    c = resolve(doc, row).get("campaign") or {}
    parts = []
    for x in c.get("crossovers", ()):
        parts.append(f"cheaper than {x['platform_id']} from run {fmt_int(x['runs'])}"
                     if x["runs"] is not None else f"never cheaper than {x['platform_id']}")
    return "; ".join(parts) or "-"


CAMPAIGN = (
    Column("platform", "platform_id", T, align=L),
    Column("runs", "campaign.runs", "int"),
    Column("accelerator time", "campaign.accelerator_s", "s"),
    Column("calendar", "campaign.calendar_s", "s"),
    Column("runs / week of quota", "campaign.runs_per_week", "ratio"),
    Column("compute", "campaign.compute_usd", "usd"),
    Column("subscription", "campaign.subscription_usd", "usd"),
    Column("hardware", "campaign.hardware_usd", "usd"),
    Column("electricity", "campaign.electricity_usd", "usd"),
    Column("total", "campaign.total_usd", "usd"),
    Column("waiting ($10/h)", "campaign.waiting_usd", "usd"),
)


def campaign_rows(doc: dict) -> list[str]:
    """Row paths of the platforms with a campaign (those that run every variant)."""
    return [f"platforms[{i}]" for i, p in enumerate(doc["platforms"]) if p.get("campaign")]


def campaign_lines(doc: dict) -> list[str]:
    """What a campaign table needs said in words: the runs, the prices, the crossovers."""
    c = doc.get("campaign")
    if not c:
        return []
    per = f" a {c['per']}" if c.get("per") else ""
    sweep = "; ".join(f"{k} in {', '.join(map(str, v))}" for k, v in c["sweep"].items())
    out = [f"{fmt_int(c['runs'])} runs{per}"
           + (f" ({fmt_int(c['runs_per_variant'])} of each of {len(c['variants'])} planned "
              f"variants; sweep: {sweep})" if c["sweep"] else "")
           + f"; electricity {fmt_usd(c['electricity_usd_per_kwh'])}/kWh "
             f"({c['electricity_source']}); owned hardware's price spread over "
             f"{fmt_ratio(c['lifetime_years'])} years; one session at a time per platform."]
    for row in campaign_rows(doc):
        p = resolve(doc, row)
        if p["campaign"]["owned"] and p["campaign"]["crossovers"]:
            out.append(f"{p['platform_id']}: {crossover_text(doc, row)}.")
        if p["campaign"]["within_period"] is False:
            out.append(f"{p['platform_id']}: the runs take {fmt_seconds(p['campaign']['calendar_s'])}, "
                       f"more than a {c['per']}.")
    return out


FIXES = (
    Column("rung", "rung", T, align=L),
    Column("change", "title", T, align=L),
    Column("cost to you", "cost", T, align=L),
    Column("saves alone", "saved_bytes_alone", "bytes"),
    Column("alone", "fit_state_alone", T, align=L),
    Column("memory before", "device_used_bytes_before", "bytes"),
    Column("memory after", "device_used_bytes_after", "bytes"),
    Column("then", "fit_state", T, align=L),
    Column("micro-batch", "micro_batch_size", "int"),
    Column("accum", "grad_accum", "int"),
    Column("step before", "step_time_s_before", "s"),
    Column("step after", "step_time_s_after", "s"),
    Column("changes training", "changes_training", "bool"),
    Column("note", "note", T, align=L),
)


def fix_line(f: dict) -> str:
    """One rung of a platform's ladder in a sentence: its own saving, then the state with the
    rungs before it. 'fits' only where that state fits (predict/memory.py)."""
    alone = ""
    saved = f.get("saved_bytes_alone")
    if saved is not None:
        alone = (f": alone {'saves' if saved >= 0 else 'adds'} {fmt_bytes(abs(saved))} "
                 f"({f['fit_state_alone'] or '-'})")
    mb = f["micro_batch_size"]
    state = f.get("fit_state") or ("fits" if f["fits"] else "does not fit")
    then = (f"; with the rungs before, micro-batch {fmt_int(mb)}, {state}" if mb is not None
            else "; not planned")
    return f"{f['title']}{alone}{then}" + (f" ({f['note']})" if f["note"] else "")


# what the reports say where a plan has no memory curve (plan/extras.py `memory_curve`)
NO_CURVE = ("No curve: memory at other micro-batches than the plan's own would need traces the "
            "plan did not take (a rollout at another batch, or a micro-batch off the traced line).")
CURVE = (
    Column("micro-batch", "micro_batch_size", "int"),
    Column("device used", "device_used_bytes", "bytes"),
    Column("fits", "fits", "bool"),
    Column("interpolated", "interpolated", "bool"),
)

CATALOG = (
    Column("platform", "platform_id", T, align=L),
    Column("platform row as of", "platform_as_of", T, align=L),
    Column("status as of", "status_as_of", T, align=L),
    Column("accelerator", "accelerator_id", T, align=L),
    Column("accelerator row as of", "accelerator_as_of", T, align=L),
    Column("sources (data/SOURCES.md)", None,
           text=lambda doc, row: ", ".join(resolve(doc, row)["sources"]) or "-", align=L),
)


def problem_platforms(doc: dict):
    """(index, platform, its failing or warning checklist items) for every current platform that
    has fixes, impossible fixes or problems to show (the reports' "Problems and fixes")."""
    for i, p in enumerate(doc["platforms"]):
        if p["verdict"] == "RETIRED":
            continue
        issues = [c for c in p["checklist"] if c["status"] in ("fail", "warn")]
        if p["fixes"] or p["skipped_fixes"] or issues:
            yield i, p, issues


def chosen_index(doc: dict) -> int:
    """Index of the recommended platform, else the best-ranked one (the plan is in rank order)."""
    for i, p in enumerate(doc["platforms"]):
        if p["platform_id"] == doc.get("winner"):
            return i
    return 0


# (setting, path in job, path in the chosen platform's plan or None, format)
SETTINGS = (
    ("model", "job.model", None, "text"),
    ("parameters", "job.params_total", None, "count"),
    ("trainable parameters", "job.params_trainable", None, "count"),
    ("precision", "job.precision", "precision", "text"),
    ("optimizer", "job.optimizer", None, "text"),
    ("strategy", "job.strategy", "strategy", "text"),
    ("micro-batch", "job.batch_size", "micro_batch_size", "int"),
    ("gradient accumulation", "job.grad_accum", "grad_accum", "int"),
    ("global batch", "target_batch", "global_batch_size", "int"),
    ("sequence length", "job.seq_len", None, "int"),
    ("image size", "job.image_size", None, "int"),
    ("LoRA rank", "job.lora_rank", None, "int"),
    ("quantization", "job.quantize", None, "text"),
    ("activation checkpointing", "job.grad_checkpointing", None, "text"),
    ("gradient clipping (norm)", "job.max_grad_norm", None, "ratio"),
    ("optimizer steps", "steps", "steps", "int"),
)


def settings_rows(doc: dict) -> list[tuple[str, Cell, Cell, str]]:
    """(setting, as written, as planned on the chosen platform, assessment) for each setting the
    job states. A setting that a kept fix-ladder rung changes shows the rung as the reason."""
    i = chosen_index(doc)
    base = f"platforms[{i}]"
    kept = {k: (f["title"], v) for f in doc["platforms"][i]["fixes"] if not f["note"]
            for k, v in f["setting"].items()}
    out = []
    for label, job_path, plan_key, fmt in SETTINGS:
        written = resolve(doc, job_path)
        field = {"lora_rank": "lora"}.get(job_path.split(".")[-1], job_path.split(".")[-1])
        if written is None and field not in kept:
            continue
        align = L if fmt == T else "right"
        w = Cell(fmt_value(fmt, written), job_path if _number(written) else None, fmt, align)
        if plan_key is not None:
            planned = cell(doc, base, Column(label, plan_key, fmt, align=align))
        elif field in kept:
            v = kept[field][1]
            planned = Cell(f"rank {v['rank']}" if isinstance(v, dict) and "rank" in v
                           else fmt_value(fmt, v), None, T, align)
        else:
            planned = w
        if planned.text == w.text:
            verdict = "kept"
        else:
            verdict = "changed: " + (kept[field][0] if field in kept else "see the changes below")
        out.append((label, w, planned, verdict))
    return out


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
