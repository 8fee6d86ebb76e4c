"""Making many traces at once, on all cores (trace/parallel.py): what a round of `in_rounds`
asks for, or what an evaluation will read (`prefetch`).

Each request is made in its canonical form (twins.py `canonical`): a request the cache already
holds, or reads off the disk store, is not traced. A flash request whose memory-efficient twin
is asked for too waits for it and is made only where that one took flash calls (the two are the
same step otherwise: twins.py `attention_twin`); a core that would sit idle makes it anyway. A
math request waits the same way, made only where its twin made attention calls.
Of requests that differ only in their optimizer's update (8-bit AdamW beside AdamW, an MPS
platform's per-parameter loop beside CUDA's multi-tensor step), one is traced and the others
read off it (`_alike`, cache.py `_swapped`), their updates made beside the traces.
"""
from __future__ import annotations

from dataclasses import replace

from ...optimizer import ADAMW, traced_as
from .. import store
from ..facts import Trace
from ..parallel import IDLE, RUN, SKIP, WAIT, Forward, trace_all
from ..stack import HIGH
from .anchoring import describe, describe_forward, describe_update, trace_job
from .cache import PENDING, TRACED_OPTIMIZERS, TraceCache, variant
from .replays import prepare
from .rounds import Deferred
from .twins import as_semantics, attention_twin, canonical, same_under


class Scheduling(TraceCache):
    """The trace cache's parallel side (module docstring). `_cuts(job, sem)` (traces.py) says
    whether a job's traces are cut."""

    def _cuts(self, job, sem) -> bool:
        raise NotImplementedError

    def prefetch(self, requests: list[tuple], forwards: list[tuple] = ()) -> None:
        """Trace each (job, semantics, batch) not yet traced, in parallel where cores allow;
        a cut model's cut trace; with the generation `forwards` (rounds.asked). A failure is
        left for `exact` to raise when it is asked for. While deferring, the requests are
        recorded instead."""
        todo = []
        for job, sem, batch in requests:
            job, sem = canonical(job, sem)
            todo.append((job, sem, batch, HIGH if self._cuts(job, sem) else None))
        if self.deferring is not None:
            # not held, and not failed in a worker: a failed one is asked of `exact`, which
            # traces it here and raises its error (deferring on it again would ask it forever)
            missing, pending = [], False
            for r in todo:
                if self._held(*r) or self._key(r[0], r[1], r[3]) + (r[2],) in self._failed:
                    continue
                made = self._swapped(*r)     # read off another optimizer's step (cache.py)
                if made is PENDING:
                    pending = True
                elif made is None:
                    missing.append(r)
            if missing or pending:
                self.deferring.extend(missing)
                raise Deferred
            return
        self.fill(todo, at_least=2, forwards=forwards)

    def fill(self, requests: list[tuple], at_least: int = 1, forwards: list[tuple] = ()) -> None:
        """Trace each (job, semantics, batch, depth) not yet traced, at once on all cores, when
        there are `at_least` of them, and each generation forward (key, `Forward`, keep) of
        `rounds.defer_forward`; flash requests wait for their twins (module docstring)."""
        todo, seen = [], set()
        for job, sem, batch, depth in requests:
            key = self._key(job, sem, depth) + (batch,)
            if key not in self._exact and key not in seen and key not in self._failed:
                seen.add(key)
                todo.append((key, trace_job(job), sem, batch, depth))
        fwd = list({key: (request, keep) for key, request, keep in forwards}.values())
        if len(todo) + len(fwd) < at_least:
            return
        todo = [r for r in todo if not self._held(*r[1:])
                and self._swapped(*r[1:], ask=False) is None]
        todo, swaps = self._alike(todo)
        updates = (self._part_request(tj, sem, depth) for _k, tj, sem, _b, depth in swaps)
        fwd += {key: (request, keep) for key, request, keep in updates
                if key not in self._parts}.values()
        if not todo and not fwd:
            return
        first, then, parked = self._pairs(todo)
        steps = len(first)
        requests = [r[1:] for r in first] + [request for request, _keep in fwd]
        followups = [then[i][1:] if i in then else None for i in range(steps)] + [None] * len(fwd)

        def policy(i, done, result):
            if i >= steps:
                return SKIP
            if done:
                self._learn(first[i][1], first[i][2], result)
                if i not in then:
                    return SKIP
                return SKIP if isinstance(result, Trace) and same_under(result, then[i][2]) \
                    else RUN
            hint = self._hint(then[i][1], then[i][2])
            return RUN if hint else WAIT if hint is False else IDLE

        def started(kind, i):
            if not self._progress:
                return
            if i >= steps:
                f = fwd[i - steps][0]
                self._progress(describe_forward(f.job, f.sem, f.batch, f.new_tokens, f.context)
                               if isinstance(f, Forward) else describe_update(f.job))
                return
            _key, tj, sem, batch, _d = first[i] if kind == "r" else then[i]
            self._progress(describe(tj, sem, batch))

        out = trace_all(requests, followups, policy, started, finish=prepare)
        results, more = out if then else (out, [None] * len(requests))
        for (_request, keep), tr in zip(fwd, results[steps:]):
            keep(tr)
        for i, ((key, tj, sem, _b, _d), tr) in enumerate(zip(first, results)):
            self._keep(key, tj, sem, tr, True)
            if i in then:
                fkey, ftj, fsem = then[i][:3]
                if more[i] is not None or not isinstance(tr, Trace):
                    self._keep(fkey, ftj, fsem, more[i], True)
                else:                     # the same step (policy: not made)
                    self._keep(fkey, ftj, fsem, as_semantics(tr, fsem), False)
        left = [r for r in swaps if self._swapped(*r[1:], ask=False) is None]
        left += [r for r in parked if not self._held(*r[1:])]
        if left:                          # not read off after all: traced
            self.fill([(tj, sem, batch, depth) for _k, tj, sem, batch, depth in left])

    def _alike(self, todo: list[tuple]) -> tuple[list[tuple], list[tuple]]:
        """(the requests to trace, those to read off one of them: cache.py `_swapped`): of
        requests that differ only in their update (the optimizer, torch.optim's multi-tensor
        step or its per-parameter loop), the one with AdamW's multi-tensor step, else the first
        optimizer of optimizer.py's, is traced, and the rest read off it once it is made, each
        with its optimizer's update made beside the traces."""
        groups: dict[tuple, list[tuple]] = {}
        for r in todo:
            _key, tj, sem, batch, depth = r
            groups.setdefault((variant(tj.with_(optimizer=ADAMW)),
                               replace(sem, optimizer_foreach=True).key(), depth, batch),
                              []).append(r)
        traced, swaps = [], []
        for alike in groups.values():
            alike.sort(key=lambda r: (TRACED_OPTIMIZERS.index(traced_as(r[1].optimizer)),
                                      not r[2].optimizer_foreach))
            traced.append(alike[0])
            swaps += alike[1:]
        order = {id(r): n for n, r in enumerate(todo)}
        return sorted(traced, key=lambda r: order[id(r)]), swaps

    def _pairs(self, todo: list[tuple]) -> tuple[list[tuple], dict[int, tuple], list[tuple]]:
        """(requests, {i: the flash or math request that waits for request i}, math requests
        read off their twins after the round): a flash or math request whose memory-efficient
        twin is also asked for, or, where this model's traces have not taken flash (made no
        attention call, for math: `_hint`), whose twin is added to be traced first unless it is
        held already (the hint is the model's at this precision: a held twin that is not the
        same step is not traced again). One request waits for each twin: a math request whose
        twin a flash one waits for already is read off it after the round where the model's
        traces made no attention call, else traced in the round."""
        index = {(key[0], key[1], key[2], key[3]): n for n, (key, *_r) in enumerate(todo)}
        waiting: dict[int, int | None] = {}
        followed: set[int] = set()
        parked: list[tuple] = []
        for n, (key, tj, sem, batch, depth) in enumerate(todo):
            if sem.attention not in ("flash", "math"):
                continue
            m = index.get((key[0], attention_twin(sem).key(), key[2], key[3]))
            if m is not None:
                if m not in followed:     # one request waits for each
                    waiting[n] = m
                    followed.add(m)
                elif sem.attention == "math" and self._hint(tj, sem) is False:
                    parked.append(todo[n])
            elif self._hint(tj, sem) is False and \
                    not self._held(tj, attention_twin(sem), batch, depth):
                waiting[n] = None         # (a twin held took flash calls: this one is traced)
        kept = {id(r) for r in parked}
        first = [r for n, r in enumerate(todo) if n not in waiting and id(r) not in kept]
        at = {r[0]: i for i, r in enumerate(first)}     # by request key (keys are unique)
        then = {}
        for n, m in waiting.items():
            key, tj, sem, batch, depth = todo[n]
            if m is None:                 # its twin, traced first
                other = attention_twin(sem)
                tkey = self._key(tj, other, depth) + (batch,)
                if tkey in at:            # added for another request (flash) already: math
                    (parked if sem.attention == "math" else first).append(todo[n])  # reads it
                    continue
                first.append((tkey, tj, other, batch, depth))
                at[tkey] = len(first) - 1
                then[len(first) - 1] = todo[n]
            else:
                then[at[todo[m][0]]] = todo[n]
        return first, then, parked

    def _keep(self, key: tuple, tj, sem, tr, traced: bool) -> None:
        """A trace from `fill` (`traced`: made, not shared): cached, stored on disk, learnt
        from; a failure (or none) recorded as failed."""
        if isinstance(tr, Trace):
            store.save(store.key(tj, sem, key[-1], key[-2]), tr)
            self._store(key[:-1], key[-1], tr, "traced" if traced else None)
            self._learn(tj, sem, tr)
        else:
            self._failed.add(key)
