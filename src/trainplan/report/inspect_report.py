"""`trainplan inspect` output: a per-module table and totals (memory in GiB/MiB, labelled)."""
from __future__ import annotations


from rich.markup import escape

from ..units import fmt_bytes, fmt_count, fmt_flops, fmt_int, fmt_note, key_label
from .console import Col, console, fit_table


def inspect_json(tr, accel, stored: bool = False) -> dict:
    return {
        "schema_version": "1.0",
        "model": tr.model,
        "semantics": {"target": accel.id, "attention": tr.semantics.attention,
                      "autocast_dtype": tr.semantics.autocast_dtype},
        "batch_size": tr.batch_size,
        "params": {"total": tr.params_total, "trainable": tr.params_trainable},
        "flops": tr.flops,
        "bytes_moved": tr.bytes_moved,
        "recompute_flops": tr.recompute_flops,
        "saved_activation_bytes": tr.activation_bytes,
        "weight_cast_bytes": tr.weight_cast_bytes,
        "peak_allocated_bytes": tr.peak_allocated_bytes,
        "peak_phase": tr.peak_phase,
        "peak_breakdown_bytes": tr.peak_breakdown_bytes,
        "modules": [{"name": m.name, "depth": m.depth, "params": m.params,
                     "trainable_params": m.trainable_params,
                     "activation_bytes": m.activation_bytes,
                     "flops_forward": m.flops_forward, "flops_backward": m.flops_backward}
                    for m in tr.modules],
        "checkpointed_blocks": tr.checkpointed_blocks,
        "lora_modules": tr.lora_modules,
        "trace_seconds": tr.trace_seconds,
        "from_trace_store": stored,
        "notes": tr.notes,
    }


def inspect_text(tr, accel, depth: int = 3, stored: bool = False) -> None:
    c = console()
    sem = tr.semantics
    c.print(f"[bold]{escape(tr.model)}[/bold]  batch {fmt_int(tr.batch_size)}"
            + (f" x seq {fmt_int(tr.seq_len)}" if tr.seq_len else "")
            + f"  | kernels of {accel.id}: {sem.attention} attention, "
            + (f"autocast {sem.autocast_dtype}" if sem.autocast_dtype else "no autocast")
            + (f"  | from the trace store (traced in {tr.trace_seconds:.2f} s)" if stored else
               f"  | traced in {tr.trace_seconds:.2f} s"))
    cols = [Col("module", key=True), Col("params", "right", priority=5),
            Col("trainable", "right", priority=2), Col("activations (saved)", "right", priority=4),
            Col("fwd FLOPs", "right", priority=3), Col("bwd FLOPs", "right", priority=1)]
    body = []
    shown = 0
    for m in tr.modules[1:]:
        if m.depth > depth:
            continue
        if m.params == 0 and m.activation_bytes == 0 and m.flops_forward == 0:
            continue
        shown += 1
        if shown > 200:
            body.append(["...", "", "", "", "", ""])
            break
        name = "  " * (m.depth - 1) + m.name.rsplit(".", 1)[-1] if m.depth > 1 else m.name
        body.append([escape(name), fmt_count(m.params), fmt_count(m.trainable_params),
                     fmt_bytes(m.activation_bytes), fmt_flops(m.flops_forward),
                     fmt_flops(m.flops_backward)])
    tot = tr.modules[0]
    body.append(["[bold]total[/bold]", fmt_count(tr.params_total), fmt_count(tr.params_trainable),
                 fmt_bytes(tr.activation_bytes), fmt_flops(tot.flops_forward),
                 fmt_flops(tot.flops_backward)])
    c.print(fit_table(cols, body, c.width))
    fl = tr.flops
    c.print(f"FLOPs per micro-batch: forward {fmt_flops(sum(fl['forward'].values()))}, backward "
            f"{fmt_flops(sum(fl['backward'].values()))} (matmul "
            f"{fmt_flops(fl['forward']['matmul'] + fl['backward']['matmul'])}, attention "
            f"{fmt_flops(fl['forward']['attention'] + fl['backward']['attention'])}"
            + (f", recomputation {fmt_flops(tr.recompute_flops)}" if tr.recompute_flops else "")
            + ")")
    bd = tr.peak_breakdown_bytes
    c.print(f"Peak allocated on one device (memory in GiB = 2^30 bytes): "
            f"{fmt_bytes(tr.peak_allocated_bytes)} during {tr.peak_phase} = "
            + ", ".join(f"{key_label(k)} {fmt_bytes(v)}" for k, v in bd.items() if v))
    for n in tr.notes:
        c.print(f"note: {escape(fmt_note(n))}")
