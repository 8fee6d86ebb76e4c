"""The step of a model with L repeated blocks, from traces of the same model cut to 3 and 4.

A model with a stack of L alike blocks (trace/depth.py) runs, per step, the ops outside the stack
(embeddings, head, loss, the optimizer's multi-tensor kernels over every parameter) and L times
one block's ops, forward and backward (and the rerun of a checkpointed block). So:

* ops: the 4-block trace's, plus L-4 more times the ops one more block adds (what the 4-block
  trace runs beyond the 3-block one, compared as multisets); an op both run at different sizes
  (a multi-tensor optimizer kernel over every parameter) takes FLOPs and bytes
  x(L) = x(3) + (L - 3)(x(4) - x(3));
* every byte count and each phase's peak by category: the same line through the two traces. A
  phase's peak is where the live total is largest; with alike blocks it mostly comes at the same
  place in the step (end of forward, the start of backward, the optimizer's update) at any depth
  and grows by one block's share per block. Where another place grows faster and overtakes it
  deeper in the model, the line reads low by at most about one block's working memory
  (Llama-3.2-1B with accumulation: 0.6%, mid-backward overtaking the start of backward at 16
  blocks). Not from 2 blocks: with full checkpointing a 2-block model's backward peaks at another
  place (activations still live);
* the caching allocator's fragmentation: that of the 4-block replay (`_fragmentation`);
* the module table, the checkpointed blocks and the LoRA modules: block 3's rows copied for 4..L-1.

Where the 3-block trace runs an op the 4-block one does not, `stitch` returns None and the whole
model is traced. tests/test_depth.py checks the result against full traces (Llama, GPT-2, BERT,
LoRA, QLoRA, checkpointing, accumulation, 8-bit AdamW): the same step time and byte counts, the
allocated peak within 1%, the required memory within the allocator replay's noise (5%).
"""
from __future__ import annotations

import copy
import re
from dataclasses import replace

from ..trace.counters import CATEGORIES
from ..trace.tracer import ModuleRow, Trace
from .memory import Fragmentation, fragmentation

LOW, HIGH = 3, 4       # blocks kept in the two cut traces


def _index_pattern(path: str) -> re.Pattern:
    """Matches '<path>.<i>' as a whole component of a dotted module name, capturing i."""
    return re.compile(r"(?:^|\.)" + re.escape(path) + r"\.(\d+)(?=\.|$)")


def _block_of(pattern: re.Pattern, name: str) -> int | None:
    m = pattern.search(name)
    return int(m.group(1)) if m else None


def _split(pattern: re.Pattern, name: str) -> tuple[str, str]:
    """`name` around its block index (a, b): block i's name is a + str(i) + b."""
    m = pattern.search(name)
    return name[: m.start(1)], name[m.end(1):]


def _op_key(r) -> tuple:
    return (r.name, r.phase, r.dtype, r.recompute, r.family)


def _sig(r) -> tuple:
    return _op_key(r) + (round(r.flops), round(r.bytes))


def _block_delta(lo_ops: list, hi_ops: list) -> tuple[list, list[tuple]] | None:
    """(the ops one more block adds, [(op in lo, op in hi)] for ops that grow with depth), or
    None where lo runs an op hi does not. The ops are compared as multisets: the tracker's module
    names cannot say which block a backward op belongs to (ModuleTracker's backward hooks fire
    as autograd reaches a module, not per op), so nothing here reads them."""
    counts: dict[tuple, int] = {}
    for r in lo_ops:
        counts[_sig(r)] = counts.get(_sig(r), 0) - 1
    added, grown = [], {}
    for r in hi_ops:
        k = _sig(r)
        if counts.get(k, 0) < 0:
            counts[k] += 1
        else:
            added.append(r)
    gone: dict[tuple, list] = {}
    for r in lo_ops:                      # lo's ops hi has at another size
        k = _sig(r)
        if counts.get(k, 0) < 0:
            counts[k] += 1
            gone.setdefault(_op_key(r), []).append(r)
    pairs, new = [], []
    for r in added:
        partners = gone.get(_op_key(r))
        if partners:
            pairs.append((partners.pop(0), r))
        else:
            new.append(r)
    if any(gone.values()):
        return None
    return new, pairs


def stitch(lo: Trace, hi: Trace) -> Trace | None:
    """The whole model's trace from its traces cut to LOW and HIGH blocks (module docstring), or
    None where they do not fit the pattern of alike blocks."""
    if lo.stack is None or hi.stack is None or lo.stack.path != hi.stack.path:
        return None
    L, path = hi.stack.blocks, hi.stack.path
    f = float(L - LOW)                 # (L - LOW) / (HIGH - LOW), HIGH - LOW = 1
    pattern = _index_pattern(path)
    last = HIGH - 1
    delta = _block_delta(lo.ops, hi.ops)
    if delta is None or lo.phase_peaks.keys() != hi.phase_peaks.keys():
        return None
    new, pairs = delta

    def line(x0, x1):
        return max(0.0, x0 + f * (x1 - x0))

    def whole(x0, x1) -> int:
        return int(round(line(x0, x1)))

    grown = {id(b): a for a, b in pairs}
    ops = []
    for r in hi.ops:                      # the grown ops on their line, the rest as traced
        a = grown.get(id(r))
        if a is not None:
            r = copy.copy(r)
            r.flops, r.bytes = line(a.flops, r.flops), line(a.bytes, r.bytes)
        ops.append(r)
    # the same records, not copies: nothing changes a trace's records in place (who derives one
    # copies it first: interpolate.py, traces.relabel), and an 80-block model repeats ~150 of
    # them 76 times (copying them was most of a warm 70B plan's time)
    ops.extend(r for _ in range(HIGH, L) for r in new)

    phase_peaks = {ph: (whole(lo.phase_peaks[ph][0], v[0]),
                        {c: whole(lo.phase_peaks[ph][1].get(c, 0), v[1].get(c, 0))
                         for c in CATEGORIES})
                   for ph, v in hi.phase_peaks.items()}
    peak_phase = max(phase_peaks, key=lambda ph: phase_peaks[ph][0])

    def nested(d0, d1):
        return {k: {kk: line(d0[k][kk], v) for kk, v in inner.items()} for k, inner in d1.items()}

    def names(items: list[str]) -> list[str]:
        tails = [_split(pattern, n) for n in items if _block_of(pattern, n) == last]
        return list(items) + [f"{a}{i}{b}" for i in range(HIGH, L) for a, b in tails]

    out = replace(
        hi, ops=ops, phase_peaks=phase_peaks, peak_phase=peak_phase,
        peak_allocated_bytes=phase_peaks[peak_phase][0],
        peak_breakdown_bytes=dict(phase_peaks[peak_phase][1]),
        params_total=whole(lo.params_total, hi.params_total),
        params_trainable=whole(lo.params_trainable, hi.params_trainable),
        weight_bytes=whole(lo.weight_bytes, hi.weight_bytes),
        trainable_param_bytes=whole(lo.trainable_param_bytes, hi.trainable_param_bytes),
        gradient_bytes=whole(lo.gradient_bytes, hi.gradient_bytes),
        optimizer_state_bytes=whole(lo.optimizer_state_bytes, hi.optimizer_state_bytes),
        activation_bytes=whole(lo.activation_bytes, hi.activation_bytes),
        weight_cast_bytes=whole(lo.weight_cast_bytes, hi.weight_cast_bytes),
        expert_param_bytes=whole(lo.expert_param_bytes, hi.expert_param_bytes),
        expert_trainable_bytes=whole(lo.expert_trainable_bytes, hi.expert_trainable_bytes),
        moe_dispatch_elements=whole(lo.moe_dispatch_elements, hi.moe_dispatch_elements),
        flops=nested(lo.flops, hi.flops), bytes_moved=nested(lo.bytes_moved, hi.bytes_moved),
        recompute_flops=line(lo.recompute_flops, hi.recompute_flops),
        modules=_modules(lo, hi, pattern, L, line),
        checkpointed_blocks=names(hi.checkpointed_blocks), lora_modules=names(hi.lora_modules),
        alloc_events=[], memory_log=[], trace_seconds=lo.trace_seconds + hi.trace_seconds,
        notes=list(hi.notes) + [f"traced with {LOW} and with {HIGH} of its {L} alike blocks "
                                f"({path}); the step adds the other {L - HIGH} as copies"])
    out.derived["fragmentation"] = _fragmentation(hi)
    return out


def _modules(lo: Trace, hi: Trace, pattern, L: int, line) -> list[ModuleRow]:
    """hi's rows; rows outside the stack on the line through lo's, block HIGH-1's rows copied."""
    by_name = {m.name: m for m in lo.modules}
    rows, last = [], HIGH - 1
    block_rows = [m for m in hi.modules if _block_of(pattern, m.name) == last]
    tail = block_rows[-1] if block_rows else None
    for m in hi.modules:
        a = by_name.get(m.name) if _block_of(pattern, m.name) is None else None
        if a is None:
            rows.append(m)
        else:
            rows.append(ModuleRow(m.name, m.depth, int(line(a.params, m.params)),
                                  int(line(a.trainable_params, m.trainable_params)),
                                  int(line(a.activation_bytes, m.activation_bytes)),
                                  line(a.flops_forward, m.flops_forward),
                                  line(a.flops_backward, m.flops_backward)))
        if m is tail:
            tails = [(_split(pattern, r.name), r) for r in block_rows]
            rows.extend(ModuleRow(f"{a}{i}{b}", r.depth, r.params, r.trainable_params,
                                  r.activation_bytes, r.flops_forward, r.flops_backward)
                        for i in range(HIGH, L) for (a, b), r in tails)
    return rows


def _fragmentation(hi: Trace) -> Fragmentation:
    """The 4-block trace's replay (allocator.py). The caching allocator's waste comes from the mix
    of block sizes the step allocates and frees, and the cut model has the whole model's mix:
    every block allocates the same sizes. Against full traces (tests/test_depth.py cases) the
    required memory stays within -2% and +4% (a replay's segment-level noise, which scaling by
    depth or by activations amplified to +6% and +11%)."""
    return fragmentation(hi)
