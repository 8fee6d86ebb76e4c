"""Traces one step serves for two targets (trace/derive/twins.py): flash and memory-efficient
attention where no SDPA call can take flash, and a TPU's fp16 AMP step, which is its bf16 step.
Each sharing is checked against the real traces it replaces, and the scheduler (trace/parallel.py)
against tracing everything."""
import pytest
import torch

from trainplan.accelerators import get_accelerator
from trainplan.models.reference import TransformerDims
from trainplan.precision import BF16_AMP, FP16_AMP
from trainplan.predict import Traces, evaluate
from trainplan.predict.target import semantics_for
from trainplan.trace.derive import attention_twin, same_step
from trainplan.trace import parallel, store
from trainplan.trace.semantics import KernelSemantics

from conftest import shallow, tiny_job

@pytest.fixture(autouse=True)
def no_store(monkeypatch):
    """Count what is traced here, not what an earlier test left in the session's store."""
    monkeypatch.setenv(store.ENV, "off")


FLASH = KernelSemantics(attention="flash", autocast_dtype=torch.bfloat16)
EFFICIENT = KernelSemantics(attention="efficient", autocast_dtype=torch.bfloat16)


def _same_step(a, b) -> bool:
    ops = [(r.name, r.phase, r.flops, r.bytes, r.dtype, r.module) for r in a.ops]
    return (ops == [(r.name, r.phase, r.flops, r.bytes, r.dtype, r.module) for r in b.ops]
            and a.log.events == b.log.events and a.phase_peaks == b.phase_peaks)


def _alibi():
    """An encoder whose attention takes an ALiBi bias (as GraphMER-SE's): flash never applies."""
    dims = TransformerDims(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128,
                           vocab_size=256, kind="encoder", positional_encoding="alibi")
    return tiny_job(precision="bf16-amp").with_(transformer=dims)


def test_a_step_no_call_of_which_can_take_flash_is_the_same_under_both():
    from trainplan.trace.tracer import trace_step
    job = _alibi()
    flash, efficient = trace_step(job, FLASH, 2), trace_step(job, EFFICIENT, 2)
    assert flash.flash_eligible == efficient.flash_eligible == 0
    assert _same_step(flash, efficient)


def test_a_causal_bf16_step_takes_flash_and_is_not_shared():
    from trainplan.trace.tracer import trace_step
    job = tiny_job(precision="bf16-amp")
    flash, efficient = trace_step(job, FLASH, 2), trace_step(job, EFFICIENT, 2)
    assert efficient.flash_eligible > 0 and flash.flash_eligible == efficient.flash_eligible
    assert any("flash" in r.name for r in flash.ops)
    assert not _same_step(flash, efficient)
    traces = Traces()
    traces.exact(job, EFFICIENT, 2)
    got = traces.exact(job, FLASH, 2)
    assert traces.traced == 2 and any("flash" in r.name for r in got.ops)


def test_the_cache_serves_the_twin_without_tracing_it(monkeypatch):
    monkeypatch.setenv("TRAINPLAN_JOBS", "1")
    job = _alibi()
    traces = Traces()
    efficient = traces.exact(job, EFFICIENT, 2)
    flash = traces.exact(job, FLASH, 2)
    assert traces.traced == 1
    assert flash.semantics == FLASH and _same_step(flash, efficient)
    assert attention_twin(FLASH) == EFFICIENT and attention_twin(EFFICIENT) == FLASH
    assert attention_twin(MATH) == EFFICIENT
    assert attention_twin(KernelSemantics(attention="eager")) is None


MATH = KernelSemantics(attention="math", autocast_dtype=torch.bfloat16)


def _eager():
    """Gemma-2, whose attention transformers 5.2x runs eager (no SDPA path): no attention call
    reaches a kernel the semantics choose."""
    from trainplan.spec import Job
    return Job(model=shallow("google/gemma-2-2b", 2), seq_len=64, precision="bf16-amp")


def test_a_step_without_attention_calls_is_the_same_under_math_and_efficient(monkeypatch):
    from trainplan.trace.tracer import trace_step
    job = _eager()
    math_, efficient = trace_step(job, MATH, 2), trace_step(job, EFFICIENT, 2)
    assert math_.sdpa_calls == efficient.sdpa_calls == 0
    assert _same_step(math_, efficient)
    # a step with attention calls is not: math materialises the scores
    causal = tiny_job(precision="bf16-amp")
    m, e = trace_step(causal, MATH, 2), trace_step(causal, EFFICIENT, 2)
    assert m.sdpa_calls > 0 and e.sdpa_calls > 0 and not _same_step(m, e)
    # the cache: math read off the efficient trace only where it made no attention call
    monkeypatch.setenv("TRAINPLAN_JOBS", "1")
    for j, shared in ((job, True), (causal, False)):
        traces = Traces()
        traces.exact(j, EFFICIENT, 2)
        got = traces.exact(j, MATH, 2)
        assert traces.traced == (1 if shared else 2) and got.semantics == MATH


def test_a_round_asking_math_and_efficient_traces_one_where_they_are_the_same(monkeypatch):
    """schedule.py `_pairs`: the math request waits for its efficient twin in the round and is
    made only where the twin made attention calls (one core: nothing runs speculatively)."""
    monkeypatch.setenv("TRAINPLAN_JOBS", "1")
    for job, made in ((_eager(), 2), (tiny_job(precision="bf16-amp"), 4)):
        traces = Traces()
        traces.prefetch([(job, s, b) for s in (MATH, EFFICIENT) for b in (2, 32)])
        assert traces.traced == made
        for b in (2, 32):
            m, e = traces.exact(job, MATH, b), traces.exact(job, EFFICIENT, b)
            assert m.semantics == MATH and _same_step(m, e) == (made == 2)
        assert traces.traced == made
    # flash, efficient and math asked at once: flash waits for its twin; math, once the model's
    # traces have made no attention call, is read off the same twin after the round
    for jobs in ("1", "2"):
        monkeypatch.setenv("TRAINPLAN_JOBS", jobs)
        traces = Traces()
        traces.exact(_eager(), EFFICIENT, 1)             # the model's hint: no attention calls
        traces.prefetch([(_eager(), s, 2) for s in (FLASH, MATH, EFFICIENT)])
        assert traces.traced == 2, jobs
        assert _same_step(traces.exact(_eager(), MATH, 2), traces.exact(_eager(), FLASH, 2))
        assert traces.traced == 2, jobs


def test_after_one_trace_without_flash_a_flash_request_traces_the_twin_first(monkeypatch):
    monkeypatch.setenv("TRAINPLAN_JOBS", "1")
    job = _alibi()
    traces = Traces()
    traces.exact(job, EFFICIENT, 2)
    traces.exact(job, FLASH, 32)            # no twin at 32 yet: traced as efficient, shared
    assert traces.traced == 2
    assert traces.exact(job, EFFICIENT, 32).semantics == EFFICIENT
    assert traces.traced == 2


def test_a_flash_request_whose_held_twin_took_flash_is_traced_not_its_twin_again(monkeypatch):
    """The flash hint is the model's at a precision (twins.py `hint_key`): another trace of the
    model may have taken no flash while this step's twin, held, did; the twin is not traced
    again (as it was, twice in a Llama-3.2-1B plan over every platform) and the step is."""
    from trainplan.trace.derive.twins import hint_key
    monkeypatch.setenv("TRAINPLAN_JOBS", "2")
    job = tiny_job(precision="bf16-amp")
    traces = Traces()
    assert traces.exact(job, EFFICIENT, 2).flash_eligible > 0
    traces._flash_hint[hint_key(job, FLASH)] = False     # as another of its traces left it
    traces.fill([(job, FLASH, 2, None)])
    assert traces.traced == 2
    assert any("flash" in r.name for r in traces.exact(job, FLASH, 2).ops)


def _made_in(_trace) -> int:
    """trace_all's `finish` (pickled by name to the workers): the process the trace was made in."""
    import os
    return os.getpid()


def test_one_trace_runs_on_the_warm_pool_once_there_is_one(monkeypatch):
    """A round of one trace in this process would import torch here (a plan's main process does
    not otherwise: about 4 s on 2 cores) and start with cold fake-tensor caches; once a pool is
    started it runs there."""
    import os
    monkeypatch.setenv("TRAINPLAN_JOBS", "2")
    monkeypatch.setattr(parallel, "_POOLS", {})      # this test's own pool, forked with its env
    monkeypatch.setattr(parallel, "_POOL_ENV", {})
    job = tiny_job(precision="bf16-amp")
    try:
        parallel.trace_all([(job, EFFICIENT, 2, None), (job, EFFICIENT, 32, None)])  # the pool
        assert parallel.trace_all([(job, EFFICIENT, 1, None)], finish=_made_in)[0] != os.getpid()
        monkeypatch.setenv("TRAINPLAN_HOME", os.environ["TRAINPLAN_HOME"] + "-later")
        # a setting made after the fork would not reach the workers: here, as before
        assert parallel.trace_all([(job, EFFICIENT, 1, None)], finish=_made_in)[0] == os.getpid()
    finally:
        for pool in parallel._POOLS.values():
            pool.terminate()


def test_prefetch_of_both_traces_one_per_batch_on_one_core_and_on_two(monkeypatch):
    job = _alibi()
    for jobs in ("1", "2"):
        monkeypatch.setenv("TRAINPLAN_JOBS", jobs)
        traces = Traces()
        traces.prefetch([(job, s, b) for s in (FLASH, EFFICIENT) for b in (2, 32)])
        # the first pair's flash may run on a free core before its twin says it is not needed;
        # once one trace has said so, the rest wait for their twins
        assert 2 <= traces.traced <= 3, jobs
        for b in (2, 32):
            assert _same_step(traces.exact(job, FLASH, b), traces.exact(job, EFFICIENT, b))
    monkeypatch.setenv("TRAINPLAN_JOBS", "1")     # one core: nothing runs speculatively
    traces = Traces()
    traces.prefetch([(job, s, b) for s in (FLASH, EFFICIENT) for b in (2, 32)])
    assert traces.traced == 2


def test_prefetch_of_a_flash_step_traces_both():
    job = tiny_job(precision="bf16-amp")
    traces = Traces()
    traces.prefetch([(job, s, 2) for s in (FLASH, EFFICIENT)])
    assert traces.traced == 2
    assert any("flash" in r.name for r in traces.exact(job, FLASH, 2).ops)
    assert not any("flash" in r.name for r in traces.exact(job, EFFICIENT, 2).ops)


def test_an_fp16_job_on_a_tpu_is_traced_as_its_bf16_step():
    job = tiny_job(precision="fp16-amp")
    tpu, t4 = get_accelerator("tpu-v5e-8"), get_accelerator("t4")
    sem = semantics_for(job, tpu)
    assert sem.autocast_dtype == "bfloat16"
    canon, _ = same_step(job, sem)
    assert canon.precision == BF16_AMP and same_step(job, semantics_for(job, t4))[0] is job
    traces = Traces()
    a = evaluate(job, tpu, traces=traces, strict=False)
    n = traces.traced
    b = evaluate(job.with_(precision=BF16_AMP), tpu, traces=traces, strict=False)
    assert traces.traced == n                # the bf16 job reads the same traces
    assert a.memory.required_bytes == b.memory.required_bytes
    assert a.trace.ops[0].dtype == b.trace.ops[0].dtype
    assert {r.dtype for r in a.trace.ops if r.family == "matmul"} == {"bfloat16"}
    gpu = evaluate(job, t4, traces=traces)       # a T4's fp16: the same trace, relabelled
    assert traces.traced == n
    assert {r.dtype for r in gpu.trace.ops if r.family == "matmul"} == {"float16"}
    assert FP16_AMP.is_fp16


def test_trace_all_follow_ups_follow_the_policy(monkeypatch):
    """The one-core path: a follow-up is made unless its request's result says skip."""
    monkeypatch.setenv("TRAINPLAN_JOBS", "1")
    made = []
    monkeypatch.setattr(parallel, "_run", lambda r, finish=None: made.append(r) or r)
    seen = []

    def policy(i, done, result):
        seen.append((i, done, result))
        return parallel.SKIP if result == "a" else parallel.RUN

    out = parallel.trace_all(["a", "b", "c"], [None, "b2", None], policy)
    assert out == (["a", "b", "c"], [None, "b2", None])
    assert made == ["a", "b", "c", "b2"]
    made.clear()
    out = parallel.trace_all(["a", "b"], ["a2", None], policy)
    assert out == (["a", "b"], [None, None]) and made == ["a", "b"]
    assert parallel.trace_all(["a"]) == ["a"]          # no follow-ups: a plain list


def test_a_round_asks_for_both_anchors_of_a_cut_model_at_once(monkeypatch):
    """traces.every: a step read off the anchors' line of a cut model needs two traces (the two
    anchors, cut to 4 blocks; one block more is read off the last, depth.extend); the first
    round asks for both, not one per round."""
    from trainplan.trace.derive import ANCHORS
    from trainplan.trace.stack import HIGH, MIN_BLOCKS
    rounds = []

    class Stop(Exception):
        pass

    def fill(self, requests, *a, **kw):
        rounds.append({(batch, depth) for _job, _sem, batch, depth in requests})
        raise Stop
    monkeypatch.setattr(Traces, "fill", fill)
    job = tiny_job(num_layers=MIN_BLOCKS)
    traces = Traces()
    with pytest.raises(Stop):
        traces.in_rounds([lambda: traces.at(job, EFFICIENT, 5)])
    assert rounds == [{(b, HIGH) for b in ANCHORS}]


@pytest.mark.parametrize("model, made", [
    # T5: the first block owns the relative position bias, so the blocks are not alike and
    # nothing is cut: the traces asked cut are whole, and serve as the whole ones (2, not 4)
    ("google-t5/t5-small", [2, 4]),
    # a stack cut whose allocations do not repeat block by block (no bundled model's since
    # BERT's do, repeat.py `_gradients_freed_late`: BERT's made so here, 6 of BERT-base's blocks
    # (conftest.py `shallow`), below EXACT_BLOCKS): traced whole after the cut traces, and the
    # next variant whole at once
    ("google-bert/bert-base-uncased", [4, 6]),
])
def test_a_model_that_cannot_be_read_off_a_cut_trace_is_traced_whole_once(monkeypatch, model,
                                                                            made):
    """trace/derive/traces.py `_traced_whole`: what the built model shows on its first cut trace
    (nothing to cut, or a cut step that is not exact) holds for its other variants (a rung's
    checkpointing): none of them is traced cut again."""
    import trainplan.trace.derive.traces as traces_mod
    import trainplan.trace.stack as trace_depth
    if "bert" in model:
        from trainplan.trace.derive import repeat
        monkeypatch.setattr(repeat, "_repeat_plan", lambda log: None)
        monkeypatch.setenv("TRAINPLAN_TRACE_CACHE", "off")   # no repeat plan stored with a trace
    monkeypatch.setattr(trace_depth, "MIN_BLOCKS", 6)
    monkeypatch.setattr(traces_mod, "MIN_BLOCKS", 6)
    monkeypatch.setenv("TRAINPLAN_JOBS", "1")      # a pool forked earlier cuts from its own
    from trainplan.spec import Job, validate
    ref = shallow(model, 6) if "bert" in model else "hf:" + model
    job = validate(Job(model=ref, seq_len=32, precision="bf16-amp"))
    traces = Traces()
    whole = traces.in_rounds([lambda: traces.at(job, EFFICIENT, 5)])[0][0]
    assert traces.traced == made[0] and whole.stack is None
    ckpt = job.with_(grad_checkpointing="full")
    traces.in_rounds([lambda: traces.at(ckpt, EFFICIENT, 5)])
    assert traces.traced == made[1]
    assert not traces._cuts(ckpt, EFFICIENT) and traces.traced_batches(ckpt, EFFICIENT) == [2, 32]


def test_a_paged_optimizer_reads_its_unpaged_twins_trace(monkeypatch):
    """paged-adamw-8bit runs adamw-8bit's step (the same builder and options: optimizer.py
    `traced_as`): one trace serves both, and only where the states live differs."""
    from trainplan.optimizer import ADAMW_8BIT, PAGED_ADAMW_8BIT, traced_as
    from trainplan.trace.derive import trace_job
    from trainplan.trace.tracer import trace_step
    monkeypatch.setenv("TRAINPLAN_JOBS", "1")
    assert traced_as(PAGED_ADAMW_8BIT) is ADAMW_8BIT and traced_as(ADAMW_8BIT) is ADAMW_8BIT
    job = tiny_job(precision="bf16-amp")
    paged, plain = job.with_(optimizer="paged-adamw-8bit"), job.with_(optimizer="adamw-8bit")
    assert trace_job(paged) == trace_job(plain)
    # what it replaces: the paged step traced as itself is the same step
    own = trace_step(paged, EFFICIENT, 2)
    assert _same_step(own, trace_step(plain, EFFICIENT, 2))
    assert own.optimizer_state_bytes > 0
    a100 = get_accelerator("a100-80gb")
    traces = Traces()
    a = evaluate(paged, a100, traces=traces, strict=False)
    n = traces.traced
    b = evaluate(plain, a100, traces=traces, strict=False)
    assert traces.traced == n and a.trace is b.trace
    assert a.time.step_time_s == b.time.step_time_s
    # the paged states are outside what must fit (predict/memory.py)
    assert a.memory.required_bytes < b.memory.required_bytes
