"""The step of a model with L repeated blocks, from one trace of the same model cut to 4.

A model with a stack of L alike blocks (trace/depth.py) runs, per step, the ops outside the stack
(embeddings, head, loss, the optimizer's multi-tensor kernels over every parameter) and L times
one block's ops, forward and backward (and the rerun of a checkpointed block). Two cuts, n and
n + 1 blocks, give what one block adds: the 4-block trace and the same step with one block more,
read off what the 4-block trace's last block does (`extend`, exact against a real 5-block trace);
where that cannot be read (a mixture-of-experts model, events that do not repeat block by
block), a second trace cut to 3 (`stitch(lo, hi)` either way). So, with n the smaller cut:

* ops: the larger cut's, plus L-n-1 more times the ops one more block adds (what the larger
  cut runs beyond the smaller, compared as multisets); an op both run at different sizes
  (a multi-tensor optimizer kernel over every parameter) takes FLOPs and bytes
  x(L) = x(n) + (L - n)(x(n+1) - x(n));
* every byte count and each phase's peak by category: the same line through the two traces. A
  phase's peak is where the live total is largest; with alike blocks it mostly comes at the same
  place in the step (end of forward, the start of backward, the optimizer's update) at any depth
  and grows by one block's share per block. Where another place grows faster and overtakes it
  deeper in the model, the line reads low by at most about one block's working memory
  (Llama-3.2-1B with accumulation: 0.6%, mid-backward overtaking the start of backward at 16
  blocks). Not from 2 blocks: with full checkpointing a 2-block model's backward peaks at another
  place (activations still live);
* the caching allocator's fragmentation: the replay of the whole stack's allocations, the
  4-block trace's repeated block by block (`whole_events`), which is the full trace's replay;
  where they do not repeat, that of the 4-block replay (`_fragmentation`);
* the module table, the checkpointed blocks and the LoRA modules: the larger cut's last block's
  rows copied for the rest.

Where the smaller cut runs an op the larger one does not, `stitch` returns None and the whole
model is traced. tests/test_depth.py checks the result against full traces (Llama, GPT-2, BERT,
LoRA, QLoRA, checkpointing, accumulation, 8-bit AdamW): the same step time and byte counts, the
allocated peak within 1%, the required memory within the allocator replay's noise (5%).
"""
from __future__ import annotations

import copy
import functools
import re
from dataclasses import replace

from ..trace.counters import ALLOC, CATEGORIES, FREE, RETAG, replay_log
from ..trace.shapes import on_line
from ..trace.tracer import ModuleRow, Trace
from .allocator import CUDA, Rules, replay
from .memory import Fragmentation, fragmentation, replayed

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


def stitch(lo: Trace, hi: Trace, tagged: Trace | None = None) -> Trace | None:
    """The whole model's trace from its traces cut to n and n + 1 blocks (module docstring:
    LOW and HIGH, or HIGH and the HIGH-block trace's `extend`), or None where they do not fit
    the pattern of alike blocks. `tagged`: the HIGH-block trace, whose allocations repeat over
    the whole stack (`whole_events`); `hi` by default."""
    if lo.stack is None or hi.stack is None or lo.stack.path != hi.stack.path or \
            hi.stack.traced != lo.stack.traced + 1:
        return None
    tagged = hi if tagged is None else tagged
    L, path, n = hi.stack.blocks, hi.stack.path, hi.stack.traced
    f = float(L - lo.stack.traced)     # (L - lo) / (hi - lo), hi - lo = 1
    pattern = _index_pattern(path)
    last = n - 1
    made = hi.derived.get("one_more")       # read off lo by `extend`: what it added, known
    delta = made[1:] if made is not None and made[0] is lo else _block_delta(lo.ops, hi.ops)
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
            r.shape = on_line(a.shape, r.shape, f)
        ops.append(r)
    # the same records, not copies: nothing changes a trace's records in place (who derives one
    # copies it first: interpolate.py, traces.relabel), and an 80-block model repeats ~150 of
    # them 76 times (copying them was most of a warm 70B plan's time)
    ops.extend(new * (L - n))

    phase_peaks = {ph: (whole(lo.phase_peaks[ph][0], v[0]),
                        {c: whole(lo.phase_peaks[ph][1].get(c, 0), v[1].get(c, 0))
                         for c in CATEGORIES})
                   for ph, v in hi.phase_peaks.items()}
    peak_phase = max(phase_peaks, key=lambda ph: phase_peaks[ph][0])

    def nested(d0, d1):
        return {k: {kk: line(d0[k][kk], v) for kk, v in inner.items()} for k, inner in d1.items()}

    def names(items: list[str]) -> list[str]:
        return _with_copies(items, pattern, last, L)

    out = replace(
        hi, ops=ops, phase_peaks=phase_peaks, peak_phase=peak_phase,
        peak_allocated_bytes=phase_peaks[peak_phase][0],
        peak_breakdown_bytes=dict(phase_peaks[peak_phase][1]),
        params_total=whole(lo.params_total, hi.params_total),
        params_trainable=whole(lo.params_trainable, hi.params_trainable),
        weight_bytes=whole(lo.weight_bytes, hi.weight_bytes),
        packed_weight_bytes=whole(lo.packed_weight_bytes, hi.packed_weight_bytes),
        floating_weight_elements=whole(lo.floating_weight_elements, hi.floating_weight_elements),
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
        alloc_events=[], memory_log=[], event_blocks=tagged.event_blocks, stack=tagged.stack,
        flash_eligible=tagged.flash_eligible, last_block=None,
        trace_seconds=lo.trace_seconds + (0.0 if hi.derived.get("extended") else
                                          hi.trace_seconds),
        notes=list(hi.notes) + [
            f"traced with {HIGH} of its {L} alike blocks ({path}); the step adds the other "
            f"{L - HIGH} as copies of the last" if hi.derived.get("extended") else
            f"traced with {LOW} and with {HIGH} of its {L} alike blocks ({path}); the step adds "
            f"the other {L - HIGH} as copies"])
    # the whole stack's replay is made when a fit is asked of this trace (memory.fragmentation:
    # the anchors', not every micro-batch a search reads off their line)
    out.derived["whole_replay"] = repeats(tagged, L)
    out.derived["fragmentation_from"] = functools.partial(_fragmentation, tagged)
    return out


def extend(hi: Trace) -> Trace | None:
    """The trace of the model cut to HIGH + 1 blocks, read off the HIGH-block trace alone: with
    it, `stitch` needs no trace cut to LOW (one trace where there were two; 0.8 of the HIGH
    one's time). The tracer tags what the last block does (trace/blocks.py, counters.py): every
    event, the share of every op's work (`OpRecord.last_block`: 1 for an op the block runs, its
    tensors' share of a multi-tensor optimizer op's bytes) and what it adds to the totals
    (tracer.py `_last_block`). One more block then adds:

    * ops: a copy of each op the block runs; a multi-tensor op grows by the block's share;
    * memory: the events and memory log repeated over one more block (`whole_log`, the same
      repetition as the allocator's replay of the whole stack), replayed for each phase's peak;
    * totals, and the module table: the last block's, its rows copied as block HIGH.

    tests/test_depth.py checks it against a real trace cut to HIGH + 1 blocks, field by field.
    None where the events do not repeat block by block, the model has mixture-of-experts
    layers (whose routing totals are not split by block), or the trace is not tagged."""
    if hi.stack is None or hi.stack.traced != HIGH or hi.last_block is None or \
            hi.expert_param_bytes or hi.moe_dispatch_elements:
        return None
    log = whole_log(hi, HIGH + 1)
    if log is None:
        return None
    phase_peaks = replay_log(log)[0]
    if phase_peaks.keys() != hi.phase_peaks.keys():
        return None
    peak_phase = max(phase_peaks, key=lambda ph: phase_peaks[ph][0])
    ops, more, grown = [], [], []
    flops = {ph: dict(v) for ph, v in hi.flops.items()}
    moved = {ph: dict(v) for ph, v in hi.bytes_moved.items()}
    recompute = hi.recompute_flops
    work = {"forward": 0.0, "backward": 0.0}    # of the ops the module table attributes
    for r in hi.ops:
        share = r.last_block
        if share and r.phase in flops:
            flops[r.phase][r.family] += share * r.flops
            moved[r.phase][r.family] += share * r.bytes
            if r.recompute:
                recompute += share * r.flops
            if r.module and r.phase in work:
                work[r.phase] += share * r.flops
        if share >= 1.0:
            more.append(r)
        elif share > 0.0:
            r0, r = r, copy.copy(r)
            r.flops, r.bytes, r.last_block = (r.flops * (1 + share), r.bytes * (1 + share),
                                              share / (1 + share))
            # a multi-tensor op's list grows by the last block's tensors (trace/shapes.py)
            r.shape = (r.shape[0] + r.shape[2],) + r.shape[1:] if len(r.shape) == 3 else \
                r.shape[:1] and (round(r.shape[0] * (1 + share)),) + r.shape[1:]
            grown.append((r0, r))
        ops.append(r)
    pattern = _index_pattern(hi.stack.path)
    add = hi.last_block
    out = replace(
        hi, stack=replace(hi.stack, traced=HIGH + 1), ops=ops + more, phase_peaks=phase_peaks,
        peak_phase=peak_phase, peak_allocated_bytes=phase_peaks[peak_phase][0],
        peak_breakdown_bytes=dict(phase_peaks[peak_phase][1]), flops=flops, bytes_moved=moved,
        recompute_flops=recompute,
        modules=_one_more_block(hi.modules, pattern, hi.stack.path, work),
        checkpointed_blocks=_with_copies(hi.checkpointed_blocks, pattern, HIGH - 1, HIGH + 1),
        lora_modules=_with_copies(hi.lora_modules, pattern, HIGH - 1, HIGH + 1),
        alloc_events=[], memory_log=log, event_blocks=None, marks=[], gradients_made=[],
        timeline=[], **{k: type(getattr(hi, k))(getattr(hi, k) + v) for k, v in add.items()})
    out.derived["extended"] = True
    # what one block added, for `stitch`: the ops it runs, and the multi-tensor ops it grew
    # (what _block_delta would find comparing the two op lists: 1.1 s of a 70B plan)
    out.derived["one_more"] = (hi, more, grown)
    return out


def _with_copies(items: list[str], pattern, last: int, blocks: int) -> list[str]:
    """`items` and block `last`'s names as those of blocks last+1 .. blocks-1."""
    tails = [_split(pattern, n) for n in items if _block_of(pattern, n) == last]
    return list(items) + [f"{a}{i}{b}" for i in range(last + 1, blocks) for a, b in tails]


def _row_copies(block_rows: list[ModuleRow], pattern, blocks) -> list[ModuleRow]:
    """One block's module rows, renamed as each of `blocks`'."""
    tails = [(_split(pattern, r.name), r) for r in block_rows]
    return [ModuleRow(f"{a}{i}{b}", r.depth, r.params, r.trainable_params, r.activation_bytes,
                      r.flops_forward, r.flops_backward) for i in blocks for (a, b), r in tails]


def _one_more_block(rows: list[ModuleRow], pattern, path: str, work: dict[str, float]
                    ) -> list[ModuleRow]:
    """The module table with one more block: block HIGH-1's rows copied as block HIGH's after
    them, and what the block holds added to each row holding it (the stack, the model): its
    parameters and activations, and the FLOPs of the ops it runs (`work`: forward, backward;
    not its row's, which the module tracker's backward attribution moves between neighbouring
    blocks)."""
    block = f"{path}.{HIGH - 1}"
    mine = next((m for m in rows if m.name == block), None)
    if mine is None:
        return list(rows)
    holders = {"(total)"} | {".".join(path.split(".")[:i]) for i in range(1, path.count(".") + 2)}
    block_rows = [m for m in rows if _block_of(pattern, m.name) == HIGH - 1]
    out = []
    for m in rows:
        if m.name in holders:
            m = ModuleRow(m.name, m.depth, m.params + mine.params,
                          m.trainable_params + mine.trainable_params,
                          m.activation_bytes + mine.activation_bytes,
                          m.flops_forward + work["forward"], m.flops_backward + work["backward"])
        out.append(m)
        if m is block_rows[-1]:
            out.extend(_row_copies(block_rows, pattern, [HIGH]))
    return out


def _modules(lo: Trace, hi: Trace, pattern, L: int, line) -> list[ModuleRow]:
    """hi's rows; rows outside the stack on the line through lo's, hi's last block's rows
    copied."""
    by_name = {m.name: m for m in lo.modules}
    rows, n = [], hi.stack.traced
    last = n - 1
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
            rows.extend(_row_copies(block_rows, pattern, range(n, L)))
    return rows


_PLANS: dict[int, tuple[list, tuple | None]] = {}


def _plan_of(hi: Trace):
    """`_repeat_plan(hi)`, made once per tag list: the traces interpolated from a cut trace
    share its tags and serials (interpolate.py), so its plan too."""
    tags = hi.event_blocks
    hit = _PLANS.get(id(tags))
    if hit is None or hit[0] is not tags:
        if len(_PLANS) > 512:          # it keeps each tag list alive: bounded
            _PLANS.clear()
        hit = _PLANS[id(tags)] = (tags, _repeat_plan(hi))
    return hit[1]


def repeats(hi: Trace, blocks: int) -> bool:
    """Whether the cut trace's events repeat block by block (`whole_events` is not None)."""
    return blocks > HIGH and _plan_of(hi) is not None


def _fragmentation(hi: Trace, rules: Rules = CUDA) -> Fragmentation:
    """The caching allocator's waste over the whole model's step (its `stack.blocks` blocks),
    memoised on the cut trace `hi`: the replay (allocator.py) of the allocations the whole stack
    makes (`whole_events`), which equals the full trace's replay (tests/test_depth.py). Where
    the events do not repeat block by block, that of the 4-block replay: the cut model has the
    whole model's mix of block sizes, and against full traces its required memory stays within
    -2% and +4% (a replay's segment-level noise)."""
    key = "whole_fragmentation" if rules is CUDA else f"whole_fragmentation:{rules.name}"
    if key not in hi.derived:
        events = whole_events(hi, hi.stack.blocks)
        hi.derived[key] = \
            fragmentation(hi, rules) if events is None else replayed(*replay(events, rules))
    return hi.derived[key]


def prepare(tr: Trace) -> Trace:
    """`tr` with the allocator replay a plan reads of it made and kept on it (in `derived`, so
    the trace store keeps it too: a warm plan replays nothing). Traces run in worker processes
    (trace/parallel.py), which call this before sending a trace back, so the replays run on
    all cores beside the traces: the whole stack's for a HIGH-block cut trace (`_fragmentation`:
    31,000 events for Llama-3.1-70B, half a warm plan's time when made in the planning
    process), the trace's own for a whole one. A LOW-block trace is never replayed."""
    if tr.stack is None:
        fragmentation(tr)
    elif tr.stack.traced == HIGH and tr.stack.blocks > HIGH:
        _fragmentation(tr)
    return tr


def keep_replays(src: Trace, dst: Trace) -> Trace:
    """`dst`, a trace with `src`'s allocations (the same step under other semantics or dtype
    names: predict/traces.py), given the replays made of `src` (`prepare`)."""
    for k in ("replay", "whole_fragmentation"):      # memory._replay_once's, _fragmentation's
        if k in src.derived:
            dst.derived.setdefault(k, src.derived[k])
    return dst


def whole_events(hi: Trace, blocks: int) -> list[tuple[int, int]] | None:
    """The allocation events of the whole model's step, from the HIGH-block trace's tagged events
    (trace/blocks.py), or None where they do not repeat block by block.

    Each maximal run of events in block HIGH-1 (the template) is matched with the run of block
    HIGH-2 beside it: before it where the blocks run in ascending order (forward, a multi-tensor
    optimizer op's outputs), after it where they run descending (backward, a list of outputs
    freed from its end). The two must have the same sizes event by event. The whole model runs
    blocks HIGH..L-1 as copies of the template, after it when ascending and before it when
    descending. Each free in the template names what it frees relative to its block: its own
    allocation (a copy frees its own copy's), the previous block's (the copy before it), or the
    next one's (which for block HIGH-1 was outside the stack: the head's; the template frees
    the first copy's, the last copy the head's). Frees outside the stack of block HIGH-1's
    allocations (the head reading the last block's output) free the last copy's."""
    plan = _plan_of(hi)
    return None if plan is None or blocks <= HIGH else _emit(hi.alloc_events, plan, blocks)


def _repeat_plan(hi: Trace):
    """What `whole_events` repeats: (runs, {template run: (start, length, ascending)}, each
    template free's relation, serial -> (block, run, position) of the template's and its
    counterparts' allocations, {outside run: what it frees of every block}), or None."""
    tags, events = hi.event_blocks, hi.alloc_events
    T, P = HIGH - 1, HIGH - 2
    if tags is None or len(tags) != len(events):
        return None
    runs = _split_turns(_runs(tags), events, T, P)
    template: dict[int, tuple[int, int, bool]] = {}
    counterpart: dict[int, int] = {}
    for i, (tag, start, n) in enumerate(runs):
        if tag != T:
            continue
        before = i > 0 and runs[i - 1][0] == P and runs[i - 1][2] == n
        after = i + 1 < len(runs) and runs[i + 1][0] == P and runs[i + 1][2] == n
        if not (before or after):
            return None
        c = i - 1 if before else i + 1
        cstart = runs[c][1]
        if any(events[start + m][1] != events[cstart + m][1] for m in range(n)):
            return None
        template[i], counterpart[i] = (start, n, before), c
    pos: dict[int, tuple[int, int, int]] = {}
    for i, c in counterpart.items():
        for block, run in ((T, i), (P, c)):
            start, n = runs[run][1], runs[run][2]
            for m in range(n):
                serial, nbytes = events[start + m]
                if nbytes >= 0:
                    pos[serial] = (block, i, m)
    relation: dict[tuple[int, int], tuple] = {}
    for i, (start, n, _asc) in template.items():
        cstart = runs[counterpart[i]][1]
        for m in range(n):
            serial, nbytes = events[start + m]
            if nbytes >= 0:
                continue
            where = pos.get(serial)
            if where is not None and where[0] == T:
                relation[(i, m)] = ("same",) + where[1:]
            elif where is not None and where[0] == P:
                relation[(i, m)] = ("prev",) + where[1:]
            else:
                theirs = pos.get(events[cstart + m][0])
                if theirs is None or theirs[0] != T or events[cstart + m][1] >= 0:
                    return None
                relation[(i, m)] = ("next",) + theirs[1:] + (serial,)
    every = {}
    for i, (tag, start, n) in enumerate(runs):
        if tag == -1:
            every[i] = _freed_by_all(events, start, n, pos, T, P)
            if every[i] is None:
                return None
    return runs, template, relation, pos, every


def _emit(events, plan, blocks: int, src: list | None = None) -> list[tuple[int, int]]:
    """The whole stack's events (`whole_events`). Block k >= HIGH's copy of the template's
    allocation at (run, position) gets serial base + (k - HIGH) x A + its slot, A the template's
    allocations. `src`, if given, receives for each event emitted (the index in `events` it
    copies, the block k >= HIGH whose copy it is or -1)."""
    runs, template, relation, pos, every = plan
    T, last = HIGH - 1, blocks - 1
    slot, base = _slots(events, template)
    real = {(i, m): events[template[i][0] + m][0] for i, m in slot}
    A = len(slot)
    recipes = {}
    for i, (start, n, _a) in template.items():
        recipe = []
        for m in range(n):
            serial, nbytes = events[start + m]
            if nbytes >= 0:
                recipe.append((0, slot[(i, m)], nbytes, serial, 0))
                continue
            kind, run, at = relation[(i, m)][:3]
            if kind == "same":
                recipe.append((1, slot[(run, at)], nbytes, real[(run, at)], 0))
            elif kind == "prev":
                recipe.append((2, slot[(run, at)], nbytes, serial, real[(run, at)]))
            else:
                recipe.append((3, slot[(run, at)], nbytes, relation[(i, m)][3], 0))
        recipes[i] = recipe
    out: list[tuple[int, int]] = []
    append = out.append
    for i, (tag, start, n) in enumerate(runs):
        if i in template:
            order = [T] + list(range(HIGH, blocks)) if template[i][2] else \
                list(range(last, T, -1)) + [T]
            for k in order:
                off = base + (k - HIGH) * A
                if src is not None:
                    src.extend((start + m, -1 if k == T else k) for m in range(n))
                for kind, sl, nbytes, serial, other in recipes[i]:
                    if k == T:      # the traced block: its own serials; its next is copy HIGH
                        append((base + sl if kind == 3 else serial, nbytes))
                    elif kind <= 1:
                        append((off + sl, nbytes))
                    elif kind == 2:
                        append((other if k - 1 == T else off - A + sl, nbytes))
                    else:
                        append((serial if k == last else off + A + sl, nbytes))
            continue
        all_blocks = every.get(i, {})
        for e in range(start, start + n):
            serial, nbytes = events[e]
            where = pos.get(serial)
            if nbytes >= 0 or tag != -1 or where is None or where[0] != T:
                append((serial, nbytes))
                if src is not None:
                    src.append((e, -1))
                continue
            sl = slot[where[1:]]
            if where[1:] in all_blocks:   # every block's, freed here: the copies' too
                mine = [(base + (k - HIGH) * A + sl, nbytes) for k in range(HIGH, blocks)]
                ks = list(range(HIGH, blocks))
                if all_blocks[where[1:]]:
                    out += [(serial, nbytes)] + mine
                    ks = [-1] + ks
                else:
                    out += mine[::-1] + [(serial, nbytes)]
                    ks = ks[::-1] + [-1]
                if src is not None:
                    src.extend((e, k) for k in ks)
            else:                         # the last block's (the head reads it): the last copy's
                append((base + (last - HIGH) * A + sl, nbytes))
                if src is not None:
                    src.append((e, last))
    return out


def _slots(events, template: dict) -> tuple[dict[tuple[int, int], int], int]:
    """({(template run, position): slot} for the template's allocations in order, the serial
    after the last): block k >= HIGH's copy of the allocation in slot s has serial
    base + (k - HIGH) x (allocations) + s (`_emit`, `whole_log`)."""
    slot: dict[tuple[int, int], int] = {}
    for i, (start, n, _a) in template.items():
        for m in range(n):
            if events[start + m][1] >= 0:
                slot[(i, m)] = len(slot)
    return slot, max((s for s, _n in events), default=0) + 1


def _freed_by_all(events, start: int, n: int, pos: dict, T: int, P: int
                  ) -> dict[tuple[int, int], bool] | None:
    """Allocations of the template's runs that a run outside the stack frees in every block
    (cyclic garbage collected at a phase's end): {(run, position): ascending?}, where block P's
    and block T's are both freed here; None where block P's is freed without block T's."""
    at: dict[tuple, dict[int, int]] = {}
    for e in range(start, start + n):
        serial, nbytes = events[e]
        where = pos.get(serial)
        if nbytes < 0 and where is not None:
            at.setdefault(where[1:], {})[where[0]] = e
    out = {}
    for key, blocks_at in at.items():
        if P in blocks_at:
            if T not in blocks_at:
                return None
            out[key] = blocks_at[P] < blocks_at[T]
    return out


def _runs(tags: list[int]) -> list[tuple[int, int, int]]:
    """Maximal runs of equal tags: (tag, start, length)."""
    runs, start = [], 0
    for i in range(1, len(tags) + 1):
        if i == len(tags) or tags[i] != tags[start]:
            runs.append((tags[start], start, i - start))
            start = i
    return runs


def _split_turns(runs, events, T: int, P: int):
    """Split a template run where the blocks turn around (ascending, then descending: one
    multi-tensor op's outputs, then the list freed from its end): a run of block T between two
    runs of block P as long as both together."""
    out = []
    for i, (tag, start, n) in enumerate(runs):
        if tag == T and 0 < i < len(runs) - 1 and runs[i - 1][0] == P and runs[i + 1][0] == P \
                and runs[i - 1][2] + runs[i + 1][2] == n:
            a = runs[i - 1][2]
            out += [(T, start, a), (T, start + a, n - a)]
        else:
            out.append((tag, start, n))
    return out


_LOGS: dict[tuple, tuple] = {}


def whole_log(hi: Trace, blocks: int) -> list[tuple] | None:
    """The memory log (trace/counters.py) of the step with `blocks` blocks in its stack, from
    the HIGH-block trace's: its events repeated as `whole_events` repeats them, each with its
    log entry (category and phase as the template's), and the entries between events (a
    tensor's category changed, the peaks reset) kept where they were. A category change right
    after an event of the template's (a gradient made, a weight cast) follows each copy of it,
    on the copy's tensor; one elsewhere of a template's tensor (the optimizer states tagged
    after the first step) changes the copies' too; the peaks' reset after a template event
    (the warm-up's last gradient freed) comes after its last copy. None where the events do
    not repeat, or a change inside the template names a tensor the copies have no counterpart
    of.

    Made once per log structure: what is repeated where depends on the order of the events,
    their blocks and the tensors they name, not on their sizes, and the traces of one step at
    other micro-batches (anchors, and those read off their line: interpolate.py) share all
    of that; each gets the first one's whole log with its own sizes (the log's walk was most
    of `extend`'s time in a warm plan over many platforms)."""
    shape = tuple(e if e[0] != ALLOC else (ALLOC, e[1], e[3], e[4]) for e in hi.memory_log)
    tags = tuple(hi.event_blocks) if hi.event_blocks is not None else None
    key = (hash(shape), hash(tags), blocks)
    hit = _LOGS.get(key)
    if hit is None or hit[0] != shape or hit[1] != tags:
        if len(_LOGS) > 64:            # it keeps each log alive: bounded
            _LOGS.clear()
        made = _whole_log(hi, blocks)
        _LOGS[key] = (shape, tags) + (made or (None, None))
        return None if made is None else made[0]
    log, sources = hit[2:]
    if log is None:
        return None
    size = {e[1]: e[2] for e in hi.memory_log if e[0] == ALLOC}
    return [e if s is None else (ALLOC, e[1], size[s], e[3], e[4]) for e, s in zip(log, sources)]


def _whole_log(hi: Trace, blocks: int) -> tuple[list[tuple], list[int | None]] | None:
    """(`whole_log`, for each of its entries the serial in `hi`'s log that an allocation
    copies, else None), or None."""
    plan = _plan_of(hi)
    if plan is None or blocks <= HIGH:
        return None
    _runs_, template, _relation, pos, _every = plan
    src: list[tuple[int, int]] = []
    events = _emit(hi.alloc_events, plan, blocks, src)
    entry: list[tuple] = []
    after: dict[int, list[tuple]] = {}
    for ent in hi.memory_log:
        if ent[0] == ALLOC or ent[0] == FREE:
            entry.append(ent)
        else:
            after.setdefault(len(entry) - 1, []).append(ent)
    if len(entry) != len(hi.alloc_events):
        return None
    T = HIGH - 1
    slot, base = _slots(hi.alloc_events, template)
    A = len(slot)
    in_template = {start + m for start, n, _a in template.values() for m in range(n)}

    def copy_of(serial: int, k: int) -> int | None:
        where = pos.get(serial)
        if where is None or where[0] != T:
            return None
        return base + (k - HIGH) * A + slot[where[1:]]

    last_at = {e: j for j, (e, _k) in enumerate(src)}
    out: list[tuple] = list(after.get(-1, ()))
    alive: set[int] = set()
    copied: dict[int, int] = {}          # index in `out` of an allocation -> serial it copies
    for j, ((serial, nbytes), (e, k)) in enumerate(zip(events, src)):
        ent = entry[e]
        if ent[0] == ALLOC:
            copied[len(out)] = ent[1]
            out.append((ALLOC, serial, ent[2], ent[3], ent[4]))
            alive.add(serial)
        elif serial in alive:
            out.append((FREE, serial))
            alive.discard(serial)
        elif nbytes:
            return None
        # else: a free of nothing (`_emit` cannot tell an empty free from an empty allocation)
        extra = after.get(e)
        if not extra:
            continue
        if e in in_template:                 # follows each copy, on the copy's tensor
            for x in extra:
                if x[0] != RETAG:            # the peaks reset: once, after the last copy
                    if last_at[e] == j:
                        out.append(x)
                    continue
                if k == -1:
                    out.append(x)
                    continue
                c = copy_of(x[1], k)
                if c is None:
                    return None
                out.append((RETAG, c, x[2]))
        elif last_at[e] == j:                # once, where it was; the copies' tensors too
            for x in extra:
                out.append(x)
                if x[0] == RETAG and copy_of(x[1], HIGH) is not None:
                    out.extend((RETAG, copy_of(x[1], k), x[2]) for k in range(HIGH, blocks))
    return out, [copied.get(j) for j in range(len(out))]


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
        peak_bytes=replay_log(log)[1][0], alloc_events=[], memory_log=[], event_blocks=None,
        notes=list(tr.notes) + [f"traced with {n} of its {L} alike layers ({tr.stack.path}); "
                                f"the forward adds the other {extra} as copies of the last"])
