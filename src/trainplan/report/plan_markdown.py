"""`trainplan plan --format md` / `--report plan.md`: the plan as a Markdown document.

The structure follows what the seeds write by hand (a decision and answer first, a comparison
table, memory analysis, configuration assessment, predicted performance, issues with solutions,
a setup checklist) but every number comes from the plan. Sections, in this order:

    verdict and recommendation, the verdicts table          (first screen)
    Hardware compared, The job's settings, Memory per device, Memory against micro-batch,
    Predicted performance, Sessions, quota and cost, Problems and fixes, Launch checklist,
    Assumptions and catalog dates

Nothing here computes; the tables are `plan_tables.py`, the formats `units.py`. The output is
deterministic (no dates or timings of its own), so the examples' reports are golden files.
"""
from __future__ import annotations

from ..plan.extras import ReportExtras
from .plan_document import document
from .plan_tables import (CAMPAIGN, CATALOG, COST, CURVE, NO_CURVE, FIXES, HARDWARE, PERFORMANCE, SESSIONS, STORAGE,
                          VERDICTS, Cell, chosen_index, fmt_by_key, memory_columns, phase_columns,
                          platform_rows, problem_platforms, rows, settings_rows,
                          campaign_lines, campaign_rows)
from ..plan.verdict import headline
from ..units import fmt_note, key_label, fmt_bytes, fmt_int, fmt_seconds, fmt_usd

SECTIONS = ("Verdicts", "Hardware compared", "The job's settings", "Memory per device",
            "Memory against micro-batch", "Predicted performance", "Sessions, quota and cost",
            "Campaign", "Problems and fixes", "Launch checklist", "Assumptions and catalog dates")
CHECK_MARK = {"pass": "- [x] ", "fail": "- [ ] **fail:** ", "warn": "- [ ] **check:** ",
              "info": "- "}


def _esc(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def table(headers: list[str], body: list[list[Cell]] | list[list[str]],
          aligns: list[str] | None = None) -> str:
    """A GitHub-flavoured Markdown table; cells are Cells or strings."""
    aligns = aligns or [c.align if isinstance(c, Cell) else "left" for c in (body[0] if body else [])]
    rule = ["---:" if a == "right" else "---" for a in aligns] or ["---"] * len(headers)
    lines = ["| " + " | ".join(_esc(h) for h in headers) + " |", "|" + "|".join(rule) + "|"]
    for r in body:
        lines.append("| " + " | ".join(_esc(c.text if isinstance(c, Cell) else str(c)) for c in r) + " |")
    return "\n".join(lines)


def _cols_table(doc, bases, cols) -> str:
    return table([c.header for c in cols], rows(doc, bases, cols), [c.align for c in cols])


def _head(doc: dict) -> list[str]:
    job = doc["job"]
    i = chosen_index(doc)
    best = doc["platforms"][i] if doc["platforms"] else None
    out = [f"# Training plan: {job['name']}", ""]
    h = headline(doc)
    if h.platform_id:
        out.append(f"**Verdict:** {h.verdict} on **{h.platform_id}** ({h.name})"
                   + (f": {h.text}" if h.text else ""))
    else:
        out.append(f"**Verdict:** {h.text}")
    out += ["", f"**Recommendation:** {doc['recommendation']}", ""]
    limits = [f"optimize for {doc['optimize']}", f"{fmt_int(doc['steps'])} optimizer steps "
              f"({doc['steps_source']})", f"global batch {fmt_int(doc['target_batch'])}"]
    if doc.get("budget_usd") is not None:
        limits.append(f"budget {fmt_usd(doc['budget_usd'])}")
    if doc.get("deadline_s") is not None:
        limits.append(f"deadline {fmt_seconds(doc['deadline_s'])}")
    out.append("**Planned for:** " + "; ".join(limits))
    if best and best["changes"] and doc.get("winner"):
        out += ["", f"**Changes for {best['platform_id']}:**", ""]
        out += [f"{k}. {c}" for k, c in enumerate(best["changes"], 1)]
    return out


def _settings(doc: dict) -> list[str]:
    i = chosen_index(doc)
    p = doc["platforms"][i]
    body = [[label, w, planned, verdict] for label, w, planned, verdict in settings_rows(doc)]
    out = [table(["setting", "job as written", f"planned on {p['platform_id']}", "assessment"],
                 body, ["left", "right", "right", "left"])]
    notes = [f for f in p["findings"] if f["severity"] in ("error", "warning", "info")]
    if notes:
        out += ["", f"Findings on {p['platform_id']}:", ""]
        out += [f"- **{f['severity']}:** {f['message']}" + (f" Fix: {f['fix']}" if f.get("fix") else "")
                for f in notes]
    return out


def _curves(doc: dict) -> list[str]:
    curves = doc.get("memory_vs_micro_batch") or []
    if not curves:
        return [NO_CURVE]
    out = ["Device memory is affine in the micro-batch for a fixed input shape; points between "
           "two traced micro-batches are interpolated (an upper bound)."]
    for k, c in enumerate(curves):
        out += ["", f"**{c['platform_id']}** ({c['accelerator_id']}, {fmt_int(c['devices'])} device(s), "
                    f"capacity {fmt_bytes(c['capacity_bytes'])}, planned micro-batch "
                    f"{fmt_int(c['planned_micro_batch_size'])} x {fmt_int(c['grad_accum'])} accumulation)", ""]
        bases = [f"memory_vs_micro_batch[{k}].points[{j}]" for j in range(len(c["points"]))]
        out.append(_cols_table(doc, bases, CURVE))
    return out


def _problems(doc: dict) -> list[str]:
    out = []
    for i, p, issues in problem_platforms(doc):
        out += [f"### {p['platform_id']}: {p['verdict']}", ""]
        if p["reason"]:
            out += [p["reason"], ""]
        if p["fixes"]:
            bases = [f"platforms[{i}].fixes[{j}]" for j in range(len(p["fixes"]))]
            out += ["Fix ladder, each rung on top of the ones before:", "",
                    _cols_table(doc, bases, FIXES), ""]
        if p["skipped_fixes"]:
            out += ["Not possible here: " + "; ".join(p["skipped_fixes"]) + ".", ""]
        out += [CHECK_MARK[c["status"]] + c["text"] for c in issues]
        if issues:
            out.append("")
    return out or ["No platform needs a fix beyond the changes listed in its checklist."]


def _checklist(doc: dict) -> list[str]:
    i = chosen_index(doc)
    p = doc["platforms"][i]
    out = [f"For **{p['platform_id']}** ({p['name']}), verdict {p['verdict']}:", ""]
    if p["changes"]:
        out += ["Before launch, change:", ""]
        out += [f"{k}. {c}" for k, c in enumerate(p["changes"], 1)]
        out += ["", "Then check:", ""]
    out += [CHECK_MARK[c["status"]] + c["text"] for c in p["checklist"]]
    return out


def _assumptions(doc: dict) -> list[str]:
    out = [f"- {key_label(k)}: {fmt_by_key(k, v)}" for k, v in doc["assumptions"].items()]
    out += ["- memory in GiB (2^30 bytes), per device, as nvidia-smi shows it (allocator "
            "reserve and CUDA context included)",
            f"- plan schema_version {doc['schema_version']}"]
    out += [f"- note: {fmt_note(n)}" for n in doc.get("notes", [])]
    if doc.get("catalog"):
        bases = [f"catalog[{j}]" for j in range(len(doc["catalog"]))]
        out += ["", "Catalog rows the numbers rest on:", "", _cols_table(doc, bases, CATALOG)]
    return out


def plan_markdown(plan, extras: ReportExtras | None = None, doc: dict | None = None) -> str:
    """The Markdown report of `plan` (or of an already built `doc`)."""
    doc = doc or document(plan, extras)
    every = platform_rows(doc)
    live = platform_rows(doc, include_retired=False)
    fitting = [b for b in every if doc["platforms"][int(b[10:-1])]["sessions"] is not None]
    sec = dict.fromkeys(SECTIONS)
    sec["Verdicts"] = [_cols_table(doc, every, VERDICTS)]
    sec["Hardware compared"] = [_cols_table(doc, every, HARDWARE)]
    sec["The job's settings"] = _settings(doc)
    sec["Memory per device"] = ["Per device, GiB = 2^30 bytes; the terms sum to the device used.", "",
                                _cols_table(doc, every, memory_columns(doc))]
    sec["Memory against micro-batch"] = _curves(doc)
    phases = phase_columns(doc)
    sec["Predicted performance"] = [_cols_table(doc, live, PERFORMANCE)] + (
        ["", "Step phases, time per optimizer step:", "", _cols_table(doc, live, phases)]
        if phases else [])
    sec["Sessions, quota and cost"] = (
        [_cols_table(doc, fitting, SESSIONS), "", "Checkpoints:", "", _cols_table(doc, fitting, STORAGE),
         "", "Cost:", "", _cols_table(doc, fitting, COST)]
        if fitting else ["No platform runs the job, so there are no sessions to plan."])
    if doc.get("campaign"):
        sec["Campaign"] = [*campaign_lines(doc), "",
                           _cols_table(doc, campaign_rows(doc), CAMPAIGN)]
    sec["Problems and fixes"] = _problems(doc)
    sec["Launch checklist"] = _checklist(doc)
    sec["Assumptions and catalog dates"] = _assumptions(doc)
    out = _head(doc)
    for name, body in sec.items():
        if body is None:          # a section this plan has nothing for (Campaign)
            continue
        while body and body[-1] == "":
            body = body[:-1]
        out += ["", f"## {name}", "", *body]
    return "\n".join(out).rstrip() + "\n"
