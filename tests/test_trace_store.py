"""The disk store of traces (trace/store.py): a second run reads what the first traced, gives the
same answers, and never reads a trace made from anything else."""
import json
import os
import sys
from pathlib import Path

import pytest

from trainplan.accelerators import get_accelerator
from trainplan.predict import Traces, evaluate
from trainplan.trace.derive import Deferred
from trainplan.predict.target import semantics_for
from trainplan.spec import Job, validate
from trainplan.trace import store

from conftest import tiny_job

T4 = get_accelerator("t4")


@pytest.fixture
def where(tmp_path, monkeypatch):
    monkeypatch.setenv(store.ENV, str(tmp_path / "traces"))
    return tmp_path / "traces"


def _answers(ev):
    return (ev.memory.required_bytes, ev.memory.peak_allocated_bytes, ev.time.step_time_s)


def test_second_run_reads_the_store_and_answers_the_same(where):
    job = tiny_job(batch_size=4)
    first = Traces()
    a = evaluate(job, T4, traces=first)
    assert first.traced >= 2 and first.loaded == 0
    assert len(list(where.glob("*.trace"))) == first.traced
    second = Traces()
    b = evaluate(job, T4, traces=second)
    assert second.traced == 0 and second.loaded == first.traced
    assert _answers(a) == _answers(b)


def test_a_step_read_off_another_is_kept_and_read_back(where):
    # gradient accumulation: the step without it is traced, the step with it read off it
    # (trace/derive/accumulate.py) and stored beside it; the next run traces nothing
    job = tiny_job(batch_size=4, grad_accum=4)
    first = Traces()
    a = evaluate(job, T4, traces=first)
    stored = len(list(where.glob("*.trace")))
    assert first.traced >= 1 and stored == 2 * first.traced
    second = Traces()
    b = evaluate(job, T4, traces=second)
    assert second.traced == 0 and second.loaded == stored
    assert _answers(a) == _answers(b)


def test_what_reads_only_traces_made_reads_only_this_runs(where):
    # a memory curve (plan/extras.py) reads only traces already made (`made_only`): those this
    # run made or read for its plan. A warm plan reads the same ones from the store as it plans,
    # so its curve is the cold one's; a trace another command stored is not read there, so a
    # report does not depend on what else was traced before
    job = tiny_job(batch_size=1)
    sem = semantics_for(job, T4)
    first = Traces()
    evaluate(job, T4, traces=first)            # micro-batch 1 and its anchor, traced and stored
    second = Traces()
    with second.made_only(), pytest.raises(Deferred):
        second.prefetch([(job, sem, 1)])       # stored by another run: not read within
    ev = evaluate(job, T4, traces=second)      # planning reads it from the store
    assert second.traced == 0 and second.loaded == first.traced
    with second.made_only():
        second.prefetch([(job, sem, 1)])       # now this run's: read within
        assert _answers(evaluate(job, T4, traces=second)) == _answers(ev)
    assert _answers(ev) == _answers(evaluate(job, T4, traces=first))
    with second.made_only(), pytest.raises(Deferred):   # one never made is still not made
        second.prefetch([(job.with_(optimizer="sgd"), sem, 1)])
    assert second.traced == 0


def test_a_plans_memory_curve_does_not_depend_on_other_commands_traces(tmp_path, monkeypatch,
                                                                     capsys):
    # a batch-1 trace another command stored (an estimate at micro-batch 1) used to add a row
    # to the plan's memory curves, so the report depended on what was traced before it
    from trainplan.cli.main import main
    job = str(Path(__file__).resolve().parents[1] / "examples" / "graphmer-se.yaml")

    def curves(name: str, before=()) -> list:
        monkeypatch.setenv(store.ENV, str(tmp_path / name))
        for argv in before:
            assert main(argv) == 0
        capsys.readouterr()
        assert main(["plan", job, "--format", "json", "-q"]) == 0
        return json.loads(capsys.readouterr().out)["memory_vs_micro_batch"]

    alone = curves("alone")
    assert alone and all(p["micro_batch_size"] != 1 for c in alone for p in c["points"])
    after = curves("after", [["estimate", job, "--gpu", g, "--batch-size", "1", "-q"]
                             for g in ("t4", "tpu-v5e-1")])
    assert after == alone


def test_a_different_job_or_batch_is_a_different_key(where):
    job = tiny_job()
    sem = semantics_for(job, T4)
    keys = {store.key(job, sem, 2, None), store.key(job, sem, 32, None),
            store.key(job, sem, 2, 3), store.key(job.with_(optimizer="sgd"), sem, 2, None),
            store.key(job, semantics_for(job, get_accelerator("a100-80gb")), 2, None)}
    assert len(keys) == 5 and None not in keys


def test_an_edited_local_config_is_a_new_key(where, tmp_path):
    cfg = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 64,
           "n_layer": 2, "n_head": 4, "vocab_size": 256, "n_positions": 64}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    job = validate(Job(model=f"hf:{path}", seq_len=32))
    sem = semantics_for(job, T4)
    before = store.key(job, sem, 2, None)
    path.write_text(json.dumps(dict(cfg, n_layer=3)))
    assert store.key(job, sem, 2, None) != before


HELPER = "import torch\nWIDTH = {w}\n"
MODEL = ("import torch\nimport helper\n"
         "def build():\n"
         "    return torch.nn.Sequential(torch.nn.Linear(8, helper.WIDTH), torch.nn.ReLU(),\n"
         "                               torch.nn.Linear(helper.WIDTH, 1))\n")


def test_a_py_model_is_read_back_only_while_its_code_and_what_it_imports_are_unchanged(
        where, tmp_path, monkeypatch):
    """A `py:` model is keyed by its file; the helper module it imports from the user's folder
    is recorded in the trace, and an edited helper makes the stored trace stale."""
    # traced in this process: a worker of an earlier test's pool (trace/parallel.py keeps one
    # per process) would keep the helper it imported first, where a new process imports it anew
    monkeypatch.setenv("TRAINPLAN_JOBS", "1")
    code = tmp_path / "code"
    code.mkdir()
    (code / "helper.py").write_text(HELPER.format(w=16))
    (code / "usermodel.py").write_text(MODEL)
    monkeypatch.syspath_prepend(str(code))
    monkeypatch.delitem(sys.modules, "helper", raising=False)
    job = validate(Job(model=f"py:{code / 'usermodel.py'}:build", batch_size=4,
                       inputs=[{"name": "input", "shape": ["batch", 8], "dtype": "float32"}]))
    first = Traces()
    a = evaluate(job, T4, traces=first)
    assert first.traced >= 1 and first.loaded == 0
    tr = next(iter(first._exact.values()))
    assert set(tr.sources) >= {str(code / "helper.py"), str(code / "usermodel.py")}
    warm = Traces()
    assert _answers(evaluate(job, T4, traces=warm)) == _answers(a)
    assert warm.traced == 0 and warm.loaded == first.traced

    (code / "helper.py").write_text(HELPER.format(w=4096))     # same key, stale trace
    monkeypatch.delitem(sys.modules, "helper")                  # as a new process imports it
    sem = semantics_for(job, T4)
    assert store.key(job, sem, 4, None) is not None
    edited = Traces()
    b = evaluate(job, T4, traces=edited)
    assert edited.loaded == 0 and edited.traced >= 1
    assert b.memory.required_bytes > a.memory.required_bytes

    before = store.key(job, sem, 4, None)
    (code / "usermodel.py").write_text(MODEL + "# edited\n")
    assert store.key(job, sem, 4, None) != before


def test_a_store_turned_off_is_never_written(where, monkeypatch):
    job = tiny_job()
    sem = semantics_for(job, T4)
    for off in ("off", "0", "no"):
        monkeypatch.setenv(store.ENV, off)
        assert store.folder() is None and store.key(job, sem, 2, None) is None
    evaluate(job, T4, traces=Traces())
    assert not where.exists()


def test_a_damaged_file_is_traced_again(where):
    job = tiny_job(batch_size=4)
    evaluate(job, T4, traces=Traces())
    for f in where.glob("*.trace"):
        f.write_bytes(b"not a trace")
    again = Traces()
    evaluate(job, T4, traces=again)
    assert again.loaded == 0 and again.traced >= 2


def test_the_least_recently_used_are_pruned(where, monkeypatch):
    evaluate(tiny_job(batch_size=4), T4, traces=Traces())

    def kept():            # traces and what is kept beside them (an interpolated trace's peaks)
        return sorted(p for p in where.iterdir() if p.suffix[1:] in store.KINDS)
    files = kept()
    assert len(files) >= 2 and {p.suffix for p in files} == {".trace", ".peaks"}
    for i, f in enumerate(files):            # distinct use times: files[-1] used last
        os.utime(f, (1_000_000 + i, 1_000_000 + i))
    monkeypatch.setattr(store, "MAX_BYTES", files[-1].stat().st_size)
    monkeypatch.setattr(store, "_PRUNED", set())
    store._prune(where)
    assert kept() == [files[-1]]


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_cut_trace_keeps_its_whole_stack_replay_so_a_warm_run_replays_nothing(where, monkeypatch,
                                                                               jobs):
    """trace/derive/replays.py `prepare`: a cut trace made here or in a worker (trace/parallel.py)
    comes back with its whole stack's allocator replay, the store keeps it, and a second run reads it
    instead of replaying 16 blocks' allocations again."""
    import trainplan.trace.derive.replays as replays
    from trainplan.trace.derive import fragmentation
    from trainplan.trace.stack import MIN_BLOCKS
    monkeypatch.setenv("TRAINPLAN_JOBS", jobs)
    job = tiny_job(num_layers=MIN_BLOCKS)
    sem = semantics_for(job, T4)
    cold = Traces()
    cold.prefetch([(job, sem, 2), (job, sem, 32)])     # two traces: in workers, where jobs=2
    whole = cold.exact(job, sem, 2)
    assert whole.stack is not None and whole.stack.blocks == MIN_BLOCKS   # stitched, not whole
    assert cold.traced == 2 and cold.loaded == 0       # cut to 4 blocks, at 2 and at 32
    frag = fragmentation(whole)

    def no_replay(*a, **kw):
        raise AssertionError("replayed again")
    monkeypatch.setattr(replays, "replay", no_replay)
    import trainplan.trace.derive.repeat as repeat
    plan = repeat.plan_of(whole.derived.whole_of.log)
    monkeypatch.setattr(repeat, "_repeat_plan", no_replay)   # nor planned again: the repeat
    warm = Traces()                                          # plan is stored with the log
    again = warm.exact(job, sem, 2)
    assert warm.traced == 0 and warm.loaded == 1
    assert fragmentation(again) == frag
    assert plan is not None and repeat.plan_of(again.derived.whole_of.log) == plan
    # and what interpolating it compares (derive/interpolate.py `family_key`), made with it
    cut, back = whole.derived.whole_of, again.derived.whole_of
    assert back.derived.family is not None and back.derived.family == cut.derived.family


def test_an_interpolated_cut_trace_keeps_its_peaks_so_a_warm_run_replays_no_log(where,
                                                                                 monkeypatch):
    """trace/derive/traces.py `between`: what a plan reads of a trace interpolated between two
    cut traces (each phase's peak; over one block more and over the whole stack, stitch.py) is
    stored once read, so the next run reads it there instead of replaying its anchor's memory
    log at the interpolated sizes, and gets the same peaks and the same whole step."""
    import trainplan.trace.derive.interpolate as interpolate
    import trainplan.trace.derive.peaks as peaks_mod
    from trainplan.trace.derive.anchoring import anchors
    from trainplan.trace.stack import HIGH, MIN_BLOCKS
    job = tiny_job(num_layers=MIN_BLOCKS)
    sem = semantics_for(job, T4)
    lo, hi = anchors(job)
    assert hi - lo > 1
    cold = Traces()
    whole, interpolated = cold.at(job, sem, lo + 1)
    assert interpolated and whole.stack is not None and whole.stack.blocks == MIN_BLOCKS
    cut = whole.derived.whole_of
    assert cut.log.resized is not None
    memo = dict(cut.log.peaks_memo)
    assert set(memo) == {HIGH + 1, MIN_BLOCKS} and all(v is not None for v in memo.values())

    def unread(*a, **kw):
        raise AssertionError("an anchor's memory log was replayed again")
    monkeypatch.setattr(interpolate, "phase_peaks_from_log", unread)
    monkeypatch.setattr(peaks_mod, "_read", unread)
    warm = Traces()
    again, interpolated = warm.at(job, sem, lo + 1)
    assert interpolated and warm.traced == 0
    assert again.derived.whole_of.phase_peaks == cut.phase_peaks
    assert dict(again.derived.whole_of.log.peaks_memo) == memo
    assert (again.phase_peaks, again.peak_allocated_bytes) == \
        (whole.phase_peaks, whole.peak_allocated_bytes)
    assert _answers(evaluate(job.with_(batch_size=lo + 1), T4, traces=warm)) == \
        _answers(evaluate(job.with_(batch_size=lo + 1), T4, traces=Traces(cut=True)))


def test_a_stored_trace_unpickles_its_module_table_and_repeat_plan_where_read(where):
    """trace/lazy.py, log.py: a stored cut trace's module table and its log's repeat plan come
    back as their pickles, made where first read: a plan over every platform asks of most only
    whether the plan exists (repeat.py `repeats`). Made, each is the one stored."""
    import pickle
    from trainplan.trace import lazy
    from trainplan.trace.derive import repeat
    from trainplan.trace.derive.replays import prepare
    from trainplan.trace.stack import HIGH, MIN_BLOCKS
    from trainplan.trace.tracer import trace_step
    job = tiny_job(num_layers=MIN_BLOCKS)
    made = prepare(trace_step(job, semantics_for(job, T4), 2, depth=HIGH))
    plan = repeat.plan_of(made.log)
    assert plan is not None and len(made.modules) >= lazy.PACKED_AT["modules"]
    back = pickle.loads(lazy.dumps(made))
    assert type(back.modules) is lazy.Lazy and type(back.log.repeat_plan[0]) is bytes
    assert repeat.repeats(back, MIN_BLOCKS)
    assert type(back.log.repeat_plan[0]) is bytes           # answered without unpickling it
    assert back.modules == made.modules and repeat.plan_of(back.log) == plan
    # a log whose events do not repeat keeps None, and says so
    made.log.repeat_plan[0] = None
    assert pickle.loads(lazy.dumps(made)).log.repeat_plan == [None]
