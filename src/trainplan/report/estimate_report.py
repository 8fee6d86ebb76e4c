"""`trainplan estimate` text output."""
from __future__ import annotations

from rich.table import Table

from rich.markup import escape

from ..plan.verdict import FITS, NO_FIT, estimate_verdict
from ..units import fmt_bytes, fmt_count, fmt_int, fmt_note, fmt_rate, fmt_seconds, key_label
from .console import console


def estimate_text(est) -> None:
    c = console()
    m, t, tr, job = est.memory, est.time, est.trace, est.job
    word, why = estimate_verdict(est)
    colour = {FITS: "green", NO_FIT: "red"}.get(word, "yellow")
    verdict = f"[{colour}]{escape(word)}[/{colour}]" + (f" ({escape(why)})" if why else "")
    c.print(f"[bold]{escape(tr.model)}[/bold] on {job.gpus} x {est.accel.id} ({job.strategy.label}), "
            f"micro-batch {fmt_int(job.batch_size)}" + (f" x {fmt_int(tr.seq_len)} tokens" if tr.seq_len else "")
            + f", {job.optimizer}: {verdict}")
    c.print(f"precision: {job.precision.label}")
    c.print(f"parameters {fmt_count(tr.params_total)} ({fmt_count(tr.params_trainable)} trainable)")
    tab = Table(title="memory per device (GiB = 2^30 bytes)", show_edge=False)
    tab.add_column("term")
    tab.add_column("bytes", justify="right")
    for k, v in m.breakdown_bytes.items():
        tab.add_row(key_label(k), fmt_bytes(v))
    tab.add_row("[bold]device used (nvidia-smi)[/bold]", fmt_bytes(m.device_used_bytes))
    tab.add_row("least it runs in (fit test)", fmt_bytes(m.required_bytes))
    tab.add_row("peak allocated", fmt_bytes(m.peak_allocated_bytes))
    tab.add_row("peak reserved", fmt_bytes(m.peak_reserved_bytes))
    tab.add_row("capacity", fmt_bytes(m.capacity_bytes))
    c.print(tab)
    c.print(f"free on the device: {m.fit_margin:.1%} of its capacity"
            + (" (the allocator must release its cache)" if m.fit_margin < 0 and m.fits else ""))
    c.print(f"largest micro-batch that fits: {fmt_int(est.max_batch_size) if est.max_batch_size else 'none'}"
            + ("" if est.max_batch_size is None else
               f"; with headroom: {fmt_int(est.max_batch_size_with_margin) if est.max_batch_size_with_margin else 'none'}"))
    if t is not None:
        c.print(f"step time {fmt_seconds(t.step_time_s)} ({job.grad_accum} micro-batch(es)), "
                f"{fmt_rate(t.samples_per_s)} samples/s"
                + (f", {t.tokens_per_s:,.0f} tokens/s" if t.tokens_per_s else "")
                + (f", MFU {t.mfu:.0%}" if t.mfu is not None else ""))
        c.print(f"step time rests on {est.calibration['text']}")
    for f in est.findings:
        colour = {"error": "red", "warning": "yellow"}.get(f.severity, "cyan")
        c.print(f"[{colour}]{f.severity}[/{colour}]: {escape(f.message)}"
                + (f"  -> {escape(f.fix)}" if f.fix else ""))
    for n in tr.notes:
        c.print(f"note: {escape(fmt_note(n))}")
