"""`trainplan measure` and `trainplan calibrate` text output."""
from __future__ import annotations

from rich.table import Table

from ..units import fmt_bytes, fmt_seconds
from .console import console


def _fmt(value, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "s":
        return fmt_seconds(value)
    if unit == "bytes":
        return fmt_bytes(value)
    return f"{value:,.1f}"


def calibration_line(cal: dict) -> str:
    """'calibrated on 5 measurements from 2026-11-20 to 2026-11-22 (step time x1.23)'."""
    n = cal["measurements"]
    dates = cal["first"] if cal["first"] == cal["last"] else f"{cal['first']} to {cal['last']}"
    return (f"step time calibrated on {n} measurement{'s' if n != 1 else ''} from {dates} "
            f"(x{cal['step_time_factor']:.3g}; `trainplan calibrate --show`)")


def measure_text(rec: dict, path) -> None:
    from ..measure.compare import comparison
    c = console()
    d, m, job = rec["device"], rec["measured"], rec["job"]
    acc = rec.get("accelerator")
    where = f"{d['type']} {d['name']}" + (f" = {acc} ({rec['accelerator_source']})" if acc else "")
    if d["type"] != "cpu" and d.get("host_cpu"):
        where += f", host {d['host_cpu']}"
    if rec["source"] == "measure-generate":
        st = rec["settings"]
        c.print(f"[bold]{job['model']}[/bold] generating {st['completion_len']} tokens after "
                f"{st['prompt_len']} for {job.get('batch_size', 1)} sequences, "
                f"{job.get('precision', 'fp32')}, on {where}: {m['steps']} timed calls after "
                f"{m['warmup_steps']} warm-up")
    else:
        c.print(f"[bold]{job['model']}[/bold], micro-batch {job.get('batch_size', 1)} x "
                f"{job.get('grad_accum', 1)}, {job.get('precision', 'fp32')}, on {where}: "
                f"{m['steps']} timed steps after {m['warmup_steps']} warm-up")
    c.print(_comparison_table("predicted against measured (GiB = 2^30 bytes; error = "
                              "predicted / measured - 1)", "quantity", comparison(rec)))
    _kernel_table(rec)
    spread = sorted(m["step_times_s"])
    what = "generate calls" if rec["source"] == "measure-generate" else "step times"
    c.print(f"{what}: median {fmt_seconds(m['step_time_s'])}, mean "
            f"{fmt_seconds(m['step_time_mean_s'])}, min {fmt_seconds(spread[0])}, max "
            f"{fmt_seconds(spread[-1])}"
            + (f"; loss {m['loss_first']:.4g} -> {m['loss_last']:.4g}"
               if m.get("loss_first") is not None else ""))
    if m.get("device_used_source"):
        c.print(f"device used read from {m['device_used_source']}")
    for n in rec["notes"]:
        c.print(f"note: {n}")
    if path:
        c.print(f"record appended to {path}")


def _kernel_table(rec: dict) -> None:
    """`measure --profile`: the profiled step's device time by kernel class beside the
    prediction's (measure/compare.py kernel_comparison), and its busiest ops."""
    from ..measure.compare import kernel_comparison
    rows = kernel_comparison(rec)
    if not rows:
        return
    prof = rec["measured"]["profile"]
    c = console()
    c.print(_comparison_table(f"device time a step, by kernel class (one profiled step, "
                              f"{prof['device']})", "kernels", rows))
    top = ", ".join(f"{o['op'].removeprefix('aten::')} {fmt_seconds(o['device_s'])}"
                    for o in prof["top_ops"][:5])
    if top:
        c.print(f"busiest ops: {top}")


def _comparison_table(title: str, first: str, rows) -> Table:
    """Predicted against measured rows (measure/compare.py Row) as a table: `first` names the
    quantities' column."""
    tab = Table(title=title, show_edge=False)
    for col, just in ((first, "left"), ("predicted", "right"), ("measured", "right"),
                      ("error", "right")):
        tab.add_column(col, justify=just)
    for r in rows:
        err = f"{r.error:+.1%}" if r.error is not None else "-"
        tab.add_row(r.quantity, _fmt(r.predicted, r.unit), _fmt(r.measured, r.unit), err)
    return tab


def calibrate_text(cals: dict, path, kept: list[str], skipped: list[str],
                   notes: list[str] = ()) -> None:
    c = console()
    if not cals:
        c.print(f"no calibration stored{f' ({path})' if path else ''}")
    else:
        tab = Table(title=f"step-time calibration ({path})", show_edge=False)
        for col in ("accelerator", "factor", "measurements", "ratio min", "ratio max", "dates"):
            tab.add_column(col)
        for acc, cal in sorted(cals.items()):
            dates = cal.first if cal.first == cal.last else f"{cal.first} to {cal.last}"
            mark = " (kept)" if acc in kept else ""
            tab.add_row(acc + mark, f"x{cal.step_time_factor:.3g}", str(cal.measurements),
                        f"{cal.ratio_min:.3g}", f"{cal.ratio_max:.3g}", dates)
        c.print(tab)
        c.print("factor = median of measured / predicted step time; estimates for these "
                "accelerators now say they are calibrated")
    for s in skipped:
        c.print(f"skipped: {s}")
    for n in notes:
        c.print(f"note: {n}")
