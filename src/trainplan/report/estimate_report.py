"""`trainplan estimate` text output."""
from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from ..plan.verdict import band_text, estimate_verdict
from ..predict.memory import FITS, NO_FIT
from ..trace.derive.allocator import CUDA_EXPANDABLE
from ..units import (fmt_bytes, fmt_count, fmt_int, fmt_note, fmt_phases, fmt_rate, fmt_seconds,
                     key_label)
from .console import console


def bytes_table(title: str, rows) -> Table:
    """A two-column table of (term, bytes) rows."""
    tab = Table(title=title, show_edge=False)
    tab.add_column("term")
    tab.add_column("bytes", justify="right")
    for term, n in rows:
        tab.add_row(term, fmt_bytes(n))
    return tab


def estimate_text(est) -> None:
    c = console()
    m, t, tr, job = est.memory, est.time, est.trace, est.job
    word, why = estimate_verdict(est)
    colour = {FITS.upper(): "green", NO_FIT.upper(): "red"}.get(word, "yellow")
    verdict = f"[{colour}]{escape(word)}[/{colour}]" + (f" ({escape(why)})" if why else "")
    c.print(f"[bold]{escape(tr.model)}[/bold] on {job.gpus} x {est.accel.id} ({job.strategy.label}), "
            f"micro-batch {fmt_int(job.batch_size)}" + (f" x {fmt_int(tr.seq_len)} tokens" if tr.seq_len else "")
            + f", {job.optimizer}"
            + (f" (gradients clipped to norm {job.max_grad_norm:g})" if job.max_grad_norm else "")
            + f": {verdict}")
    c.print(f"precision: {job.precision.label}")
    if m.allocator == CUDA_EXPANDABLE.name:
        c.print("allocator: expandable segments (PYTORCH_CUDA_ALLOC_CONF="
                "expandable_segments:True)")
    c.print(f"parameters {fmt_count(tr.params_total)} ({fmt_count(tr.params_trainable)} trainable)")
    c.print(bytes_table("memory per device (GiB = 2^30 bytes)", [
        *((key_label(k), v) for k, v in m.breakdown_bytes.items()),
        ("[bold]device used (nvidia-smi)[/bold]", m.device_used_bytes),
        ("least it runs in (fit test)", m.required_bytes),
        ("peak allocated", m.peak_allocated_bytes), ("peak reserved", m.peak_reserved_bytes),
        ("capacity", m.capacity_bytes)]))
    c.print(f"free on the device: {m.fit_margin:.1%} of its capacity"
            + (" (the allocator must release its cache)" if m.fit_margin < 0 and m.fits else ""))
    if m.band is not None and m.fits:
        c.print(escape(band_text(m)))
    c.print(f"largest micro-batch that fits: {fmt_int(est.max_batch_size) if est.max_batch_size else 'none'}"
            + ("" if est.max_batch_size is None else
               f"; fits with the band: {fmt_int(est.max_batch_size_with_margin) if est.max_batch_size_with_margin else 'none'}"))
    if t is not None:
        c.print(f"step time {fmt_seconds(t.step_time_s)} ({job.grad_accum} micro-batch(es)), "
                f"{fmt_rate(t.samples_per_s)} samples/s"
                + (f", {t.tokens_per_s:,.0f} tokens/s" if t.tokens_per_s else "")
                + (f", MFU {t.mfu:.0%}" if t.mfu is not None else ""))
        if est.phases_s is not None:
            c.print(f"step phases: {fmt_phases(est.phases_s)}")
        g = est.generation
        if g is not None:
            c.print(f"generation: {fmt_int(g.sequences)} sequences x {fmt_int(g.completion_len)} "
                    f"tokens, {fmt_rate(g.tokens_per_s)} tokens/s, KV cache "
                    f"{fmt_bytes(g.kv_cache_bytes)}, bound by {escape(g.bound)}")
        c.print(f"step time rests on {est.calibration['text']}")
    for f in est.findings:
        colour = {"error": "red", "warning": "yellow"}.get(f.severity, "cyan")
        c.print(f"[{colour}]{f.severity}[/{colour}]: {escape(f.message)}"
                + (f"  -> {escape(f.fix)}" if f.fix else ""))
    for n in est.notes:
        c.print(f"note: {escape(fmt_note(n))}")


def generation_text(job, accel, g) -> None:
    """`estimate --task generate` text output."""
    c = console()
    fits = g.peak_bytes <= accel.usable_memory_bytes
    word = "[green]fits[/green]" if fits else "[red]does not fit[/red]"
    c.print(f"[bold]{escape(job.model_label)}[/bold] generating on {escape(accel.id)} "
            f"({escape(g.engine)}): {fmt_int(g.sequences)} sequences, {fmt_int(g.prompt_len)} "
            f"prompt + {fmt_int(g.completion_len)} new tokens: {word}")
    c.print(f"precision: {job.precision.label}")
    c.print(bytes_table("memory per device", [
        ("weights", g.weight_bytes), ("KV cache (prompt + completion)", g.kv_cache_bytes),
        ("largest forward's transient", g.transient_bytes), ("[bold]peak[/bold]", g.peak_bytes),
        ("capacity", accel.usable_memory_bytes)]))
    c.print(f"prefill {fmt_seconds(g.prefill_s)}, decode {fmt_seconds(g.decode_s)} "
            f"({fmt_seconds(g.per_token_s_first)} -> {fmt_seconds(g.per_token_s_last)} per "
            f"token), total {fmt_seconds(g.total_s)}")
    c.print(f"{fmt_rate(g.tokens_per_s)} new tokens/s over all sequences; bound by "
            f"{escape(g.bound)}")
    for n in g.notes:
        c.print(f"note: {escape(fmt_note(n))}")
