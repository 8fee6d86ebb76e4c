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

from .console import console as default_console
from ..plan.extras import ReportExtras
from .plan_document import document
from .plan_tables import (COST, PERFORMANCE, SESSIONS, VERDICTS, Column, chosen_index,
                          fmt_by_key, memory_columns, platform_rows, rows)
from ..units import fmt_int, fmt_seconds, fmt_usd

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


def rich_table(doc: dict, bases: list[str], cols: tuple[Column, ...], title: str = "") -> Table:
    t = Table(title=title or None, title_justify="left", show_edge=False, pad_edge=False,
              header_style="bold")
    for c in cols:
        t.add_column(c.header, justify="right" if c.align == "right" else "left")
    for r in rows(doc, bases, cols):
        t.add_row(*(_styled(c.text) for c in r))
    return t


def _headline(doc: dict) -> Panel:
    i = chosen_index(doc)
    best = doc["platforms"][i] if doc["platforms"] else None
    job = doc["job"]
    lines = []
    if doc.get("winner") and best:
        lines.append(f"{_styled(best['verdict'])} on [bold]{escape(best['platform_id'])}[/bold] "
                     f"({escape(best['name'])})")
    else:
        lines.append("[bold red]no platform qualifies[/bold red]")
    lines.append(f"[bold]Recommendation:[/bold] {escape(doc['recommendation'])}")
    plan_for = [f"optimize for {doc['optimize']}", f"{fmt_int(doc['steps'])} steps",
                f"global batch {fmt_int(doc['target_batch'])}"]
    if doc.get("budget_usd") is not None:
        plan_for.append(f"budget {fmt_usd(doc['budget_usd'])}")
    if doc.get("deadline_s") is not None:
        plan_for.append(f"deadline {fmt_seconds(doc['deadline_s'])}")
    lines.append("[dim]" + escape("; ".join(plan_for)) + "[/dim]")
    if best and best["changes"] and doc.get("winner"):
        lines.append("[bold]Changes:[/bold]")
        lines += [f"  {k}. {escape(c)}" for k, c in enumerate(best["changes"], 1)]
    return Panel("\n".join(lines), title=f"Training plan: {escape(job['name'])}", title_align="left")


def _checklist(doc: dict) -> Group:
    p = doc["platforms"][chosen_index(doc)]
    lines = [f"[bold]Launch checklist for {escape(p['platform_id'])}[/bold]"]
    lines += [f"  {MARK.get(c['status'], '?')} {escape(c['text'])}" for c in p["checklist"]]
    return Group(*lines)


def _problems(doc: dict, limit: int) -> list[str]:
    out = []
    for p in doc["platforms"][:limit]:
        issues = [c for c in p["checklist"] if c["status"] in ("fail", "warn")]
        if p["verdict"] == "RETIRED" or not (p["fixes"] or issues):
            continue
        out.append(f"[bold]{escape(p['platform_id'])}[/bold]: {_styled(p['verdict'])}")
        for f in p["fixes"]:
            state = "fits" if f["fits"] else "does not fit yet"
            mb = f["micro_batch_size"]
            result = f"micro-batch {mb}, {state}" if mb is not None else "not planned"
            out.append(f"  fix: {escape(f['title'])} -> {result}"
                       + (f" ({escape(f['note'])})" if f["note"] else ""))
        out += [f"  {MARK[c['status']]} {escape(c['text'])}" for c in issues]
    return out


def plan_rich(plan, extras: ReportExtras | None = None, console: Console | None = None,
              doc: dict | None = None) -> None:
    """Print the plan: first screen (verdict, recommendation, verdicts), then details."""
    c = console or default_console()
    doc = doc or document(plan, extras)
    every = platform_rows(doc)
    c.print(_headline(doc))
    c.print(rich_table(doc, every[:FIRST_SCREEN], VERDICTS, "Verdicts, best first"))
    if len(every) > FIRST_SCREEN:
        c.print(f"[dim]... {len(every) - FIRST_SCREEN} more platforms below[/dim]")
    top = platform_rows(doc, include_retired=False)[:DETAILS]
    fitting = [b for b in top if doc["platforms"][int(b[10:-1])]["sessions"] is not None]
    memory = tuple(col for col in memory_columns(doc) if col.header not in TERMINAL_SKIPS)
    c.print()
    c.print(rich_table(doc, top, memory, "Memory per device (GiB = 2^30 bytes)"))
    c.print()
    c.print(rich_table(doc, top, PERFORMANCE, "Predicted performance"))
    if fitting:
        c.print()
        c.print(rich_table(doc, fitting, SESSIONS, "Sessions and quota"))
        c.print()
        c.print(rich_table(doc, fitting, COST, "Cost"))
    problems = _problems(doc, DETAILS)
    if problems:
        c.print("\n[bold]Problems and fixes[/bold]")
        for line in problems:
            c.print(line)
    c.print()
    c.print(_checklist(doc))
    if len(every) > FIRST_SCREEN:
        c.print()
        c.print(rich_table(doc, every[FIRST_SCREEN:], VERDICTS, "The other platforms"))
    c.print("\n[dim]" + escape("; ".join(f"{k.replace('_', ' ')}: {fmt_by_key(k, v)}"
                                         for k, v in doc["assumptions"].items())) + "[/dim]")
    for n in doc.get("notes", []):
        c.print(f"[dim]note: {escape(n)}[/dim]")
    dates = sorted({r["platform_as_of"] for r in doc.get("catalog", []) if r["platform_as_of"]}
                   | {r["accelerator_as_of"] for r in doc.get("catalog", []) if r["accelerator_as_of"]})
    if dates:
        c.print(f"[dim]catalog rows as of {dates[0]}"
                + (f" to {dates[-1]}" if dates[-1] != dates[0] else "") + "[/dim]")


@contextlib.contextmanager
def tracing_progress(console: Console | None = None) -> Iterator[Callable[[str], None] | None]:
    """A progress callback for `Planner` / `Traces(progress=...)`: a status line on stderr that
    shows the trace under way, and one dim line per finished trace. Yields None (no display)
    when stderr is not a terminal."""
    err = console or Console(stderr=True, highlight=False)
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
    if done:
        err.print(f"[dim]  {escape(done[-1])}: done ({len(done)} trace{'s' if len(done) > 1 else ''})[/dim]",
                  highlight=False)
