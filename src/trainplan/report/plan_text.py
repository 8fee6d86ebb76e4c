"""`trainplan plan` for the terminal: recommendation first, then a table of platforms in rank
order, then per platform its verdict, the changes to make, the fix ladder's effects and the
checklist. Reads only `plan.result.Plan`; numbers are formatted by units.py.
"""
from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from ..units import fmt_bytes, fmt_count, fmt_seconds, fmt_usd
from .console import console

DETAIL_ALL_UP_TO = 6      # with more platforms, details for the first DETAIL_TOP only
DETAIL_TOP = 3
_VERDICT_STYLE = {"READY": "green", "READY WITH CHANGES": "yellow", "WON'T FIT": "red",
                  "RETIRED": "dim"}
_MARK = {"pass": "[green]\\[x][/green]", "fail": "[red]\\[ ][/red]", "warn": "[yellow]\\[!][/yellow]",
         "info": "[cyan]\\[i][/cyan]"}


def _v(verdict: str) -> str:
    s = _VERDICT_STYLE.get(verdict, "")
    return f"[{s}]{escape(verdict)}[/{s}]" if s else escape(verdict)


def _job_line(plan) -> str:
    j = plan.job
    shape = f" x {j.seq_len} tokens" if j.seq_len else (f" at {j.image_size}px" if j.image_size else "")
    params = f"{fmt_count(j.params_total)} parameters" + (
        f" ({fmt_count(j.params_trainable)} trainable)" if j.params_trainable != j.params_total else "")
    steps = f"{plan.steps:,} steps" + (f" ({plan.epochs:g} epochs of {plan.dataset_size:,} samples)"
                                       if plan.steps_source != "steps" else "")
    return (f"[bold]{escape(j.name)}[/bold]: {params}; {steps} at global batch {plan.target_batch}"
            f"{shape}; {j.precision}, {j.optimizer}, {j.strategy}; optimize {plan.optimize}"
            + (f", budget {fmt_usd(plan.budget_usd)}" if plan.budget_usd is not None else "")
            + (f", deadline {fmt_seconds(plan.deadline_s)}" if plan.deadline_s is not None else ""))


def _table(plan) -> Table:
    t = Table(show_edge=False, pad_edge=False, title="platforms, best first (memory per device, "
                                                      "GiB = 2^30 bytes)")
    for col, just in (("#", "right"), ("platform", "left"), ("verdict", "left"), ("devices", "right"),
                      ("micro x accum", "right"), ("memory", "right"), ("step", "right"),
                      ("finish", "right"), ("sessions", "right"), ("quota wk", "right"),
                      ("cost", "right")):
        t.add_column(col, justify=just)
    for p in plan.platforms:
        s, c = p.sessions, p.cost
        t.add_row(str(p.rank), escape(p.platform_id), _v(p.verdict),
                  f"{p.devices} x {p.accelerator_id}",
                  f"{p.micro_batch_size} x {p.grad_accum}" if p.micro_batch_size else "-",
                  f"{fmt_bytes(p.device_used_bytes)} / {fmt_bytes(p.capacity_bytes)}",
                  fmt_seconds(p.step_time_s) if p.fits or p.sessions else "-",
                  fmt_seconds(s.finish_s) if s else "-",
                  str(s.sessions) if s else "-",
                  f"{s.quota_weeks:.2f}" if s and s.quota_weeks is not None else "-",
                  fmt_usd(c.total_usd) if c else "-")
    return t


def _details(c, p) -> None:
    c.print(f"\n[bold]{p.rank}. {escape(p.name)}[/bold] ({escape(p.platform_id)}): {_v(p.verdict)}"
            f" -- {escape(p.reason)}")
    if p.changes:
        c.print("  changes:")
        for i, ch in enumerate(p.changes, 1):
            c.print(f"    {i}. {escape(ch)}")
    if p.fixes:
        c.print("  fix ladder (each rung re-planned on top of the ones before):")
        for f in p.fixes:
            mem = (f"{fmt_bytes(f.device_used_bytes_before)} -> {fmt_bytes(f.device_used_bytes_after)}"
                   if f.device_used_bytes_after is not None else "")
            tm = (f", step {fmt_seconds(f.step_time_s_before)} -> {fmt_seconds(f.step_time_s_after)}"
                  if f.step_time_s_after is not None else "")
            state = "fits" if f.fits else "does not fit yet"
            c.print(f"    - {escape(f.title)}: {mem}{tm}, micro-batch {f.micro_batch_size}; {state}"
                    + (f" ({escape(f.note)})" if f.note else ""))
    for s in p.skipped_fixes:
        c.print(f"  [dim]not proposed: {escape(s)}[/dim]")
    if p.step_time_s and p.sessions:
        rate = f"{p.samples_per_s:.1f} samples/s" if p.samples_per_s else ""
        if p.tokens_per_s:
            rate += f", {p.tokens_per_s:,.0f} tokens/s"
        c.print(f"  time: {p.steps:,} steps x {fmt_seconds(p.step_time_s)} = {fmt_seconds(p.train_s)} "
                f"of training ({rate}" + (f", MFU {p.mfu:.0%}" if p.mfu is not None else "") + ")")
    c.print("  checklist:")
    for item in p.checklist:
        c.print(f"    {_MARK.get(item.status, '?')} {escape(item.text)}")


def plan_text(plan) -> None:
    c = console()
    c.print(_job_line(plan))
    rec = plan.recommendation
    c.print(f"[bold]Recommendation:[/bold] {escape(rec)}")
    c.print(_table(plan))
    shown = plan.platforms if len(plan.platforms) <= DETAIL_ALL_UP_TO else plan.platforms[:DETAIL_TOP]
    for p in shown:
        _details(c, p)
    if len(shown) < len(plan.platforms):
        c.print(f"\n(details for the first {len(shown)} of {len(plan.platforms)}; "
                "all of them with --format json, or fewer with --platforms)")
    for n in plan.notes:
        c.print(f"note: {escape(n)}")
    a = plan.assumptions
    c.print(f"[dim]assumed: {fmt_seconds(a['session_overhead_s'])} start-up per session "
            f"(session_overhead_s), checkpoints at most every {fmt_seconds(a['checkpoint_every_max_s'])}, "
            f"time valued at ${a['value_of_time_usd_per_h']:.0f}/h for --optimize balanced; "
            f"{escape(a['quota'])}[/dim]")
