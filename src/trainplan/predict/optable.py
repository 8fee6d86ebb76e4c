"""A traced step's ops as the time model reads them: de-duplicated kernels and their order.

Every accelerator times the same ops, so a trace is summarised once (memoised on it): each
distinct kernel -- (name, family, dtype, phase, convolution?, FLOPs, bytes, channels per group,
shape, rerun?, dynamic casting?) -- once, with its count, and the step's kernels in the order the
host issues them (`seq`, indices into the table) with the kernel-less ops the host dispatched
before each (`seq_host`: views and the like, trace/counters.py `host_ops`) and the model's
modules entered before each (`seq_modules`: `host_modules`). The order is what the host/device queue
(predict/host.py) runs over; the counts are what the totals sum.

A trace read off a cut one (trace/derive/stitch.py) holds each of the last block's records once
per block, the copies appended after the traced ops: the same record objects, so that a copy is
known by its identity. In `seq` they are put back where a real step
runs them: after the last traced block's run in each phase (forward, backward), block after
block, so a 32-block model's queue sees 32 blocks and then the head, as it runs.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from operator import itemgetter

import numpy as np

from ..trace.facts import OpRecord

PHASES = ("forward", "backward", "optimizer")
FORWARD, BACKWARD, OPTIMIZER = range(len(PHASES))     # OpTable.phase codes
FAMILIES = ("matmul", "attention", "other")
_PHASE, _FAMILY = ({v: i for i, v in enumerate(t)} for t in (PHASES, FAMILIES))
DTYPES = {"float32": 0, "float16": 1, "bfloat16": 2,          # others (int, bool, "") -> 3
          "float8_e4m3fn": 4, "float8_e5m2": 4, "float8_e4m3fnuz": 4, "float8_e5m2fnuz": 4}


@dataclass
class TableMemo:
    """What the time model reads off a table that no parameter changes, made once per table
    (a fit times one table thousands of times): timing.py's kernel classes, per-accelerator
    static arrays and MFU peak, host.py's issue counts and synchronising kernels."""

    kernel_classes: np.ndarray | None = None
    static: dict[tuple, object] = field(default_factory=dict)     # (accel, precision) -> _Static
    mfu_peak: dict[tuple, float | None] = field(default_factory=dict)
    issue: object | None = None                                   # host._Issue
    sync: np.ndarray | None = None                                # host.sync_mask
    # timing.py `_timed`: each unique op's device time and the step's queue, per accelerator,
    # precision, parameters and queue settings (a plan times one table on every platform with
    # that accelerator; a fit under thousands of parameter sets: at most MEMO_ENTRIES kept)
    timed: dict[tuple, tuple] = field(default_factory=dict)


MEMO_ENTRIES = 64


@dataclass
class OpTable:
    """Ops of one trace, de-duplicated, with counts and the order they run in."""

    name: np.ndarray          # aten op name (str), e.g. "mm", "native_layer_norm_backward"
    family: np.ndarray
    dtype: np.ndarray
    phase: np.ndarray
    conv: np.ndarray
    flops: np.ndarray
    bytes: np.ndarray
    count: np.ndarray
    group_channels: np.ndarray = None   # convolutions: input channels per group (1 = depthwise)
    shape: np.ndarray = None            # trace/shapes.py: GEMMs, attention dims, list lengths
    recompute: np.ndarray = None        # the backward's rerun of a checkpointed block's op
    cast: np.ndarray = None             # runs TensorIterator's dynamic-casting loop (casting.py)
    meta: dict = field(default_factory=dict)   # model_flops, gradient_bytes, params_total, ...
    seq: np.ndarray = None              # the step's kernels in issue order (indices)
    seq_host: np.ndarray = None         # kernel-less ops the host dispatched before each
    seq_modules: np.ndarray = None      # the model's modules the host entered before each
    memo: TableMemo = field(default_factory=TableMemo, repr=False, compare=False)

    COLS = ("name", "family", "dtype", "phase", "conv", "flops", "bytes", "count",
            "group_channels", "shape", "recompute", "cast")

    def __post_init__(self):
        n = len(self.flops)
        if self.group_channels is None:
            self.group_channels = np.zeros(n, dtype=np.int64)
        if self.shape is None:
            self.shape = np.empty(n, dtype=object)
            self.shape[:] = [()] * n
        if self.recompute is None:
            self.recompute = np.zeros(n, dtype=bool)
        if self.cast is None:
            self.cast = np.zeros(n, dtype=bool)
        if self.seq is None:        # no order known: each op its count of times, phase by phase
            self.seq = np.repeat(np.arange(n), self.count)
            self.seq = self.seq[np.argsort(self.phase[self.seq], kind="stable")]
        if self.seq_host is None:
            self.seq_host = np.zeros(len(self.seq), dtype=np.int64)
        if self.seq_modules is None:
            self.seq_modules = np.zeros(len(self.seq), dtype=np.int64)

    def to_dict(self) -> dict:
        cols = {c: getattr(self, c).tolist() for c in self.COLS if c != "shape"}
        cols["shape"] = [list(s) for s in self.shape]
        return {"cols": cols, "meta": self.meta, "seq": self.seq.tolist(),
                "seq_host": self.seq_host.tolist(), "seq_modules": self.seq_modules.tolist()}

    @classmethod
    def from_dict(cls, d: dict) -> "OpTable":
        c = d["cols"]
        ints = {k: np.asarray(c[k], dtype=np.int64) for k in ("family", "dtype", "phase", "count",
                                                              "group_channels") if k in c}
        shape = None
        if "shape" in c:
            shape = np.empty(len(c["shape"]), dtype=object)
            shape[:] = [tuple(s) for s in c["shape"]]
        seq = d.get("seq")
        recompute = np.asarray(c["recompute"], dtype=bool) if "recompute" in c else None
        cast = np.asarray(c["cast"], dtype=bool) if "cast" in c else None
        return cls(name=np.asarray(c["name"], dtype=object), conv=np.asarray(c["conv"], dtype=bool),
                   recompute=recompute, cast=cast,
                   flops=np.asarray(c["flops"], float), bytes=np.asarray(c["bytes"], float),
                   meta=d["meta"], shape=shape,
                   seq=None if seq is None else np.asarray(seq, dtype=np.int64),
                   seq_host=None if seq is None else np.asarray(d["seq_host"], dtype=np.int64),
                   seq_modules=None if seq is None or "seq_modules" not in d else
                   np.asarray(d["seq_modules"], dtype=np.int64),
                   **ints)


def _in_order(ops: list, parts: tuple | None = None) -> tuple[np.ndarray, list]:
    """(the step's order as indices into `distinct`, `distinct`: each record once, where it
    first appears in `ops`): a record that appears more than once (a cut trace's last block,
    repeated for the blocks left out: trace/derive/stitch.py) keeps its first place, and its
    copies run after the last repeated record of its phase, block after block (module
    docstring). A repeated record is the same object: counted by its identity within `ops`.

    `parts` (a stitched trace's, stitch.py `TraceDerived.ops_parts`): `ops` as (base, block,
    k), the list base + block x k, whose block records are base's own; read as that list
    without making it (an 80-block model's stitched step holds ~150 records 77 times: the
    distinct records are walked, the order is made by numpy)."""
    if parts is not None:
        base, block, k = parts
        ids = list(map(id, base))
        times = Counter(ids)
        if any(id(o) not in times for o in block):
            return _in_order(base + block * k)
        for o in block:
            times[id(o)] += k
        listed = base
    else:
        ids = list(map(id, ops))
        times = Counter(ids)
        if len(times) == len(ids):
            return np.arange(len(ids), dtype=np.int64), list(ops)
        listed = ops
    distinct = list(dict(zip(ids, listed)).values())
    # how many more times each distinct record runs, read in C; only the repeated ones (a
    # block's records) are walked
    extra = np.fromiter(map(times.__getitem__, map(id, distinct)), dtype=np.int64,
                        count=len(distinct)) - 1
    runs, after = {}, {}
    for pos in np.flatnonzero(extra > 0).tolist():
        phase = distinct[pos].phase
        runs.setdefault(phase, []).append((pos, int(extra[pos])))
        after[phase] = pos + 1
    pieces, start = [], 0
    for phase in sorted(after, key=after.get):     # each phase's copies at its place
        pos, n = (np.array(x, dtype=np.int64) for x in zip(*runs[phase]))
        pieces.append(np.arange(start, after[phase], dtype=np.int64))
        pieces.append(np.tile(pos, int(n[0])) if n.min() == n.max() else
                      np.concatenate([pos[n > c] for c in range(int(n.max()))]))
        start = after[phase]
    pieces.append(np.arange(start, len(distinct), dtype=np.int64))
    return np.concatenate(pieces), distinct


# an OpRecord's fields a table row is keyed on, as they are (trace/facts.py): name, family,
# dtype, phase, FLOPs, bytes, channels per group, shape, rerun, casting; and its host ops
_RAW = itemgetter(*(OpRecord._fields.index(f) for f in (
    "name", "family", "dtype", "phase", "flops", "bytes", "group_channels", "shape",
    "recompute", "cast")))
_HOST = itemgetter(OpRecord._fields.index("host_ops"))
_MODULES = itemgetter(OpRecord._fields.index("host_modules"))


def _key(name, family, dtype, phase, flops, nbytes, group_channels, shape, recompute,
         cast) -> tuple:
    """A table row's key: what the time model tells kernels apart by."""
    return (name, _FAMILY[family], DTYPES.get(dtype, 3), _PHASE[phase],
            "convolution" in name, float(flops), float(nbytes), int(group_channels),
            tuple(shape), bool(recompute), bool(cast))


def _rows(distinct: list) -> tuple[np.ndarray, list[tuple]]:
    """(each record's row, -1 for one with no work; each row's key, in the order rows first
    appear). OpRecords are told apart first by their fields as they are, in C (a stitched
    step's table has ~2,000 records and a few hundred rows), and each distinct field tuple is
    keyed once: the same rows in the same order as keying every record, since equal fields
    make equal keys and a key first appears with the first record giving it."""
    raw = list(map(_RAW, distinct))
    fields = dict.fromkeys(raw)
    index: dict[tuple, int] = {}
    keys: list[tuple] = []
    for f in fields:
        if f[4] == 0 and f[5] == 0:
            fields[f] = -1
            continue
        key = _key(*f)
        row = index.get(key)
        if row is None:
            row = index[key] = len(keys)
            keys.append(key)
        fields[f] = row
    return np.fromiter(map(fields.__getitem__, raw), dtype=np.int64, count=len(raw)), keys


def summarize(trace) -> OpTable:
    """Aggregate `trace.ops` once (kept on the trace: TraceDerived.op_table) so every
    accelerator reuses it. Each distinct record's key is made once (a stitched trace repeats
    the same objects); the order and the counts are read off the records' identities."""
    if isinstance(trace, OpTable):
        return trace
    if trace.derived.op_table is not None:
        return trace.derived.op_table
    # a stitched trace's ops as its parts: the list need not be made
    order, distinct = _in_order(trace.ops, trace.derived.ops_parts)
    of_record, keys = _rows(distinct)
    host = np.fromiter(map(_HOST, distinct), dtype=np.int64, count=len(distinct))
    every = of_record[order]
    worked = every >= 0
    seq = every[worked]
    seq_host = host[order][worked]
    modules = np.fromiter(map(_MODULES, distinct), dtype=np.int64, count=len(distinct))
    seq_modules = modules[order][worked]
    counts = np.bincount(seq, minlength=len(keys))
    if not keys:
        keys, counts = [("none", 2, 3, 0, False, 0.0, 0.0, 0, (), False, False)], [0]
    arr = list(zip(*keys))
    shape = np.empty(len(keys), dtype=object)
    shape[:] = list(arr[8])
    table = OpTable(np.array(arr[0], dtype=object), np.array(arr[1]), np.array(arr[2]),
                    np.array(arr[3]), np.array(arr[4], bool), np.array(arr[5], float),
                    np.array(arr[6], float), np.array(counts), np.array(arr[7], dtype=np.int64),
                    shape, recompute=np.array(arr[9], dtype=bool),
                    cast=np.array(arr[10], dtype=bool),
                    meta={"model_flops": float(trace.model_flops),
                          "gradient_bytes": float(trace.gradient_bytes),
                          "params_total": int(trace.params_total),
                          "params_trainable": int(trace.params_trainable),
                          "weight_bytes": float(trace.weight_bytes),
                          "largest_block_param_bytes": float(trace.largest_block_param_bytes),
                          "moe_dispatch_elements": int(trace.moe_dispatch_elements),
                          "batch_size": int(trace.batch_size),
                          "tokens_per_sample": trace.tokens_per_sample,
                          "channels_last": bool(trace.semantics.channels_last),
                          "cudnn_grouped_direct": bool(trace.semantics.cudnn_grouped_direct)},
                    seq=seq, seq_host=seq_host, seq_modules=seq_modules)
    trace.derived.op_table = table
    return table
