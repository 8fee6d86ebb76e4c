"""`trainplan plan --report plan.html`: one self-contained HTML file with charts.

No network and no JavaScript: styles are inline, charts are inline SVG (`charts.py`), and the
plan's JSON document is embedded as data (`<script type="application/json" id="plan-json">`,
which a browser never executes). Sections are those of the Markdown report, with four charts
after the verdicts:

    memory per device, stacked by term, against each platform's capacity
    time to finish per platform
    cost against time to finish
    memory against micro-batch, with the capacity line (one panel per platform)

Every number in a table carries `data-json-path` (its place in the embedded JSON) and
`data-format` (the units.py format it is shown in), so a test can read the page as a browser
renders it and check each number against the JSON.
"""
from __future__ import annotations

import json
import re
from html import escape

from ..plan.verdict import headline
from ..units import fmt_note, key_label, fmt_bytes, fmt_int, fmt_seconds, fmt_usd, gib, time_unit
from . import charts
from ..plan.extras import ReportExtras
from .plan_document import document, resolve
from .sources import anchor, source_entries
from .plan_tables import (CAMPAIGN, CATALOG, COST, CURVE, NO_CURVE, FIXES, HARDWARE, PERFORMANCE, SESSIONS, STORAGE,
                          VERDICTS, Cell, chosen_index, fmt_by_key, memory_columns, phase_columns,
                          platform_rows, problem_platforms, rows, settings_rows,
                          campaign_lines, campaign_rows)

CHART_ROWS = 12       # platforms per bar chart: the best-ranked ones (the tables list them all)
CURVE_WIDTH = 560     # memory-curve panels, two side by side

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto;
       max-width: 1180px; padding: 0 1em; color: #1a1a1a; line-height: 1.4; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2em; margin-top: 1.8em; }
.wrap { overflow-x: auto; }
table { border-collapse: collapse; font-size: 0.88em; margin: 0.6em 0; }
th, td { border: 1px solid #d0d0d0; padding: 0.25em 0.55em; vertical-align: top; }
th { background: #f3f3f3; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.v-ready { background: #dff3e3; } .v-changes { background: #fff1cc; }
.v-wont { background: #fbdada; } .v-retired { background: #ececec; color: #666; }
.verdict { font-size: 1.25em; padding: 0.4em 0.7em; display: inline-block; border-radius: 4px; }
figure { margin: 1em 0; } figcaption { font-size: 0.85em; color: #555; max-width: 560px; }
.charts { display: flex; flex-wrap: wrap; gap: 1em; }
ul.check { list-style: none; padding-left: 0.5em; } ul.check li { margin: 0.15em 0; }
.s-pass::before { content: "\\2713  "; color: #1a7f37; font-weight: bold; }
.s-fail::before { content: "\\2717  "; color: #c00000; font-weight: bold; }
.s-warn::before { content: "!  "; color: #b36b00; font-weight: bold; }
.s-info::before { content: "\\2022  "; color: #666; }
"""

VERDICT_CLASS = {"READY": "v-ready", "READY WITH CHANGES": "v-changes", "TIGHT": "v-changes",
                 "WON'T FIT": "v-wont",
                 "RETIRED": "v-retired"}


HTML = "html"     # a Cell whose text is already markup (links), written as it is


def _td(c: Cell) -> str:
    cls = ' class="num"' if c.align == "right" else ""
    data = f' data-json-path="{escape(c.path)}" data-format="{c.fmt}"' if c.path else ""
    v = VERDICT_CLASS.get(c.text)
    if v:
        cls = f' class="{v}"'
    return f"<td{cls}{data}>{c.text if c.fmt == HTML else escape(c.text)}</td>"


def table(headers: list[str], body: list[list[Cell]], table_id: str = "") -> str:
    tid = f' id="{escape(table_id)}"' if table_id else ""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    trs = "\n".join("<tr>" + "".join(_td(c) for c in r) + "</tr>" for r in body)
    return f'<div class="wrap"><table{tid}>\n<tr>{head}</tr>\n{trs}\n</table></div>'


def _cols_table(doc, bases, cols, table_id="") -> str:
    return table([c.header for c in cols], rows(doc, bases, cols), table_id)


def _section(sid: str, title: str, body: list[str]) -> str:
    return f'<section id="{sid}">\n<h2>{escape(title)}</h2>\n' + "\n".join(body) + "\n</section>"


def _head(doc: dict) -> str:
    job = doc["job"]
    i = chosen_index(doc)
    best = doc["platforms"][i] if doc["platforms"] else None
    out = [f"<h1>Training plan: {escape(job['name'])}</h1>"]
    h = headline(doc)
    if h.platform_id:
        out.append(f'<p class="verdict {VERDICT_CLASS.get(h.verdict, "")}" id="verdict">'
                   f'{escape(h.verdict)} on <b>{escape(h.platform_id)}</b> '
                   f'({escape(h.name)})' + (f': {escape(h.text)}' if h.text else '') + '</p>')
    else:
        out.append(f'<p class="verdict v-wont" id="verdict">{escape(h.text)}</p>')
    out.append(f'<p id="recommendation"><b>Recommendation:</b> {escape(doc["recommendation"])}</p>')
    limits = [f"optimize for {doc['optimize']}",
              f'<span data-json-path="steps" data-format="int">{fmt_int(doc["steps"])}</span> '
              f"optimizer steps ({escape(doc['steps_source'])})",
              f'global batch <span data-json-path="target_batch" data-format="int">'
              f'{fmt_int(doc["target_batch"])}</span>']
    if doc.get("budget_usd") is not None:
        limits.append(f'budget <span data-json-path="budget_usd" data-format="usd">'
                      f'{fmt_usd(doc["budget_usd"])}</span>')
    if doc.get("deadline_s") is not None:
        limits.append(f'deadline <span data-json-path="deadline_s" data-format="s">'
                      f'{fmt_seconds(doc["deadline_s"])}</span>')
    out.append("<p><b>Planned for:</b> " + "; ".join(limits) + "</p>")
    if best and best["changes"] and doc.get("winner"):
        out.append(f"<p><b>Changes for {escape(best['platform_id'])}:</b></p><ol>"
                   + "".join(f"<li>{escape(c)}</li>" for c in best["changes"]) + "</ol>")
    return "<header>\n" + "\n".join(out) + "\n</header>"


# --- charts ------------------------------------------------------------------------------------

def _charted(doc: dict) -> list[dict]:
    return [p for p in doc["platforms"] if p["verdict"] != "RETIRED"][:CHART_ROWS]


def _figure(svg: str | None, caption: str, chart_id: str) -> str:
    if svg is None:
        return (f'<figure data-chart="{chart_id}" class="empty"><p>Nothing to chart: '
                f'{escape(caption)}</p></figure>')
    return f"<figure>\n{svg}\n<figcaption>{escape(caption)}</figcaption>\n</figure>"


def memory_chart(doc: dict) -> str | None:
    plats = [p for p in _charted(doc) if p["device_used_bytes"] is not None]
    if not plats:
        return None
    terms: list[str] = []
    for p in plats:
        terms += [k for k in p["memory_breakdown_bytes"] if k not in terms]
    rows_ = [charts.StackRow(p["platform_id"],
                             tuple(gib(p["memory_breakdown_bytes"].get(k, 0)) for k in terms),
                             gib(p["capacity_bytes"]),
                             f"{fmt_bytes(p['device_used_bytes'])} of {fmt_bytes(p['capacity_bytes'])}")
             for p in plats]
    return charts.stacked_bars("Memory per device against capacity", rows_,
                               [t.replace("_", " ") for t in terms], "GiB per device (2^30 bytes)",
                               chart_id="memory")


def _finishing(doc: dict) -> list[dict]:
    return [p for p in _charted(doc) if p["sessions"] is not None and p["cost"] is not None]


def time_chart(doc: dict) -> str | None:
    plats = _finishing(doc)
    if not plats:
        return None
    unit, per = time_unit(max(p["sessions"]["finish_s"] for p in plats))
    rows_ = [charts.Bar(p["platform_id"], p["sessions"]["finish_s"] / per,
                        fmt_seconds(p["sessions"]["finish_s"])) for p in plats]
    return charts.bars("Time to finish (sessions and quota waits included)", rows_,
                       f"time to finish ({unit})", chart_id="time")


def cost_chart(doc: dict) -> str | None:
    plats = _finishing(doc)
    if not plats:
        return None
    unit, per = time_unit(max(p["sessions"]["finish_s"] for p in plats))
    pts = [charts.Point(p["platform_id"], p["sessions"]["finish_s"] / per, p["cost"]["total_usd"])
           for p in plats]
    return charts.scatter("Cost against time to finish", pts, f"time to finish ({unit})",
                          "total cost (USD)", chart_id="cost")


def curve_charts(doc: dict) -> list[str]:
    out = []
    for c in doc.get("memory_vs_micro_batch") or []:
        pts = tuple((q["micro_batch_size"], gib(q["device_used_bytes"])) for q in c["points"])
        planned = next((q for q in c["points"] if q["micro_batch_size"] == c["planned_micro_batch_size"]),
                       None)
        s = charts.Series(f"{c['accelerator_id']} x {fmt_int(c['devices'])} device(s), accumulation {c['grad_accum']}",
                          pts, (planned["micro_batch_size"], gib(planned["device_used_bytes"]))
                          if planned else None, "planned" if planned else "")
        out.append(charts.line_chart(
            f"Memory against micro-batch: {c['platform_id']}", [s], "micro-batch per device",
            "GiB per device", [(f"capacity {fmt_bytes(c['capacity_bytes'])}", gib(c["capacity_bytes"]))],
            chart_id=f"curve-{c['platform_id']}", width=CURVE_WIDTH))
    return out


def _charts(doc: dict) -> list[str]:
    n = len(_charted(doc))
    more = f" The best-ranked {n} current platforms; the tables list all." if \
        len(platform_rows(doc, include_retired=False)) > n else ""
    figs = [
        _figure(memory_chart(doc), "Device memory per device by term (weights, gradients, optimizer "
                "state, activations, temporaries, framework overhead); the dashed red mark is the "
                "device's usable capacity." + more, "memory"),
        _figure(time_chart(doc), "Wall-clock time from the first session to the last step, with "
                "per-session overheads and waits for weekly quota." + more, "time"),
        _figure(cost_chart(doc), "Total dollars (compute and subscription) against time to finish: "
                "down and to the left is better." + more, "cost"),
    ]
    curves = curve_charts(doc)
    if curves:
        figs += [_figure(svg, "Device memory at each micro-batch for the plan's job on this "
                              "platform; the circled point is the planned micro-batch. Points "
                              "between traced micro-batches are interpolated.", "curve")
                 for svg in curves]
    else:
        figs.append(_figure(None, "memory against micro-batch was not computed for this report",
                            "curve"))
    return ['<div class="charts">', *figs, "</div>"]


# --- the other sections -------------------------------------------------------------------------

def _settings(doc: dict) -> list[str]:
    i = chosen_index(doc)
    p = doc["platforms"][i]
    body = [[Cell(label, None, "text", "left"), w, planned, Cell(verdict, None, "text", "left")]
            for label, w, planned, verdict in settings_rows(doc)]
    out = [table(["setting", "job as written", f"planned on {p['platform_id']}", "assessment"], body,
                 "settings")]
    if p["findings"]:
        out.append(f"<p>Findings on {escape(p['platform_id'])}:</p><ul>" + "".join(
            f"<li><b>{escape(f['severity'])}:</b> {escape(f['message'])}"
            + (f" Fix: {escape(f['fix'])}" if f.get("fix") else "") + "</li>"
            for f in p["findings"]) + "</ul>")
    return out


def _curves(doc: dict) -> list[str]:
    out = []
    for k, c in enumerate(doc.get("memory_vs_micro_batch") or []):
        out.append(f"<h3>{escape(c['platform_id'])}</h3><p>{escape(c['accelerator_id'])}, "
                   f"{fmt_int(c['devices'])} device(s), capacity {fmt_bytes(c['capacity_bytes'])}, planned "
                   f"micro-batch {fmt_int(c['planned_micro_batch_size'])} x {fmt_int(c['grad_accum'])} accumulation</p>")
        bases = [f"memory_vs_micro_batch[{k}].points[{j}]" for j in range(len(c["points"]))]
        out.append(_cols_table(doc, bases, CURVE))
    return out or [f"<p>{escape(NO_CURVE)}</p>"]


def _checks(items: list[dict]) -> str:
    return '<ul class="check">' + "".join(
        f'<li class="s-{escape(c["status"])}">{escape(c["text"])}</li>' for c in items) + "</ul>"


def _problems(doc: dict) -> list[str]:
    out = []
    for i, p, issues in problem_platforms(doc):
        out.append(f"<h3>{escape(p['platform_id'])}: {escape(p['verdict'])}</h3>")
        if p["reason"]:
            out.append(f"<p>{escape(p['reason'])}</p>")
        if p["fixes"]:
            bases = [f"platforms[{i}].fixes[{j}]" for j in range(len(p["fixes"]))]
            out += ["<p>Fix ladder, each rung on top of the ones before:</p>",
                    _cols_table(doc, bases, FIXES)]
        if p["skipped_fixes"]:
            out.append("<p>Not possible here: " + escape("; ".join(p["skipped_fixes"])) + ".</p>")
        if issues:
            out.append(_checks(issues))
    return out or ["<p>No platform needs a fix beyond the changes listed in its checklist.</p>"]


def _checklist(doc: dict) -> list[str]:
    p = doc["platforms"][chosen_index(doc)]
    out = [f"<p>For <b>{escape(p['platform_id'])}</b> ({escape(p['name'])}), verdict "
           f"{escape(p['verdict'])}:</p>"]
    if p["changes"]:
        out.append("<p>Before launch, change:</p><ol>" + "".join(
            f"<li>{escape(c)}</li>" for c in p["changes"]) + "</ol><p>Then check:</p>")
    out.append(_checks(p["checklist"]))
    return out


def _assumptions(doc: dict) -> list[str]:
    items = [f"{key_label(k)}: {fmt_by_key(k, v)}" for k, v in doc["assumptions"].items()]
    items += ["memory in GiB (2^30 bytes), per device, as nvidia-smi shows it (allocator reserve "
              "and CUDA context included)", f"plan schema_version {doc['schema_version']}"]
    items += [f"note: {fmt_note(n)}" for n in doc.get("notes", [])]
    out = ["<ul>" + "".join(f"<li>{escape(s)}</li>" for s in items) + "</ul>"]
    if doc.get("catalog"):
        bases = [f"catalog[{j}]" for j in range(len(doc["catalog"]))]
        body = []
        for base, r in zip(bases, rows(doc, bases, CATALOG)):
            ids = resolve(doc, base)["sources"]
            links = ", ".join(f'<a href="#{anchor(i)}">{escape(i)}</a>' for i in ids) or "-"
            body.append(r[:-1] + [Cell(links, None, HTML, "left")])
        out += ["<p>Catalog rows the numbers rest on:</p>",
                table([c.header for c in CATALOG], body, "catalog"), *_sources(doc)]
    return out


def _offline(text: str) -> str:
    """A quoted source without its URL schemes: the page stays self-contained (no link out;
    the address still reads as one)."""
    return re.sub(r"https?://", "", text)


def _sources(doc: dict) -> list[str]:
    """The sources the catalog rows cite, each row with the id the catalog's links point at."""
    cited = list(dict.fromkeys(i for r in doc.get("catalog", []) for i in r["sources"]))
    if not cited:
        return []
    entries = source_entries()
    trs = "\n".join(f'<tr id="{anchor(i)}"><td>{escape(i)}</td><td>'
                     f'{escape(_offline(entries.get(i, "not in data/SOURCES.md")))}</td></tr>'
                     for i in cited)
    return ["<p>Sources cited (from data/SOURCES.md):</p>",
            f'<div class="wrap"><table id="sources">\n<tr><th>id</th><th>source</th></tr>\n{trs}\n'
            "</table></div>"]


def embedded_json(doc: dict) -> str:
    """The document as JSON that is safe inside a <script> element ('</' cannot close it)."""
    return json.dumps(doc, indent=1, sort_keys=False).replace("</", "<\\/")


def campaign_chart(doc: dict) -> str | None:
    """The campaign's cumulative cost against the number of runs, per platform (its points are
    the plan's `campaign.cost_by_runs`)."""
    series = [charts.Series(p["platform_id"], [(float(n), usd) for n, usd in
                                               p["campaign"]["cost_by_runs"]])
              for p in (resolve(doc, r) for r in campaign_rows(doc)[:CHART_ROWS])]
    if not series:
        return None
    return charts.line_chart("Cumulative cost of the campaign", series, "runs",
                             "total cost (USD)", chart_id="campaign-cost")


def _campaign(doc: dict) -> list[str]:
    return ([f"<p>{escape(line)}</p>" for line in campaign_lines(doc)]
            + [_figure(campaign_chart(doc), "Cumulative cost of the campaign by run count; an "
                       "owned machine starts at its share of the purchase price.",
                       "campaign-cost"),
               _cols_table(doc, campaign_rows(doc), CAMPAIGN)])


def plan_html(plan, extras: ReportExtras | None = None, doc: dict | None = None) -> str:
    """The HTML report of `plan` (or of an already built `doc`)."""
    doc = doc or document(plan, extras)
    every = platform_rows(doc)
    live = platform_rows(doc, include_retired=False)
    phases = phase_columns(doc)
    fitting = [f"platforms[{i}]" for i, p in enumerate(doc["platforms"]) if p["sessions"] is not None]
    secs = [
        _section("verdicts", "Verdicts", [_cols_table(doc, every, VERDICTS, "verdict-table")]),
        _section("charts", "Charts", _charts(doc)),
        _section("hardware", "Hardware compared", [_cols_table(doc, every, HARDWARE)]),
        _section("settings", "The job's settings", _settings(doc)),
        _section("memory", "Memory per device",
                 ["<p>Per device, GiB = 2^30 bytes; the terms sum to the device used.</p>",
                  _cols_table(doc, every, memory_columns(doc))]),
        _section("memory-curve", "Memory against micro-batch", _curves(doc)),
        _section("performance", "Predicted performance", [_cols_table(doc, live, PERFORMANCE)] + (
            ["<p>Step phases, time per optimizer step:</p>", _cols_table(doc, live, phases)]
            if phases else [])),
        _section("sessions", "Sessions, quota and cost",
                 [_cols_table(doc, fitting, SESSIONS), "<p>Checkpoints:</p>",
                  _cols_table(doc, fitting, STORAGE), "<p>Cost:</p>", _cols_table(doc, fitting, COST)]
                 if fitting else ["<p>No platform runs the job, so there are no sessions to plan.</p>"]),
        *([_section("campaign", "Campaign", _campaign(doc))] if doc.get("campaign") else []),
        _section("problems", "Problems and fixes", _problems(doc)),
        _section("checklist", "Launch checklist", _checklist(doc)),
        _section("assumptions", "Assumptions and catalog dates", _assumptions(doc)),
    ]
    title = f"Training plan: {doc['job']['name']}"
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(title)}</title>", f"<style>{CSS}</style>", "</head>", "<body>",
        _head(doc), *secs,
        f'<script type="application/json" id="plan-json">{embedded_json(doc)}</script>',
        "</body>", "</html>", ""])
