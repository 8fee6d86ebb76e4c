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
  block's (cyclic garbage at a phase's end: repeat.py `_freed_by_all`) frees all (with block
  P's, all but the last, where the blocks are freed down and the last after them), and a
  category change outside the stack moves all.

Every total is then a + b x r over the r = L - HIGH copies, so one pass reads several depths at
once (one block more and the whole stack, for stitch.py), each kept on the log (`peaks_memo`).

`whole_peaks` gives what `replay_log(whole_log(hi, L))` gives, phase by phase and category by
category (tests/test_depth.py compares the two on every stitched case), or None where the log has
what it does not read (a peak reset inside a template run, a category change of another block's
tensor in one): the caller then replays the whole log.
"""
from __future__ import annotations

from ..log import CATEGORIES, Alloc, PhasePeaks, Reset, Retag, TraceLog
from ..stack import HIGH
from .repeat import DOWN_THEN_LAST, Plan, plan_of


def whole_peaks(hl: TraceLog, blocks: int, also: tuple[int, ...] = ()) -> PhasePeaks | None:
    """Each phase's peak and its split by category over the stack of `blocks` blocks, from the
    HIGH-block trace's log `hl` (module docstring), or None. `also`: other stack depths to read
    in the same pass (one block more and the whole stack: stitch.py), kept on the log for the
    next ask."""
    memo = hl.peaks_memo
    todo = sorted({blocks, *also} - memo.keys())
    if todo:
        found = _read(hl, [b for b in todo if b > HIGH])
        for b in todo:
            memo[b] = found.get(b)
    return memo[blocks]


def _read(hl: TraceLog, depths: list[int]) -> dict[int, PhasePeaks]:
    """{depth: its peaks} for each of `depths`, or {} where the log is not read here."""
    plan = plan_of(hl)
    if plan is None or not depths:
        return {}
    base, sizes = hl.resized or (hl, None)     # an interpolated log: its anchor's, resized
    sizes = sizes() if callable(sizes) else sizes    # (interpolate.py: made where read)
    entry, after = base.by_event
    if len(entry) != len(base.events):
        return {}
    state = _State([b - HIGH for b in depths], sizes)
    if not state.between(after.get(-1, ()), plan):
        return {}
    for i, (_tag, start, n) in enumerate(plan.runs):
        ok = state.template(plan, i, entry, after) if i in plan.template else \
            state.outside(plan, i, start, n, entry, after)
        if not ok:
            return {}
    return {b: {ph: (v[0], {c: int(v[1].get(c, 0)) for c in CATEGORIES})
                for ph, v in peaks.items()} for b, peaks in zip(depths, state.peaks)}


class _State:
    """The replay's live total, by category and by tensor, over the cut log, for stacks of
    HIGH + r blocks (`rs`) at once. A total is a + b x r: `live`/`cats` hold a, `slope`/`cslope`
    b (what each copy adds); each template tensor stands for itself and `extra[serial]` = (a, b)
    alike copies (r of them as its run ends)."""

    def __init__(self, rs: list[int], sizes: dict[int, int] | None = None):
        self.rs = rs
        self.sizes = sizes or {}        # serial -> bytes where the log is read resized
        self.live = self.slope = 0
        self.cats = dict.fromkeys(CATEGORIES, 0)
        self.cslope = dict.fromkeys(CATEGORIES, 0)
        self.held: dict[int, list] = {}            # serial -> [bytes, category]
        self.extra: dict[int, tuple[int, int]] = {}
        self.peaks: list[PhasePeaks] = [{} for _ in rs]

    def _free(self, serial: int, copies: tuple[int, int] = (0, 0)) -> bool:
        rec = self.held.pop(serial, None)
        if rec is None:
            return False
        n, cat = rec
        self.live -= n * (1 + copies[0])
        self.cats[cat] -= n * (1 + copies[0])
        if copies[1]:
            self.slope -= n * copies[1]
            self.cslope[cat] -= n * copies[1]
        return True

    def _retag(self, x: Retag, copies: tuple[int, int] = (0, 0)) -> None:
        rec = self.held.get(x.serial)
        if rec is None:
            return
        n, old = rec
        cats, cslope = self.cats, self.cslope
        cats[old] -= n * (1 + copies[0])
        cats[x.category] = cats.get(x.category, 0) + n * (1 + copies[0])
        if copies[1]:
            cslope[old] -= n * copies[1]
            cslope[x.category] = cslope.get(x.category, 0) + n * copies[1]
        rec[1] = x.category

    def _at(self, r: int, cats: dict, cslope: dict) -> dict:
        if not r or not any(cslope.values()):
            return dict(cats)
        return {c: v + cslope.get(c, 0) * r for c, v in cats.items()}

    def between(self, entries, plan: Plan) -> bool:
        """Category changes and peak resets between events, outside any template run."""
        for x in entries:
            if type(x) is Reset:
                for p in self.peaks:
                    p.clear()
                continue
            copies = self.extra.get(x.serial, (0, 0)) if _template(plan, x.serial) else (0, 0)
            if copies != (0, 0) and x.serial not in self.held:
                return False          # copies live, the template's own freed: not read here
            self._retag(x, copies)
        return True

    def outside(self, plan: Plan, i: int, start: int, n: int, entry, after) -> bool:
        """A run outside the template's, as traced; a free of a template tensor frees the last
        copy's, or every copy's where every block's is freed here (module docstring)."""
        every = plan.every.get(i, {})
        held, cats, pos, T = self.held, self.cats, plan.pos, HIGH - 1
        ks, sizes = list(zip(self.rs, self.peaks)), self.sizes
        for e in range(start, start + n):
            ent = entry[e]
            if type(ent) is Alloc:         # inline: most of the events
                serial, nbytes, cat, phase = ent
                nbytes = sizes.get(serial, nbytes)
                held[serial] = [nbytes, cat]
                self.live += nbytes
                cats[cat] = cats.get(cat, 0) + nbytes
                for r, peaks in ks:
                    v = self.live + self.slope * r
                    if v > peaks.get(phase, (-1,))[0]:
                        peaks[phase] = (v, self._at(r, cats, self.cslope))
            else:
                where = pos.get(ent.serial)
                copies = (0, 0)
                if where is not None and where[0] == T and where[1:] in every:
                    copies = self.extra.pop(ent.serial, (0, 0))
                elif where is not None and where[0] == T - 1 and \
                        every.get(where[1:]) == DOWN_THEN_LAST:
                    # block T's and the copies' but the last go with block P's (repeat.py)
                    mine = entry[plan.template[where[1]][0] + where[2]].serial
                    a, b = self.extra.pop(mine, (0, 0))
                    rec = self.held.get(mine)
                    if rec is None or not self._free(mine, (a - 1, b)):
                        return False
                    self.held[mine] = rec
                if not self._free(ent.serial, copies):
                    return False
            if e in after and not self.between(after[e], plan):
                return False
        return True

    def template(self, plan: Plan, i: int, entry, after) -> bool:
        """A template run and its copies (module docstring): one pass over the template's
        events; the r copies repeat its change (`delta`), so the stack's largest point in the
        stretch is the pass's largest at the last copy where delta > 0, else at the template."""
        start, n, _ascending = plan.template[i]
        live0, cats0 = self.live, dict(self.cats)
        best: dict[str, tuple[int, dict]] = {}
        made, taken = [], []          # template serials allocated; (slot serial) copies free
        reset = False
        for m in range(n):
            e = start + m
            ent = entry[e]
            if type(ent) is Alloc:
                nbytes = self.sizes.get(ent.serial, ent.nbytes)
                self.held[ent.serial] = [nbytes, ent.category]
                self.live += nbytes
                self.cats[ent.category] = self.cats.get(ent.category, 0) + nbytes
                made.append(ent.serial)
                rel = self.live - live0
                if rel > best.get(ent.phase, (-1,))[0]:
                    best[ent.phase] = (rel, {c: v - cats0.get(c, 0)
                                             for c, v in self.cats.items()})
            else:
                if not self._free(ent.serial):
                    return False
                if (i, m) in plan.relation:   # (an empty free is none: repeat.py `_emit`)
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
        dcat = {c: v - cats0.get(c, 0) for c, v in self.cats.items()}
        for r, peaks in zip(self.rs, self.peaks):
            j = r if delta > 0 else 0
            base = live0 + self.slope * r + j * delta
            for phase, (rel, rcat) in best.items():
                if base + rel > peaks.get(phase, (-1,))[0]:
                    peaks[phase] = (base + rel, {
                        c: cats0.get(c, 0) + self.cslope.get(c, 0) * r + j * dcat.get(c, 0)
                        + rcat.get(c, 0) for c in self.cats})
        # after the stretch: the template's change once more per copy
        self.live, self.slope = live0 + delta, self.slope + delta
        self.cats = {c: cats0.get(c, 0) + dcat.get(c, 0) for c in self.cats}
        self.cslope = {c: self.cslope.get(c, 0) + dcat.get(c, 0) for c in self.cats}
        if reset:
            for p in self.peaks:
                p.clear()
        for s in made:
            a, b = self.extra.get(s, (0, 0))
            self.extra[s] = (a, b + 1)
        for s in taken:
            a, b = self.extra.get(s, (0, 0))
            self.extra[s] = (a, b - 1)
        return all(self.extra[s][0] + self.extra[s][1] * r >= 0 for s in taken for r in self.rs)


def _template(plan: Plan, serial: int) -> bool:
    """Whether `serial` is one of the template block's allocations."""
    where = plan.pos.get(serial)
    return where is not None and where[0] == HIGH - 1
