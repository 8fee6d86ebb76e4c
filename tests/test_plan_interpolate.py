"""A trace interpolated between two micro-batches equals the traced one (trace/derive/interpolate.py)."""
import pytest
import torch

from conftest import tiny_job, trace
from trainplan.accelerators import get_accelerator
from trainplan.predict.memory import estimate_memory
from trainplan.trace.derive import Traces
from trainplan.trace.derive.interpolate import same_shape_family, trace_between
from trainplan.predict.timing import estimate_step_time


@pytest.fixture(scope="module")
def three():
    job = tiny_job(precision="fp16-amp", grad_accum=2)
    return job, {b: trace(job, "efficient", autocast=torch.float16, batch=b) for b in (2, 3, 4, 6, 8)}


def test_same_ops_at_every_batch(three):
    _job, t = three
    assert same_shape_family(t[2], t[8]) and same_shape_family(t[4], t[6])


def test_interpolated_trace_matches_the_traced_one(three):
    # from batch 4 up, every phase peak of this model is at the same op: all sizes are affine
    job, t = three
    mid = trace_between(t[4], t[8], 6)
    real = t[6]
    assert mid.batch_size == 6
    for a, b in zip(mid.ops, real.ops):
        assert a.flops == pytest.approx(b.flops, rel=1e-9, abs=1)
        assert a.bytes == pytest.approx(b.bytes, rel=1e-3, abs=1024)     # 512-byte rounding
    for ph in real.phase_peaks:
        assert mid.phase_peaks[ph][0] == pytest.approx(real.phase_peaks[ph][0], rel=1e-3)
    assert mid.flops_per_step == pytest.approx(real.flops_per_step, rel=1e-9)
    for acc in ("t4", "a100-sxm4-80gb"):
        a = get_accelerator(acc)
        j = job.with_(batch_size=6)
        assert estimate_memory(mid, a, j).device_used_bytes == pytest.approx(
            estimate_memory(real, a, j).device_used_bytes, rel=5e-3)
        assert estimate_step_time(mid, a, j).step_time_s == pytest.approx(
            estimate_step_time(real, a, j).step_time_s, rel=1e-3)


def test_where_the_peak_moves_interpolation_is_still_exact(three):
    # at batch 2-3 the backward peak of this tiny model sits elsewhere (output temporaries) than
    # at 8: the phase peaks are not affine, but they are recomputed from the affine allocation
    # sizes by replaying the tracer's memory log, so they equal the real trace's
    _job, t = three
    mid = trace_between(t[2], t[8], 3)
    for ph, (peak, cats) in t[3].phase_peaks.items():
        assert mid.phase_peaks[ph][0] == pytest.approx(peak, rel=1e-4)
        for c, v in cats.items():
            assert mid.phase_peaks[ph][1][c] == pytest.approx(v, rel=1e-3, abs=4096)


def test_only_strictly_between(three):
    _job, t = three
    with pytest.raises(ValueError):
        trace_between(t[2], t[8], 8)


def test_trace_cache_reads_every_batch_off_the_anchors():
    """Real traces at 1 (when asked) and at the anchors 2 and 32 only; every other micro-batch is
    read off their line, whatever was traced before (trace/derive/traces.py)."""
    job = tiny_job(precision="fp16-amp")
    from trainplan.trace.semantics import KernelSemantics
    sem = KernelSemantics(attention="efficient")
    traces = Traces()
    t3, interp = traces.at(job, sem, 3)
    assert interp and t3.batch_size == 3 and traces.traced_batches(job, sem) == [2, 32]
    traces.exact(job, sem, 6)                               # a real trace elsewhere changes nothing
    t3_again, _ = traces.at(job, sem, 3)
    assert t3_again is t3
    t1, interp = traces.at(job, sem, 1)
    assert not interp and t1.batch_size == 1
    t64, interp = traces.at(job, sem, 64)                    # beyond the anchors: the same line
    assert interp and t64.batch_size == 64 and traces.traced == 4
    # a variant that differs only in untraced fields (devices, strategy) shares the traces
    again, interp = traces.at(job.with_(gpus=4, strategy="ddp", gpu="t4"), sem, 3)
    assert again is t3 and traces.traced == 4


def test_an_interpolated_traces_lists_are_made_once_when_read():
    """trace/lazy.py `Lazy` (an interpolated trace's lists, a stored trace's): made on the first
    read, never before, read like the list it stands for, made before it is changed; a copy or a
    pickle of it is a plain list, and a packed list not yet read pickles as the same bytes."""
    import copy
    import pickle

    from trainplan.trace.lazy import Lazy, dumps

    made = []
    lazy = Lazy(lambda: made.append(1) or [3, 1, 2])
    assert made == []
    assert len(lazy) == 3 and lazy[0] == 3 and lazy[-1] == 2 and lazy[1:] == [1, 2]
    assert list(lazy) == [3, 1, 2] and list(reversed(lazy)) == [2, 1, 3] and 1 in lazy
    assert lazy == [3, 1, 2] and lazy + [4] == [3, 1, 2, 4] and [0] + lazy == [0, 3, 1, 2]
    assert sorted(lazy) == [1, 2, 3] and lazy.index(2) == 2 and bool(lazy)
    assert made == [1] and type(lazy) is not Lazy and isinstance(lazy, list)
    for other in (copy.copy(lazy), copy.deepcopy(lazy), pickle.loads(pickle.dumps(lazy))):
        assert type(other) is list and other == [3, 1, 2]
    assert not Lazy(list) and made == [1]
    import json
    import numpy as np
    assert json.dumps(Lazy(lambda: [1, 2])) == "[1, 2]" and ",".join(Lazy(lambda: ["a", "b"])) \
        == "a,b" and tuple(Lazy(lambda: [5])) == (5,)
    assert np.asarray(Lazy(lambda: [1.0, 2.0])).tolist() == [1.0, 2.0]
    grown = Lazy(lambda: [1])
    grown.append(2)
    assert grown == [1, 2]
    # two not made yet compare by what they hold, either way round and against a made one
    a, b, c = Lazy(lambda: [1, 2]), Lazy(lambda: [1, 2]), Lazy(lambda: [1, 3])
    assert a == b and not a != b and b == Lazy(lambda: [1, 2]) and a != c and not a == c
    assert [1, 2] == Lazy(lambda: [1, 2]) and list(a) != Lazy(lambda: [2])
    from trainplan.trace.log import TraceLog
    log = TraceLog(memory=list(range(600)), events=[1, 2])
    packed = pickle.loads(dumps(log))
    assert type(packed.memory) is Lazy and type(packed.events) is list
    assert type(log.memory) is list
    again = pickle.loads(pickle.dumps(packed.memory))
    assert type(again) is Lazy and again == list(range(600)) and packed.memory[599] == 599
    # what a dataclass makes afresh rather than takes (Trace.derived: the stored replays) is kept
    from trainplan.trace.facts import Trace
    import dataclasses
    fields = {f.name: None for f in dataclasses.fields(Trace) if f.init}
    tr = Trace(**{**fields, "ops": list(range(600)), "checkpointed_blocks": [],
                  "lora_modules": [], "trace_seconds": 0.0})
    tr.derived.replay["cuda"] = (1, 2, 3)
    back = pickle.loads(dumps(tr))
    assert type(back.ops) is Lazy and back.derived.replay == {"cuda": (1, 2, 3)}
    # rebuilt from an iterable, as dataclasses.asdict rebuilds a list of its type: made at once
    assert dataclasses.asdict(back)["ops"] == list(range(600))


def test_a_packed_list_of_named_tuples_comes_back_as_the_same_named_tuples():
    """trace/lazy.py keeps a long list of named tuples (a memory log, its events) as rows of plain
    tuples and their classes, made again by tuple.__new__: the same classes, values and order; a
    list holding anything else is pickled as it is."""
    import pickle

    from trainplan.trace.lazy import Lazy, dumps
    from trainplan.trace.log import Alloc, Event, Free, Retag, TraceLog

    memory = [Alloc(i, 512 * i, "activations", "forward") if i % 3 == 0 else
              Free(i - 1) if i % 3 == 1 else Retag(i, "gradients") for i in range(900)]
    events = [Event(i, -i if i % 2 else i) for i in range(700)]
    back = pickle.loads(dumps(TraceLog(memory=memory, events=events, timeline=[("x", 1)] * 600)))
    assert type(back.memory) is Lazy and type(back.events) is Lazy
    assert back.memory == memory and [type(m) for m in back.memory] == [type(m) for m in memory]
    assert back.events == events and all(type(e) is Event for e in back.events)
    assert back.memory[3].category == "activations" and back.events[5].nbytes == -5
    assert back.timeline == [("x", 1)] * 600 and type(back.timeline[0]) is tuple
    mixed = [Free(i) for i in range(599)] + [7]        # not all named tuples: a plain pickle
    assert pickle.loads(dumps(TraceLog(memory=mixed))).memory == mixed


def test_packed_op_records_come_back_as_records_and_repeats_stay_one_object():
    """A trace's OpRecords are named tuples and take lazy.py's fast path; a list holding one
    record more than once (a stitched trace's block copies, which optable.py knows by their
    identity) is pickled as it is, so the copies are still one object."""
    import pickle

    from trainplan.trace.facts import OpRecord
    from trainplan.trace.lazy import _encode, _unpacked

    ops = [OpRecord(f"mm{i}", "matmul", "forward", float(i), 2.0 * i, "bfloat16", "m",
                    shape=(1, i, 3)) for i in range(700)]
    back = pickle.loads(pickle.dumps(_unpacked(_encode(ops))))
    assert back == ops and all(type(o) is OpRecord for o in back)
    stitched = ops + ops[-5:] * 3
    again = _unpacked(_encode(stitched))
    assert again == stitched and again[-1] is again[-6] is again[-11] is again[699]


def test_a_copied_op_record_is_replace_with_the_changes():
    from trainplan.trace.facts import OpRecord
    r = OpRecord("mm", "matmul", "forward", 2.0, 3.0, "bfloat16", "m.layers.0", shape=(1, 2, 3, 4, 0))
    c = r.copied(flops=5.0, shape=(1, 2, 3, 8, 0))
    assert c == r._replace(flops=5.0, shape=(1, 2, 3, 8, 0)) and c is not r
    assert type(c) is OpRecord and c.host_ops == 0 and c.module == "m.layers.0"
    assert r.flops == 2.0 and r.shape == (1, 2, 3, 4, 0)          # the original unchanged


def test_the_family_key_tells_what_same_shape_family_told(three):
    """derive/interpolate.py `family_key`: one digest of what the anchors must share (op names,
    phases, dtypes, recompute flags; event serials and signs; the counts), equal for the same
    job at two micro-batches, different for a trace whose ops differ; kept on the trace."""
    from trainplan.trace.derive.interpolate import family_key
    _job, t = three
    a, b, c = t[2], t[4], t[8]
    assert family_key(a) == family_key(b) == family_key(c) and same_shape_family(a, c)
    assert a.derived.family is not None
    import dataclasses
    other = dataclasses.replace(b, ops=list(b.ops[:-1]))     # one op fewer: another family
    assert family_key(other) != family_key(b) and not same_shape_family(b, other)
    flipped = dataclasses.replace(b, ops=[r.copied(recompute=not r.recompute) if i == 0 else r
                                          for i, r in enumerate(b.ops)])
    assert len(flipped.ops) == len(b.ops)
    assert not same_shape_family(b, flipped)
