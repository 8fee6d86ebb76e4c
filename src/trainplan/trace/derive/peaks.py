"""Each phase's peak over a whole stack, read off a cut trace's memory log without writing the
whole stack's.

repeat.py `whole_log` writes the memory log of the step with all L blocks (the cut trace's
template block repeated), and log.py `replay_log` replays it: exact, and for an 80-block model
tens of thousands of entries per micro-batch a plan asks about. What the replay finds follows
from the cut log alone, because the copies of a template run repeat it event for event:

* a template run (block T's events in one stretch: repeat.py) and its copies are R = L - HIGH + 1
  repetitions of the same sizes and categories, each starting where the one before left the live
  total, so repetition j runs at  start + j x delta + prefix(m),  delta the run's net change and
  prefix(m) the live total after its m-th event less the start. A phase's largest point in the
  stretch is the run's largest prefix at the last repetition where delta > 0, else at the first
  (the replay keeps the first of equal peaks); by category likewise;
* the tensors the copies leave live are counted with the template's own (`extra`): a later free
  of the template's tensor outside the stack frees one of them (the last copy's), a free of every
  block's (cyclic garbage at a phase's end: repeat.py `_freed_by_all`) frees all, and a category
  change outside the stack moves all.

`whole_peaks` gives what `replay_log(whole_log(hi, L))` gives, phase by phase and category by
category (tests/test_depth.py compares the two on every stitched case), or None where the log has
what it does not read (a peak reset inside a template run, a category change of another block's
tensor in one): the caller then replays the whole log.
"""
from __future__ import annotations

from ..log import CATEGORIES, Alloc, PhasePeaks, Reset, Retag, TraceLog
from ..stack import HIGH
from .repeat import Plan, plan_of


def whole_peaks(hl: TraceLog, blocks: int) -> PhasePeaks | None:
    """Each phase's peak and its split by category over the stack of `blocks` blocks, from the
    HIGH-block trace's log `hl` (module docstring), or None."""
    plan = plan_of(hl)
    if plan is None or blocks <= HIGH:
        return None
    entry, after = hl.by_event
    if len(entry) != len(hl.events):
        return None
    state = _State(blocks - HIGH + 1)
    if not state.between(after.get(-1, ()), plan):
        return None
    for i, (_tag, start, n) in enumerate(plan.runs):
        ok = state.template(plan, i, entry, after) if i in plan.template else \
            state.outside(plan, i, start, n, entry, after)
        if not ok:
            return None
    return {ph: (v[0], {c: int(v[1].get(c, 0)) for c in CATEGORIES})
            for ph, v in state.peaks.items()}


class _State:
    """The replay's live total, by category and by tensor, over the cut log: each template
    tensor stands for itself and `extra[serial]` alike copies."""

    def __init__(self, reps: int):
        self.reps = reps
        self.live = 0
        self.by_cat = dict.fromkeys(CATEGORIES, 0)
        self.held: dict[int, list] = {}       # serial -> [bytes, category]
        self.extra: dict[int, int] = {}       # template serial -> copies of it live
        self.peaks: PhasePeaks = {}

    def _alloc(self, ent: Alloc) -> None:
        self.held[ent.serial] = [ent.nbytes, ent.category]
        self.live += ent.nbytes
        self.by_cat[ent.category] = self.by_cat.get(ent.category, 0) + ent.nbytes

    def _free(self, serial: int, copies: int = 0) -> bool:
        rec = self.held.pop(serial, None)
        if rec is None:
            return False
        self.live -= rec[0] * (1 + copies)
        self.by_cat[rec[1]] -= rec[0] * (1 + copies)
        return True

    def _retag(self, x: Retag, copies: int = 0) -> None:
        rec = self.held.get(x.serial)
        if rec is None:
            return
        moved = rec[0] * (1 + copies)
        self.by_cat[rec[1]] -= moved
        self.by_cat[x.category] = self.by_cat.get(x.category, 0) + moved
        rec[1] = x.category

    def _peak(self, phase: str, total: int, cats: dict) -> None:
        if total > self.peaks.get(phase, (-1,))[0]:
            self.peaks[phase] = (total, dict(cats))

    def between(self, entries, plan: Plan) -> bool:
        """Category changes and peak resets between events, outside any template run."""
        for x in entries:
            if type(x) is Reset:
                self.peaks.clear()
                continue
            copies = self.extra.get(x.serial, 0) if _template(plan, x.serial) else 0
            if copies and x.serial not in self.held:
                return False          # copies live, the template's own freed: not read here
            self._retag(x, copies)
        return True

    def outside(self, plan: Plan, i: int, start: int, n: int, entry, after) -> bool:
        """A run outside the template's, as traced; a free of a template tensor frees the last
        copy's, or every copy's where every block's is freed here (module docstring)."""
        every = plan.every.get(i, {})
        held, by_cat, peaks, pos, T = self.held, self.by_cat, self.peaks, plan.pos, HIGH - 1
        for e in range(start, start + n):
            ent = entry[e]
            if type(ent) is Alloc:         # `_alloc` and `_peak`, inline: most of the events
                serial, nbytes, cat, phase = ent
                held[serial] = [nbytes, cat]
                self.live += nbytes
                by_cat[cat] = by_cat.get(cat, 0) + nbytes
                if self.live > peaks.get(phase, (-1,))[0]:
                    peaks[phase] = (self.live, dict(by_cat))
            else:
                where = pos.get(ent.serial)
                copies = 0
                if where is not None and where[0] == T and where[1:] in every:
                    copies = self.extra.pop(ent.serial, 0)
                if not self._free(ent.serial, copies):
                    return False
            if e in after and not self.between(after[e], plan):
                return False
        return True

    def template(self, plan: Plan, i: int, entry, after) -> bool:
        """A template run and its copies (module docstring)."""
        start, n, _ascending = plan.template[i]
        live0, cats0 = self.live, dict(self.by_cat)
        best: dict[str, tuple[int, dict]] = {}
        made, taken = [], []          # template serials allocated; (slot serial) copies free
        reset = False
        for m in range(n):
            e = start + m
            ent = entry[e]
            if type(ent) is Alloc:
                self._alloc(ent)
                made.append(ent.serial)
                rel = self.live - live0
                if rel > best.get(ent.phase, (-1,))[0]:
                    best[ent.phase] = (rel, {c: v - cats0.get(c, 0)
                                             for c, v in self.by_cat.items()})
            else:
                rec = self.held.get(ent.serial)
                if rec is None or not self._free(ent.serial):
                    return False
                if rec[0]:       # (an empty free is no event of the plan's: repeat.py `_emit`)
                    _kind, run, pos = plan.relation[(i, m)][:3]
                    taken.append(entry[plan.template[run][0] + pos].serial)
            for x in after.get(e, ()):
                if type(x) is Reset and m == n - 1:
                    reset = True      # after the last copy (repeat.py `whole_log`)
                elif type(x) is not Retag or not _template(plan, x.serial) or reset:
                    return False
                else:
                    self._retag(x)
        delta = self.live - live0
        dcat = {c: v - cats0.get(c, 0) for c, v in self.by_cat.items()}
        j = self.reps - 1 if delta > 0 else 0
        for phase, (rel, rcat) in best.items():
            self._peak(phase, live0 + j * delta + rel,
                       {c: cats0.get(c, 0) + j * dcat.get(c, 0) + rcat.get(c, 0)
                        for c in self.by_cat})
        self.live = live0 + self.reps * delta
        self.by_cat = {c: cats0.get(c, 0) + self.reps * dcat.get(c, 0) for c in self.by_cat}
        if reset:
            self.peaks.clear()
        for s in made:
            self.extra[s] = self.extra.get(s, 0) + self.reps - 1
        for s in taken:
            self.extra[s] = self.extra.get(s, 0) - (self.reps - 1)
        return all(v >= 0 for v in self.extra.values())


def _template(plan: Plan, serial: int) -> bool:
    """Whether `serial` is one of the template block's allocations."""
    where = plan.pos.get(serial)
    return where is not None and where[0] == HIGH - 1
