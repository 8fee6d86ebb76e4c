"""`trainplan plan` in the terminal, with rich: the verdict, the recommendation and the verdicts
table on the first screen; the details (memory, performance, sessions and cost, problems and
fixes, the launch checklist, assumptions and catalog dates) below.

The tables are the Markdown and HTML report's (`plan_tables.py`), so the three show the same
numbers. Colour only where the terminal supports it: rich's Console decides from the stream
(no colour when piped) and honours NO_COLOR (https://no-color.org) and TERM=dumb.

`tracing_progress()` is the progress display while models are traced: a rich status line on
stderr, only when stderr is a terminal (so logs and pipes stay clean).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from .console import Col, console as default_console, fit_table
from ..plan.extras import ReportExtras
from .plan_document import document
from .plan_tables import (CAMPAIGN, COST, PERFORMANCE, SESSIONS, VERDICTS, Column,
                          campaign_lines, campaign_rows, chosen_index, fix_line,
                          fmt_by_key, memory_columns, phase_columns, platform_rows, rows)
from ..plan.verdict import headline
from ..predict.memory import NO_FIT
from ..units import fmt_gib_pair, fmt_int, fmt_note, fmt_seconds, fmt_usd, key_label

FIRST_SCREEN = 12     # platforms in the first table; the rest follow below it
DETAILS = 6           # platforms in the detail tables
STYLE = {"READY": "bold green", "READY WITH CHANGES": "bold yellow", "TIGHT": "bold yellow",
         "WON'T FIT": "bold red",
         "RETIRED": "dim"}
TERMINAL_SKIPS = ("peak in", "host RAM needed", "host RAM")   # in the Markdown and HTML reports
MARK = {"pass": "[green]✓[/green]", "fail": "[red]✗[/red]", "warn": "[yellow]![/yellow]",
        "info": "[cyan]·[/cyan]"}


def _styled(text: str) -> str:
    s = STYLE.get(text)
    return f"[{s}]{escape(text)}[/{s}]" if s else escape(text)


# Which columns stay when the terminal is narrow: higher stays longer; the platform id is the
# key (never cut, never left out). Headers not named here go first.
PRIORITY = {
    "verdict": 20, "time to finish": 18, "cost": 17, "total": 17, "memory / device": 16,
    "device used": 16, "capacity": 15, "headroom": 14, "step time": 16, "training time": 15,
    "micro-batch x accum x devices": 12, "sessions": 14, "accelerator time": 13,
    "weeks of quota": 12, "price / hour": 14, "accelerator hours": 13, "within budget": 12,
    "meets deadline": 12, "accelerator": 10, "samples/s": 11, "tokens/s": 10, "MFU": 9,
    "bound": 6, "steps": 5, "session limit": 8, "weekly quota": 7, "overhead / session": 6,
    "checkpoint every (steps)": 4, "compute": 6, "subscription": 5, "compute units": 4, "#": 3,
    "runs": 11, "calendar": 18, "runs / week of quota": 9, "hardware": 7, "electricity": 6,
    "waiting ($10/h)": 3,
}
KEYS = ("platform",)


def rich_table(doc: dict, bases: list[str], cols: tuple[Column, ...], title: str = "",
               width: int = 80):
    """The table laid out for `width` columns (report/console.py: ids whole, low-priority
    columns left out and named when it is narrow)."""
    spec = [Col(c.header, "right" if c.align == "right" else "left", key=c.header in KEYS,
                priority=PRIORITY.get(c.header, 0)) for c in cols]
    body = [[_styled(c.text) for c in r] for r in rows(doc, bases, cols)]
    return fit_table(spec, body, width, title)


def _items(lines: list[tuple[str, str]], indent: int = 2) -> Table:
    """(mark, text) lines with a hanging indent: wrapped text stays right of its mark."""
    g = Table.grid(padding=(0, 1, 0, 0))
    g.add_column(width=indent, no_wrap=True)
    g.add_column(no_wrap=True)
    g.add_column(overflow="fold")
    for mark, text in lines:
        g.add_row("", mark, text)
    return g


def _info_findings(platform: dict) -> list[tuple[str, str]]:
    """The information-level findings (precision substitutions and the like), which the
    checklist does not carry, as compact lines."""
    return [(MARK["info"], escape(f["message"] + (f" -> {f['fix']}" if f.get("fix") else "")))
            for f in platform.get("findings", []) if f["severity"] == "info"]


def _headline(doc: dict) -> Panel:
    i = chosen_index(doc)
    best = doc["platforms"][i] if doc["platforms"] else None
    job = doc["job"]
    lines = []
    h = headline(doc)
    if h.platform_id:
        lines.append(f"{_styled(h.verdict)} on [bold]{escape(h.platform_id)}[/bold] "
                     f"({escape(h.name)})" + (f": {escape(h.text)}" if h.text else ""))
    else:
        lines.append(f"[bold red]{escape(h.text)}[/bold red]")
    lines.append(f"[bold]Recommendation:[/bold] {escape(doc['recommendation'])}")
    plan_for = [f"optimize for {doc['optimize']}", f"{fmt_int(doc['steps'])} steps",
                f"global batch {fmt_int(doc['target_batch'])}"]
    if doc.get("budget_usd") is not None:
        plan_for.append(f"budget {fmt_usd(doc['budget_usd'])}")
    if doc.get("deadline_s") is not None:
        plan_for.append(f"deadline {fmt_seconds(doc['deadline_s'])}")
    lines.append("[dim]" + escape("; ".join(plan_for)) + "[/dim]")
    body: list = ["\n".join(lines)]
    if best and best["changes"] and doc.get("winner"):
        body += ["[bold]Changes:[/bold]",
                 _items([(f"{k}.", escape(c)) for k, c in enumerate(best["changes"], 1)])]
    return Panel(Group(*body), title=f"Training plan: {escape(job['name'])}", title_align="left")


def _checklist(doc: dict) -> Group:
    p = doc["platforms"][chosen_index(doc)]
    lines = [(MARK.get(c["status"], "?"), escape(c["text"])) for c in p["checklist"]]
    return Group(f"[bold]Launch checklist for {escape(p['platform_id'])}[/bold]",
                 _items(lines + _info_findings(p)))


def _problems(doc: dict, limit: int) -> list:
    out = []
    for p in doc["platforms"][:limit]:
        issues = [c for c in p["checklist"] if c["status"] in ("fail", "warn")]
        infos = _info_findings(p)
        if p["verdict"] == "RETIRED" or not (p["fixes"] or issues or infos):
            continue
        out.append(f"[bold]{escape(p['platform_id'])}[/bold]: {_styled(p['verdict'])}")
        lines = []
        for f in p["fixes"]:
            lines.append(("fix:", escape(fix_line(f))))
        lines += [(MARK[c["status"]], escape(c["text"])) for c in issues]
        out.append(_items(lines + infos))
    return out


def plan_rich(plan, extras: ReportExtras | None = None, console: Console | None = None,
              doc: dict | None = None) -> None:
    """Print the plan: first screen (verdict, recommendation, verdicts), then details."""
    c = console or default_console()
    w = c.width
    doc = doc or document(plan, extras)
    every = platform_rows(doc)
    c.print(_headline(doc))
    c.print(rich_table(doc, every[:FIRST_SCREEN], VERDICTS, "Verdicts, best first", w))
    if len(every) > FIRST_SCREEN:
        c.print(f"[dim]... {len(every) - FIRST_SCREEN} more platforms below[/dim]")
    top = platform_rows(doc, include_retired=False)[:DETAILS]
    fitting = [b for b in top if doc["platforms"][int(b[10:-1])]["sessions"] is not None]
    memory = tuple(col for col in memory_columns(doc) if col.header not in TERMINAL_SKIPS)
    c.print()
    c.print(rich_table(doc, top, memory, "Memory per device (GiB = 2^30 bytes)", w))
    c.print()
    c.print(rich_table(doc, top, PERFORMANCE, "Predicted performance", w))
    phases = phase_columns(doc)
    if phases:
        c.print(rich_table(doc, top, phases, "Step phases (time per optimizer step)", w))
    if fitting:
        c.print()
        c.print(rich_table(doc, fitting, SESSIONS, "Sessions and quota", w))
        c.print()
        c.print(rich_table(doc, fitting, COST, "Cost", w))
    if doc.get("campaign"):
        c.print()
        c.print(rich_table(doc, campaign_rows(doc)[:DETAILS], CAMPAIGN, "Campaign", w))
        for line in campaign_lines(doc):
            c.print(escape(line))
    problems = _problems(doc, DETAILS)
    if problems:
        c.print("\n[bold]Problems and fixes[/bold]")
        for line in problems:
            c.print(line)
    c.print()
    c.print(_checklist(doc))
    if len(every) > FIRST_SCREEN:
        c.print()
        c.print(rich_table(doc, every[FIRST_SCREEN:], VERDICTS, "The other platforms", w))
    c.print("\n[dim]" + escape("; ".join(f"{key_label(k)}: {fmt_by_key(k, v)}"
                                         for k, v in doc["assumptions"].items())) + "[/dim]")
    for n in doc.get("notes", []):
        c.print(f"[dim]note: {escape(fmt_note(n))}[/dim]")
    dates = sorted({r["platform_as_of"] for r in doc.get("catalog", []) if r["platform_as_of"]}
                   | {r["accelerator_as_of"] for r in doc.get("catalog", []) if r["accelerator_as_of"]})
    if dates:
        c.print(f"[dim]catalog rows as of {dates[0]}"
                + (f" to {dates[-1]}" if dates[-1] != dates[0] else "") + "[/dim]")


def stderr_console() -> Console:
    """The console a plan's progress and first answer share (stderr; stdout is the report)."""
    return Console(stderr=True, highlight=False)


@contextlib.contextmanager
def tracing_progress(console: Console | None = None) -> Iterator[Callable[[str], None] | None]:
    """A progress callback for `Planner` / `Traces(progress=...)`: a status line on stderr that
    shows the trace under way, and one dim line per finished trace. Yields None (no display)
    when stderr is not a terminal."""
    err = console or stderr_console()
    if not err.is_terminal:
        yield None
        return
    done: list[str] = []
    with err.status("planning", spinner="dots") as status:
        def progress(message: str) -> None:
            if done:
                err.print(f"[dim]  {escape(done[-1])}: done[/dim]", highlight=False)
            done.append(message)
            status.update(f"{escape(message)} (trace {len(done)})")
        yield progress
    if done:                  # two lines: a trace's name may take most of 80 columns
        err.print(f"[dim]  {escape(done[-1])}: done[/dim]", highlight=False)
        err.print(f"[dim]  {len(done)} trace{'s' if len(done) > 1 else ''} made[/dim]",
                  highlight=False)


AS_GIVEN_ROWS = 6      # more platforms than this: summary lines (a plan over every platform)


def as_given_lines(rows: list) -> list[str]:
    """What a plan knows first (plan/result.py `AsGiven`, one per platform): the job as written
    on each platform, a line each (micro-batch a device, time a step, memory needed / capacity),
    or two summary lines over many; then what comes next. Under 80 columns for the catalog's
    platform names (25 characters at most)."""
    if not rows:
        return []
    runs = [r for r in rows if r.fit_state != NO_FIT]
    rest = len(rows) - len(runs)
    if len(rows) > AS_GIVEN_ROWS:
        out = [f"As written, the job fits on {len(runs)} of {len(rows)} platforms."]
        if runs:
            fast = min(runs, key=lambda r: r.step_time_s)
            out.append(f"Fastest as written: {fast.platform_id}, "
                       f"{fmt_seconds(fast.step_time_s)} a step.")
    else:
        width = max(len(r.platform_id) for r in rows)
        out = ["As written (micro-batch a device, time a step, memory needed / capacity):"]
        for r in rows:
            when = fmt_seconds(r.step_time_s) if r.fit_state != NO_FIT else ""
            out.append(f"  {r.platform_id:<{width}}  {r.fit_state:<12}  {fmt_int(r.micro_batch):>4}"
                       f"  {when:>9}  {fmt_gib_pair(r.required_bytes, r.capacity_bytes)}")
    if rest:
        out.append(f"Next: the fix ladder where it does not fit ({rest} platform"
                   f"{'s' if rest > 1 else ''}), then the plan.")
    return out


def print_as_given(rows: list, console: Console | None = None) -> None:
    """`as_given_lines` on stderr, while the fix ladders and batch searches are planned."""
    err = console or stderr_console()
    for line in as_given_lines(rows):
        err.print(escape(line), highlight=False, overflow="ellipsis", no_wrap=True)
