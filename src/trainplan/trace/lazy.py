"""Lists made on first read: what keeps a warm plan from building every record of every trace.

A plan reads many traces and few of their records. A trace stored on disk (store.py) or sent
back by a tracing worker (parallel.py) holds tens of thousands of op records, allocation events
and memory-log entries; unpickling them was most of a warm plan's time (Llama-3.2-1B over 95
platforms: 229 traces, 12.8 s of 24.3 s in `pickle.loads`, 2026-11-28), although a plan reads
most traces' peaks, fragmentation and op table (fields of their own) and not their lists.
`dumps` pickles every long list as the bytes of its own pickle, which `pickle.loads` turns back
into a `Lazy` list that unpickles them on its first read; a trace interpolated between two
micro-batches (derive/interpolate.py) makes its lists the same way.

A `Lazy` reads like the list it stands for (iteration, len, indexing, comparison, +, *, in);
anything that would change it makes it first. Once made it becomes a `Made`, a list with list's
own methods: a loop indexing it element by element (derive/repeat.py over a stitched trace's
events) cost 2.7 s of a 11.7 s warm chart-rvr plan through `Lazy`'s methods (profiled,
2026-11-28). A copy or a pickle of one is a plain list (or, not yet made, the same bytes
again); json, str.join, tuple, numpy and dataclasses.asdict read it as the list
(tests/test_plan_interpolate.py checks the list operations, copies and pickles).
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import pickle

PACKED = 512          # lists at least this long are pickled on their own (`dumps`)
# the dataclass fields whose lists are packed: a Trace's op records, its log's memory entries,
# events, their blocks and the live-bytes timeline (tens of thousands of records each), and
# its module table (a few hundred rows, read by few: `inspect`, predict/memory.py, the fix
# ladder's frozen-embeddings rung), packed from a shorter length (`PACKED_AT`)
FIELDS = frozenset({"ops", "memory", "events", "blocks", "timeline", "modules"})
PACKED_AT = {"modules": 32}


class Made(list):
    """A `Lazy` once made: a plain list in all but name (its copies and pickles are lists; a
    `Lazy`'s too, made first: `list(self)` reads it)."""

    def copy(self):
        return list(self)

    def __copy__(self):
        return list(self)

    def __deepcopy__(self, memo):
        return copy.deepcopy(list(self), memo)

    def __reduce__(self):
        return (list, (list(self),))

    __hash__ = None


def _made(x):
    return x._full() if isinstance(x, Lazy) else x


class Lazy(Made):
    """A list made by `make()` on first use (module docstring); `blob`, the pickle it is made
    from, where it came from one."""

    def __init__(self, make, blob: bytes | None = None):
        super().__init__()
        self._make, self._blob = make, blob
        if not callable(make):       # Lazy(iterable), as dataclasses.asdict and copy rebuild a
            self._make = None        # list of the same type: made at once
            list.extend(self, make)
            self.__class__ = Made

    def _full(self) -> list:
        if self._make is not None:
            make, self._make, self._blob = self._make, None, None
            list.extend(self, make())
            self.__class__ = Made    # list's own methods from now on: a loop indexing it
        return self                  # element by element (derive/repeat.py) pays nothing more

    def __len__(self):
        return list.__len__(self._full())

    def __iter__(self):
        return list.__iter__(self._full())

    def __reversed__(self):
        return list.__reversed__(self._full())

    def __getitem__(self, i):
        return list.__getitem__(self._full(), i)

    def __contains__(self, x):
        return list.__contains__(self._full(), x)

    def __bool__(self):
        return list.__len__(self._full()) > 0

    def __eq__(self, other):      # another one not made yet is made first: list's own
        return list.__eq__(self._full(), _made(other))   # comparison reads what a list holds

    def __ne__(self, other):
        return list.__ne__(self._full(), _made(other))

    def __add__(self, other):
        return list(self._full()) + other

    def __radd__(self, other):
        return other + list(self._full())

    def __mul__(self, n):
        return list(self._full()) * n

    __rmul__ = __mul__

    def __repr__(self):
        return list.__repr__(self._full())

    def index(self, *a):
        return list.index(self._full(), *a)

    def count(self, x):
        return list.count(self._full(), x)

    def __reduce__(self):
        if self._make is not None and self._blob is not None:
            return (_unpacked, (self._blob,))
        return (list, (list(self._full()),))


def _changes(name: str):
    def method(self, *a, **kw):
        return getattr(list, name)(self._full(), *a, **kw)
    method.__name__ = name
    return method


for _name in ("append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse",
              "__setitem__", "__delitem__", "__iadd__", "__imul__"):
    setattr(Lazy, _name, _changes(_name))


def _unpacked(blob: bytes) -> Lazy:
    return Lazy(lambda: _decode(blob), blob)


def _encode(items: list) -> bytes:
    """The pickle of `items`. A list of named tuples (a memory log's Alloc, Free, Retag...
    entries, its events; a trace's OpRecords) is kept as its classes, each item's class number
    and its fields as a plain tuple: made again by `tuple.__new__` in C, where unpickling each
    named tuple called its Python `__new__` (2.2 million calls, about 2 s of a 5.3 s warm
    chart-rvr plan, profiled 2026-11-28). A list holding one object more than once (a stitched
    trace's block copies, whose identity optable.py reads) is pickled as it is, which keeps it
    one object."""
    if len(set(map(id, items))) != len(items):
        return pickle.dumps(list(items), protocol=pickle.HIGHEST_PROTOCOL)
    classes: dict[type, int] = {}
    kinds = bytearray()
    for x in items:
        c = type(x)
        k = classes.get(c)
        if k is None:
            if not (issubclass(c, tuple) and hasattr(c, "_fields")) or len(classes) == 255:
                return pickle.dumps(list(items), protocol=pickle.HIGHEST_PROTOCOL)
            k = classes[c] = len(classes)
        kinds.append(k)
    rows = [tuple(x) for x in items]
    return pickle.dumps((tuple(classes), bytes(kinds), rows), protocol=pickle.HIGHEST_PROTOCOL)


def _decode(blob: bytes) -> list:
    """`_encode`'s list again."""
    data = pickle.loads(blob)
    if type(data) is list:
        return data
    classes, kinds, rows = data
    if len(classes) == 1:
        return list(map(tuple.__new__, itertools.repeat(classes[0], len(rows)), rows))
    return list(map(tuple.__new__, map(classes.__getitem__, kinds), rows))


class _Pack(list):
    """A long list marked to be pickled as the bytes of its own pickle (`dumps`)."""

    def __reduce__(self):
        return (_unpacked, (_encode(self),))


def _marked(x, depth: int, packed: int = PACKED):
    """`x` with its long lists (`packed` items or more) marked, looking `depth` dataclasses
    deep (a Trace, its log)."""
    if type(x) is Lazy:              # not yet made: pickles as its own bytes again
        return x
    if type(x) is list or type(x) is Made:
        return _Pack(x) if len(x) >= packed else x
    if depth and dataclasses.is_dataclass(x) and not isinstance(x, type):
        changes = {}
        for f in dataclasses.fields(x):
            if f.init:
                v = getattr(x, f.name)
                if not dataclasses.is_dataclass(v) and f.name not in FIELDS:
                    continue
                m = _marked(v, depth - 1, PACKED_AT.get(f.name, PACKED))
                if m is not v:
                    changes[f.name] = m
        if not changes:
            return x
        out = dataclasses.replace(x, **changes)
        for f in dataclasses.fields(x):       # what replace() makes afresh (Trace.derived:
            if not f.init:                    # the allocator replays made with the trace)
                setattr(out, f.name, getattr(x, f.name))
        names = {f.name for f in dataclasses.fields(x)}
        for k, v in vars(x).items():          # memos of the same values (cached properties:
            if k not in names:                # TraceLog.peaks_memo); its __getstate__ says
                out.__dict__.setdefault(k, v)  # which of them are pickled
        return out
    return x


def dumps(obj) -> bytes:
    """`obj` pickled with every list of PACKED items or more in its FIELDS, or in those of a
    dataclass it holds, pickled on its own (module docstring); `obj` itself is left as it is."""
    return pickle.dumps(_marked(obj, 2), protocol=pickle.HIGHEST_PROTOCOL)
