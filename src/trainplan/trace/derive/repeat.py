"""A cut trace's allocations and memory log repeated over the whole stack, block by block.

A trace of the model cut to HIGH blocks (trace/stack.py) tags every allocation and free with the
block it happened in (trace/blocks.py). Block HIGH-1, the last traced (T), is the template; block
HIGH-2 (P) the one before it. The whole model runs blocks HIGH .. L-1 as copies of the template:

* each maximal run of events in block T is matched with the run of block P beside it: before it
  where the blocks run in ascending order (forward, a multi-tensor optimizer op's outputs), after
  it where they run descending (backward, a list of outputs freed from its end). The two must
  have the same sizes event by event. The copies follow the template when ascending, precede it
  when descending;
* each free in the template names what it frees relative to its block (`Recipe`): its own
  block's allocation (a copy frees its own copy's), the previous block's (the copy before it),
  or the next one's (which for block T was outside the stack: the head's; the template frees the
  first copy's, the last copy the head's);
* frees outside the stack of block T's allocations (the head reading the last block's output)
  free the last copy's; an allocation of every block freed outside the stack (cyclic garbage
  collected at a phase's end; a tuple of every block's output; an earlier block's run freeing
  every block's share of a shared tensor's gradient) is freed for every copy too.

Block k >= HIGH's copy of the template's allocation in slot s (the template's allocations in
order) gets serial base + (k - HIGH) x A + s, A the template's allocations and base the serial
after the trace's last. `whole_events` gives the events (what the allocator replays:
replays.py); `whole_log` the memory log, each copied event with its entry and the category
changes after it. None where the events do not repeat block by block.
"""
from __future__ import annotations

import enum
import itertools
import pickle
from typing import NamedTuple

from ..log import Alloc, Event, Free, Retag, TraceLog
from ..stack import HIGH


class Recipe(enum.Enum):
    """What one event of the template does, and so what each copy does."""

    ALLOC = "alloc"            # an allocation: each copy allocates its own
    FREE_OWN = "own"           # frees an allocation of its own block: each copy its own copy's
    FREE_PREV = "prev"         # frees the previous block's: each copy the copy's before it
    FREE_NEXT = "next"         # frees the next block's: each copy the copy's after it


class Step(NamedTuple):
    """One event of a template run, as copies replay it (`_recipes`)."""

    kind: Recipe
    slot: int                  # the template allocation it makes or frees
    nbytes: int
    serial: int                # the template's own event serial (FREE_NEXT: the head's)
    other: int = 0             # FREE_PREV: the serial block P's counterpart allocation had


class Plan(NamedTuple):
    """What repeats where (module docstring), made once per log (`plan_of`)."""

    runs: list[tuple[int, int, int]]           # (block tag, start, length), maximal runs
    template: dict[int, tuple[int, int, bool]]  # template run -> (start, length, ascending)
    relation: dict[tuple[int, int], tuple]     # (run, position) of a template free -> what
    pos: dict[int, tuple[int, int, int]]       # serial -> (block, template run, position)
    every: dict[int, dict]                     # outside run -> what it frees of every block


def plan_of(log: TraceLog) -> Plan | None:
    """The log's repeat plan, made once per log (TraceLog.repeat_plan; a stored log's kept as
    its pickle, unpickled here where first read)."""
    if not log.repeat_plan:
        log.repeat_plan.append(_repeat_plan(log))
    plan = log.repeat_plan[0]
    if type(plan) is bytes:
        plan = log.repeat_plan[0] = pickle.loads(plan)
    return plan


def repeats(hi, blocks: int) -> bool:
    """Whether the cut trace's events repeat block by block (`whole_events` is not None): a
    stored plan is one (TraceLog.__getstate__ keeps none as None)."""
    if blocks <= HIGH:
        return False
    if hi.log.repeat_plan and type(hi.log.repeat_plan[0]) is bytes:
        return True
    return plan_of(hi.log) is not None


def whole_events(hi, blocks: int) -> list[Event] | None:
    """The allocation events of the whole model's step (its `blocks` blocks), from the
    HIGH-block trace `hi`'s (module docstring), or None where they do not repeat block by
    block."""
    plan = plan_of(hi.log)
    return None if plan is None or blocks <= HIGH else _emit(hi.log.events, plan, blocks)


def _repeat_plan(log: TraceLog) -> Plan | None:
    tags, events = log.blocks, log.events
    if tags is None or len(tags) != len(events):
        return None
    runs = _runs(tags)
    plan = _plan_for(events, _split_turns(runs, events, HIGH - 1, HIGH - 2))
    for regroups in REGROUPS:
        if plan is not None:
            break
        merged = runs
        for regroup in regroups:
            merged = regroup(merged, events)
        if merged != runs:
            plan = _plan_for(events, _split_turns(merged, events, HIGH - 1, HIGH - 2))
    return plan if plan is None or _balanced(events, plan, tags) else None


def _plan_for(events, runs) -> Plan | None:
    """The plan over `runs` (maximal runs of one block's events), or None."""
    T, P = HIGH - 1, HIGH - 2
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
        if any(events[start + m].nbytes != events[cstart + m].nbytes for m in range(n)):
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
    relation = _relations(events, runs, template, counterpart, pos)
    if relation is None:
        return None
    every = {}
    born = _born(runs, events)
    for i, (tag, start, n) in enumerate(runs):
        if tag == -1:
            every[i] = _freed_by_all(events, start, n, pos, T, P, born)
            if every[i] is None:
                return None
        elif tag < P:     # an earlier block's run freeing every block's (DeBERTa's backward)
            found = _freed_by_all(events, start, n, pos, T, P, born, in_block=True)
            if found is None:
                return None
            if found:
                every[i] = found
    return Plan(runs, template, relation, pos, every)


def _balanced(events, plan: Plan, tags: list[int]) -> bool:
    """Whether one copy more leaves alive at the step's end what block T does: as many
    allocations alive as the cut trace, and block T's again. A free the copies do not repeat
    (emitted once, as traced: a tensor of each block that an earlier block's run frees, before
    `_freed_by_all` read such runs for DeBERTa) leaves each copy's alive: the plan is refused,
    and the model traced whole, rather than its peaks read low or high."""
    def alive(evs) -> set[int]:
        out: set[int] = set()
        for serial, nbytes in evs:
            if nbytes > 0:
                out.add(serial)
            elif nbytes < 0:
                out.discard(serial)
        return out
    mine = alive(events)
    last = {serial for (serial, nbytes), tag in zip(events, tags)
            if nbytes > 0 and tag == HIGH - 1}
    return len(alive(_emit(events, plan, HIGH + 1))) == len(mine) + len(mine & last)


def _relations(events, runs, template, counterpart, pos) -> dict | None:
    """What each free of the template frees (`Recipe`): ("same" | "prev", run, position) of the
    allocation, or ("next", run, position, the serial block P's counterpart frees); None where a
    free matches none of these."""
    T, P = HIGH - 1, HIGH - 2
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
                theirs = pos.get(events[cstart + m].serial)
                if theirs is None or theirs[0] != T or events[cstart + m].nbytes >= 0:
                    return None
                relation[(i, m)] = ("next",) + theirs[1:] + (serial,)
    return relation


def _recipes(events, plan: Plan, slot: dict) -> dict[int, list[Step]]:
    """Each template run's events as `Step`s."""
    real = {(i, m): events[plan.template[i][0] + m].serial for i, m in slot}
    kinds = {"same": Recipe.FREE_OWN, "prev": Recipe.FREE_PREV, "next": Recipe.FREE_NEXT}
    recipes = {}
    for i, (start, n, _a) in plan.template.items():
        recipe = []
        for m in range(n):
            serial, nbytes = events[start + m]
            if nbytes >= 0:
                recipe.append(Step(Recipe.ALLOC, slot[(i, m)], nbytes, serial))
                continue
            rel = plan.relation[(i, m)]
            kind, at = kinds[rel[0]], (rel[1], rel[2])
            if kind is Recipe.FREE_OWN:
                recipe.append(Step(kind, slot[at], nbytes, real[at]))
            elif kind is Recipe.FREE_PREV:
                recipe.append(Step(kind, slot[at], nbytes, serial, real[at]))
            else:
                recipe.append(Step(kind, slot[at], nbytes, rel[3]))
        recipes[i] = recipe
    return recipes


def _emit(events, plan: Plan, blocks: int, src: list | None = None) -> list[Event]:
    """The whole stack's events (module docstring). `src`, if given, receives for each event
    emitted (the index in `events` it copies, the block k >= HIGH whose copy it is or -1)."""
    T, last = HIGH - 1, blocks - 1
    slot, base = _slots(events, plan.template)
    A = len(slot)
    recipes = _recipes(events, plan, slot)
    out: list[Event] = []
    append = out.append
    new = tuple.__new__      # Event(s, n) without NamedTuple's __new__ frame: tens of thousands
    ALLOC, OWN, PREV = Recipe.ALLOC, Recipe.FREE_OWN, Recipe.FREE_PREV
    for i, (tag, start, n) in enumerate(plan.runs):
        if i in plan.template:
            order = [T] + list(range(HIGH, blocks)) if plan.template[i][2] else \
                list(range(last, T, -1)) + [T]
            for k in order:
                off = base + (k - HIGH) * A
                if src is not None:
                    src.extend((start + m, -1 if k == T else k) for m in range(n))
                for kind, sl, nbytes, serial, other in recipes[i]:
                    if k == T:      # the traced block: its own serials; its next is copy HIGH
                        append(new(Event, (base + sl if kind is Recipe.FREE_NEXT else serial,
                                           nbytes)))
                    elif kind is ALLOC or kind is OWN:
                        append(new(Event, (off + sl, nbytes)))
                    elif kind is PREV:
                        append(new(Event, (other if k - 1 == T else off - A + sl, nbytes)))
                    else:
                        append(new(Event, (serial if k == last else off + A + sl, nbytes)))
            continue
        _emit_outside(events, plan, i, start, n, base, A, slot, blocks, out, src)
    return out


def _emit_outside(events, plan: Plan, i: int, start: int, n: int, base: int, A: int,
                  slot: dict, blocks: int, out: list[Event], src: list | None) -> None:
    """A run outside the template's: its events as traced, except frees of block T's
    allocations: of every block's (`_freed_by_all`) for each copy too, in the order found
    (DOWN_THEN_LAST: the copies' but the last with block P's), else the last copy's."""
    T, P, last = HIGH - 1, HIGH - 2, blocks - 1
    tag = plan.runs[i][0]
    all_blocks = plan.every.get(i, {})
    for e in range(start, start + n):
        serial, nbytes = events[e]
        where = plan.pos.get(serial)
        if where is not None and where[0] == P and nbytes < 0 and \
                all_blocks.get(where[1:]) == DOWN_THEN_LAST:
            # the copies but the last, down, and block T (now an inner block) before block P's
            run, m = where[1:]
            mine = plan.template[run][0] + m
            ks = list(range(last - 1, HIGH - 1, -1))
            sl = slot[where[1:]]
            out += [Event(base + (k - HIGH) * A + sl, nbytes) for k in ks]
            out.append(Event(events[mine].serial, nbytes))
            if src is not None:
                t_free = _free_of(events, start, n, events[mine].serial)
                src.extend((t_free, k) for k in ks)
                src.append((t_free, -1))
        if nbytes >= 0 or where is None or where[0] != T or \
                (tag != -1 and where[1:] not in all_blocks):
            out.append(Event(serial, nbytes))
            if src is not None:
                src.append((e, -1))
            continue
        sl = slot[where[1:]]
        order = all_blocks.get(where[1:])
        if order == UP or order == DOWN:   # every block's, freed here: the copies' too
            mine = [Event(base + (k - HIGH) * A + sl, nbytes) for k in range(HIGH, blocks)]
            ks = list(range(HIGH, blocks))
            if order == UP:
                out += [Event(serial, nbytes)] + mine
                ks = [-1] + ks
            else:
                out += mine[::-1] + [Event(serial, nbytes)]
                ks = ks[::-1] + [-1]
            if src is not None:
                src.extend((e, k) for k in ks)
        else:   # the last block's (the head reads it; DOWN_THEN_LAST: after the others'): the
            # last copy's
            out.append(Event(base + (last - HIGH) * A + sl, nbytes))
            if src is not None:
                src.append((e, last))


def _free_of(events, start: int, n: int, serial: int) -> int:
    """The index of the free of `serial` in the run at `start` (`n` events)."""
    return next(e for e in range(start, start + n)
                if events[e].serial == serial and events[e].nbytes < 0)


def _slots(events, template: dict) -> tuple[dict[tuple[int, int], int], int]:
    """({(template run, position): slot} for the template's allocations in order, the serial
    after the last)."""
    slot: dict[tuple[int, int], int] = {}
    for i, (start, n, _a) in template.items():
        for m in range(n):
            if events[start + m].nbytes >= 0:
                slot[(i, m)] = len(slot)
    return slot, max((s for s, _n in events), default=0) + 1


UP, DOWN, DOWN_THEN_LAST = "up", "down", "down, then the last"


def _freed_by_all(events, start: int, n: int, pos: dict, T: int, P: int, born: dict,
                  in_block: bool = False) -> dict[tuple[int, int], str] | None:
    """Allocations of the template's runs that a run outside the stack frees in every block:
    {(run, position): the order}, where block P's and block T's are both freed here; None where
    block P's is freed without block T's. The order: UP (block P's, then T's: cyclic garbage
    collected at a phase's end), DOWN (T's, then P's), or DOWN_THEN_LAST: block P's, then the
    earlier blocks' down to block 0, and block T's after them (a tuple of every block's output
    dropped: CPython frees a tuple's items from its end, and the last block's outlives it as
    the head's input; DeBERTa). `in_block`: the run is an earlier block's, which may free block
    P's alone (its next block's: `Recipe.FREE_NEXT`); only where it frees block T's too is it
    every block's (DeBERTa's shared relative embeddings: each block's share of their gradient
    freed once block 0's backward has summed them)."""
    at: dict[tuple, dict[int, int]] = {}
    for e in range(start, start + n):
        serial, nbytes = events[e]
        where = pos.get(serial)
        if nbytes < 0 and where is not None:
            at.setdefault(where[1:], {})[where[0]] = e
    out = {}
    for key, blocks_at in at.items():
        if in_block and T not in blocks_at:
            continue
        if P in blocks_at:
            if T not in blocks_at:
                return None
            p, t = blocks_at[P], blocks_at[T]
            earlier = [born[events[e].serial] for e in range(p + 1, t)
                       if events[e].nbytes < 0 and 0 <= born.get(events[e].serial, -1) < P]
            if p > t:
                out[key] = DOWN
            elif not earlier:
                out[key] = UP
            elif earlier == list(range(P - 1, -1, -1)):
                out[key] = DOWN_THEN_LAST
            else:
                return None
    return out


def _runs(tags: list[int]) -> list[tuple[int, int, int]]:
    """Maximal runs of equal tags: (tag, start, length)."""
    runs, start = [], 0
    for i in range(1, len(tags) + 1):
        if i == len(tags) or tags[i] != tags[start]:
            runs.append((tags[start], start, i - start))
            start = i
    return runs


def _merge_lagging_frees(runs, events):
    """`runs` with each run of frees alone between two runs of one other block taken into them.

    An optimizer that updates parameter by parameter (torch's loop without foreach, MPS) frees a
    parameter's temporary when Python rebinds its name in the next parameter's update: the last
    temporary of block k-1 is freed inside block k's run, splitting it (k, k-1, k); the last
    block's is freed inside the head's. That free is the block running's: taken into it, it
    frees the previous block's allocation (`Recipe.FREE_PREV`) or, in the head's run, the last
    copy's, as the whole stack's step frees it. Tried only where the runs as tagged do not
    repeat (`_repeat_plan`), so what repeated before repeats as before. Where no parameter
    follows the stack's (LoRA adapters only in the blocks), the last block's temporary is freed
    as the loop ends, after its run and tagged its own: that free, one event more than the run
    of the block before, is split off as the head's."""
    out = list(runs)
    i = 1
    while i < len(out) - 1:
        (a, sa, na), (b, sb, nb), (c, _sc, nc) = out[i - 1], out[i], out[i + 1]
        if a == c != b and all(events[sb + m].nbytes < 0 for m in range(nb)):
            out[i - 1:i + 2] = [(a, sa, na + nb + nc)]
        else:
            i += 1
    for i in range(len(out) - 1, 0, -1):
        (p, sp, np_), (t, st, nt) = out[i - 1], out[i]
        if t >= 0 and p == t - 1 and nt == np_ + 1 and events[st + np_].nbytes < 0 and \
                all(events[st + m].nbytes == events[sp + m].nbytes for m in range(np_)):
            out[i:i + 1] = [(t, st, np_), (-1, st + np_, 1)]
    return out


def _outputs_freed_late(runs, events):
    """`runs` with each block's output freed after the next block has run taken into that next
    block's run. Where the blocks save nothing of their input for the backward (a frozen base
    whose linear layers keep no activation: torchao's NF4 weights under LoRA), block k-1's
    output lives until block k returns, and is freed between block k's run and block k+1's
    (tagged -1: no block is running), or at the start of the head's run after the last block.
    Taken into block k's run, it frees the previous block's allocation (`Recipe.FREE_PREV`), as
    each copy frees the copy's before it. Tried only where the runs as tagged do not repeat
    (`_repeat_plan`), so what repeated before repeats as before."""
    return _first_free_taken_back(runs, events, lambda k, g, of: g == -1 and of == k - 1)


def _gradients_freed_late(runs, events):
    """`runs` with the free that opens a block's backward run taken into the run before it,
    where it frees an allocation of that run's block. A stack whose blocks allocate between
    their hooks (BERT's layers: the head's gradient and each block's are made outside any
    block's hook) frees block k's last gradient once block k-1's backward has begun: the first
    event of block k-1's run frees block k's allocation, and the last block's is freed by the
    head before that block's run, so block T's run is one event shorter than block P's. Taken
    back into block k's run, each block's run ends by freeing its own allocation
    (`Recipe.FREE_OWN`), the events keep their order and each copy frees its own. Tried only
    where the runs as tagged and the other regroupings do not repeat (`_repeat_plan`)."""
    return _first_free_taken_back(runs, events, lambda k, g, of: g == k - 1 and of == k)


def _first_free_taken_back(runs, events, takes) -> list[tuple[int, int, int]]:
    """`runs` with the first event of a run taken into the run of block k >= 1 before it,
    where that event is a free and `takes(k, the run's tag, the block whose allocation it
    frees or None)`."""
    born = _born(runs, events)
    out = list(runs)
    for i in range(len(out) - 1):
        (k, sk, nk), (g, sg, ng) = out[i], out[i + 1]
        if k >= 1 and ng >= 1 and events[sg].nbytes < 0 and \
                takes(k, g, born.get(events[sg].serial)):
            out[i], out[i + 1] = (k, sk, nk + 1), (g, sg + 1, ng - 1)
    return [r for r in out if r[2] > 0]


def _born(runs, events) -> dict[int, int]:
    """{serial: the block it was allocated in} of the allocations in the blocks' runs."""
    return {serial: tag for tag, start, n in runs if tag >= 0
            for serial, nbytes in events[start:start + n] if nbytes > 0}


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


# what `_repeat_plan` tries, in order, where the runs as tagged do not repeat: each regrouping
# alone, then two, then all three, applied one after the other (each reads its own phase: the
# optimizer's loop, the forward, the backward; a LoRA'd BERT frees outputs late in its forward
# and gradients late in its backward, and on MPS also lags in its optimizer loop)
REGROUPS = tuple(c for n in (1, 2, 3) for c in itertools.combinations(
    (_merge_lagging_frees, _outputs_freed_late, _gradients_freed_late), n))

_LOGS: dict[tuple, tuple] = {}


def whole_log(hi, blocks: int) -> list | None:
    """The memory log (log.py) of the step with `blocks` blocks in its stack, from the
    HIGH-block trace `hi`'s: its events repeated as `whole_events` repeats them, each with its
    log entry (category and phase as the template's), and the entries between events (a tensor's
    category changed, the peaks reset) kept where they were. A category change right after an
    event of the template's (a gradient made, a weight cast) follows each copy of it, on the
    copy's tensor; one elsewhere of a template's tensor (the optimizer states tagged after the
    first step) changes the copies' too; the peaks' reset after a template event (the warm-up's
    last gradient freed) comes after its last copy. None where the events do not repeat, or a
    change inside the template names a tensor the copies have no counterpart of.

    Made once per log structure (TraceLog.structure): what is repeated where depends on the
    order of the events, their blocks and the tensors they name, not on their sizes, and the
    traces of one step at other micro-batches share all of that; each gets the first one's whole
    log with its own sizes."""
    key = (hi.log.structure, blocks)
    hit = _LOGS.get(key)
    if hit is None:
        if len(_LOGS) > 64:            # it keeps each log alive: bounded
            _LOGS.clear()
        hit = _LOGS[key] = _whole_log(hi.log, blocks) or (None, None)
        return hit[0]
    log, sources = hit
    if log is None:
        return None
    size = {e.serial: e.nbytes for e in hi.log.memory if type(e) is Alloc}
    return [e if s is None else Alloc(e.serial, size[s], e.category, e.phase)
            for e, s in zip(log, sources)]


def _whole_log(hl: TraceLog, blocks: int) -> tuple[list, list[int | None]] | None:
    """(`whole_log`, for each of its entries the serial in `hl` that an allocation copies,
    else None), or None."""
    plan = plan_of(hl)
    if plan is None or blocks <= HIGH:
        return None
    src: list[tuple[int, int]] = []
    events = _emit(hl.events, plan, blocks, src)
    entry, after = hl.by_event
    if len(entry) != len(hl.events):
        return None
    T = HIGH - 1
    slot, base = _slots(hl.events, plan.template)
    A = len(slot)
    in_template = {start + m for start, n, _a in plan.template.values() for m in range(n)}

    def copy_of(serial: int, k: int) -> int | None:
        where = plan.pos.get(serial)
        if where is None or where[0] != T:
            return None
        return base + (k - HIGH) * A + slot[where[1:]]

    last_at = {e: j for j, (e, _k) in enumerate(src)}
    out: list = list(after.get(-1, ()))
    alive: set[int] = set()
    copied: dict[int, int] = {}          # index in `out` of an allocation -> serial it copies
    for j, ((serial, nbytes), (e, k)) in enumerate(zip(events, src)):
        ent = entry[e]
        if type(ent) is Alloc:
            copied[len(out)] = ent.serial
            out.append(Alloc(serial, ent.nbytes, ent.category, ent.phase))
            alive.add(serial)
        elif serial in alive:
            out.append(Free(serial))
            alive.discard(serial)
        elif nbytes:
            return None
        # else: a free of nothing (`_emit` cannot tell an empty free from an empty allocation)
        extra = after.get(e)
        if not extra:
            continue
        if e in in_template:                 # follows each copy, on the copy's tensor
            for x in extra:
                if type(x) is not Retag:     # the peaks reset: once, after the last copy
                    if last_at[e] == j:
                        out.append(x)
                    continue
                if k == -1:
                    out.append(x)
                    continue
                c = copy_of(x.serial, k)
                if c is None:
                    return None
                out.append(Retag(c, x.category))
        elif last_at[e] == j:                # once, where it was; the copies' tensors too
            for x in extra:
                out.append(x)
                if type(x) is Retag and copy_of(x.serial, HIGH) is not None:
                    out.extend(Retag(copy_of(x.serial, k), x.category)
                               for k in range(HIGH, blocks))
    return out, [copied.get(j) for j in range(len(out))]
