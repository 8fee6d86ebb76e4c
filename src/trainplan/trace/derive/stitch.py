"""The step of a model with L repeated blocks, from one trace of the same model cut to 4.

A model with a stack of L alike blocks (trace/stack.py; a block is one layer, or one period of
layers whose kinds repeat: Gemma-2's sliding and full attention) runs, per step, the ops outside
the stack (embeddings, head, loss, the optimizer's multi-tensor kernels over every parameter) and
L times one block's ops, forward and backward (and the rerun of a checkpointed block). Two cuts, n and
n + 1 blocks, give what one block adds: the 4-block trace and the same step with one block more,
read off what the 4-block trace's last block does (`extend`, exact against a real 5-block trace);
where that cannot be read (a mixture-of-experts model, events that do not repeat block by
block), a second trace cut to 3 (`stitch(lo, hi)` either way). So, with n the smaller cut:

* ops: the larger cut's, plus L-n-1 more times the ops one more block adds (what the larger
  cut runs beyond the smaller, compared as multisets); an op both run at different sizes
  (a multi-tensor optimizer kernel over every parameter) takes FLOPs and bytes
  x(L) = x(n) + (L - n)(x(n+1) - x(n));
* every byte count: the same line through the two traces;
* each phase's peak by category: the whole stack's memory log (the 4-block trace's repeated
  block by block, repeat.py `whole_log`) replayed as the tracer computes peaks, which is the full
  trace's (`_peaks_replayed`). Where the allocations do not repeat, the line through the two
  cuts: a phase's peak mostly comes at the same place in the step (end of forward, the start of
  backward, the optimizer's update) at any depth and grows by one block's share per block, but
  where another place overtakes it deeper in the model the line reads it low, and category by
  category it can give a split no point of the step has (`_peaks_replayed`);
* the caching allocator's fragmentation: the replay of the whole stack's allocations, the
  4-block trace's repeated block by block (repeat.py), which is the full trace's replay; where
  they do not repeat, that of the 4-block replay (replays.py `whole_fragmentation`);
* the module table, the checkpointed blocks and the LoRA modules: the larger cut's last block's
  rows copied for the rest (the activations of each but the last as the block before it keeps
  them: the head need not keep the last block's output, tracer.py `_last_block`), made where
  first read (lazy.py; `inspect`, predict/memory.py, the
  fix ladder's frozen-embeddings rung): a plan stitches hundreds of traces and reads few.

Where the smaller cut runs an op the larger one does not, `stitch` returns None and the whole
model is traced. tests/test_depth.py checks the result against full traces (Llama, GPT-2, BERT,
LoRA, QLoRA, checkpointing, accumulation, 8-bit AdamW, the per-parameter optimizer loop): the
same step time and byte counts, each phase's peak by category, the required memory within the
allocator replay's noise (5%).
"""
from __future__ import annotations

import functools
import itertools
import re
from dataclasses import replace
from operator import itemgetter
from typing import NamedTuple

from ..facts import ModuleRow, OpRecord, Trace
from ..lazy import Lazy
from ..log import CATEGORIES, TraceLog, replay_log
from ..shapes import on_line
from ..stack import HIGH, LOW
from .interpolate import line_values
from .peaks import whole_peaks
from .repeat import repeats, whole_log


_LAST_BLOCK = itemgetter(OpRecord._fields.index("last_block"))


def _index_pattern(path: str) -> re.Pattern:
    """Matches '<path>.<i>' as a whole component of a dotted module name, capturing i."""
    return re.compile(r"(?:^|\.)" + re.escape(path) + r"\.(\d+)(?=\.|$)")


def _block_of(pattern: re.Pattern, name: str) -> int | None:
    m = pattern.search(name)
    return int(m.group(1)) if m else None


def _in_block(pattern: re.Pattern, name: str, period: int) -> tuple[str, int, str]:
    """`name` around its layer index j: (a, j's place in its block of `period` layers, b); layer
    i's name is a + str(i) + b."""
    m = pattern.search(name)
    return name[: m.start(1)], int(m.group(1)) % period, name[m.end(1):]


def _unit_of(pattern: re.Pattern, name: str, period: int) -> int | None:
    """The block (trace/stack.py: `period` layers) the layer `name` is in, or None."""
    j = _block_of(pattern, name)
    return None if j is None else j // period


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


def stitch(lo: Trace, hi: Trace, tagged: Trace | None = None) -> Trace | None:
    """The whole model's trace from its traces cut to n and n + 1 blocks (module docstring:
    LOW and HIGH, or HIGH and the HIGH-block trace's `extend`), or None where they do not fit
    the pattern of alike blocks. `tagged`: the HIGH-block trace, whose allocations repeat over
    the whole stack (repeat.py); `hi` by default."""
    if lo.stack is None or hi.stack is None or lo.stack.path != hi.stack.path or \
            hi.stack.traced != lo.stack.traced + 1:
        return None
    tagged = hi if tagged is None else tagged
    L, path, n, period = hi.stack.blocks, hi.stack.path, hi.stack.traced, hi.stack.period
    f = float(L - lo.stack.traced)     # (L - lo) / (hi - lo), hi - lo = 1
    pattern = _index_pattern(path)
    made = hi.derived.one_more        # read off lo by `extend`: what it added, known
    delta = made[1] if made is not None and made[0] is lo else _block_delta(lo.ops, hi.ops)
    if delta is None or lo.phase_peaks.keys() != hi.phase_peaks.keys():
        return None

    def line(x0, x1):
        return max(0.0, x0 + f * (x1 - x0))

    @functools.cache
    def parts() -> list:
        """[the larger cut's ops with the grown ones on their line, the block's ops, L - n]:
        the whole step's ops are the first and L - n times the second."""
        new, pairs = delta
        grown = {id(b): a for a, b in pairs}  # this call's pairs: the record object is the key
        ops = list(hi.ops)                # the grown ops on their line, the rest as traced
        if grown:
            for i in [i for i, key in enumerate(map(id, ops)) if key in grown]:
                r = ops[i]
                a = grown[id(r)]
                ops[i] = r.copied(flops=line(a.flops, r.flops), bytes=line(a.bytes, r.bytes),
                                  shape=on_line(a.shape, r.shape, f))
        return [ops, list(new), L - n]

    def whole_ops() -> list:
        # the same records, not copies: nothing changes a trace's records in place (who derives
        # one copies it first: interpolate.py, twins.relabel), and an 80-block model repeats
        # ~150 of them 76 times, which copying would make the costliest part of a warm plan;
        # the op table puts them back in place by their identity (optable.py `_in_order`),
        # reading the parts without this list
        base, block, k = parts()
        return base + block * k

    extended = hi.derived.extended
    out = replace(
        hi, ops=Lazy(whole_ops), **_on_line(lo, hi, line),
        modules=Lazy(lambda: _modules(lo, hi, pattern, L, line)),   # made where read (inspect)
        checkpointed_blocks=_with_copies(hi.checkpointed_blocks, pattern, n - 1, L, period),
        lora_modules=_with_copies(hi.lora_modules, pattern, n - 1, L, period),
        log=TraceLog(blocks=tagged.log.blocks, marks=hi.log.marks,
                     gradients=hi.log.gradients, timeline=hi.log.timeline),
        stack=tagged.stack, flash_eligible=tagged.flash_eligible, last_block=None,
        trace_seconds=lo.trace_seconds + (0.0 if extended else hi.trace_seconds),
        notes=list(hi.notes) + [
            f"traced with {replace(hi.stack, traced=HIGH).describe()}; the step adds the other "
            f"{L - HIGH} as copies of the last" if extended else
            f"traced with {hi.stack.describe(f'{LOW} and with {HIGH}')}; the step adds the "
            f"other {L - HIGH} as copies"])
    # the whole stack's replay is made when a fit is asked of this trace (replays.py
    # `fragmentation`: the anchors', not every micro-batch a search reads off their line)
    rep = repeats(tagged, L)
    if rep:
        out = _peaks_replayed(out, tagged, L)
    out.derived.repeats = rep
    out.derived.whole_of = tagged
    out.derived.ops_parts = Lazy(parts)
    return out


def _peaks_replayed(out: Trace, tagged: Trace, L: int) -> Trace:
    """`out` with each phase's peak, by category, from the whole stack's memory log (the
    HIGH-block trace's repeated over L blocks: repeat.py `whole_log`), replayed as the tracer
    computes them: the full trace's peaks, where the line through the two cuts reads a phase's
    peak at two different places (module docstring) and, category by category, a split that no
    point of the step has (Llama-3.2-1B, s1024 b1, memory-efficient attention: a backward peak
    of 22.7 GB whose categories summed to 55 GB; the full trace's is 24.4 GB)."""
    found = _stack_peaks(tagged, L)
    if found is None or found[0].keys() != out.phase_peaks.keys():
        return out
    peaks = found[0]
    peak_phase = max(peaks, key=lambda ph: peaks[ph][0])
    return replace(out, phase_peaks=peaks, peak_phase=peak_phase,
                   peak_allocated_bytes=peaks[peak_phase][0],
                   peak_breakdown_bytes=dict(peaks[peak_phase][1]))


def _stack_peaks(tr: Trace, blocks: int, also: tuple[int, ...] = ()) -> tuple | None:
    """(each phase's peaks by category over a stack of `blocks` blocks, its memory log) from
    the HIGH-block trace `tr`, or None where its events do not repeat: the peaks read off the
    cut log (peaks.py; `also`, other depths read in the same pass) and the log written only
    where it is read, else the whole log written and replayed (repeat.py `whole_log`)."""
    peaks = whole_peaks(tr.log, blocks, also)
    if peaks is not None:
        return peaks, Lazy(lambda: whole_log(tr, blocks) or [])
    log = whole_log(tr, blocks)
    return None if log is None else (replay_log(log)[0], log)


def _on_line(lo: Trace, hi: Trace, line) -> dict:
    """Every total and each phase's peak by category on the line through the two cuts."""
    def whole(x0, x1) -> int:
        return int(round(line(x0, x1)))

    def nested(d0, d1):
        return {k: {kk: line(d0[k][kk], v) for kk, v in inner.items()} for k, inner in d1.items()}

    phase_peaks = {ph: (whole(lo.phase_peaks[ph][0], v[0]),
                        {c: whole(lo.phase_peaks[ph][1].get(c, 0), v[1].get(c, 0))
                         for c in CATEGORIES})
                   for ph, v in hi.phase_peaks.items()}
    peak_phase = max(phase_peaks, key=lambda ph: phase_peaks[ph][0])
    totals = ("params_total", "params_trainable", "weight_bytes", "packed_weight_bytes",
              "floating_weight_elements", "trainable_param_bytes", "gradient_bytes",
              "optimizer_state_bytes", "activation_bytes", "weight_cast_bytes",
              "expert_param_bytes", "expert_trainable_bytes", "moe_dispatch_elements")
    return dict({k: whole(getattr(lo, k), getattr(hi, k)) for k in totals},
                phase_peaks=phase_peaks, peak_phase=peak_phase,
                peak_allocated_bytes=phase_peaks[peak_phase][0],
                peak_breakdown_bytes=dict(phase_peaks[peak_phase][1]),
                flops=nested(lo.flops, hi.flops), bytes_moved=nested(lo.bytes_moved, hi.bytes_moved),
                recompute_flops=line(lo.recompute_flops, hi.recompute_flops))


def extend(hi: Trace) -> Trace | None:
    """The trace of the model cut to HIGH + 1 blocks, read off the HIGH-block trace alone: with
    it, `stitch` needs no trace cut to LOW (one trace where there were two; 0.8 of the HIGH
    one's time). The tracer tags what the last block does (trace/blocks.py, counters.py): every
    event, the share of every op's work (`OpRecord.last_block`: 1 for an op the block runs, its
    tensors' share of a multi-tensor optimizer op's bytes) and what it adds to the totals
    (tracer.py `_last_block`). One more block then adds:

    * ops: a copy of each op the block runs; a multi-tensor op grows by the block's share;
    * memory: the events and memory log repeated over one more block (repeat.py `whole_log`,
      the same repetition as the allocator's replay of the whole stack), replayed for each
      phase's peak (read off the cut log: peaks.py; the log itself made where it is read);
    * totals, and the module table: the last block's, its rows copied as block HIGH.

    tests/test_depth.py checks it against a real trace cut to HIGH + 1 blocks, field by field.
    None where the events do not repeat block by block, the model has mixture-of-experts
    layers (whose routing totals are not split by block), or the trace is not tagged."""
    if not _extendable(hi):
        return None
    # the whole stack's peaks read in the same pass, for `stitch`
    found = _stack_peaks(hi, HIGH + 1, also=(hi.stack.blocks,))
    if found is None or found[0].keys() != hi.phase_peaks.keys():
        return None
    phase_peaks, log = found
    peak_phase = max(phase_peaks, key=lambda ph: phase_peaks[ph][0])
    flops = {ph: dict(v) for ph, v in hi.flops.items()}
    moved = {ph: dict(v) for ph, v in hi.bytes_moved.items()}
    recompute = hi.recompute_flops
    work = {"forward": 0.0, "backward": 0.0}    # of the ops the module table attributes
    blk = block_ops(hi)
    for (phase, family, share, rec, in_module), fl, by in zip(blk.keys, blk.flops, blk.bytes):
        if phase in flops:
            flops[phase][family] += share * fl
            moved[phase][family] += share * by
            if rec:
                recompute += share * fl
            if in_module and phase in work:
                work[phase] += share * fl

    @functools.cache
    def made() -> tuple[list, list, list]:
        """The ops with one block more, the block's ops and the multi-tensor ops it grew."""
        ops = list(hi.ops)
        shares = list(map(_LAST_BLOCK, ops))
        more = list(itertools.compress(ops, [s >= 1.0 for s in shares]))
        grown = []
        for i in [i for i, s in enumerate(shares) if 0.0 < s < 1.0]:
            r, share = ops[i], shares[i]
            # a multi-tensor op's list grows by the last block's tensors (trace/shapes.py)
            shape = (r.shape[0] + r.shape[2],) + r.shape[1:] if len(r.shape) == 3 else \
                r.shape[:1] and (round(r.shape[0] * (1 + share)),) + r.shape[1:]
            ops[i] = r.copied(flops=r.flops * (1 + share), bytes=r.bytes * (1 + share),
                              last_block=share / (1 + share), shape=shape)
            grown.append((r, ops[i]))
        return ops + more, more, grown

    pattern, period = _index_pattern(hi.stack.path), hi.stack.period
    add = hi.last_block
    out = replace(
        hi, stack=replace(hi.stack, traced=HIGH + 1), ops=Lazy(lambda: made()[0]),
        phase_peaks=phase_peaks,
        peak_phase=peak_phase, peak_allocated_bytes=phase_peaks[peak_phase][0],
        peak_breakdown_bytes=dict(phase_peaks[peak_phase][1]), flops=flops, bytes_moved=moved,
        recompute_flops=recompute,
        modules=Lazy(lambda: _one_more_block(hi.modules, pattern, hi.stack.path, work,
                                             period)),
        checkpointed_blocks=_with_copies(hi.checkpointed_blocks, pattern, HIGH - 1, HIGH + 1,
                                         period),
        lora_modules=_with_copies(hi.lora_modules, pattern, HIGH - 1, HIGH + 1, period),
        log=TraceLog(memory=log),
        **{k: type(getattr(hi, k))(getattr(hi, k) + v) for k, v in add.items()})
    out.derived.extended = True
    # what one block added, for `stitch`: the ops it runs, and the multi-tensor ops it grew
    # (what _block_delta finds by comparing the two op lists, known here without comparing);
    # like the ops, made only where read: a micro-batch search reads the stitched trace's
    # memory, not its ops
    out.derived.one_more = (hi, Lazy(lambda: list(made()[1:])))
    return out


class BlockOps(NamedTuple):
    """The ops of a cut trace's last block (OpRecord.last_block > 0), in order: per op (phase,
    family, share, recomputed?, in a module?) and its FLOPs and bytes. What `extend` adds to the
    totals per block, without the trace's op records."""

    keys: list
    flops: list
    bytes: list


def block_ops(tr: Trace) -> BlockOps:
    """`tr`'s BlockOps, made once and kept on it (TraceDerived.block_ops). A trace read off two
    others on a line (derive/interpolate.py, `TraceDerived.line`) has its records copied from
    the lower one's with FLOPs and bytes on the line: its block's are the anchors' on the same
    line, elementwise as interpolate.py computes every record's (so the same numbers), read off
    their BlockOps without making its records, where both anchors' blocks run the same ops."""
    blk = tr.derived.block_ops
    if blk is None:
        between = tr.derived.line
        if between is not None:
            lo, hi, f = between
            a, b = block_ops(lo), block_ops(hi)
            if a.keys == b.keys:
                blk = BlockOps(a.keys, line_values(a.flops, b.flops, f).tolist(),
                               line_values(a.bytes, b.bytes, f).tolist())
        if blk is None:
            rows = [r for r in tr.ops if r.last_block]
            blk = BlockOps([(r.phase, r.family, r.last_block, r.recompute, bool(r.module))
                            for r in rows], [r.flops for r in rows], [r.bytes for r in rows])
        tr.derived.block_ops = blk
    return blk


def _extendable(hi: Trace) -> bool:
    """Whether `extend` reads one block more off `hi`: a tagged HIGH-block cut trace without
    mixture-of-experts layers."""
    return hi.stack is not None and hi.stack.traced == HIGH and hi.last_block is not None and \
        not (hi.expert_param_bytes or hi.moe_dispatch_elements)


def read_peaks(hi: Trace) -> None:
    """Read what `extend` reads of `hi`'s log, the peaks over one block more and over the whole
    stack, onto the log (`TraceLog.peaks_memo`, pickled with it), and its last block's ops
    (`block_ops`, kept on the trace): done where a trace is made (replays.py `prepare`), so a
    plan from stored traces reads no cut log again, nor its op records to extend it."""
    if _extendable(hi):
        whole_peaks(hi.log, HIGH + 1, also=(hi.stack.blocks,))
        block_ops(hi)


def one_more(tr: Trace) -> Trace | None:
    """`extend(tr)`, made once per trace (kept on it: TraceDerived.more)."""
    made, more = tr.derived.more
    if not made:
        more = extend(tr)
        tr.derived.more = (True, more)
    return more


def _with_copies(items: list[str], pattern, last: int, blocks: int, period: int = 1
                 ) -> list[str]:
    """`items` and block `last`'s names (its `period` layers') as those of blocks last+1 ..
    blocks-1, made when first read (lazy.py): few read them (predict/memory.py, `inspect`), and
    every stitched trace has them (Llama-3.1-70B's LoRA modules, 7 a block: 532 names made for
    each of the ~430 traces a warm plan over every platform stitches, a tenth of its time,
    profiled)."""
    def made() -> list[str]:
        tails = [_in_block(pattern, n, period) for n in items
                 if _unit_of(pattern, n, period) == last]
        return list(items) + [f"{a}{i * period + k}{b}" for i in range(last + 1, blocks)
                              for a, k, b in tails]
    return Lazy(made)


def _row_copies(block_rows: list[ModuleRow], pattern, blocks, period: int = 1
                ) -> list[ModuleRow]:
    """One block's module rows (its `period` layers'), renamed as each of `blocks`'."""
    tails = [(_in_block(pattern, r.name, period), r) for r in block_rows]
    return [ModuleRow(f"{a}{i * period + k}{b}", r.depth, r.params, r.trainable_params,
                      r.activation_bytes, r.flops_forward, r.flops_backward)
            for i in blocks for (a, k, b), r in tails]


def _inner_activations(rows: list[ModuleRow], pattern, last: int, period: int = 1
                       ) -> dict[tuple[int, str], int]:
    """{(a row's layer within its block, its name after the layer index): activation bytes} of
    the block before block `last`: what an inner block keeps at the end of the forward, where
    the last block's output may be freed by the head (tracer.py `_last_block`)."""
    return {_in_block(pattern, m.name, period)[1:]: m.activation_bytes
            for m in rows if _unit_of(pattern, m.name, period) == last - 1}


def _as_inner(block_rows: list[ModuleRow], pattern, inner: dict, period: int = 1
              ) -> list[ModuleRow]:
    """The last block's rows with an inner block's activations."""
    return [m._replace(activation_bytes=inner.get(_in_block(pattern, m.name, period)[1:],
                                                  m.activation_bytes)) for m in block_rows]


def _one_more_block(rows: list[ModuleRow], pattern, path: str, work: dict[str, float],
                    period: int = 1) -> list[ModuleRow]:
    """The module table with one more block: block HIGH-1's rows copied as block HIGH's after
    them, block HIGH-1's own now keeping the activations block HIGH-2's keep (an inner block's,
    `_inner_activations`), and what the block holds added to each row holding it (the stack, the
    model): its parameters, an inner block's activations, and the FLOPs of the ops it runs
    (`work`: forward, backward; not its row's, which the module tracker's backward attribution
    moves between neighbouring blocks). A block of `period` layers: their rows."""
    layers = {f"{path}.{(HIGH - 1) * period + k}": k for k in range(period)}
    mine = {layers[m.name]: m for m in rows if m.name in layers}
    if len(mine) != period:
        return list(rows)
    holders = {"(total)"} | {".".join(path.split(".")[:i]) for i in range(1, path.count(".") + 2)}
    block_rows = [m for m in rows if _unit_of(pattern, m.name, period) == HIGH - 1]
    inner = _inner_activations(rows, pattern, HIGH - 1, period)
    as_inner = dict(zip(map(id, block_rows), _as_inner(block_rows, pattern, inner, period)))
    params = sum(m.params for m in mine.values())
    trainable = sum(m.trainable_params for m in mine.values())
    added = sum(inner.get((k, ""), m.activation_bytes) for k, m in mine.items())
    out = []
    for m in rows:
        if m.name in holders:
            m = ModuleRow(m.name, m.depth, m.params + params, m.trainable_params + trainable,
                          m.activation_bytes + added,
                          m.flops_forward + work["forward"], m.flops_backward + work["backward"])
        out.append(as_inner.get(id(m), m))
        if m is block_rows[-1]:
            out.extend(_row_copies(block_rows, pattern, [HIGH], period))
    return out


def _modules(lo: Trace, hi: Trace, pattern, L: int, line) -> list[ModuleRow]:
    """hi's rows; rows outside the stack on the line through lo's, hi's last block's rows
    copied."""
    by_name = {m.name: m for m in lo.modules}
    rows, n, period = [], hi.stack.traced, hi.stack.period
    last = n - 1
    block_rows = [m for m in hi.modules if _unit_of(pattern, m.name, period) == last]
    inner = _as_inner(block_rows, pattern,
                      _inner_activations(hi.modules, pattern, last, period), period)
    as_inner = dict(zip(map(id, block_rows), inner))
    tail = block_rows[-1] if block_rows else None
    for m in hi.modules:
        a = by_name.get(m.name) if _block_of(pattern, m.name) is None else None
        if a is None:
            rows.append(as_inner.get(id(m), m) if n < L else m)
        else:
            rows.append(ModuleRow(m.name, m.depth, int(line(a.params, m.params)),
                                  int(line(a.trainable_params, m.trainable_params)),
                                  int(line(a.activation_bytes, m.activation_bytes)),
                                  line(a.flops_forward, m.flops_forward),
                                  line(a.flops_backward, m.flops_backward)))
        if m is tail:       # inner blocks as the one before the last, the last as the last
            rows.extend(_row_copies(inner, pattern, range(n, L - 1), period))
            rows.extend(_row_copies(block_rows, pattern, range(max(n, L - 1), L), period))
    return rows


def whole_forward(tr):
    """An inference forward (trace/generate.py `InferenceTrace`) traced with HIGH of its stack's
    layers, as the whole stack's: each op a layer runs repeated for the layers left out, the
    parameters, weights and KV cache of the last layer added for each, and the live-memory peak
    replayed over the whole stack's memory log (`whole_log`: the weights, the cache each layer
    holds and each layer's working memory, in order). `tr` itself where it was traced whole;
    None where its events do not repeat layer by layer (then it is traced whole)."""
    if tr.stack is None:
        return tr
    log = whole_log(tr, tr.stack.blocks)
    if log is None:
        return None
    n, L = tr.stack.traced, tr.stack.blocks
    extra = L - n
    layer = [r for r in tr.ops if r.last_block >= 1.0]
    return replace(
        tr, ops=list(tr.ops) + layer * extra,
        params_total=tr.params_total + extra * tr.last_block["params_total"],
        weight_bytes=tr.weight_bytes + extra * tr.last_block["weight_bytes"],
        kv_cache_bytes=tr.kv_cache_bytes + extra * (tr.kv_cache_bytes // n),
        peak_bytes=replay_log(log)[1][0], log=TraceLog(),
        notes=list(tr.notes) + [f"traced with {n} of its {L} alike layers ({tr.stack.path}); "
                                f"the forward adds the other {extra} as copies of the last"])
